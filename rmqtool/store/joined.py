"""A file joined from part files written apart, or written in place by several processes, each its own range
(export to one file from worker processes); a file written with its blocks allocated ahead of the writes."""

from __future__ import annotations

import os
from pathlib import Path

from rmqtool.store.atomic import named


class JoinedFile:
    """The file at ``path``, made of parts added in order: the first part's file becomes it (renamed and cut
    to its end), the others' bytes are appended (``copy_range``) and their files removed. An OSError that
    names no file names ``path``."""

    def __init__(self, path: Path):
        self.path, self.out = path, None

    @property
    def size(self) -> int:
        return self.out.tell() if self.out is not None else 0

    def add(self, part: str | os.PathLike, start: int, end: int) -> None:
        """Bytes ``start``-``end`` of the part file at ``part`` (the first part's from 0 on: it becomes the file)."""
        with named(self.path):
            if self.out is None:
                os.replace(part, self.path)
                self.out = open(self.path, "r+b")
                self.out.truncate(end)
                self.out.seek(end)
                return
            copy_range(part, self.out, start, end - start)
            os.unlink(part)

    def write(self, data: bytes) -> None:
        with named(self.path):
            self.out.write(data)

    def close(self) -> None:
        if self.out is not None:
            with named(self.path):
                self.out.close()


def open_at(path: str | os.PathLike, offset: int):
    """The existing file at ``path`` open for writing from ``offset`` on, nothing before or after it cut (a
    process writing its range of a file written in place); an OSError names ``path``."""
    with named(path):
        out = open(path, "r+b")
        try:
            out.seek(offset)
        except BaseException:
            out.close()
            raise
    return out


class Allocating:
    """A binary file written on from where it is open, its blocks allocated 64 MiB ahead of the writes
    (``fallocate`` keeping its size), up to ``end`` where given. Buffered writes into blocks the file system
    has to allocate first (ext4's delayed allocation) cost the kernel up to 3x the writes into allocated ones
    here (4 GB from one process, 1 MiB at a time: median 2.9 CPU-s against 1.0), and hold the file's lock that
    long, so that processes writing their ranges of one file take turns. Where the file system cannot allocate
    ahead (or is full) the writes go on as before. ``close`` frees the blocks allocated past the end of the
    file (``end`` not given: this writer writes the file's end)."""

    def __init__(self, out, end: int | None = None):
        self.out, self.end, self.ahead = out, end, True
        self.at = self.allocated = out.tell()

    def write(self, data) -> int:
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if self.ahead and self.at + size > self.allocated:
            self._allocate(self.at + size)
        n = self.out.write(data)
        self.at += n
        return n

    def _allocate(self, upto: int) -> None:
        length = max(upto - self.allocated, PIECE)
        if self.end is not None:
            length = min(length, self.end - self.allocated)
        if length <= 0 or not _fallocate_ahead(self.out.fileno(), self.allocated, length):
            self.ahead = False                # at its end, or not here: plain writes from now on
            return
        self.allocated += length

    def tell(self) -> int:
        return self.at

    def close(self) -> None:
        try:
            if self.end is None and self.allocated > self.at:
                self.out.flush()
                os.ftruncate(self.out.fileno(), self.at)     # the file's size again: the blocks past it freed
        finally:
            self.out.close()


_KEEP_SIZE = 1       # FALLOC_FL_KEEP_SIZE
_fallocate = None    # libc's fallocate64 once looked up; False where there is none


def _fallocate_ahead(fd: int, offset: int, length: int) -> bool:
    """Blocks ``offset``..``offset + length`` of ``fd`` allocated, its size kept; False where the system or the
    file system cannot (or there is no room: the writes will say so)."""
    global _fallocate
    if _fallocate is None:
        import ctypes
        try:
            _fallocate = ctypes.CDLL(None, use_errno=True).fallocate64
        except (AttributeError, OSError):
            _fallocate = False
        else:
            _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return bool(_fallocate) and _fallocate(fd, _KEEP_SIZE, offset, length) == 0


PIECE = 1 << 26


def copy_range(path: str | os.PathLike, out, offset: int, count: int) -> None:
    """Append ``count`` bytes of the file at ``path`` from ``offset`` to the open binary file ``out``, the part
    file cut as it goes (it is removed after): 64 MiB at a time from its end back, in the kernel
    (``os.copy_file_range``, a reflink on file systems that share blocks) where it can, else read and
    written. The page cache a piece held is freed at once and the next piece's pages reuse it: fresh pages
    cost far more than pages just freed on a virtual machine whose host takes back the guest's free memory
    (here: a 2 GiB part copied whole 5.0 CPU-s, cut as it goes 1.0)."""
    out.flush()
    base = out.seek(0, os.SEEK_END)
    with open(path, "r+b") as src:
        end = count
        while end:
            start = (end - 1) // PIECE * PIECE
            _copy_piece(src, out, offset + start, base + start, end - start, path)
            src.truncate(offset + start)
            end = start
    out.seek(0, os.SEEK_END)


def _copy_piece(src, out, at: int, to: int, count: int, path) -> None:
    """Bytes ``at``..``at + count`` of ``src`` written at ``to`` in ``out``."""
    try:
        while count:
            n = os.copy_file_range(src.fileno(), out.fileno(), count, at, to)
            if n == 0:
                raise OSError("copy_file_range copied nothing")
            at, to, count = at + n, to + n, count - n
        return
    except (AttributeError, OSError):           # no such call here, or not between these file systems
        pass
    while count:
        chunk = os.pread(src.fileno(), min(count, 1 << 24), at)
        if not chunk:
            raise OSError(f"{path}: shorter than expected")
        os.pwrite(out.fileno(), chunk, to)
        at, to, count = at + len(chunk), to + len(chunk), count - len(chunk)
