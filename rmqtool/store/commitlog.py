"""The commit log on disk: a file queue of records. Maps physical offsets to (file, position), walks
entries across files, and finds the end of written data (a zero header or a pre-allocated zero file).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rmqtool import constants as C
from rmqtool.errors import FormatError, StoreError
from rmqtool.format.commitlog import Blank, Entry, Message, decode_entry, peek_header
from rmqtool.store.broker_model import recovered_tail, step_over
from rmqtool.store.filequeue import FileQueue, QueueFile, is_offset_name, release_pages

_RELEASE_BYTES = 16 << 20


@dataclass(frozen=True)
class Located:
    """An entry with where it was read: its real physical offset and file."""

    offset: int
    file: QueueFile
    entry: Entry


class CommitLog:
    entry_header_size = 0     # bytes in front of each record (DLedger: its entry header)
    zero_ends_data = True     # a zero header ends the data (a compaction log goes on in its next file)
    # Readers read each file to its own end of data: a zero header where a later file holds records is a hole,
    # which the broker serves the later files past unless its recovery reaches it (CommitLog.recoverNormally
    # begins at the third file from the end; verify's data_after_end says what a start costs)
    reader_crosses_holes = True
    skipped: tuple = ()       # what this view of a refused commit log leaves out (store.readable.commitlog_view)

    def __init__(self, queue: FileQueue):
        self.queue = queue

    @classmethod
    def open(cls, path: Path, file_size: int | None = None) -> "CommitLog":
        """A commit-log directory, or one commit-log file (its name gives its start offset, else 0)."""
        path = Path(path)
        if path.is_file():
            start = int(path.name) if is_offset_name(path.name) else 0
            files = [QueueFile(path, start, path.stat().st_size)]
            return cls(FileQueue(files, file_size))
        if not path.exists():
            raise StoreError("no such file or directory", path=str(path))
        return cls(FileQueue.from_dir(path, file_size))

    @property
    def file_size(self) -> int | None:
        return self.queue.file_size

    @property
    def min_offset(self) -> int:
        return self.queue.min_offset

    def read_at(self, offset: int, *, check_crc: bool = False) -> Entry:
        """Decode the entry at a physical offset (which must be a record boundary)."""
        f, pos = self.queue.locate(offset)
        if pos >= f.readable and f.limit is not None:
            raise StoreError(f"offset {offset} lies in the part of the file not read (past its last whole "
                             "record)", path=str(f.path))
        buf = f.read()
        try:
            return decode_entry(buf, pos, check_crc=check_crc)
        except FormatError as exc:
            exc.offset = offset
            raise exc.at(path=str(f.path)) from None

    def iter_entries(self, start: int | None = None, *, check_crc: bool = False,
                     include_blank: bool = True, stop_at_damage: bool = False,
                     reader: bool = False) -> Iterator[Located]:
        """Entries in commit-log order from ``start`` (default: the first file) to the written end.

        A BLANK moves to the next file; a zero header ends the walk (a ``reader``'s: its file's data, where
        ``reader_crosses_holes``), and so does the torn record a recovered store keeps past its end
        (broker_model.recovered_tail). A damaged record raises a FormatError naming the file and the offset,
        or with ``stop_at_damage`` ends the walk there, as the broker's recovery does (it treats the first
        invalid record as the end of data).
        """
        files = self.queue.files
        if not files:
            return
        first, pos = (files[0], 0) if start is None else self.queue.locate(start)
        for f in files[files.index(first):]:
            buf = f.read()
            end = self.data_end(f, min(len(buf), f.readable))
            while True:
                if end - pos < C.END_FILE_MIN_BLANK_LENGTH:
                    if pos < end and any(buf[pos:end]):
                        raise FormatError(f"{end - pos} stray bytes at the end of the file",
                                          path=str(f.path), offset=f.start + pos)
                    break   # file end without a BLANK: next file
                size, magic = peek_header(buf, pos)
                if size == 0 and magic == 0:
                    if self.zero_ends_data and not (reader and self.reader_crosses_holes):
                        return  # end of written data
                    break
                try:
                    entry = decode_entry(buf, pos, check_crc=check_crc)
                except FormatError as exc:
                    if stop_at_damage or recovered_tail(f.path, buf, pos):
                        return
                    exc.offset = f.start + pos
                    raise exc.at(path=str(f.path)) from None
                if isinstance(entry, Blank):
                    entry = Blank(entry.total_size, entry.padding, f.start + pos)
                    if include_blank:
                        yield Located(f.start + pos, f, entry)
                    break
                yield Located(f.start + pos, f, entry)
                pos += entry.total_size
            pos = 0

    def data_end(self, f: QueueFile, length: int) -> int:
        """Where the data of file ``f`` (``length`` bytes read) can end: the file's end."""
        return length

    def iter_messages(self, start: int | None = None, *, check_crc: bool = False) -> Iterator[Message]:
        for loc in self.iter_entries(start, check_crc=check_crc, include_blank=False):
            yield loc.entry  # type: ignore[misc]

    def recovered_end(self, start: int) -> int:
        """The commit log's end after the broker's recovery (its processOffset): from ``start`` (where
        recovery starts reading: broker_model) to the first record that fails checkMessageAndReturnSize
        with the CRC check (checkCRCOnRecover defaults to true)."""
        end = start
        try:
            for loc in self.iter_entries(end, check_crc=True, stop_at_damage=True):
                if isinstance(loc.entry, Message):
                    end = loc.offset + loc.entry.total_size
        except FormatError:
            pass                # stray bytes at a file end: recovery stops there too
        return end

    def written_end(self) -> int:
        """The physical offset after the last entry (the broker's max offset after recovery)."""
        end = self.min_offset
        for loc in self.iter_entries():
            end = loc.offset + loc.entry.total_size
        return end

    def append_end(self, hint: int | None = None) -> int:
        """Where the next record goes, found as CommitLog.recoverNormally does, from the last three files
        with data: a walk of record headers (TOTALSIZE, MAGICCODE) to the zero header that ends the data,
        a BLANK going on at the next file. A header recovery would refuse, or data after the end, raises
        FormatError (the store needs repair first). Reads a few bytes a record.

        ``hint``: a record start known from elsewhere (the newest index entry's offset). When a sound
        message header there names that very offset as its PHYSICALOFFSET, the walk starts there: a few
        records instead of up to three files (damage before it is left to verify and the broker)."""
        files = [f for f in self.queue.files if f.length]
        if not files:
            return self.queue.files[0].start if self.queue.files else 0
        tail = files[max(0, len(files) - 3):]
        head = _HEADER.unpack_from
        smallest = C.FIXED_WITHOUT_HOSTS + 2 * C.IPV4_HOST_LEN + 1
        first, skip = 0, 0
        if hint is not None and not self.entry_header_size:
            at = next((i for i, f in enumerate(tail) if f.start <= hint < f.start + f.length), None)
            if at is not None and self._names_itself(tail[at], hint - tail[at].start, smallest):
                first, skip = at, hint - tail[at].start
        end = tail[first].start
        for i, f in enumerate(tail[first:], first):
            buf, pos = f.read(), (skip if i == first else 0)
            n = len(buf)
            while True:
                if n - pos < 8:
                    return f.start + pos if pos < n or i + 1 == len(tail) else end
                size, magic = head(buf, pos)
                if magic == C.MESSAGE_MAGIC_CODE or magic == C.MESSAGE_MAGIC_CODE_V2:
                    if smallest <= size <= n - pos:
                        pos += size
                        continue
                elif magic == C.BLANK_MAGIC_CODE:
                    end = f.start + n
                    break
                elif size == 0 and magic == 0:
                    if i + 1 < len(tail):
                        raise FormatError(f"the data ends at offset {f.start + pos} but later files hold more",
                                          path=str(tail[i + 1].path), offset=tail[i + 1].start)
                    return f.start + pos
                raise FormatError(f"no valid record header (size {size}, magic {magic:#x})", path=str(f.path),
                                  offset=f.start + pos)
        return end

    def end_blank(self, f: QueueFile) -> int | None:
        """Position in ``f`` of the BLANK that ends its records (None: they end otherwise, at zeros or the
        file's end): a walk of record headers (TOTALSIZE, MAGICCODE) from the file's start, a damaged record
        stepped over as verify's walk steps over it (broker_model.step_over). Reads a few bytes a record."""
        if self.entry_header_size or not f.length:
            return None
        buf = f.read()
        n, pos, released = len(buf), 0, 0
        head = _HEADER.unpack_from
        smallest = C.FIXED_WITHOUT_HOSTS + 2 * C.IPV4_HOST_LEN + 1
        while n - pos >= 8:
            if pos - released >= _RELEASE_BYTES:         # walked pages leave RSS (a 1 GiB file's would stay)
                released = release_pages(buf, pos, released)
            size, magic = head(buf, pos)
            if magic == C.BLANK_MAGIC_CODE:
                return pos
            if size == 0 and magic == 0:
                return None
            if (magic == C.MESSAGE_MAGIC_CODE or magic == C.MESSAGE_MAGIC_CODE_V2) and smallest <= size <= n - pos:
                pos += size
            else:
                pos = step_over(buf, pos, n)
        return None

    @staticmethod
    def _names_itself(f: QueueFile, pos: int, smallest: int) -> bool:
        """Whether a message header at ``pos`` of ``f`` fits its file and stores ``f.start + pos`` as its
        PHYSICALOFFSET (a record start, not bytes that happen to look like one)."""
        head = f.read_at(pos, _PHYSICAL_OFFSET_AT + 8)
        if len(head) < _PHYSICAL_OFFSET_AT + 8:
            return False
        size, magic = _HEADER.unpack_from(head)
        return (magic in (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2) and smallest <= size <= f.length - pos
                and struct.unpack_from(">q", head, _PHYSICAL_OFFSET_AT)[0] == f.start + pos)


_HEADER = struct.Struct(">iI")          # TOTALSIZE, MAGICCODE
_PHYSICAL_OFFSET_AT = 28                # TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, then it
