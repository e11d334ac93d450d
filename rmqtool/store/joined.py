"""A file joined from part files written apart (export to one file from worker processes)."""

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


def copy_range(path: str | os.PathLike, out, offset: int, count: int) -> None:
    """Append ``count`` bytes of the file at ``path`` from ``offset`` to the open binary file ``out``: in the
    kernel (``os.copy_file_range``, a reflink on file systems that share blocks) where it can, else read and
    written."""
    out.flush()
    with open(path, "rb") as src:
        try:
            while count:
                n = os.copy_file_range(src.fileno(), out.fileno(), count, offset)
                if n == 0:
                    raise OSError("copy_file_range copied nothing")
                offset += n
                count -= n
            out.seek(0, os.SEEK_END)
            return
        except (AttributeError, OSError):           # no such call here, or not between these file systems
            out.seek(0, os.SEEK_END)
        src.seek(offset)
        while count:
            chunk = src.read(min(count, 1 << 24))
            if not chunk:
                raise OSError(f"{path}: shorter than expected")
            out.write(chunk)
            count -= len(chunk)
