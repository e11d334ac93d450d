"""config/*.json as the broker loads them (``ConfigManager.load``).

The broker reads ``<name>``; when it is missing or empty, or does not decode, it reads ``<name>.bak``
(which ``MixAll.string2File`` fills with the previous content on every write). A missing or empty
``.bak`` leaves the table empty; a ``.bak`` that does not decode fails the load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

from rmqtool.errors import FormatError
from rmqtool.format.fastjson import parse_fastjson

__all__ = ["parse_fastjson", "read_config", "load_config", "Loaded"]

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


def _text(path: Path) -> str:
    """MixAll.file2String: the whole file as UTF-8 (malformed bytes become U+FFFD, as in Java)."""
    return path.read_bytes().decode("utf-8", "replace")
