"""The index-file builder: IndexService.buildIndex over ``IndexWriter`` (= IndexFile.putKey, one key or
a column of keys), new files named by the one index-file clock (``index_file_name``), written as they fill
(``StreamedIndexFile``), continued in place (``ContinuedIndexFile``) or, for a dry run, compared with the
store's files instead of written (``ComparedIndexFile``).
"""

from __future__ import annotations

import mmap
import os
import stat
import time
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

from rmqtool import constants as C
from rmqtool.format.indexfile import Geometry, IndexWriter, check_geometry, decode_header
from rmqtool.format.java import index_key_hash
from rmqtool.store.atomic import copy_sparse, named
from rmqtool.store.filequeue import first_nonzero_at, gaps, joined_spans, map_private, page_bytes


class RecordInfo(NamedTuple):
    """What dispatch needs of one record (the writers' single-record path)."""

    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    tags_code: int
    store_timestamp: int
    index_keys: tuple[str, ...]      # UNIQ_KEY then each KEYS element (IndexService.buildIndex order)

    @property
    def gets_cq_unit(self) -> bool:
        """CommitLogDispatcherBuildConsumeQueue: only NOT and COMMIT transaction types."""
        return C.transaction_type(self.sys_flag) in (C.TransactionType.NOT_TYPE, C.TransactionType.COMMIT)

    @property
    def indexed(self) -> bool:
        return C.transaction_type(self.sys_flag) is not C.TransactionType.ROLLBACK


def index_file_name(timestamp_ms: int, after: str | None = None) -> str:
    """UtilAll.timeMillisToHumanString in local time (TZ), made later than ``after`` if needed."""
    lt = time.localtime(timestamp_ms / 1000)
    name = time.strftime("%Y%m%d%H%M%S", lt) + f"{timestamp_ms % 1000:03d}"
    if after is not None and name <= after:
        name = str(int(after) + 1).zfill(len(after))
    return name


class IndexBuilder:
    """IndexService.buildIndex: keys into the last file, a new file (named after the record's store
    time) when it is full. ``full_end_timestamp`` is what the broker puts in the checkpoint's
    indexMsgTimestamp when a file fills up (None if none did). With ``directory``, new files are
    sparse files there, written as they fill (``StreamedIndexFile``: memory stays small whatever the
    geometry)."""

    # keys put as one set of columns: their temporaries (~130 bytes a key) stay small enough for the allocator
    # to reuse their pages from put to put (at 1 << 19, ~70 MB went back to the system after each put and
    # faulted in again: 72,000 page faults and ~0.12 CPU-s per GiB of commit log)
    KEYS_PER_PUT = 1 << 16

    def __init__(self, geometry: Geometry, files: list[tuple[str, IndexWriter]] | None = None,
                 directory: Path | None = None, create: Callable[[str, int], None] | None = None,
                 hand_over: Callable[[], None] | None = None, against: Callable[[int, str], list[Path]] | None = None):
        check_geometry(geometry)
        self.geometry = geometry
        self.files = files or []
        self.directory = directory
        self.against = against           # a dry run: (place, name) -> the existing files each new one is compared with
        self.create = create             # creates a new file (name, size) in ``directory`` (a transaction's)
        self.hand_over = hand_over       # takes a ContinuedIndexFile's changes before it is closed
        self.changed: set[str] = set()
        self.full_end_timestamp: int | None = None

    def _last(self, timestamp: int) -> IndexWriter:
        if self.files and not self.files[-1][1].is_full():
            return self.files[-1][1]
        prev = self.files[-1][1] if self.files else None
        name = index_file_name(timestamp, self.files[-1][0] if self.files else None)
        end_phy, end_ts = (prev.header.end_phy_offset, prev.header.end_timestamp) if prev else (0, 0)
        if self.against is not None:
            w = ComparedIndexFile(self.geometry, self.against(len(self.files), name), end_phy, end_ts)
        elif self.directory is None:
            w = IndexWriter(self.geometry, end_phy, end_ts)
        else:
            if self.create is not None:
                self.create(name, self.geometry.file_size)
            with open(self.directory / name, "r+b" if self.create is not None else "w+b") as fh:
                fh.truncate(self.geometry.file_size)
            w = StreamedIndexFile(self.geometry, self.directory / name, end_phy, end_ts)
        if prev is not None:
            self.full_end_timestamp = prev.header.end_timestamp
            self._release(prev)
        self.files.append((name, w))
        self.changed.add(name)
        return w

    def _release(self, w: IndexWriter) -> None:
        if isinstance(w, ContinuedIndexFile):     # a continued file filled up: its changes go first
            if self.hand_over is not None:
                self.hand_over()
            w.close()
        elif isinstance(w, StreamedIndexFile):
            w.close()

    def close(self) -> None:
        if self.files:
            self._release(self.files[-1][1])

    def add(self, r: RecordInfo) -> None:
        w = self._last(r.store_timestamp)
        if r.offset < w.header.end_phy_offset or not r.indexed:
            return
        for key in r.index_keys:
            if not w.put_key(f"{r.topic}#{key}", r.offset, r.store_timestamp):
                w = self._last(r.store_timestamp)
                w.put_key(f"{r.topic}#{key}", r.offset, r.store_timestamp)
            self.changed.add(self.files[-1][0])

    def add_facts(self, facts) -> None:
        """``add`` for every record of a file's facts (``rmqtool.ops.facts.FileFacts`` with key hashes), a file's
        worth of keys at a time."""
        import numpy as np

        cols, n = facts.columns, len(facts)
        if not n:
            return
        offset, ts = cols["offset"], cols["store_timestamp"]
        w = self._last(int(ts[0]))
        # the keys put: of indexed records not before the last file's end (offsets only grow along the
        # keys, so the files opened later end no earlier), with their records
        counts, put = np.diff(facts.key_offsets), facts.indexed() & (offset >= w.header.end_phy_offset)
        hashes = facts.key_hashes[:int(facts.key_offsets[-1])]
        if put.all():                                   # (a whole rebuild: no selection to make)
            recs = np.repeat(np.arange(n), counts)
        else:
            hashes, recs = hashes[np.repeat(put, counts)], np.repeat(np.flatnonzero(put), counts[put])
        at = 0                   # the next of them to put
        while len(recs):
            take = slice(at, at + min(self.geometry.index_num - w.index_count, self.KEYS_PER_PUT))
            w.put_hashes(hashes[take], offset[recs[take]], ts[recs[take]])
            self.changed.add(self.files[-1][0])
            at = min(take.stop, len(recs))
            if at == len(recs):
                rec = int(recs[-1]) + 1
                if w.is_full() and rec < n:
                    self._last(int(ts[rec]))        # the next record opens the next file, keys or not
                return
            # when full, the next file is opened by the record of the next key, or the record after the last one
            last = int(recs[at - 1])
            w = self._last(int(ts[last if recs[at] == last else last + 1]))


def continue_copies(refs: list, scratch: Path) -> list[tuple[str, IndexWriter]]:
    """The last kept index file, continued in a sparse copy in ``scratch`` (a ``StreamedIndexFile``);
    a full one is only read."""
    out = []
    for ref in refs:
        if ref.header.index_count >= ref.geometry.index_num:
            out.append((ref.name, IndexWriter.from_bytes(map_private(ref.path), ref.geometry)))
            continue
        copy = scratch / ref.name
        copy_sparse(ref.path, copy)
        out.append((ref.name, StreamedIndexFile.resume(ref.geometry, copy)))
    return out


class StreamedIndexFile(IndexWriter):
    """An index file written through its descriptor as it fills: the header and the hash slots (4 bytes
    each: 20 MB at the default geometry) are held here and written by ``close``, the entries appended
    (``os.pwrite``) as they are put. No map: each page of a freshly mapped sparse file costs a fault, a
    zero fill and dirty tracking before it is written. Only pages holding data are written, so the file
    keeps the holes a mapped write leaves (slot pages never set): the same bytes and the same pages of data."""

    FLUSH_BYTES = 1 << 20            # entries gathered before a write

    def __init__(self, geometry: Geometry, path: Path | None, prev_end_phy_offset: int = 0,
                 prev_end_timestamp: int = 0):
        """A new index file at ``path`` (sparse at its full size already; None: ``_write`` is a subclass's)."""
        super().__init__(geometry, prev_end_phy_offset, prev_end_timestamp, buf=bytearray(C.INDEX_HEADER_SIZE))
        self.path = path
        self.slot_buf, self.slot_at = bytearray(C.INDEX_HASH_SLOT_SIZE * geometry.hash_slot_num), 0
        self.fd: int | None = None
        if path is not None:
            with named(path):
                self.fd = os.open(path, os.O_WRONLY)
        self.pending = bytearray()
        self.pending_at = geometry.entry_pos(self.index_count)

    @classmethod
    def resume(cls, geometry: Geometry, path: Path) -> "StreamedIndexFile":
        """Continue the index file at ``path`` after the entries it holds."""
        w = cls(geometry, path)
        with named(path), open(path, "rb") as fh:
            fh.readinto(w.buf)
            fh.readinto(w.slot_buf)
        w.header = decode_header(w.buf)
        w.pending_at = geometry.entry_pos(w.index_count)
        return w

    def _write_entries(self, number: int, data) -> None:
        data = memoryview(data).cast("B")
        if len(data) >= self.FLUSH_BYTES:    # a put's column of entries: written as it is
            self._flush()
            self._write(data, self.pending_at)
            self.pending_at += len(data)
            return
        self.pending += data
        if len(self.pending) >= self.FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        self._write(self.pending, self.pending_at)
        self.pending_at += len(self.pending)
        self.pending = bytearray()

    def _write(self, data, pos: int) -> None:
        view = memoryview(data)
        with named(self.path):
            while view:
                done = os.pwrite(self.fd, view, pos)
                view, pos = view[done:], pos + done

    def close(self) -> None:
        """The pending entries, the header and each page of slots holding a set one, then the file closed."""
        if self.slot_buf is None:
            return
        self._write_held()
        self.abandon()

    def _write_held(self) -> None:
        """Write what is held here: the pending entries, the header, each page of slots holding a set one."""
        import numpy as np

        self._flush()
        self._write(self.buf, 0)
        per_page = mmap.PAGESIZE // C.INDEX_HASH_SLOT_SIZE
        lead = C.INDEX_HEADER_SIZE // C.INDEX_HASH_SLOT_SIZE          # the header's words on page 0
        slots = np.frombuffer(self.slot_buf, np.int32)
        used = np.zeros(-(-(lead + len(slots)) // per_page) * per_page, bool)
        used[:lead] = True                                             # page 0 is written (the header)
        used[lead:lead + len(slots)] = slots != 0
        pages = np.concatenate(([False], used.reshape(-1, per_page).any(axis=1), [False]))
        edges = np.flatnonzero(pages[1:] != pages[:-1]) * per_page - lead     # runs of pages, in slots
        for lo, hi in zip(edges[::2], edges[1::2]):
            lo, hi = max(int(lo), 0) * C.INDEX_HASH_SLOT_SIZE, min(int(hi) * C.INDEX_HASH_SLOT_SIZE, len(self.slot_buf))
            self._write(memoryview(self.slot_buf)[lo:hi], C.INDEX_HEADER_SIZE + lo)

    def abandon(self) -> None:
        """Close the file without writing what is held here (after ``close``, or on a change undone)."""
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.slot_buf, self.pending = None, None, bytearray()


class ComparedIndexFile(StreamedIndexFile):
    """What a ``StreamedIndexFile`` would write, compared with existing files instead (a dry run: nothing is
    written, no scratch space is needed): each write is read back from each of ``against`` at its place.
    After ``close``, ``same_as`` holds those that hold exactly the bytes the new file would (the same size,
    the same bytes where it writes, zeros elsewhere), and ``data`` is the bytes of the pages it would hold
    (``bounds.file_data``'s figure for it on a file system of page-sized blocks)."""

    def __init__(self, geometry: Geometry, against: list[Path], prev_end_phy_offset: int = 0,
                 prev_end_timestamp: int = 0):
        super().__init__(geometry, None, prev_end_phy_offset, prev_end_timestamp)
        self.fds: dict[Path, int] = {}               # the files not found to differ yet
        for path in dict.fromkeys(against):
            with named(path):
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    continue
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_size == geometry.file_size:
                self.fds[path] = fd
            else:
                os.close(fd)
        self.written: list[tuple[int, int]] = []
        self.read_buf = bytearray()
        self.same_as: set[Path] = set()
        self.data = 0

    def _write(self, data, pos: int) -> None:
        view = memoryview(data).cast("B")
        if not len(view):
            return
        self.written.append((pos, pos + len(view)))
        for path, fd in list(self.fds.items()):
            if not self._holds(path, fd, pos, view):
                self._drop(path)

    def _holds(self, path: Path, fd: int, pos: int, view) -> bool:
        """Whether ``path`` holds ``view``'s bytes at ``pos``."""
        got, n = self.read_buf, len(view)
        if len(got) > n:
            del got[n:]
        else:
            got.extend(bytes(n - len(got)))
        with named(path):                  # (a bytearray compares with memcmp; a memoryview byte by byte)
            return os.preadv(fd, [got], pos) == n and got == view

    def _drop(self, path: Path) -> None:
        os.close(self.fds.pop(path))

    def close(self) -> None:
        """Compare what would be written, and that each file holds only zeros elsewhere; then count the pages."""
        if self.slot_buf is None:
            return
        self._write_held()
        end = self.geometry.file_size
        spans = list(joined_spans(sorted(self.written)))
        self.data = page_bytes(spans, end)
        for path, fd in list(self.fds.items()):
            with named(path):
                if all(first_nonzero_at(fd, lo, hi) is None for lo, hi in gaps(spans, end)):
                    self.same_as.add(path)
        self.abandon()

    def abandon(self) -> None:
        for path in list(self.fds):
            self._drop(path)
        super().abandon()


class ContinuedIndexFile(IndexWriter):
    """The last index file continued in place: keys go into a private map of it, and ``changes`` gives the
    ranges that differ from the file (header, the hash slots set, the new entries) for the transaction."""

    @classmethod
    def open(cls, ref) -> "ContinuedIndexFile":
        w = cls.from_bytes(map_private(ref.path), ref.geometry)
        w.path = ref.path
        w.written = w.index_count                # entries up to here are on disk
        w.slots_set = set()                      # slots set since then
        return w

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        if not super().put_key(key, phy_offset, store_timestamp):
            return False
        self.slots_set.add(index_key_hash(key) % self.geometry.hash_slot_num)
        return True

    def put_hashes(self, key_hash, phy_offset, store_timestamp) -> None:
        super().put_hashes(key_hash, phy_offset, store_timestamp)
        self.slots_set.update((key_hash % self.geometry.hash_slot_num).tolist())

    def changes(self) -> Iterator[tuple[int, bytes]]:
        g = self.geometry
        if self.index_count == self.written:
            return
        yield 0, bytes(self.buf[:C.INDEX_HEADER_SIZE])
        slots = sorted(self.slots_set)
        start = 0
        for i in range(1, len(slots) + 1):             # runs of adjacent slots, one range each
            if i == len(slots) or slots[i] != slots[i - 1] + 1:
                lo, hi = g.slot_pos(slots[start]), g.slot_pos(slots[i - 1] + 1)
                yield lo, bytes(self.buf[lo:hi])
                start = i
        lo, hi = g.entry_pos(self.written), g.entry_pos(self.index_count)
        yield lo, bytes(self.buf[lo:hi])
        self.written, self.slots_set = self.index_count, set()

    def forget(self) -> None:
        """Drop the private copies of pages now written to the file (they read back from it)."""
        if hasattr(self.buf, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self.buf.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        if isinstance(self.buf, mmap.mmap) and not self.buf.closed:
            self.buf.close()
