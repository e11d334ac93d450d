"""What a reader may read of a commit log: one rule for incomplete input, applied by every reader (export,
stats, grep, cat-commitlog, verify, info, query-*, the Spark data source).

A commit log the broker refuses to load is refused by every reader with the same line (``Refused``, exit 4):
a file whose length is not the file size (rule commitlog_file_size, MappedFileQueue.load; an empty last file
excepted: it holds nothing, and 5.x deletes it), a file named off the grid of file starts (it overlaps its
neighbours), a missing file between two others (a gap offsets cannot cross). Asked to read it anyway, a
reader reads each file on the grid up to the end of its last whole record, leaves the files off the grid out,
and ends with a warning naming what it skipped (``Readable.skipped``: records, bytes, where; exit 3).
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple, Sequence

from rmqtool import constants as C
from rmqtool.errors import StoreError
from rmqtool.format import dledger as D
from rmqtool.store.broker_model import MIN_RECORD_SIZE, refusal

READ_ANYWAY = "--read-anyway"
_HEAD = struct.Struct(">iI")
_SMALLEST = C.FIXED_WITHOUT_HOSTS + 2 * C.IPV4_HOST_LEN + 1
_MESSAGE_MAGICS = (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2)
_OFF_GRID = "a file off the grid of file names"

# A gap or an overlap among the file names: MappedFileQueue.load maps every file, and findMappedFileByOffset
# picks a file by (offset - first start) / file size, so the offsets after it are read in the wrong file.
_MISPLACED = ("the broker reads the offsets after it in the wrong file (MappedFileQueue.findMappedFileByOffset); "
              "a commit log over several directories is named DIR;DIR")


class Refused(StoreError):
    """A store the broker refuses to load: every reader refuses it the same way (exit 4)."""


class Part(NamedTuple):
    """A commit-log file as a reader lists it: a local path or a URI, its start offset, its length."""

    where: str
    start: int
    length: int


class Skipped(NamedTuple):
    where: str        # the file (a missing one: the name it would have)
    offset: int       # physical offset of the first byte skipped
    bytes: int        # bytes skipped, missing ones included
    records: int      # records among them on disk (a torn one counts)
    why: str


@dataclass(frozen=True)
class Readable:
    """The verdict on a commit log: ``problems`` (where, what the broker does with it) that make readers
    refuse it (none: the broker loads it), the bytes of each file a reader reads (``limits``; a file not named there is left out) and what
    reading it anyway skips."""

    problems: tuple[tuple[str, str], ...] = ()
    limits: dict = field(default_factory=dict)
    skipped: tuple[Skipped, ...] = ()

    def check(self, read_anyway: bool) -> "Readable":
        """Self, or the refusal (one line, naming the first problem) unless ``read_anyway``."""
        if self.problems and not read_anyway:
            where, problem = self.problems[0]
            more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            raise Refused(f"{problem}{more}; {READ_ANYWAY} reads what is readable", path=where)
        return self



def readable(parts: Sequence[Part], file_size: int | None, read: Callable[[str], object]) -> Readable:
    """The rule for the commit-log files ``parts`` of one store (``file_size``: the inferred size of its
    files; ``read(where)``: a file's bytes, read only for a file of the wrong size)."""
    parts = sorted(parts, key=lambda p: p.start)
    if not parts or not file_size:
        return Readable(limits={p.where: p.length for p in parts})
    grid = Counter(p.start % file_size for p in parts).most_common(1)[0][0]
    problems, limits, skipped = [], {}, []
    previous = None
    for i, p in enumerate(parts):
        if p.start % file_size != grid:
            problems.append((p.where, f"named at offset {p.start}, between the starts of {file_size}-byte files: "
                                      f"it overlaps its neighbours: {_MISPLACED}"))
            _, records, torn = _walk(read(p.where), p.length)
            skipped.append(Skipped(p.where, p.start, p.length, records + torn, _OFF_GRID))
            continue
        if previous is not None and p.start > previous + file_size:
            gap = previous + file_size
            problems.append((p.where, f"starts at {p.start}, expected {gap} (missing file): {_MISPLACED}"))
            skipped.append(Skipped(f"{gap:0{C.FILE_NAME_DIGITS}d}", gap, p.start - gap, 0, "missing file(s)"))
        previous = p.start
        if p.length == file_size or (p.length == 0 and i == len(parts) - 1):
            limits[p.where] = p.length
            continue
        problem = f"file is {p.length} bytes, expected {file_size}"
        problems.append((p.where, refusal(problem)))
        end, _, torn = _walk(read(p.where), min(p.length, file_size))
        limits[p.where] = end
        skipped.append(Skipped(p.where, p.start + end, max(p.length, file_size) - end, torn, problem))
    return Readable(tuple(problems), limits, tuple(skipped))


def _walk(buf, length: int) -> tuple[int, int, int]:
    """(end of the last whole record, whole records, torn records: 0 or 1) of the first ``length`` bytes
    of a commit-log or DLedger data file, by record headers (TOTALSIZE, MAGICCODE; a DLedger entry's magic
    and size)."""
    ledger = length >= 8 and struct.unpack_from(">i", buf, 0)[0] in D.VALID_MAGICS
    pos = records = 0
    while length - pos >= 8:
        if ledger:
            magic, size = struct.unpack_from(">ii", buf, pos)
            entry = magic in D.VALID_MAGICS and size > D.HEADER_SIZE
        else:
            size, magic = _HEAD.unpack_from(buf, pos)
            entry = magic in _MESSAGE_MAGICS and size >= _SMALLEST
        if not entry:                   # a BLANK, zeros (the end of the data) or damage (the reader's to report)
            return length, records, 0
        if pos + size > length:
            return pos, records, 1
        pos += size
        records += 1
    torn = any(bytes(buf[pos:length]))
    return (pos if torn else length), records, int(torn)


def unread_spans(skipped: Sequence[Skipped]) -> list[tuple[Skipped, int, int]]:
    """(part, lo, hi): the physical offsets [lo, hi) a read of ``skipped`` leaves unread (a file's bytes past its
    last whole record, a missing file). A file off the grid has none: its offsets are other files'."""
    return [(s, s.offset, s.offset + s.bytes) for s in skipped if s.why != _OFF_GRID]


def is_unread(skipped: Sequence[Skipped], offset: int) -> bool:
    """Whether the physical ``offset`` lies in what a read of ``skipped`` leaves unread (unread_spans)."""
    return any(lo <= offset < hi for _, lo, hi in unread_spans(skipped))


def unread_records_before(skipped: Sequence[Skipped], offset: int) -> int:
    """The most records the parts a read of ``skipped`` leaves unread (unread_spans) can hold before the
    physical ``offset``: each a record of at least MIN_RECORD_SIZE bytes."""
    return sum(-(-(min(hi, offset) - lo) // MIN_RECORD_SIZE) for _, lo, hi in unread_spans(skipped) if lo < offset)


def skipped_line(skipped: Sequence[Skipped], what: str = "") -> str:
    """The closing warning of a read that skipped ``skipped``: how many records and bytes, and where."""
    records, size = sum(s.records for s in skipped), sum(s.bytes for s in skipped)
    where = "; ".join(f"{s.where}: {s.bytes} bytes from offset {s.offset} ({s.why})" for s in skipped)
    return f"partial{what}: skipped {records} record(s) and {size} bytes: {where}"


def commitlog_view(cl, read_anyway: bool):
    """The commit log ``cl`` (a CommitLog) as readers read it, and what that skips: refused (Refused) unless
    ``read_anyway``; then its files cut to their readable length, those off the grid left out. A compaction
    log is not a commit log the broker loads this way: as it is."""
    from rmqtool.store.filequeue import FileQueue, map_file

    if not cl.zero_ends_data:
        return cl, ()
    files = {str(f.path): f for f in cl.queue}
    verdict = readable([Part(w, f.start, f.length) for w, f in files.items()], cl.queue.file_size,
                       lambda w: map_file(files[w].path)).check(read_anyway)
    if not verdict.problems:
        return cl, ()
    kept = [replace(f, limit=verdict.limits[w]) for w, f in files.items() if w in verdict.limits]
    view = type(cl)(FileQueue(kept, cl.queue.file_size))
    view.skipped = verdict.skipped
    return view, verdict.skipped


def open_readable(path, read_anyway: bool):
    """(Store, skipped): the store at ``path`` with its commit log as readers read it (``commitlog_view``)."""
    from rmqtool.store.store import Store

    store = Store.open(path)
    view, skipped = commitlog_view(store.commitlog, read_anyway)
    store.commitlog = view
    return store, skipped
