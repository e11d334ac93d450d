"""How large a write may grow (#37): a plan's size (the files and bytes it creates, changes and deletes),
stated in every write command's plan, checked against the room the file system has (atomic.check_room) and
against a bound derived from the store's own size plus the input given.

The bound (``Bound``): a plan may create at most

    files: 2 x (the store's files + the records its commit log can hold + the input's items) + 64
    bytes: 2 x (the store's allocated bytes + the input's bytes) + 64 MiB

The records a commit log (or a DLedger node's data) can hold (its bytes / MIN_RECORD_SIZE, 92 for a 1-byte
topic) bound the queues and units any dispatch makes: every queue and index file a rebuild needs comes from
one of them. A plan's bytes are its data (pre-allocated files are sparse: their holes take no room, and are
stated apart). A plan beyond the bound is refused (``TooLarge``, exit 4, nothing written) unless the caller
allows it (``--allow-large``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rmqtool.errors import UnsafeWrite
from rmqtool.store import layout as L
from rmqtool.store.broker_model import MIN_RECORD_SIZE
from rmqtool.store.filequeue import data_extents

FACTOR = 2
SLACK_FILES = 64
SLACK_BYTES = 64 << 20


def file_data(path) -> tuple[int, int]:
    """(bytes of data, size) of a file: its data extents (SEEK_DATA; holes of a sparse file left out), which
    unlike allocated blocks do not vary with the file system's pre-allocation."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return sum(hi - lo for lo, hi in data_extents(fd, 0, size)), size
    finally:
        os.close(fd)


def _is_commitlog(rel: str) -> bool:
    """Whether the store directory ``rel`` holds commit-log data (``commitlog/``, a DLedger node's ``data/``)."""
    head, _, tail = rel.partition(os.sep)
    return rel == L.COMMITLOG or (head.startswith(L.DLEDGER_PREFIX) and tail == L.DLEDGER_DATA)


class TooLarge(UnsafeWrite):
    """A plan far larger than its store plus its input (exit 4, nothing written)."""


def _human(n: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


@dataclass
class PlanSize:
    """What a plan creates (files, bytes written, apparent bytes of sparse files), changes and deletes;
    ``by_path`` the created files and bytes per directory (the largest names what drives a refusal), ``why``
    the stored field behind a directory's files where one is known."""

    files: int = 0
    data: int = 0
    sparse: int = 0
    changed: int = 0
    deleted: int = 0
    by_path: dict[str, list[int]] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)     # a directory -> the stored field that drives it

    def create(self, rel: str, data: int, size: int | None = None) -> None:
        self.files += 1
        self.data += data
        self.sparse += max(0, (size if size is not None else data) - data)
        where = self.by_path.setdefault(str(Path(rel).parent), [0, 0])
        where[0], where[1] = where[0] + 1, where[1] + data

    def add_tree(self, root: Path, rel: str = "") -> None:
        """Every file under ``root`` created, named as under ``rel``."""
        for d, _, names in os.walk(root):
            for name in names:
                here = os.path.relpath(os.path.join(d, name), root)
                self.create(os.path.join(rel, here) if rel else here, *file_data(os.path.join(d, name)))

    def line(self) -> str:
        """The plan's total, short enough for one line of a table beside the 'total' action."""
        text = f"{self.files} files new, {self.changed} changed, {self.deleted} deleted; {_human(self.data)}"
        return text + (f" (+{_human(self.sparse)} sparse)" if self.sparse else "")

    def driver(self) -> tuple[str, int, int]:
        """(directory, files, bytes) of the directory creating the most."""
        path, (files, data) = max(self.by_path.items(), key=lambda kv: (kv[1][0], kv[1][1]),
                                  default=(".", (0, 0)))
        return path, files, data


@dataclass(frozen=True)
class Bound:
    files: int
    data: int
    said: str                   # what it derives from

    @classmethod
    def of(cls, root: Path, given_items: int = 0, given_bytes: int = 0) -> "Bound":
        """The bound of a write to the store at ``root`` given ``given_items`` items of ``given_bytes``."""
        files = data = log = 0
        for d, _, names in os.walk(root):
            for name in names:
                st = os.lstat(os.path.join(d, name))
                files, data = files + 1, data + st.st_blocks * 512
                if _is_commitlog(os.path.relpath(d, root)):
                    log += st.st_size
        records = log // MIN_RECORD_SIZE + 1
        said = f"the store's {files} files, {_human(data)}, {records} possible records"
        if given_items or given_bytes:
            said += f" and the input's {given_items} item(s), {_human(given_bytes)}"
        return cls(FACTOR * (files + records + given_items) + SLACK_FILES,
                   FACTOR * (data + given_bytes) + SLACK_BYTES, said)

    def excess(self, plan: PlanSize, what: str) -> str | None:
        """None when ``plan`` is within the bound, else the one line saying what drives it past."""
        if plan.files <= self.files and plan.data <= self.data:
            return None
        path, files, data = plan.driver()
        why = f"{plan.why[path]}: " if path in plan.why else ""
        return (f"{path}: {why}{what} would create {files} file(s), {_human(data)} here ({plan.files} file(s), "
                f"{_human(plan.data)} in all), beyond the bound of {self.files} file(s), {_human(self.data)} "
                f"({FACTOR} x {self.said}); --allow-large writes it anyway")

    def check(self, plan: PlanSize, what: str, allow: bool) -> None:
        """Refuse (TooLarge) a plan beyond the bound unless ``allow``."""
        said = None if allow else self.excess(plan, what)
        if said is not None:
            raise TooLarge(said + ": nothing written")
