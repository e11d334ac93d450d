"""Per-file steps in worker processes: the local engine's counterpart of one Spark task per file.

``process_map(fn, items, jobs)`` is ``[fn(item, progress) for item in items]`` over ``jobs`` processes,
forked where the platform can (a caller's script needs no ``__main__`` guard; workers touch no lock of
the parent's progress thread), else spawned: then ``fn`` is pickled, so it is a module-level function or
a ``functools.partial`` of one. Workers add the bytes they report to one shared counter, which the
caller's ``progress`` is told about as it grows.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

from rmqtool import errors

PARALLEL_MIN_BYTES = 256 << 20      # below this, starting workers costs more than it saves
WORKER_BYTES = 1 << 30              # memory set aside per worker (one 1 GiB commit-log file takes ~0.4 GB)

_task: Callable | None = None
_counter: Any = None


def guard(fn: Callable, *args):
    """``fn(*args)`` in a task; an RmqError comes back as data (exceptions with their own constructor
    arguments do not survive pickling)."""
    try:
        return True, fn(*args)
    except errors.RmqError as exc:
        return False, (type(exc).__mro__, exc.message, exc.path, exc.offset)


def rebuild_error(info) -> errors.RmqError:
    mro, message, path, offset = info
    for cls in (errors.FormatError, errors.EncodeError, errors.StoreError, errors.UnsafeWrite,
                errors.SparkUnavailable, errors.RmqError):
        if cls in mro:
            return cls(message, path=path, offset=offset)
    return errors.RmqError(message, path=path, offset=offset)


def unguard(out: list) -> list:
    """The values of guarded results; the first error (in item order) raised here."""
    for ok, value in out:
        if not ok:
            raise rebuild_error(value)
    return [value for _, value in out]


def default_jobs(input_bytes: int, files: int) -> int:
    """Worker processes for a store: one per core and file as memory allows, none for a small store."""
    if input_bytes < PARALLEL_MIN_BYTES:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, files, available_memory() // WORKER_BYTES))


def available_memory() -> int:
    """MemAvailable of /proc/meminfo (Linux); elsewhere unknown: no limit."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _start(task: Callable, counter) -> None:
    global _task, _counter
    _task, _counter = task, counter


def _advance(n: int) -> None:
    with _counter.get_lock():
        _counter.value += n


def _run(item):
    return guard(_task, item, _advance)


def process_map(fn: Callable, items: list, jobs: int, progress: Callable[[int], None] | None = None) -> list:
    """``[fn(item, progress) for item in items]``, in ``jobs`` worker processes when there are several."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(item, progress) for item in items]
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    counter = ctx.Value("q", 0)
    seen = 0
    pool = ProcessPoolExecutor(min(jobs, len(items)), mp_context=ctx, initializer=_start, initargs=(fn, counter))
    try:
        futures = [pool.submit(_run, item) for item in items]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            now = counter.value                     # read once: workers keep adding to it
            if progress and now > seen:
                progress(now - seen)
                seen = now
        return unguard([f.result() for f in futures])
    except BrokenProcessPool as exc:
        raise errors.RmqError(f"a worker process died ({exc}); try --jobs 1") from None
    except BaseException:                     # interrupted (Ctrl-C): stop the workers, not just their queue
        for proc in list((pool._processes or {}).values()):     # Python < 3.14 has no public terminate
            proc.terminate()
        raise
    finally:
        pool.shutdown(cancel_futures=True)
