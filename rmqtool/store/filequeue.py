"""MappedFileQueue on disk: files named by their 20-digit start offset, all of one size.

The file size is inferred from the files themselves (stores may use any mappedFileSize): the size
shared by every file but the last; the last file alone decides when it is the only one.
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rmqtool.constants import FILE_NAME_DIGITS
from rmqtool.errors import StoreError


@dataclass(frozen=True)
class QueueFile:
    path: Path
    start: int       # the offset in the file's name
    length: int      # bytes on disk
    limit: int | None = None     # bytes a reader reads (a file cut to what is readable: store.readable)

    @property
    def readable(self) -> int:
        return self.length if self.limit is None else self.limit

    def read(self) -> bytes | mmap.mmap:
        return map_file(self.path)

    def read_at(self, pos: int, count: int) -> bytes:
        with open(self.path, "rb") as fh:
            return read_exact(fh, count, pos)


# A pre-allocated file (consume queue, timer log) is sparse: a few KiB of units, megabytes of hole. The
# kernel's read-around on a map fault (read_ahead_kb, often MiBs) fills the page cache with the hole's
# zeros: 2,000 queues touched once put 12 GB of zero pages in the cache. Such files are mapped without
# read-around and their data extents read ahead explicitly. Larger files (commit log, index) keep the
# kernel's read-ahead: they are scanned, and only their end borders a hole.
SPARSE_MAP_LIMIT = 64 << 20


def map_file(path: Path, random_access: bool = False) -> bytes | mmap.mmap:
    """Read-only mmap of a file (plain bytes for an empty one). ``random_access``: pages are read as
    they are touched, without read-around (an index lookup touches a few pages of a 420 MB file)."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_size == 0:
                return b""
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            if not hasattr(mmap, "MADV_RANDOM"):
                return mm
            blocks = getattr(st, "st_blocks", None)           # not on every platform
            if random_access:
                mm.madvise(mmap.MADV_RANDOM)
            elif blocks is not None and blocks * 512 < st.st_size <= SPARSE_MAP_LIMIT:
                mm.madvise(mmap.MADV_RANDOM)
                for lo, hi in data_extents(fh.fileno(), 0, st.st_size):
                    lo -= lo % mmap.PAGESIZE
                    mm.madvise(mmap.MADV_WILLNEED, lo, hi - lo)
            return mm
    except OSError as exc:
        raise StoreError(f"cannot read: {exc.strerror or exc}", path=str(path)) from exc


def read_exact(fh, count: int, offset: int) -> bytes:
    """``count`` bytes at ``offset`` of an open file, without read-ahead past them (see above)."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
    return os.pread(fh.fileno(), count, offset)


def open_random(path) -> int:
    """A file descriptor for reads at offsets (``os.pread``) without read-ahead past them (see above): one
    advice for every read, no buffered file object."""
    fd = os.open(path, os.O_RDONLY)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


def patched(path: Path, pos: int, data: bytes, base=None):
    """A file's new content as a private map of it (or ``base``, one patched before) with ``data`` at ``pos``:
    the file itself is unchanged (a transaction stages the result)."""
    buf = map_private(path) if base is None else base
    buf[pos:pos + len(data)] = data
    return buf


def map_private(path: Path) -> mmap.mmap:
    """A copy-on-write map of a file: writes stay in this process's memory, the file is unchanged."""
    try:
        with open(path, "rb") as fh:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot map: {exc}", path=str(path)) from exc


def data_extents(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """[start, end) ranges of a file that may hold data: its data extents (the holes of a sparse file
    skipped), or the whole range where the file system cannot tell holes."""
    seek_data = getattr(os, "SEEK_DATA", None)      # not on every platform
    pos = start
    while pos < end:
        try:
            if seek_data is None:
                raise OSError(errno.EINVAL, "no SEEK_DATA")
            lo = os.lseek(fd, pos, seek_data)
            hi = os.lseek(fd, lo, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:      # only a hole is left
                return
            lo, hi = pos, end
        if lo >= end:
            return
        yield lo, min(hi, end)
        pos = max(hi, pos + 1)


def same_content(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes, reading only where either holds data (sparse files): each
    byte once, into two buffers kept for the whole compare."""
    size = os.path.getsize(a)
    if os.path.getsize(b) != size:
        return False
    fa, fb = open_random(a), open_random(b)
    try:
        buf_a, buf_b = bytearray(_COMPARE), bytearray(_COMPARE)
        for lo, hi in joined_spans(sorted([*data_extents(fa, 0, size), *data_extents(fb, 0, size)])):
            for pos in range(lo, hi, _COMPARE):
                n = min(_COMPARE, hi - pos)
                x, y = (buf_a, buf_b) if n == _COMPARE else (bytearray(n), bytearray(n))
                if os.preadv(fa, [x], pos) != n or os.preadv(fb, [y], pos) != n or x != y:
                    return False
        return True
    finally:
        os.close(fa)
        os.close(fb)


_COMPARE = 1 << 20               # bytes compared at a time


def joined_spans(spans: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Sorted [lo, hi) spans, overlapping or touching ones joined."""
    it = iter(spans)
    cur = next(it, None)
    for lo, hi in it:
        if lo <= cur[1]:
            cur = (cur[0], max(cur[1], hi))
        else:
            yield cur
            cur = (lo, hi)
    if cur is not None:
        yield cur


def gaps(spans: list[tuple[int, int]], end: int) -> Iterator[tuple[int, int]]:
    """The parts of [0, ``end``) that no span (sorted, disjoint) covers: what a sparse file written at
    ``spans`` holds as zeros."""
    at = 0
    for lo, hi in spans:
        if lo >= end:
            break
        if lo > at:
            yield at, lo
        at = max(at, hi)
    if at < end:
        yield at, end


def page_bytes(spans: list[tuple[int, int]], size: int) -> int:
    """The bytes of the pages that writes of ``spans`` (sorted, disjoint) give a sparse file of ``size`` bytes:
    ``file_data``'s figure for it on a file system of page-sized blocks."""
    page = mmap.PAGESIZE
    return sum(hi - lo for lo, hi in joined_spans([(lo // page * page, min(-(-hi // page) * page, size))
                                                   for lo, hi in spans]))


def read_data(path: Path) -> tuple[bytes, int]:
    """A file's bytes up to the end of its last data extent, and its size: the hole a pre-allocated file
    has after its data (the broker's 6,000,000-byte consume-queue files, mostly empty) is not read."""
    fd = open_random(path)
    try:
        size = os.fstat(fd).st_size
        end = max((hi for _, hi in data_extents(fd, 0, size)), default=0)
        parts, pos = [], 0
        while pos < end:
            part = os.pread(fd, min(end - pos, 1 << 24), pos)
            if not part:              # the file shrank under the read
                break
            parts.append(part)
            pos += len(part)
        return b"".join(parts), size
    finally:
        os.close(fd)


def first_nonzero(path: Path, start: int, end: int | None = None) -> int | None:
    """Position of the first non-zero byte in [start, end) of a file; holes are skipped."""
    fd = open_random(path)
    try:
        size = os.fstat(fd).st_size
        return first_nonzero_at(fd, start, size if end is None else min(end, size))
    finally:
        os.close(fd)


def first_nonzero_at(fd: int, start: int, end: int) -> int | None:
    """``first_nonzero`` in a file open already (``open_random``), ``end`` at most its size."""
    for lo, hi in data_extents(fd, start, end):
        for pos in range(lo, hi, 1 << 20):
            at = first_nonzero_byte(os.pread(fd, min(1 << 20, hi - pos), pos))
            if at is not None:
                return pos + at
    return None


_ZEROS = bytes(1 << 16)


def first_nonzero_byte(data: bytes) -> int | None:
    """Index of the first non-zero byte of ``data`` (None: all zero): blocks compared with zeros (memcmp), the
    first that differs narrowed down the same way (``bytes.lstrip`` tests byte by byte: ~10 ms a MiB)."""
    lo, hi = 0, len(data)
    for step in (1 << 16, 1 << 10, 16):
        while lo < hi and data[lo:lo + step] == _ZEROS[:min(step, hi - lo)]:
            lo += step
        if lo >= hi:
            return None
        hi = min(lo + step, hi)
    while data[lo] == 0:
        lo += 1
    return lo


def first_difference(a: bytes, b: bytes) -> int | None:
    """The first position where ``a`` and ``b`` differ, each read as followed by zeros (None: none): blocks
    compared (memcmp), the first that differs narrowed down the same way."""
    n = min(len(a), len(b))
    lo, hi = 0, n
    if a[:n] != b[:n]:
        for step in (1 << 16, 1 << 10, 16, 1):
            while a[lo:min(lo + step, hi)] == b[lo:min(lo + step, hi)]:
                lo += step
            hi = min(lo + step, hi)
        return lo
    hit = first_nonzero_byte(memoryview(a if len(a) > n else b)[n:])
    return None if hit is None else n + hit


def release_pages(mm, upto: int, released: int = 0) -> int:
    """Drop the pages of a read-only file map in [released, upto) (already decoded): RSS stays flat while
    a large file is walked; the pages stay in the page cache. Returns the new released position."""
    done = upto // mmap.PAGESIZE * mmap.PAGESIZE
    if isinstance(mm, mmap.mmap) and done > released:
        mm.madvise(mmap.MADV_DONTNEED, released, done - released)
        return done
    return released


def populate_pages(mm, pos: int, length: int) -> None:
    """Map the pages of a read-only file map in [pos, pos + length) in one call (Linux 5.14+
    MADV_POPULATE_READ) before a walk reads them: faulting them in 64 KiB at a time costs about a tenth of
    a CPU second per GiB, this a third of that."""
    start = pos // mmap.PAGESIZE * mmap.PAGESIZE
    if isinstance(mm, mmap.mmap) and sys.platform == "linux" and start < len(mm):
        try:
            mm.madvise(getattr(mmap, "MADV_POPULATE_READ", 22), start, min(pos + length, len(mm)) - start)
        except OSError:             # an older kernel (EINVAL): the pages fault in as they are read
            pass


def list_dir(path: Path) -> list[os.DirEntry] | None:
    """A directory's entries in one listing (their ``is_dir()``/``is_file()`` need no stat where the file
    system gives the type); None where ``Path.is_dir()`` is false."""
    try:
        with os.scandir(path) as entries:
            return list(entries)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            return None
        raise


def is_offset_name(name: str) -> bool:
    return len(name) == FILE_NAME_DIGITS and name.isdigit()


class FileQueue:
    """The files of one commit log or consume queue, sorted by start offset."""

    def __init__(self, files: list[QueueFile], file_size: int | None = None):
        self.files = sorted(files, key=lambda f: f.start)
        self.file_size = file_size if file_size is not None else infer_file_size(self.files)
        self.directories: list[Path] = []     # from_dir: directories named by digits among the files

    @classmethod
    def from_dir(cls, directory: Path, file_size: int | None = None) -> "FileQueue":
        entries = list_dir(directory)
        if entries is None:
            raise StoreError("not a directory", path=str(directory))
        files, directories = [], []
        for entry in entries:
            if entry.is_file() and is_offset_name(entry.name):
                files.append(QueueFile(Path(entry.path), int(entry.name), entry.stat().st_size))
            elif entry.name.isdigit() and entry.is_dir():
                directories.append(Path(entry.path))
        queue = cls(files, file_size)
        queue.directories = sorted(directories)
        return queue

    def __iter__(self) -> Iterator[QueueFile]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    @property
    def min_offset(self) -> int:
        return self.files[0].start if self.files else 0

    def locate(self, offset: int) -> tuple[QueueFile, int]:
        """The file holding ``offset`` and the position inside it."""
        for f in self.files:
            if f.start <= offset < f.start + max(f.length, self.file_size or 0):
                return f, offset - f.start
        raise StoreError(f"offset {offset} lies in no file "
                         f"(files cover {self.min_offset}..{self.max_file_end})")

    @property
    def max_file_end(self) -> int:
        return self.files[-1].start + self.files[-1].length if self.files else 0

    def problems(self) -> list[tuple[QueueFile | None, str]]:
        """Wrong-size files and gaps or overlaps between consecutive files."""
        out: list[tuple[QueueFile | None, str]] = []
        for i, f in enumerate(self.files):
            last = i == len(self.files) - 1
            if self.file_size and f.length != self.file_size and not (last and f.length == 0):
                out.append((f, f"file is {f.length} bytes, expected {self.file_size}"))
            if last and f.length == 0:
                out.append((f, "last file is empty (0 bytes)"))
            if i and self.file_size and f.start != self.files[i - 1].start + self.file_size:
                out.append((f, f"starts at {f.start}, expected {self.files[i - 1].start + self.file_size} "
                               "(missing or misnamed file)"))
        return out


def infer_file_size(files: list[QueueFile]) -> int | None:
    """The common size of the files (the spacing of their names when sizes disagree).

    Files of one size spaced by a multiple of it are one directory of a 5.x multi-path commit log
    (MultiPathMappedFileQueue puts every n-th file in each of n directories): the size is the files'.
    """
    sizes = [f.length for f in files if f.length > 0]
    if not sizes:
        return None
    if len(files) >= 2:
        gaps = {b.start - a.start for a, b in zip(files, files[1:])}
        if len(gaps) == 1:
            gap = gaps.pop()
            if len(set(sizes)) == 1 and len(sizes) == len(files) and gap > sizes[0] and gap % sizes[0] == 0:
                return sizes[0]
            return gap
    return max(set(sizes), key=sizes.count)


def cut_copy(path: Path, cut: int, size: int):
    """The file's first ``cut`` bytes, zeros up to ``size``: a private map, zeroed only where it holds data
    (a file of another size: a buffer of ``size`` bytes)."""
    if os.path.getsize(path) != size:
        data = Path(path).read_bytes()[:cut]
        return bytearray(data + bytes(size - len(data)))
    mm = map_private(path)
    with open(path, "rb") as fh:
        for lo, hi in data_extents(fh.fileno(), cut, size):
            for pos in range(lo, hi, 1 << 20):
                end = min(pos + (1 << 20), hi)
                mm[pos:end] = bytes(end - pos)
    return mm
