"""A file joined from part files written apart, or written in place by several processes, each its own range
(export to one file from worker processes)."""

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
