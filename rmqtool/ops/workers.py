"""Per-file steps in worker processes: the local engine's counterpart of one Spark task per file.

``process_map(fn, items, jobs)`` is ``[fn(item, progress) for item in items]`` over ``jobs`` processes,
forked where the platform can (a caller's script needs no ``__main__`` guard; workers touch no lock of
the parent's progress thread), else spawned: then ``fn`` is pickled, so it is a module-level function or
a ``functools.partial`` of one. Workers add the bytes they report to one shared counter, which the
caller's ``progress`` is told about as it grows. ``process_imap`` yields the results in order while
the workers compute the next ones (the caller's work on a result overlaps theirs); large results cross
over in shared memory: their arrays are written once to a file in ``/dev/shm`` and mapped by the
parent (pickle protocol 5's out-of-band buffers), not pickled through a pipe.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator

from rmqtool import errors
from rmqtool.store.filequeue import map_file

PARALLEL_MIN_BYTES = 256 << 20      # below this, starting workers costs more than it saves
WORKER_BYTES = 1 << 30              # memory set aside per worker (one 1 GiB commit-log file takes ~0.4 GB)

_task: Callable | None = None
_counter: Any = None
_parcels: str | None = None         # the directory results cross over in (process_imap)
SHARED_MEMORY = "/dev/shm"


def guard(fn: Callable, *args):
    """``fn(*args)`` in a task; an RmqError comes back as data (exceptions with their own constructor
    arguments do not survive pickling)."""
    try:
        return True, fn(*args)
    except errors.RmqError as exc:
        return False, error_info(exc)


def error_info(exc: errors.RmqError) -> tuple:
    """An RmqError as data that crosses between processes (``rebuild_error`` makes it again)."""
    return type(exc).__mro__, exc.message, exc.path, exc.offset


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


def _start(task: Callable, counter, parcels: str | None = None, parent: int | None = None) -> None:
    global _task, _counter, _parcels
    # the objects this worker inherited stay out of its collections: a full collection walks them all
    # (~170,000 of the parent's) and copies every page it touches (copy-on-write: ~2,800 pages per worker)
    gc.freeze()
    _task, _counter, _parcels = task, counter, parcels
    if parent is not None:
        _die_with(parent)


def _die_with(parent: int) -> None:
    """Linux: this worker is killed when ``parent`` dies (prctl PR_SET_PDEATHSIG), so no worker of a killed
    rebuild or export goes on writing into what it was building."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:                    # died before the call
        os._exit(1)


def _advance(n: int) -> None:
    with _counter.get_lock():
        _counter.value += n


def _run(item):
    return guard(_task, item, _advance)


def _run_parcel(item):
    """``_run``, its result's buffers written to a file of the parcel directory: (pickle, file, sizes)."""
    ok, value = _run(item)
    if not ok:
        return ok, value
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    fd, path = tempfile.mkstemp(dir=_parcels)
    with os.fdopen(fd, "wb") as fh:
        for b in buffers:
            fh.write(b.raw())
    return ok, (head, path, [b.raw().nbytes for b in buffers])


def _unparcel(parcel):
    """The result ``_run_parcel`` sent: its buffers mapped (read-only) from the file, which goes."""
    head, path, sizes = parcel
    try:
        if not sum(sizes):
            return pickle.loads(head, buffers=[b""] * len(sizes))
        mm = map_file(Path(path))
    finally:
        os.unlink(path)
    view, at, buffers = memoryview(mm), 0, []
    for n in sizes:
        buffers.append(view[at:at + n])
        at += n
    return pickle.loads(head, buffers=buffers)


def _worker_context():
    """The multiprocessing context workers start from (fork where the platform can). Work spread over
    processes is not small: the scan's compiled code is loaded here first, once, and the workers inherit it
    (rmqtool.columnar.kernel's small-input path would leave each to load it); a worker then loads only the
    machine code of the functions it calls (~0.01 CPU-s each: the cache load builds no registries, see
    kernel._load_overload). multiprocessing is imported here only: a small store needs none."""
    import multiprocessing

    from rmqtool.columnar.kernel import load_compiled

    load_compiled()
    _steady_malloc()
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _steady_malloc() -> None:
    """glibc: blocks up to 32 MiB from the heap and up to 64 MiB of it kept free, set before the workers are
    forked. glibc's own dynamic threshold reaches that after the first such block is freed, which a process
    that walks files itself soon does; a parent whose workers did the first step had not, so it and every
    worker it forked mapped and unmapped each temporary array of 128 KiB-32 MiB afresh, faulting its pages
    in again each time (verify, 1 GiB file: ~70,000 page faults a file against ~30,000 in one process)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-1, 64 << 20)          # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)          # M_MMAP_THRESHOLD (a fixed one: no dynamic adjustment)
    except (OSError, AttributeError):       # not glibc
        pass


def process_imap(fn: Callable, items: list, jobs: int, progress: Callable[[int], None] | None = None,
                 ahead: int = 0) -> Iterator:
    """``fn(item, progress)`` for each item, yielded in order; with several ``jobs``, computed in that many
    worker processes, each kept busy with the next item while the caller works on the last one yielded
    (at most ``jobs + ahead`` results wait: memory stays bounded). ``ahead`` items more are handed out:
    a worker done before the one whose result is due goes on with one of them instead of waiting for
    the caller. Results cross over in shared memory."""
    if jobs <= 1 or len(items) <= 1:
        for item in items:
            yield fn(item, progress)
        return
    from concurrent.futures import ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    from rmqtool.store.output import scratch_dir

    ctx = _worker_context()
    counter = ctx.Value("q", 0)
    # a directory a killed process left goes with the next one made (store.output.scratch_dir)
    with scratch_dir(SHARED_MEMORY if os.path.isdir(SHARED_MEMORY) else None, "rmqtool-parcels-") as parcels:
        seen = 0
        pool = ProcessPoolExecutor(min(jobs, len(items)), mp_context=ctx, initializer=_start,
                                   initargs=(fn, counter, parcels, os.getpid()))
        try:
            running = deque(pool.submit(_run_parcel, item) for item in items[:jobs + ahead])
            rest = iter(items[jobs + ahead:])
            while running:
                first = running.popleft()
                while True:
                    done, _ = wait([first], timeout=0.2)
                    now = counter.value
                    if progress and now > seen:
                        progress(now - seen)
                        seen = now
                    if done:
                        break
                ok, value = first.result()
                if not ok:
                    raise rebuild_error(value)
                nxt = next(rest, _END)
                if nxt is not _END:
                    running.append(pool.submit(_run_parcel, nxt))
                yield _unparcel(value)
        except BrokenProcessPool as exc:
            raise errors.RmqError(f"a worker process died ({exc}); try --jobs 1") from None
        except BaseException:                     # interrupted, or the caller stopped early: stop the workers
            for proc in list((pool._processes or {}).values()):     # Python < 3.14 has no public terminate
                proc.terminate()
            raise
        finally:
            pool.shutdown(cancel_futures=True)


_END = object()


def _ignore(n: int) -> None:
    pass


def process_map(fn: Callable, items: list, jobs: int, progress: Callable[[int], None] | None = None) -> list:
    """``[fn(item, progress) for item in items]`` over ``jobs`` processes when there are several: this one
    and ``jobs - 1`` workers (one process fewer holding its own copy of the libraries and data), which die
    with it. Each worker has up to two items queued, so it never waits for this process to hand it the next."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(item, progress) for item in items]
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = _worker_context()
    counter = ctx.Value("q", 0)
    seen = 0
    workers = min(jobs, len(items)) - 1
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start, initargs=(fn, counter, None, os.getpid()))
    out: list = [None] * len(items)
    running: dict = {}
    nxt = 0
    try:
        while nxt < len(items) or running:
            for f in [f for f in running if f.done()]:
                out[running.pop(f)] = f.result()
            while nxt < len(items) - 1 and len(running) < 2 * workers:    # the last item is this process's
                running[pool.submit(_run, items[nxt])] = nxt
                nxt += 1
            now = counter.value                     # read once: workers keep adding to it
            if progress and now > seen:
                progress(now - seen)
                seen = now
            if nxt < len(items):
                out[nxt] = guard(fn, items[nxt], progress or _ignore)
                nxt += 1
            elif running:
                wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
        return unguard(out)
    except BrokenProcessPool as exc:
        raise errors.RmqError(f"a worker process died ({exc}); try --jobs 1") from None
    except BaseException:                     # interrupted (Ctrl-C): stop the workers, not just their queue
        for proc in list((pool._processes or {}).values()):     # Python < 3.14 has no public terminate
            proc.terminate()
        raise
    finally:
        pool.shutdown(cancel_futures=True)
