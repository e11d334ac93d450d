"""The consume-queue and batch-consume-queue writers, as the broker's dispatch writes those files.

``CqWriter`` is ConsumeQueue.putMessagePositionInfo (duplicate/repeat rules, fillPreBlank, full-size
files) with recover / truncateDirtyLogicFiles, over files held in memory (repair); ``CqFileWriter``
streams a queue's units to sparse files or appends them in place (``FileStream``); ``BcqFileWriter`` is
BatchConsumeQueue.putBatchMessagePositionInfo, streamed the same ways. In place, bytes go through a
``Sink`` (put/import's transaction): ``create(name, size)`` and ``write_at(name, offset, data)``; a dry
run's ``ComparedQueue`` is a sink that writes nothing and compares each file with the store's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rmqtool import constants as C
from rmqtool.errors import EncodeError, StoreError, UnsafeWrite
from rmqtool.format.batchcq import BatchCqUnit
from rmqtool.format.consumequeue import FILLER_UNIT, UNIT, valid_prefix
from rmqtool.store.atomic import named
from rmqtool.store.broker_model import (MIN_RECORD_SIZE, expect_logic_offset, first_file_start, possible_queue_offset,
                                         stale_tail)
from rmqtool.store.filequeue import (first_difference, first_nonzero, first_nonzero_at, gaps, joined_spans,
                                     open_random, page_bytes)
from rmqtool.store.store import BatchConsumeQueue, ConsumeQueue

if TYPE_CHECKING:
    import numpy as np


UNIT_DTYPE = [("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")]     # a consume-queue unit, as a numpy dtype


class Sink(Protocol):
    """Where a queue's bytes go when they are written in place (names are the queue's file names)."""

    def create(self, name: str, size: int) -> None: ...

    def write_at(self, name: str, offset: int, data: bytes) -> None: ...

_FORBIDDEN = set('/\\\x00')


def safe_topic_dir(topic: str, offset: int | None = None) -> str:
    """A topic usable as a consume-queue directory name; anything that could leave the store is refused."""
    if not topic or topic in (".", "..") or _FORBIDDEN & set(topic) or len(topic.encode("utf-8")) > 255:
        raise EncodeError(f"topic {topic!r} cannot be a consume-queue directory name "
                          "(empty, '.', '..', or contains '/', '\\\\' or NUL)", offset=offset)
    return topic



class Misplaced(Exception):
    """A queue run a worker process wrote is not where one process puts it (rebuild's dispatch_files: the
    files are then not the rebuild's; it starts again in one process)."""


class CqWriter:
    """One consume queue in memory: full-size files keyed by start offset, a write position and
    maxPhysicOffset, changed as ConsumeQueue.putMessagePositionInfo / recover / truncate would."""

    fill_gaps = False        # True: a unit goes at its queue offset, blank units before it, unless that offset
    #                          is damage (``_settle``; beyond the broker)

    def __init__(self, file_size: int, files: dict[int, bytearray] | None = None):
        if file_size <= 0 or file_size % C.CQ_STORE_UNIT_SIZE:
            raise StoreError(f"consume-queue file size {file_size} is not a positive multiple of 20")
        self.file_size = file_size
        self.files: dict[int, bytearray] = files or {}
        self.write_pos = min(self.files) if self.files else 0
        self.max_phy = -1
        self.first_created: int | None = None
        self.held: tuple[int, int, int, int] | None = None   # fill_gaps: a unit placed when the next one shows
        self.tentative: int | None = None     # the queue offset the next unit must have (CqFileWriter.placed)
        # rule reput_misplaced: (phy, stored queue offset, placed at (None: skipped), first of its queue)
        self.misplaced: list[tuple[int, int, int | None, bool]] = []
        # fill_gaps: how many records before a commit-log offset the dispatch skipped (damaged, salvaged): the
        # most units a queue's last unit may leave blank before it (``_settle``)
        self.skipped_before = lambda phy: 0

    @classmethod
    def load(cls, cq: ConsumeQueue, file_size: int) -> "CqWriter":
        """Existing files, then ConsumeQueue.recover: keep units up to the first invalid one
        (scanning from the third-last file), drop later files and zero the rest."""
        files = {}
        for f in cq.queue:
            data = bytes(f.read())
            whole = min(len(data) - len(data) % C.CQ_STORE_UNIT_SIZE, file_size)
            files[f.start] = bytearray(data[:whole] + bytes(file_size - whole))   # whole units, full size
        try:
            w = cls(file_size, files)
        except StoreError as exc:
            raise exc.at(path=str(cq.queue.files[0].path.parent) if cq.queue.files else None) from None
        starts = sorted(files)
        if not starts:
            return w
        i = max(0, len(starts) - 3)
        pos = 0
        while True:
            buf = files[starts[i]]
            pos = 0
            for phy, size, _ in UNIT.iter_unpack(buf):
                if not (phy >= 0 and size > 0):
                    break
                pos += C.CQ_STORE_UNIT_SIZE
                w.max_phy = phy + size
            if pos == file_size and i + 1 < len(starts):
                i += 1
                continue
            break
        w._truncate_at(starts[i] + pos)
        return w

    def _truncate_at(self, logical: int) -> None:
        """MappedFileQueue.truncateDirtyFiles, plus zeroing what it leaves behind."""
        for start in sorted(self.files):
            if start + self.file_size > logical:
                if logical >= start:
                    buf = self.files[start]
                    buf[logical - start:] = bytes(self.file_size - (logical - start))
                else:
                    del self.files[start]
        self.write_pos = logical

    def put_many(self, phy: np.ndarray, size: np.ndarray, tags: np.ndarray, queue_offset: np.ndarray,
                 units: np.ndarray | None = None, unbroken: bool | None = None) -> None:
        """``put`` for each record in order; a run continuing the queue goes in as whole blocks. A caller
        that has them gives the encoded ``units`` (UNIT_DTYPE) and whether the queue offsets step by one
        and the ends (phy + size) rise (``unbroken``)."""
        import numpy as np

        i = 0
        while i < len(phy) and (not self.files or self.held is not None or self.tentative is not None):
            self.put(int(phy[i]), int(size[i]), int(tags[i]), int(queue_offset[i]))
            i += 1
        if i:
            phy, size, tags, queue_offset = phy[i:], size[i:], tags[i:], queue_offset[i:]
            units = units[i:] if units is not None else None
        n = len(phy)
        if unbroken is None:
            unbroken = bool((np.diff(queue_offset) == 1).all() and (np.diff(phy + size) > 0).all())
        if n and self.files and phy[0] + size[0] > self.max_phy \
                and queue_offset[0] * C.CQ_STORE_UNIT_SIZE == self.write_pos and unbroken:
            if units is None:
                units = np.empty(n, UNIT_DTYPE)
                units["phy"], units["size"], units["tags"] = phy, size, tags
            data = units.tobytes()
            while data:
                last = max(self.files)
                if self.write_pos >= last + self.file_size:
                    last += self.file_size
                    self._new_file(last)
                room = last + self.file_size - self.write_pos
                self._append(last, data[:room])
                data = data[room:]
            self.max_phy = int(phy[-1] + size[-1])
            return
        for i in range(n):
            self.put(int(phy[i]), int(size[i]), int(tags[i]), int(queue_offset[i]))

    def _new_file(self, start: int) -> None:
        self.files[start] = bytearray(self.file_size)
        self.write_pos = start

    def put(self, phy: int, size: int, tags_code: int, queue_offset: int) -> None:
        if phy + size <= self.max_phy:
            return                                     # "build consume queue repeatedly"
        if self.tentative is not None:
            if queue_offset != self.tentative:
                raise Misplaced                        # a worker placed the unit before this one by its offset
            self.tentative = None
        if not self.fill_gaps:
            self._put(phy, size, tags_code, queue_offset)
            return
        held, self.held = self.held, None
        if held is not None:
            self._settle(held, queue_offset)
        if self.files and queue_offset * C.CQ_STORE_UNIT_SIZE == self.write_pos:
            self._put(phy, size, tags_code, queue_offset)
        else:               # a queue's first unit, or one off its queue's end: placed once the next one shows
            self.held = (phy, size, tags_code, queue_offset)

    def finish(self) -> None:
        """The end of a dispatch (``fill_gaps``): a held unit is placed."""
        if self.held is not None:
            held, self.held = self.held, None
            self._settle(held, None)

    def _settle(self, held: tuple[int, int, int, int], next_offset: int | None) -> None:
        """Place a held unit (``fill_gaps``; rule reput_misplaced): at its queue offset when the queue's next unit
        follows it (``next_offset``) or, for the last unit, when the offset is possible for its record
        (broker_model.possible_queue_offset) and its gap no wider than the records skipped before it
        (``skipped_before``) -- blank units fill a gap before it (skipped damaged records); otherwise it is
        misplaced: it goes at its queue's end (where the broker appends it), or in an empty queue just
        before the next unit (at 0 without one), and is named in ``misplaced``."""
        phy, size, tags, q = held
        end = self.write_pos // C.CQ_STORE_UNIT_SIZE if self.files else None
        if next_offset is not None:
            trusted = q + 1 == next_offset or end is None and q < next_offset   # a queue's first: records
            #                                                   between it and the next were skipped (or cut)
        else:             # the last unit: nothing confirms a gap but the records skipped before it
            trusted = end is None or q <= end or q - end <= self.skipped_before(phy)
        trusted = trusted and possible_queue_offset(phy, q)
        if trusted and end is not None and q < end:
            self.misplaced.append((phy, q, None, False))      # below the end: skipped, as the broker does
            return
        if not trusted:
            at = end if end is not None else max(0, min(next_offset or 0, phy // MIN_RECORD_SIZE + 1) - 1)
            self.misplaced.append((phy, q, at, end is None))
            q = at
        if end is not None:
            self._fill_to(q * C.CQ_STORE_UNIT_SIZE)
        self._put(phy, size, tags, q)

    def _put(self, phy: int, size: int, tags_code: int, queue_offset: int) -> None:
        """ConsumeQueue.putMessagePositionInfo after its repeat check (rule reput_misplaced)."""
        expect = expect_logic_offset(queue_offset)
        last = max(self.files) if self.files else None
        if last is None:
            last = first_file_start(expect, self.file_size)
            if last < 0:
                raise UnsafeWrite(f"queue offset {queue_offset} of the record at {phy} makes the broker create a "
                                  f"consume-queue file at {last}, which no file name holds: not reproduced")
            self._new_file(last)
            self.first_created = last
        elif self.write_pos >= last + self.file_size:
            last += self.file_size
            self._new_file(last)
        if last == self.first_created and queue_offset != 0 and self.write_pos == last:
            filler = UNIT.pack(*FILLER_UNIT)
            while self.write_pos < last + expect - first_file_start(expect, self.file_size):   # fillPreBlank
                self._append(last, filler)
        if queue_offset != 0 and expect != self.write_pos:
            if expect < self.write_pos:
                if not self.fill_gaps:
                    self.misplaced.append((phy, queue_offset, None, False))
                return                                 # repeated
            if not self.fill_gaps:
                self.misplaced.append((phy, queue_offset, self.write_pos // C.CQ_STORE_UNIT_SIZE, False))
        self.max_phy = phy + size
        self._append(last, UNIT.pack(phy, size, tags_code))

    def _fill_to(self, expect: int) -> None:
        filler = UNIT.pack(*FILLER_UNIT)
        while self.write_pos < expect:
            last = max(self.files)
            if self.write_pos >= last + self.file_size:
                last += self.file_size
                self._new_file(last)
            self._append(last, filler)

    def _append(self, start: int, units: bytes) -> None:
        pos = self.write_pos - start
        self.files[start][pos:pos + len(units)] = units
        self.write_pos += len(units)

    def truncate_dirty(self, phy_offset: int) -> None:
        """ConsumeQueue.truncateDirtyLogicFiles: drop units whose record starts at or after phy_offset."""
        while self.files:
            last = max(self.files)
            buf = self.files[last]
            first_phy = UNIT.unpack_from(buf, 0)[0]
            if first_phy >= phy_offset:
                del self.files[last]
                self.write_pos = last
                continue
            pos = C.CQ_STORE_UNIT_SIZE
            while pos < self.file_size:
                phy, size, _ = UNIT.unpack_from(buf, pos)
                if not (phy >= 0 and size > 0) or phy >= phy_offset:
                    break
                pos += C.CQ_STORE_UNIT_SIZE
            buf[pos:] = bytes(self.file_size - pos)
            self.write_pos = last + pos
            return

    def file_bytes(self) -> dict[int, bytes]:
        return {start: bytes(buf) for start, buf in sorted(self.files.items())}


class FileStream:
    """Bytes appended to a queue's files under ``directory`` (None: only counted), one small buffer in
    memory. Files are created sparse at full size, as the broker's pre-allocated files are."""

    FLUSH_BYTES = 16 * 1024

    def __init__(self, file_size: int, directory: Path | None, sink: Sink | None = None):
        self.file_size, self.directory, self.sink = file_size, directory, sink
        self.start = self.pos = 0              # the current file and the write position (queue bytes)
        self.pending = bytearray()
        self.created = 0
        self.opened = False                    # an existing file continued (``at``)
        self._path: tuple[int, str] = (-1, "")  # (start, path) of the file flush writes last

    def at(self, start: int, pos: int) -> None:
        """Continue an existing queue: the current file starts at ``start``, writing goes on at ``pos``."""
        self.start, self.pos, self.opened = start, pos, True

    def new_file(self, start: int, made: bool = False) -> None:
        """Go on in a new file at ``start``; ``made``: another process created it (``write_run``)."""
        self.flush()
        self.start = self.pos = start
        self.created += 1
        if self.sink is not None:
            self.sink.create(C.offset_to_file_name(start), self.file_size)
        elif self.directory is not None and not made:
            os.close(_open_sized(self.directory, start, self.file_size))

    def write(self, data: bytes) -> None:
        """Append at the write position, inside the current file."""
        self.pending += data
        if len(self.pending) >= self.FLUSH_BYTES:
            self.flush()

    def skip_to(self, pos: int, files: int) -> None:
        """Go on at ``pos``, the bytes before it written by another process (``write_run``) into the files
        it created, ``files`` of them new to this stream."""
        self.flush()
        self.start, self.pos = pos - 1 - (pos - 1) % self.file_size, pos
        self.created += files

    def flush(self) -> None:
        if self.pending and self.sink is not None:
            self.sink.write_at(C.offset_to_file_name(self.start), self.pos - self.start, bytes(self.pending))
        elif self.pending and self.directory is not None and (self.created or self.opened):
            if self._path[0] != self.start:
                self._path = (self.start, os.path.join(self.directory, C.offset_to_file_name(self.start)))
            fd = os.open(self._path[1], os.O_WRONLY)
            try:
                data, at = memoryview(self.pending), self.pos - self.start
                with named(self._path[1]):
                    while data:
                        n = os.pwrite(fd, data, at)
                        data, at = data[n:], at + n
            finally:
                os.close(fd)
        self.pos += len(self.pending)
        self.pending = bytearray()


def _open_sized(directory: Path, start: int, file_size: int) -> int:
    """The queue file starting at ``start``, opened for writing; created sparse at full size where missing,
    never truncated (worker processes write other units of the same files)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / C.offset_to_file_name(start)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        with named(path):
            if os.fstat(fd).st_size < file_size:
                os.ftruncate(fd, file_size)
    except BaseException:
        os.close(fd)
        raise
    return fd


class OpenQueueFiles(dict):
    """Queue files kept open by a worker process of a rebuild (path -> descriptor) from one commit-log
    file's runs to the next: each file's run of a queue goes into the same queue file, and an open costs
    more than the write (~2,000 queues a commit-log file). Up to ``limit`` are kept (half the process's
    descriptor limit, at most 8,192); the others are opened for each run. The process's end closes them
    (a rebuild's workers end with its walk)."""

    def __init__(self):
        super().__init__()
        try:
            import resource
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            self.limit = 8192 if soft == resource.RLIM_INFINITY else min(soft // 2, 8192)
        except (ImportError, ValueError, OSError):
            self.limit = 0


def write_run(directory: Path, file_size: int, queue_offset: int, units: np.ndarray,
              kept: OpenQueueFiles | None = None) -> None:
    """Encoded consume-queue units (UNIT_DTYPE) written at their place, queue offset × 20 on, into the
    queue's files under ``directory``: a worker process's share of a rebuild (``CqFileWriter.placed``);
    ``kept``: its queue files held open."""
    data, at = memoryview(units).cast("B"), queue_offset * C.CQ_STORE_UNIT_SIZE
    while data:
        start = at - at % file_size
        path = os.path.join(directory, C.offset_to_file_name(start))
        fd = kept.get(path) if kept is not None else None
        if fd is None:
            try:                             # made by an earlier run (of this process or another): one call
                fd = os.open(path, os.O_WRONLY)
            except FileNotFoundError:
                fd = _open_sized(directory, start, file_size)
        try:
            chunk = data[:start + file_size - at]
            data = data[len(chunk):]
            with named(path):
                while chunk:
                    n = os.pwrite(fd, chunk, at - start)
                    chunk, at = chunk[n:], at + n
        finally:
            if kept is not None and (path in kept or len(kept) < kept.limit):
                kept[path] = fd
            else:
                os.close(fd)


def compare_run(directory: Path, file_size: int, queue_offset: int, units: np.ndarray) -> list[tuple[int, ...]]:
    """``write_run`` for a dry run: the run's bytes compared with the store's queue files under ``directory``,
    nothing written. For each file the run falls in: (its start, the place in it, the bytes' length, then
    what ``ComparedQueueFile.take`` records of them: the first that differs from the store's and the end of
    the last nonzero one, -1 for none)."""
    data, at, parts = memoryview(units).cast("B"), queue_offset * C.CQ_STORE_UNIT_SIZE, []
    while data:
        start = at - at % file_size
        mine = bytes(data[:start + file_size - at])         # (bytes compare with memcmp, a memoryview by byte)
        data = data[len(mine):]
        differs = _differs_at(os.path.join(directory, C.offset_to_file_name(start)), at - start, mine)
        nonzero_end = _nonzero_end(at - start, mine)
        parts.append((start, at - start, len(mine), -1 if differs is None else differs,
                      -1 if nonzero_end is None else nonzero_end))
        at += len(mine)
    return parts


def _differs_at(path: str | Path, pos: int, mine: bytes) -> int | None:
    """The first byte of ``mine``, to be written at ``pos`` of the file at ``path``, that differs from the
    file's there (a missing file's: from zeros); None: none."""
    try:
        with named(path):
            fd = os.open(path, os.O_RDONLY)               # (sequential reads: read-ahead welcome)
            try:
                theirs = os.pread(fd, len(mine), pos)
            finally:
                os.close(fd)
    except (FileNotFoundError, IsADirectoryError):
        theirs = b""
    at = first_difference(theirs, mine) if theirs != mine else None
    return None if at is None else pos + at


def _nonzero_end(pos: int, mine: bytes) -> int | None:
    """The end of the last nonzero byte of ``mine`` written at ``pos`` (None: none)."""
    kept = len(mine.rstrip(b"\0"))
    return pos + kept if kept else None


class CqFileWriter(CqWriter):
    """A CqWriter for a new queue whose units stream into files (``FileStream``): memory is one small
    buffer, whatever the queue's size."""

    def __init__(self, file_size: int, directory: Path | None, sink: Sink | None = None):
        super().__init__(file_size)
        self.stream = FileStream(file_size, directory, sink)

    @classmethod
    def append_to(cls, cq: ConsumeQueue | None, file_size: int, sink: Sink) -> "CqFileWriter":
        """Appends to an existing queue in place, from where ConsumeQueue.recover puts its end: the
        first unit that is not valid (phy >= 0, size > 0), scanning from the third-last file. A queue
        with data after that end is refused (repair truncates it first)."""
        w = cls(file_size, None, sink)
        files = [f for f in cq.queue] if cq is not None else []
        if not files:
            return w
        i = max(0, len(files) - 3)
        while True:
            f = files[i]
            buf = f.read()
            valid, end = valid_prefix(buf)
            if valid:
                w.max_phy = end
            pos = valid * C.CQ_STORE_UNIT_SIZE
            if pos == file_size and i + 1 < len(files):
                i += 1
                continue
            break
        if i + 1 < len(files) or first_nonzero(f.path, pos) is not None:
            raise UnsafeWrite("the consume queue has data after its last valid unit; run repair first",
                              path=str(f.path))
        w.files = {f.start: bytearray()}
        w.write_pos = f.start + pos
        w.stream.at(f.start, w.write_pos)
        return w

    @property
    def created(self) -> int:
        return self.stream.created

    def placed(self, queue_offset: int, count: int, first_end: int, last_end: int) -> bool:
        """Take ``count`` units another process wrote at their place (``write_run``), a run whose queue
        offsets step by one from ``queue_offset`` and whose ends (phy + size) rise from ``first_end`` to
        ``last_end``, where ``put_many`` writes the same bytes: the queue's first units (fillPreBlank
        before them), or a run going on at the write position (with ``fill_gaps``: or after it, blank
        units between). Otherwise (``put_many`` would drop or move units) False, nothing changed."""
        at = queue_offset * C.CQ_STORE_UNIT_SIZE
        if first_end <= self.max_phy or self.tentative not in (None, queue_offset):
            return False
        self.tentative = None
        if self.held is not None:
            held, self.held = self.held, None
            self._settle(held, queue_offset)
        unconfirmed = count == 1 and self.fill_gaps and at != self.write_pos
        if not self.files:                                  # put: the first file, fillPreBlank
            self.first_created = at - at % self.file_size
            self._new_file(self.first_created, made=True)
        elif at < self.write_pos or (at > self.write_pos and not self.fill_gaps):
            return False
        self._fill_to(at)
        if unconfirmed:            # a first unit or one after a gap, alone: right if the queue's next unit follows
            self.tentative = queue_offset + 1
        end = at + count * C.CQ_STORE_UNIT_SIZE
        last = (end - 1) // self.file_size * self.file_size
        self.stream.skip_to(end, (last - max(self.files)) // self.file_size)
        self.files = {last: bytearray()}
        self.write_pos, self.max_phy = end, last_end
        return True

    def _new_file(self, start: int, made: bool = False) -> None:
        self.stream.new_file(start, made)
        self.files = {start: bytearray()}       # the current file's start only; bytes live on disk
        self.write_pos = start

    def _append(self, start: int, units: bytes) -> None:
        self.stream.write(units)
        self.write_pos += len(units)

    def flush(self) -> None:
        """The queue's last bytes to its files (the end of a rebuild: a held unit is placed)."""
        if self.held is not None:
            held, self.held = self.held, None
            self._settle(held, None)
        self.stream.flush()


BCQ_UNIT = [("phy", ">i8"), ("size", ">i4"), ("tags", ">i8"), ("store_time", ">i8"), ("base", ">i8"),
            ("batch_size", ">i2"), ("compacted", ">i4"), ("reserved", ">i4")]      # a numpy dtype's fields


class BcqFileWriter:
    """BatchConsumeQueue.putBatchMessagePositionInfo for a new queue, streamed: units from queue position
    0, a unit starting at or before the last one's physical offset dropped as a repeat."""

    def __init__(self, file_size: int, directory: Path | None, sink: Sink | None = None):
        if file_size <= 0 or file_size % C.BCQ_STORE_UNIT_SIZE:
            raise StoreError(f"batch consume-queue file size {file_size} is not a positive multiple of 46")
        self.stream = FileStream(file_size, directory, sink)
        self.last_phy = -1
        self.units = 0                    # the slot (byte position / 46) the next unit goes to
        self.next_offset = 0              # the queue offset of the next message (the end of the last unit)

    @classmethod
    def append_to(cls, bcq: BatchConsumeQueue | None, file_size: int, sink: Sink) -> "BcqFileWriter":
        """Appends to an existing batch queue in place, after its last valid unit."""
        w = cls(file_size, None, sink)
        last = None
        for last in (bcq.iter_units() if bcq is not None else ()):
            pass
        if last is None:
            if bcq is not None and bcq.queue.files:        # files without a valid unit: continue the first
                f = bcq.queue.files[0]
                w.units = f.start // C.BCQ_STORE_UNIT_SIZE
                w.stream.at(f.start, f.start)
            return w
        f, pos, unit = last
        w.units = (f.start + pos) // C.BCQ_STORE_UNIT_SIZE + 1
        w.last_phy, w.next_offset = unit.physical_offset, unit.next_offset
        w.stream.at(f.start, w.units * C.BCQ_STORE_UNIT_SIZE)
        return w

    def put(self, unit: BatchCqUnit) -> None:
        """One unit (a message or batch of ``unit.batch_size``): dropped as a repeat unless it starts after
        the last one's physical offset."""
        import numpy as np

        one = lambda v: np.array([v], np.int64)   # noqa: E731
        self.put_many(one(unit.physical_offset), one(unit.size), one(unit.tags_code), one(unit.store_time),
                      one(unit.msg_base_offset), one(unit.batch_size))

    @property
    def created(self) -> int:
        return self.stream.created

    @property
    def write_pos(self) -> int:
        return self.units * C.CQ_STORE_UNIT_SIZE      # counted like consume-queue units in results

    def put_many(self, phy, size, tags, store_time, base, batch_size) -> None:
        import numpy as np

        keep = phy > np.maximum.accumulate(np.concatenate([[self.last_phy], phy[:-1]]))
        units = np.zeros(int(keep.sum()), BCQ_UNIT)
        for name, col in (("phy", phy), ("size", size), ("tags", tags), ("store_time", store_time),
                          ("base", base), ("batch_size", batch_size)):
            units[name] = col[keep]
        units["compacted"] = C.BCQ_INVALID_POS
        if len(units):
            last = units[-1]
            self.next_offset = max(self.next_offset, int(last["base"]) + int(last["batch_size"]))
        data = units.tobytes()
        fs = self.stream
        while data:
            if fs.pos + len(fs.pending) == fs.start + fs.file_size or not (fs.created or fs.opened):
                fs.new_file(self.units * C.BCQ_STORE_UNIT_SIZE)
            room = fs.start + fs.file_size - fs.pos - len(fs.pending)
            fs.write(data[:room])
            self.units += len(data[:room]) // C.BCQ_STORE_UNIT_SIZE
            data = data[room:]
        if len(phy):
            self.last_phy = max(self.last_phy, int(phy.max()))

    def flush(self) -> None:
        self.stream.flush()


class ComparedQueue:
    """A ``Sink`` for a dry run's rebuild of one queue whose directory in the store is ``theirs``: nothing is
    written; each file's writes are compared with the store's file of the same name as they come
    (``ComparedQueueFile``)."""

    def __init__(self, theirs: Path):
        self.theirs = theirs
        self.files: dict[str, ComparedQueueFile] = {}

    def create(self, name: str, size: int) -> None:
        self.files[name] = ComparedQueueFile(self.theirs / name, size)

    def write_at(self, name: str, offset: int, data: bytes) -> None:
        self.files[name].write(offset, data)

    def took(self, name: str, size: int, pos: int, n: int, differs_at: int | None, nonzero_end: int | None) -> None:
        """Bytes another process compared (``compare_run``), in their place in the order of the writes."""
        if name not in self.files:
            self.create(name, size)
        self.files[name].take(pos, n, differs_at, nonzero_end)


class ComparedQueueFile:
    """A queue file a rebuild would write (sparse, ``size`` bytes, written in order by its ``FileStream``),
    compared with the store's file at ``path`` as it is written: where the two first differ, and where the
    rebuilt file's last nonzero byte ends, are all ``same`` needs; ``data`` is the bytes of the pages it
    would hold (``bounds.file_data``'s figure for it)."""

    def __init__(self, path: Path, size: int):
        self.path, self.size = path, size
        self.spans: list[tuple[int, int]] = []         # written, in order
        self.differs_at: int | None = None             # the first byte written that differs from the store's
        self.nonzero_end = 0
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        self.stored = st is not None and stat.S_ISREG(st.st_mode) and st.st_size == size
        if not self.stored:
            self.differs_at = 0

    @property
    def data(self) -> int:
        return page_bytes(self.spans, self.size)

    def write(self, pos: int, data: bytes) -> None:
        self.take(pos, len(data), _differs_at(self.path, pos, data) if self.differs_at is None else None,
                  _nonzero_end(pos, data))

    def take(self, pos: int, n: int, differs_at: int | None, nonzero_end: int | None) -> None:
        """``n`` bytes at ``pos`` compared: the first of them that differs from the store's file, the end of
        their last nonzero byte (None: none)."""
        if self.spans and pos < self.spans[-1][1]:
            raise RuntimeError(f"{self.path}: a queue file's bytes compared out of order")
        self.spans.append((pos, pos + n))
        if nonzero_end is not None:
            self.nonzero_end = nonzero_end
        if self.differs_at is None:
            self.differs_at = differs_at

    def same(self, stale_end: int | None = None) -> bool:
        """Whether the store's file holds the rebuilt bytes: byte for byte, or (``stale_end``, a classic queue's)
        but for the units a broker's load drops past the commit log's end (broker_model.stale_units_only)."""
        if not self.stored:
            return False
        first = self.differs_at
        with named(self.path):
            fd = open_random(self.path)
            try:
                for lo, hi in gaps(list(joined_spans(self.spans)), first if first is not None else self.size):
                    at = first_nonzero_at(fd, lo, hi)              # where the rebuilt file holds zeros
                    if at is not None:
                        first = at
                        break
                if first is None:
                    return True
                if stale_end is None:
                    return False
                stop = stale_tail(os.pread(fd, self.size, 0), stale_end)
            finally:
                os.close(fd)
        return stop is not None and first >= stop and self.nonzero_end <= stop

