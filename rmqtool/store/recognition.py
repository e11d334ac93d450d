"""Recognising a store: what a store root is, what a reader's path is (``recognize``: a store, a commit-log
directory or file, else refused), whether a path lies inside a store's data directories, and which entries
of those directories the broker refuses to load.

A write touches only a directory that is a store root by its layout (``require_store_root``), and no
output of a command lands inside a store's data directories (``refuse_inside_data_dir``).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Iterator

from rmqtool import constants as C
from rmqtool.errors import StoreError
from rmqtool.format import dledger as D
from rmqtool.store import layout as L
from rmqtool.store.dledger import find_dledger_dir
from rmqtool.store.filequeue import is_offset_name, list_dir

# The directories the broker loads files from (DefaultMessageStore.load and its services): no output there.
LOADED_DIRS = L.DATA_DIRS + (L.TIMERLOG, L.TIMERWHEEL, L.COMPACTION)
_JAVA_LONG = (-(1 << 63), (1 << 63) - 1)
_JAVA_INT = (-(1 << 31), (1 << 31) - 1)


def is_store_root(path: Path) -> bool:
    """A directory holding ``commitlog/`` or a DLedger ``dledger-<id>/data/``."""
    path = Path(path)
    return path.is_dir() and ((path / L.COMMITLOG).is_dir() or find_dledger_dir(path) is not None)


NOT_A_STORE = "not a RocketMQ store (no commitlog/, consumequeue/, index/ or checkpoint)"
_RECORD_MAGICS = (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2, C.BLANK_MAGIC_CODE)
_SMALLEST_RECORD = C.FIXED_WITHOUT_HOSTS + 2 * C.IPV4_HOST_LEN + 1


def recognize(path: str | os.PathLike) -> str:
    """What a reader was given: ``"root"`` (a store root), ``"commitlog"`` (a commit-log directory: named
    so, or holding files named by offsets) or ``"file"`` (a commit-log or DLedger data file: its first
    bytes a record header, a BLANK or a DLedger entry; zeros or nothing in a file named by its offset);
    anything else is refused (StoreError, exit 4). Reads at most 64 bytes of a file."""
    path = Path(path)
    if not path.exists():
        raise StoreError("no such file or directory", path=str(path))
    if path.is_file():
        with open(path, "rb") as fh:
            head = fh.read(D.HEADER_SIZE + 8)
        problem = _not_a_commitlog_file(head, is_offset_name(path.name))
        if problem:
            raise StoreError(f"not a store or a commit-log file: {problem}", path=str(path))
        return "file"
    if (path / L.COMMITLOG).is_dir() or find_dledger_dir(path) is not None:
        return "root"
    if path.name == L.COMMITLOG or any(is_offset_name(p.name) and p.is_file() for p in path.iterdir()):
        return "commitlog"
    if (path / L.CONSUMEQUEUE).is_dir() or (path / L.INDEX).is_dir() or (path / L.CHECKPOINT).is_file():
        return "root"
    raise StoreError(NOT_A_STORE, path=str(path))


def _not_a_commitlog_file(head: bytes, offset_name: bool) -> str | None:
    """Why a file beginning with ``head`` is not a commit-log file (None: it is one)."""
    if not any(head):
        return None if offset_name else f"{len(head)} zero bytes and no record, in a file not named by its offset"
    if len(head) < 8:
        return f"{len(head)} bytes, shorter than a record header"
    size, magic = struct.unpack_from(">iI", head)
    if magic in _RECORD_MAGICS and (size >= _SMALLEST_RECORD or magic == C.BLANK_MAGIC_CODE and size >= 8):
        return None
    if size in D.VALID_MAGICS or size == D.BLANK_MAGIC:       # a DLedger data file: an entry, or a BLANK
        inner = struct.unpack_from(">I", head, D.HEADER_SIZE + 4)[0] if len(head) >= D.HEADER_SIZE + 8 else None
        if size == D.BLANK_MAGIC or inner in _RECORD_MAGICS[:2]:
            return None
    return f"its first record is no record (size {size}, magic {magic:#010x})"


def require_store_root(path: str | os.PathLike) -> Path:
    """``path`` when it is a store root; else StoreError (a write never touches anything else)."""
    path = Path(path)
    if not path.exists():
        raise StoreError("no such file or directory", path=str(path))
    if not is_store_root(path):
        what = "a file" if not path.is_dir() else "a directory without commitlog/ or dledger-<id>/data/"
        raise StoreError(f"not a store root ({what}); write commands take the store's root directory",
                         path=str(path))
    return path


def store_root_above(path: str | os.PathLike) -> tuple[Path, str] | None:
    """(store root, data directory) when ``path`` lies inside a store's data directory (or is one)."""
    path = Path(os.path.abspath(path))
    for parent in path.parents:
        name = path.relative_to(parent).parts[0]
        if (name in LOADED_DIRS or name.startswith(L.DLEDGER_PREFIX)) and is_store_root(parent):
            return parent, name
    return None


def refuse_inside_data_dir(path: str | os.PathLike, what: str) -> None:
    """StoreError when an output ``path`` would land inside a store's data directories."""
    found = store_root_above(path)
    if found is None and Path(path).exists():
        found = store_root_above(Path(path).resolve())      # through symlinks
    if found is not None:
        raise StoreError(f"{what} would land inside {found[1]}/ of the store {found[0]}, where the broker "
                         "loads its files; choose a path outside the store's data directories", path=str(path))


def _parses(name: str, bounds: tuple[int, int]) -> bool:
    """Java's Long.parseLong / Integer.parseInt accept the name (optional sign, ASCII digits, in range)."""
    digits = name[1:] if name[:1] in "+-" else name
    if not digits or not all("0" <= c <= "9" for c in digits):
        return False
    return bounds[0] <= int(name) <= bounds[1]


def is_index_name(name: str) -> bool:
    """A name IndexService.load maps as an index file (others it skips)."""
    return _parses(name, _JAVA_LONG)


def refused_entries(root: Path, *, broker_5x: bool) -> Iterator[tuple[Path, bool, str]]:
    """(path, refused, reason) for every entry of ``commitlog/``, ``consumequeue/``, ``batchconsumequeue/``
    and ``index/`` that is not a file the broker loads there. ``refused``: the broker fails to start on it;
    else it skips or deletes the entry.

    MappedFileQueue.load (4.9.7 and 5.x) refuses any entry whose length differs from the file size, and a
    name Long.parseLong rejects (MappedFile.init throws NumberFormatException, which DefaultMessageStore.load
    turns into a failed load); 5.x (MappedFileQueue.doLoad) skips directories and deletes an empty last
    entry. ConsumeQueueStore/DefaultMessageStore.loadConsumeQueue skip queue directories whose name is not an
    int. IndexService.load skips names that are not a long (it catches NumberFormatException) and refuses a
    directory (RandomAccessFile throws FileNotFoundException).
    """
    root = Path(root)
    queue_dirs = [root / L.COMMITLOG] if find_dledger_dir(root) is None else []
    for kind in (L.CONSUMEQUEUE, L.BATCHCONSUMEQUEUE):
        base = root / kind
        queue_dirs += [base / t / q for t, q in sorted(
            (t.name, q.name) for t in list_dir(base) or () if t.is_dir() for q in list_dir(t.path) or ()
            if _parses(q.name, _JAVA_INT) and q.is_dir())]
    for d in queue_dirs:
        entries = list_dir(d)
        if entries is not None:
            yield from _queue_dir_entries(d, entries, broker_5x)
    index = root / L.INDEX
    if index.is_dir():
        for p in sorted(index.iterdir()):
            if not is_index_name(p.name):
                yield p, False, "not an index file name: the broker skips it (IndexService.load)"
            elif p.is_dir():
                yield p, True, "a directory where the broker maps an index file: it refuses to load the store"


def _queue_dir_entries(d: Path, entries: list[os.DirEntry], broker_5x: bool) -> Iterator[tuple[Path, bool, str]]:
    entries = sorted(entries, key=lambda e: e.name)
    for i, e in enumerate(entries):
        if is_offset_name(e.name):
            continue                         # checked with the queue's files (sizes, a directory in its place)
        p = d / e.name
        if e.is_dir():
            if broker_5x:
                yield p, False, "a directory among the mapped files: the 5.x broker skips it"
            else:
                yield p, True, "a directory among the mapped files: the 4.9.7 broker refuses to load the store"
        elif broker_5x and i == len(entries) - 1 and e.stat().st_size == 0:
            yield p, False, "an empty last file: the 5.x broker deletes it on start"
        elif _parses(p.name, _JAVA_LONG):
            yield p, True, f"misnamed file: the broker maps it at offset {int(p.name)} among the files named " \
                           "by their 20-digit offsets"
        else:
            yield p, True, "not a file the broker maps (its name is not an offset): it refuses to load the store"
