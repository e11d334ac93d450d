"""config/*.json as the broker loads them (``ConfigManager.load``), and the RocksDB config databases of
a 5.x broker with ``storeType=defaultRocksDB`` (``RocksDBConfigManager``, see ``load_kv_config``).

The broker reads ``<name>``; when it is missing or empty, or does not decode, it reads ``<name>.bak``
(which ``MixAll.string2File`` fills with the previous content on every write). A missing or empty
``.bak`` leaves the table empty; a ``.bak`` that does not decode fails the load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

from rmqtool.errors import FormatError, StoreError
from rmqtool.format.fastjson import parse_fastjson

__all__ = ["parse_fastjson", "read_config", "load_config", "load_kv_config", "Loaded"]

# ConfigRocksDBStorage: the column families it opens, and the data version's key
KV_DEFAULT_FAMILY, KV_DATA_VERSION_FAMILY, KV_FORBIDDEN_FAMILY = "default", "kvDataVersion", "forbidden"
KV_DATA_VERSION_KEY = b"kvDataVersionKey"

T = TypeVar("T")


def read_config(path: Path):
    try:
        return parse_fastjson(_text(path))
    except FormatError as exc:
        raise exc.at(path=str(path)) from None


@dataclass(frozen=True)
class Loaded(Generic[T]):
    """A decoded config file and where it came from; ``fallback`` tells why the .bak was read."""

    value: T
    path: Path
    fallback: str | None = None


def load_config(path: Path, decode: Callable[[Any], T]) -> Loaded[T] | None:
    """ConfigManager.load of ``path``, with ``decode`` turning parsed JSON into a value (raising
    FormatError for a wrong shape). None when neither the file nor its .bak holds anything.

    A file that does not decode without a usable .bak raises its FormatError: the broker would start
    with an empty table there, which an offline reader must not present as the content.
    """
    bak = path.with_name(path.name + ".bak")
    text = _text(path) if path.is_file() else ""
    error: FormatError | None = None
    if text:
        try:
            return Loaded(decode(parse_fastjson(text)), path)
        except FormatError as exc:
            error = exc.at(path=str(path))
    bak_text = _text(bak) if bak.is_file() else ""
    if not bak_text:
        if error is not None:
            raise error
        return None
    reason = str(error) if error is not None else f"{path.name} is {'empty' if path.is_file() else 'missing'}"
    try:
        return Loaded(decode(parse_fastjson(bak_text)), bak, reason)
    except FormatError as exc:
        also = f"; {path.name}: {error.message}" if error is not None else f"; {reason}"
        raise FormatError(exc.message + also, path=str(bak), offset=exc.offset) from None


def load_kv_config(path: Path, table: str, decode: Callable[[Any], T], *,
                   value: Callable[[Any], Any] = lambda v: v) -> Loaded[T] | None:
    """A RocksDB config database (``config/topics/``, ``subscriptionGroups/``, ``consumerOffsets/``) as its
    ``RocksDBConfigManager`` loads it, decoded by ``decode`` like the JSON file it replaces; None when
    the directory holds no database (the broker creates an empty one there: setCreateIfMissing).
    Read-only (store.rocksdbcq.open_read_only): nothing is written into it.

    ConfigRocksDBStorage.postLoad opens the families default, kvDataVersion and forbidden (creating
    those missing; a database with another family does not open: the broker refuses to start).
    loadDataVersion reads ``kvDataVersionKey`` of kvDataVersion (a fresh DataVersion without it), loadData
    every live key of default in key order (deleted keys are not there): the key as UTF-8 is the table
    key, the value fastjson (``value`` picks the entry out of it, e.g. RocksDBOffsetSerializeWrapper's
    offsetTable); loadForbidden (the groups database) every key of forbidden: group -> {topic: bits}.
    ``decode`` gets them as ``{"dataVersion":…, table:{…}, "forbiddenTable":{…}}``. A value that does not
    decode fails the load (JSON.parseObject throws): a StoreError, as a database that does not open.
    """
    from rmqtool.store.rocksdbcq import close_read_only, is_rocksdb_dir, open_read_only

    if not path.is_dir() or not is_rocksdb_dir(path):
        return None
    db, families, shadow = open_read_only(path, "the RocksDB config database")
    try:
        extra = [f for f in families if f not in (KV_DEFAULT_FAMILY, KV_DATA_VERSION_FAMILY, KV_FORBIDDEN_FAMILY)]
        if extra:
            raise StoreError(f"column famil{'ies' if len(extra) > 1 else 'y'} {', '.join(map(repr, extra))} "
                             "beside default, kvDataVersion and forbidden: ConfigRocksDBStorage does not open it",
                             path=str(path))
        obj: dict[str, Any] = {table: {_key(k): _kv_json(v, k, path, value) for k, v in db.items()}}
        if KV_DATA_VERSION_FAMILY in families:
            version = db.get_column_family(KV_DATA_VERSION_FAMILY).get(KV_DATA_VERSION_KEY)
            if version and version.decode("utf-8", "replace").strip():
                obj["dataVersion"] = _kv_json(version, KV_DATA_VERSION_KEY, path)
        if KV_FORBIDDEN_FAMILY in families:
            obj["forbiddenTable"] = {_key(k): _kv_json(v, k, path)
                                     for k, v in db.get_column_family(KV_FORBIDDEN_FAMILY).items()}
    finally:
        close_read_only(db, shadow)
    try:
        return Loaded(decode(obj), path)
    except FormatError as exc:
        raise StoreError(exc.message, path=str(path)) from None


def _key(key: bytes) -> str:
    """new String(key, UTF-8): malformed bytes become U+FFFD."""
    return key.decode("utf-8", "replace")


def _kv_json(raw: bytes, key: bytes, path: Path, value: Callable[[Any], Any] = lambda v: v) -> Any:
    try:
        return value(parse_fastjson(raw.decode("utf-8", "replace")))
    except FormatError as exc:
        raise StoreError(f"key {_key(key)!r}: {exc.message}", path=str(path)) from None


def _text(path: Path) -> str:
    """MixAll.file2String: the whole file as UTF-8 (malformed bytes become U+FFFD, as in Java)."""
    return path.read_bytes().decode("utf-8", "replace")
