"""A DLedger commit log on disk (``<root>/dledger-<selfId>/``): ``data/`` files of entries, each wrapping one
commit-log record, ``index/`` files of 32-byte units, and the ``checkpoint`` / ``currterm`` text files.

``DLedgerCommitLog`` is a ``CommitLog``: records are found at the physical offsets the broker reports
(entry position + 48), so every reader of the commit log works on it unchanged. A DLedger BLANK is
yielded as a ``DLedgerBlank`` at its own position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rmqtool.errors import FormatError, StoreError
from rmqtool.format import dledger as D
from rmqtool.format.commitlog import Blank, Message, decode_entry
from rmqtool.store import layout as L
from rmqtool.store.commitlog import CommitLog, Located
from rmqtool.store.filequeue import FileQueue, QueueFile, cut_copy


@dataclass(frozen=True)
class LedgerEntry:
    """One entry as stored, with where it was read (``pos`` = absolute position of its header)."""

    pos: int
    file: QueueFile
    header: D.EntryHeader | None      # None for the BLANK
    blank: D.DLedgerBlank | None = None
    buf: object = field(default=None, repr=False, compare=False)   # the file's mapped bytes


class DLedgerCommitLog(CommitLog):
    entry_header_size = D.HEADER_SIZE
    reader_crosses_holes = False    # readers stop at its first zero entry header, as they always have

    @classmethod
    def open(cls, path: Path, file_size: int | None = None) -> "DLedgerCommitLog":
        return cls(CommitLog.open(path, file_size).queue)

    def read_at(self, offset: int, *, check_crc: bool = False):
        """The record at a physical offset (entry position + 48), or the BLANK at its position."""
        f, pos = self.queue.locate(offset)
        buf = f.read()
        try:
            if D.peek_magic(buf, pos) == D.BLANK_MAGIC:
                return D.decode_blank(buf, pos, f.start)
            return decode_entry(buf, pos, check_crc=check_crc)
        except FormatError as exc:
            exc.offset = offset
            raise exc.at(path=str(f.path)) from None

    def entry_position(self, start: int) -> tuple[QueueFile, int]:
        """(file, position in it) of the entry holding the record at ``start``, the entry at ``start``,
        or the first entry of the file when ``start`` is a file start."""
        f, pos = self.queue.locate(start)
        if pos == 0:
            return f, 0
        buf = f.read()
        if pos >= D.HEADER_SIZE and _entry_at(buf, pos - D.HEADER_SIZE, f.start):
            return f, pos - D.HEADER_SIZE
        if _entry_at(buf, pos, f.start) or (len(buf) - pos >= 4 and D.peek_magic(buf, pos) == D.BLANK_MAGIC):
            return f, pos
        raise StoreError(f"offset {start} is neither a DLedger entry nor the record inside one", path=str(f.path))

    def iter_ledger(self, start: int | None = None) -> Iterator[LedgerEntry]:
        """Entry headers and BLANKs in log order up to the written end (zero bytes or the last file).

        Only framing is checked here (a header that cannot be read, a BLANK that does not reach the end of
        its file); the ledger checks (``rmqtool.ops.dledger``) judge the header values.
        """
        files = self.queue.files
        if files:
            yield from self._ledger_from(*((files[0], 0) if start is None else self.entry_position(start)))

    def _ledger_from(self, first: QueueFile, pos: int) -> Iterator[LedgerEntry]:
        files = self.queue.files
        for f in files[files.index(first):]:
            buf = f.read()
            if f.readable < len(buf):                 # a file cut to what is readable (store.readable)
                buf = memoryview(buf)[:f.readable]
            while len(buf) - pos >= D.MIN_BLANK_LEN:
                magic = D.peek_magic(buf, pos)
                if magic == D.BLANK_MAGIC:
                    try:
                        yield LedgerEntry(f.start + pos, f, None, D.decode_blank(buf, pos, f.start), buf)
                    except FormatError as exc:
                        raise exc.at(path=str(f.path)) from None
                    break
                if magic == 0 and not any(buf[pos:pos + D.MIN_BLANK_LEN]):
                    return
                try:
                    h = D.decode_header(buf, pos)
                except FormatError as exc:
                    exc.offset = f.start + pos
                    raise exc.at(path=str(f.path)) from None
                yield LedgerEntry(f.start + pos, f, h, None, buf)
                if h.size <= 0:
                    return
                pos += h.size
            else:
                if pos < len(buf) and any(buf[pos:]):
                    raise FormatError(f"{len(buf) - pos} stray bytes at the end of the file",
                                      path=str(f.path), offset=f.start + pos)
            pos = 0

    def iter_entries(self, start: int | None = None, *, check_crc: bool = False,
                     include_blank: bool = True, stop_at_damage: bool = False,
                     reader: bool = False) -> Iterator[Located]:
        """Records (at entry position + 48) and BLANKs, as ``CommitLog.iter_entries``; a damaged entry or
        record raises a FormatError at its position, or with ``stop_at_damage`` ends the walk. A zero entry
        header ends the walk for a ``reader`` too (``reader_crosses_holes`` is false)."""
        return self._entries(self.iter_ledger(start), check_crc, include_blank, stop_at_damage)

    def entries_at(self, f: QueueFile, pos: int, *, check_crc: bool = False) -> Iterator[Located]:
        """``iter_entries`` from the entry at position ``pos`` of file ``f``."""
        return self._entries(self._ledger_from(f, pos), check_crc, True, False)

    def _entries(self, ledger: Iterator[LedgerEntry], check_crc: bool, include_blank: bool,
                 stop_at_damage: bool) -> Iterator[Located]:
        try:
            for le in ledger:
                if le.blank is not None:
                    if include_blank:
                        yield Located(le.pos, le.file, le.blank)
                    continue
                try:
                    msg = self._record(le, check_crc)
                except FormatError:
                    if stop_at_damage:
                        return
                    raise
                yield Located(le.pos + D.HEADER_SIZE, le.file, msg)
        except FormatError:
            if not stop_at_damage:
                raise

    def _record(self, le: LedgerEntry, check_crc: bool) -> Message:
        f, buf = le.file, le.buf if le.buf is not None else le.file.read()
        pos = le.pos - f.start
        try:
            D.check_header(le.header, le.pos, len(buf) - pos)
        except FormatError as exc:
            raise exc.at(path=str(f.path)) from None
        try:
            msg = decode_entry(memoryview(buf)[pos + D.HEADER_SIZE:pos + le.header.size], 0, check_crc=check_crc)
        except FormatError as exc:
            exc.offset = le.pos + D.HEADER_SIZE
            raise exc.at(path=str(f.path)) from None
        if isinstance(msg, Blank) or msg.total_size != le.header.body_size:
            raise FormatError(f"DLedger entry body of {le.header.body_size} bytes does not hold one record",
                              path=str(f.path), offset=le.pos + D.HEADER_SIZE)
        return msg

    def read_entry(self, le: LedgerEntry) -> D.DLedgerEntry:
        """The whole entry (header and body bytes)."""
        buf = le.buf if le.buf is not None else le.file.read()
        try:
            entry = D.decode_entry(buf, le.pos - le.file.start, le.file.start)
        except FormatError as exc:
            raise exc.at(path=str(le.file.path)) from None
        assert isinstance(entry, D.DLedgerEntry)
        return entry


def _entry_at(buf, pos: int, file_start: int) -> bool:
    if len(buf) - pos < D.HEADER_SIZE:
        return False
    h = D.decode_header(buf, pos)
    return h.magic in D.VALID_MAGICS and h.pos == file_start + pos


def is_dledger_queue(queue: FileQueue) -> bool:
    """The files are DLedger data files (judged by the first non-empty one)."""
    for f in queue.files:
        if f.length:
            return D.is_dledger_data(f.read()[:D.HEADER_SIZE], f.start)
    return False


def find_dledger_dir(root: Path) -> Path | None:
    """``<root>/dledger-<selfId>`` holding a ``data/`` directory (the first by name)."""
    try:
        dirs = sorted(p for p in root.iterdir() if p.name.startswith("dledger-") and (p / "data").is_dir())
    except OSError:
        return None
    return dirs[0] if dirs else None


class DLedgerFiles:
    """The non-data files of ``dledger-<selfId>/``: index units, checkpoint and currterm."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)

    @property
    def data_dir(self) -> Path:
        return self.dir / L.DLEDGER_DATA

    @property
    def index_dir(self) -> Path:
        return self.dir / L.DLEDGER_INDEX

    @property
    def checkpoint_path(self) -> Path:
        return self.dir / L.DLEDGER_CHECKPOINT

    @property
    def currterm_path(self) -> Path:
        return self.dir / L.DLEDGER_CURRTERM

    def index_queue(self) -> FileQueue:
        d = self.index_dir
        return FileQueue.from_dir(d) if d.is_dir() else FileQueue([])

    def iter_index_units(self, *, skip_short: bool = False) -> Iterator[tuple[int, QueueFile, D.IndexUnit]]:
        """(slot = entry index, file, unit) for every unit up to the first all-zero one. ``skip_short``: a
        file shorter than its siblings (or empty) is passed over, as holding no unit (DLedger's recovery
        rebuilds its units from the data); otherwise it raises FormatError."""
        queue = self.index_queue()
        for f in queue:
            if skip_short and queue.file_size and f.length != queue.file_size:
                continue
            buf = f.read()
            try:
                units = D.decode_index_units(buf)
            except FormatError as exc:
                raise exc.at(path=str(f.path), offset=exc.offset) from None
            first = f.start // D.INDEX_UNIT_SIZE
            for i, unit in enumerate(units):
                if not any(unit):
                    return
                yield first + i, f, unit

    def rewrite_index_units(self, files: dict, units: list[tuple[int, D.IndexUnit]], file_size: int) -> None:
        """Put each (slot, unit) into the new content of its index file (``files``: path -> writable bytes,
        filled in here from the file, or at full size for a short, empty or missing one), as
        DLedgerMmapFileStore.recover rebuilds the index from the data."""
        for slot, unit in units:
            at = slot * D.INDEX_UNIT_SIZE
            path = self.index_dir / f"{at - at % file_size:020d}"
            if path not in files:
                files[path] = cut_copy(path, file_size, file_size) if path.exists() else bytearray(file_size)
            pos = at % file_size
            files[path][pos:pos + D.INDEX_UNIT_SIZE] = D.encode_index_unit(unit)

    def _text(self, name: str) -> str | None:
        for path in (self.dir / name, self.dir / f"{name}.bak"):
            if path.is_file():
                return path.read_text("utf-8")
        return None

    def checkpoint(self) -> D.LedgerCheckpoint | None:
        """``checkpoint`` (or its ``.bak``, as DLedger's IOUtils.file2String falls back); None when absent."""
        text = self._text("checkpoint")
        try:
            return None if text is None else D.decode_ledger_checkpoint(text)
        except FormatError as exc:
            raise exc.at(path=str(self.dir / "checkpoint")) from None

    def currterm(self) -> D.CurrentTerm | None:
        text = self._text("currterm")
        try:
            return None if text is None else D.decode_currterm(text)
        except FormatError as exc:
            raise exc.at(path=str(self.dir / "currterm")) from None


DEFAULT_INDEX_FILE_SIZE = D.INDEX_UNIT_SIZE * 5 * 1024 * 1024     # DLedgerConfig.mappedFileSizeForEntryIndex


class LedgerAppender:
    """Entries appended as DLedgerMmapFileStore.appendAsLeader does: the next index in the current term,
    a BLANK and a new data file when ``size + 8`` bytes do not fit, the index unit at ``index * 32``.
    Bytes go to ``sink(path, position, data, file_size)``, which writes them in place (creating the file
    at ``file_size`` when it is new)."""

    def __init__(self, cl: DLedgerCommitLog, files: DLedgerFiles, *, data_file_size: int,
                 index_file_size: int, end_pos: int, last: D.EntryHeader | None, term: int, sink):
        if data_file_size < 2 * D.HEADER_SIZE or index_file_size <= 0 or index_file_size % D.INDEX_UNIT_SIZE:
            raise StoreError(f"DLedger file sizes {data_file_size} / {index_file_size} are not usable "
                             "(the index file size must be a multiple of 32)", path=str(files.dir))
        self.cl, self.ledger_files = cl, files
        self.data_file_size, self.index_file_size = data_file_size, index_file_size
        self.end_pos = end_pos
        self.next_index = last.index + 1 if last else 0
        self.term = max(term, last.term) if last else term
        self.sink = sink
        self.appended = 0

    def _write(self, directory: Path, at: int, data: bytes, size: int) -> None:
        start = at - at % size
        self.sink(directory / f"{start:020d}", at - start, data, size)

    def append(self, record_size: int, encode_at) -> int:
        """Append one entry whose body is the record ``encode_at(physical_offset)`` (``record_size``
        bytes); returns the record's physical offset (entry position + 48)."""
        size = D.HEADER_SIZE + record_size
        if size + D.MIN_BLANK_LEN > self.data_file_size:
            raise StoreError(f"an entry of {size} bytes does not fit a {self.data_file_size}-byte DLedger data file")
        data_dir = self.ledger_files.data_dir
        pos = self.end_pos % self.data_file_size
        if size + D.MIN_BLANK_LEN > self.data_file_size - pos:       # MmapFileList.preAppend with a BLANK
            self._write(data_dir, self.end_pos, D.encode_blank(D.DLedgerBlank(self.data_file_size - pos)),
                        self.data_file_size)
            self.end_pos += self.data_file_size - pos
        entry_pos = self.end_pos
        body = encode_at(entry_pos + D.HEADER_SIZE)
        if len(body) != record_size:
            raise StoreError(f"record of {len(body)} bytes, {record_size} announced")
        entry = D.DLedgerEntry(self.next_index, self.term, entry_pos, body)
        self._write(data_dir, entry_pos, D.encode_entry(entry), self.data_file_size)
        self._write(self.ledger_files.index_dir, entry.index * D.INDEX_UNIT_SIZE,
                    D.encode_index_unit(D.index_unit_of(entry)), self.index_file_size)
        self.next_index += 1
        self.appended += 1
        self.end_pos = entry_pos + size
        return entry_pos + D.HEADER_SIZE

    def checkpoint_text(self) -> bytes | None:
        """The checkpoint (and its .bak) a clean shutdown leaves after the appends (None: none)."""
        if not self.appended:
            return None
        return D.encode_ledger_checkpoint(D.LedgerCheckpoint(self.next_index - 1, self.next_index - 1)).encode()
