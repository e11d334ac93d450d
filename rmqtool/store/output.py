"""An output outside a store (export's file or dataset directory), written under a hidden name beside its
target and renamed into place; and scratch directories that a killed process does not leave for good.

While ``staged(to)`` runs, this process holds an exclusive lock (flock) on ``.NAME.tmp-lock`` beside
``to``: a second writer of ``to`` is refused, and whatever is named ``.NAME.tmp-PID*`` there was left by
a writer that was killed (SIGKILL, a power loss) and is removed first. The lock file goes when the
writer ends. The temporary name is ``.NAME.tmp-PID`` (a file or a directory, with ``.NAME.tmp-PID.*``
scratch beside it); an error removes it, and a write error names ``to``, not the hidden name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import Iterator

from rmqtool.errors import StoreWarning, UnsafeWrite

LOCK = "lock"
_SCRATCH = re.compile(r"\d+(\..*)?", re.S)    # after the prefix: a writer's PID, then its scratch's suffix
STALE_SECONDS = 60          # a scratch directory unlocked and unchanged this long was left by a killed process


def scratch_prefix(to: Path) -> str:
    """The start of every hidden name a writer of ``to`` uses beside it."""
    return f".{to.name}.tmp-"


@contextlib.contextmanager
def staged(to: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """``to``'s temporary name, under ``to``'s lock (refused while another process holds it), the leftovers
    of killed writers removed first (a warning names them). An OSError raised inside that names the
    temporary name, a file beside it or under it, names ``to`` instead and says that nothing was written
    (or that the file already there is unchanged); the temporary name is removed on any error."""
    to = Path(to)
    prefix = scratch_prefix(to)
    tmp = to.with_name(f"{prefix}{os.getpid()}")
    try:
        fd, locked = _lock(to.with_name(prefix + LOCK), to)
    except OSError as exc:
        raise _named(exc, to, to.exists()) from None
    try:
        if locked:
            _sweep(to, prefix)
        existed = to.exists() if overwrite else False
        try:
            yield tmp
        except OSError as exc:
            _discard(tmp)
            if not _ours(exc.filename, to, prefix):
                raise
            raise _named(exc, to, existed) from None
        except BaseException:
            _discard(tmp)
            raise
    finally:
        if locked:                  # still ours: a writer that opened it before re-checks what it locked
            with contextlib.suppress(OSError):
                os.unlink(to.with_name(prefix + LOCK))
        os.close(fd)


def _lock(path: Path, to: Path) -> tuple[int, bool]:
    """An open descriptor of ``path`` and whether it holds its exclusive lock (not on a file system without
    flock). The path may go away (a writer ending removes it) between open and lock, so the lock is taken
    again until it is the file at ``path``."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
                return fd, False
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise UnsafeWrite(f"another process is writing this output (it holds {path.name}); wait for it "
                                  f"to end, or write elsewhere", path=str(to)) from None
            raise
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd, True
        except FileNotFoundError:
            pass
        os.close(fd)


def _sweep(to: Path, prefix: str) -> None:
    """Remove what killed writers of ``to`` left beside it (its lock is held: no writer of it is alive)."""
    left = sorted(p for p in _siblings(to.parent)
                  if p.name.startswith(prefix) and _SCRATCH.fullmatch(p.name[len(prefix):]))
    for path in left:
        _discard(path)
    if left:
        warnings.warn(StoreWarning(f"{to}: removed what an interrupted run left beside it: "
                                   f"{', '.join(p.name for p in left)}"))


def _siblings(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except FileNotFoundError:
        return []


def _discard(path: Path) -> None:
    """Remove a temporary file or directory, if there (best effort: the error being reported matters more)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _ours(filename, to: Path, prefix: str) -> bool:
    """Whether ``filename`` (an OSError's) is ``to``'s temporary name, its lock or scratch, or under them."""
    if filename is None:
        return False
    path, parent = Path(os.path.abspath(os.fsdecode(filename))), Path(os.path.abspath(to.parent))
    while path.parent != path:
        if path.parent == parent and path.name.startswith(prefix):
            return True
        path = path.parent
    return False


def _named(exc: OSError, to: Path, existed: bool) -> OSError:
    """``exc`` naming ``to``, and what that leaves."""
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    left = "the existing output is unchanged" if existed else "nothing written"
    return OSError(exc.errno, f"{why}; {left}", str(to))


class ScratchDir:
    """A new directory ``<prefix>XXXXXXXX`` in ``directory`` (None: the system's temporary directory), for
    files built outside a store. This process holds a lock (flock) on it until ``remove()``, so that the next
    one made with the same prefix removes it if this process was killed: the leftovers of the same user,
    unlocked and unchanged for ``STALE_SECONDS`` (one made that instant, not yet locked, is not taken for
    one). As a context manager it gives its path and is removed at the end. One its holder drops without
    ``remove()`` (an error on the way) goes when it is collected or, at the latest, when this process exits
    (never at a forked worker's exit)."""

    def __init__(self, prefix: str, directory: str | os.PathLike | None = None):
        parent = os.fspath(directory) if directory is not None else tempfile.gettempdir()
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        self._fd: int | None = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        self._dropped = weakref.finalize(self, _remove_dropped, str(self.path), self._fd, os.getpid())
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.remove(strict=False)
            raise
        # ages by the file system's clock (this directory's time), not this process's: they may disagree
        _sweep_scratch(parent, prefix, os.fstat(self._fd).st_mtime)

    def remove(self, strict: bool = True) -> None:
        """Remove the directory and release its lock (once). An error is raised, naming the file that could
        not go; not ``strict``: what would not go is left for the next sweep."""
        if self._fd is None:
            return
        self._dropped.detach()
        try:
            if strict:
                from rmqtool.store.atomic import remove_scratch
                remove_scratch(self.path)
            else:
                shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, exc_type, *exc) -> None:
        self.remove(strict=exc_type is None)          # an error on the way out is not hidden by another


def _remove_dropped(path: str, fd: int, pid: int) -> None:
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


@contextlib.contextmanager
def scratch_dir(directory: str | None, prefix: str) -> Iterator[str]:
    """``ScratchDir(prefix, directory)``'s path as a string, removed at the end (what would not go is left for
    the next sweep)."""
    scratch = ScratchDir(prefix, directory)
    try:
        yield str(scratch.path)
    finally:
        scratch.remove(strict=False)


def _sweep_scratch(parent: str, prefix: str, now: float) -> None:
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if not entry.name.startswith(prefix):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or now - st.st_mtime < STALE_SECONDS:
                    continue
                fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(entry.path, ignore_errors=True)
            except OSError:
                pass                                # a live one's
            finally:
                os.close(fd)
