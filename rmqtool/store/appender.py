"""The one commit-log appender: records placed as CommitLog.doAppend places them, with the end-of-file
roll of DefaultAppendMessageCallback.doAppend (a record is written only when END_FILE_MIN_BLANK_LENGTH
bytes remain after it; otherwise a BLANK fills the rest of the file and the record opens the next one).

Bytes go to a sink: ``sink(file_start, position, data)``. ``FileSink`` writes a directory of files
pre-allocated sparse at full size, as the broker's mapped files are; put/import pass their transaction.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from rmqtool import constants as C
from rmqtool.errors import EncodeError
from rmqtool.format.commitlog import Blank, encode_blank

Sink = Callable[[int, int, bytes], None]


class CommitLogAppender:
    def __init__(self, file_size: int, end: int, sink: Sink):
        self.file_size = file_size
        self.end = end                    # the written end: where the next record goes (before a roll)
        self.sink = sink

    def reserve(self, size: int) -> int:
        """The physical offset of a record of ``size`` bytes, after the BLANK that rolls to the next file
        when it does not fit the current one."""
        if size + C.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            raise EncodeError(f"a record of {size} bytes does not fit a {self.file_size}-byte commit-log file")
        pos = self.end % self.file_size
        if pos + size + C.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            self.sink(self.end - pos, pos, encode_blank(Blank(self.file_size - pos)))
            self.end += self.file_size - pos
        return self.end

    def write(self, record: bytes) -> int:
        """Write a record at the offset ``reserve`` gave; returns that offset."""
        at = self.end
        pos = at % self.file_size
        self.sink(at - pos, pos, record)
        self.end += len(record)
        return at


class FileSink:
    """Writes into ``directory``'s files named by start offset, each created sparse at ``file_size``."""

    def __init__(self, directory: Path, file_size: int):
        self.directory, self.file_size = Path(directory), file_size
        self._fh = None
        self._start = -1

    def __call__(self, start: int, pos: int, data: bytes) -> None:
        if start != self._start:
            self.close()
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / C.offset_to_file_name(start)
            self._fh = open(path, "r+b" if path.exists() else "w+b")
            if os.fstat(self._fh.fileno()).st_size < self.file_size:
                self._fh.truncate(self.file_size)
            self._start = start
        self._fh.seek(pos)
        self._fh.write(data)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            self._start = -1
