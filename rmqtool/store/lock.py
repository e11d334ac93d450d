"""The broker's store lock: a running broker holds ``FileChannel.tryLock(0, 1)`` on ``<store>/lock``.

On Linux that is a POSIX record lock (fcntl F_SETLK) on byte 0. Such locks belong to a process, so
probing from this process tells whether *another* process holds it. Writers take the same lock for
the duration of a change, so a broker cannot start on a store that is half rewritten.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Iterator

from rmqtool.errors import UnsafeWrite


def lock_is_held(lock_path: Path) -> bool:
    """True when another process holds the broker's lock on byte 0 of ``lock_path``."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return False
    except PermissionError:
        fd = os.open(lock_path, os.O_RDONLY)
        try:   # a read-only descriptor can still take a shared lock, which an exclusive one blocks
            return not _try_lock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)
    try:
        return not _try_lock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)   # closing releases any lock this process took


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.lockf(fd, kind | fcntl.LOCK_NB, 1, 0)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
    return True


@contextlib.contextmanager
def store_write_lock(root: Path, *, force: bool = False) -> Iterator[None]:
    """Hold the broker's lock while changing a store; refuse when a broker (or another writer) has it.

    With ``force`` a held lock is ignored (and not taken). A store without a ``lock`` file is
    written without one (the broker creates it when it starts).
    """
    path = Path(root) / "lock"
    if not path.exists():
        yield
        return
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            locked = True
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            if not force:
                raise UnsafeWrite("the store's lock file is locked by another process (a running broker?); "
                                  "stop the broker first, or pass --force", path=str(path)) from None
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
    finally:
        os.close(fd)
