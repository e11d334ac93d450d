"""Which records a rebuild dispatches: the correct state by default, or what the broker would.

Default: every readable record of every commit-log file (a damaged record is stepped over, see
``rmqtool.store.broker_model.step_over``, and listed in ``DispatchPlan.damaged``); the writers then put
each unit at its stored queue offset. ``as_broker``: the records a broker of that version dispatches
after ``load()`` with no consume queues (rmqtool.store.broker_model: normal recovery from its start file,
cut at the first bad record there; older files read by the dispatch only, which checks no body CRC and
skips the rest of a file at a bad magic code); the writers then append as ConsumeQueue.putMessagePositionInfo.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator

from rmqtool.errors import StoreError, StoreWarning
from rmqtool.ops.facts import FileFacts, Progress, QueueNames, scan_files
from rmqtool.store.broker_model import (V4, V5, VERSIONS, normal_recovery_start, recovered_tail, recovery_stop,
                                        refusal, refused_files, reput_reads_size)
from rmqtool.store.filequeue import QueueFile
from rmqtool.store.store import Store


@dataclass
class DispatchPlan:
    as_broker: str | None = None
    damaged: list[tuple[int, int, str]] = field(default_factory=list)   # (offset, bytes skipped, kind)
    cut: int | None = None            # as_broker: where the broker's recovery truncates the commit log
    end: int | None = None            # the end of the data dispatched (the last file's; not for DLedger)
    jobs: int | None = None           # worker processes for the walk (facts.scan_files; None: by size)


def broker_version(store: Store, explicit: str | None = None) -> str:
    """--broker-version, else the version the store's traces show (Store.broker_version)."""
    if explicit:
        if explicit not in VERSIONS:
            raise ValueError(f"broker version {explicit!r}: one of {', '.join(VERSIONS)}")
        return explicit
    return V5 if store.is_5x else V4


def valid_facts(store: Store, names: QueueNames, *, start: int | None = None, deep: bool = False,
                keys: bool = False, props: bool = False, progress: Progress | None = None,
                jobs: int | None = None) -> Iterator[FileFacts]:
    """The files' records the broker would dispatch, in order, up to the first invalid record
    (from the file holding ``start``, whose records before it are left out); walked in ``jobs`` worker
    processes (facts.scan_files). A file cut to its whole records (store.readable, read anyway) is read to
    that end and the walk goes on in the next file, as every reader reads it."""
    files = [f for f in store.commitlog.queue.files if f.length]
    options = {"deep": deep, "keys": keys, "props": props, "ledger": bool(store.commitlog.entry_header_size)}
    if start is not None:
        files = [f for f in files if f.start + f.length > start]
    for f, facts in zip(files, scan_files([(f, options) for f in files], names, jobs, progress)):
        if start is not None and f.start < start:
            facts = facts.select(facts.columns["offset"] >= start)
        yield facts
        if facts.stop != "blank" and not (f.limit is not None and facts.stop == "file_end"):
            return


def loaded_files(store: Store, as_broker: str | None) -> list[QueueFile]:
    """The commit-log files with data a rebuild reads. A file the broker's load refuses (broker_model
    refused_files: a stray or truncated file) leaves the broker no result: ``as_broker`` refuses the store
    (StoreError, one line naming the file and the rule); the correct state is built from the other files, a
    wrong-size file before the last left out (not one the broker maps there: a 4 KiB stray would shadow the
    offsets of the file before it) and each named in a warning."""
    queue = store.commitlog.queue
    refused = refused_files(queue)
    if refused and as_broker is not None:
        f, problem = refused[0]
        raise StoreError(refusal(problem, as_broker) + ": there is no broker result to reproduce", path=str(f.path))
    last = queue.files[-1] if queue.files else None
    for f, problem in refused:
        warnings.warn(StoreWarning(f"{f.path}: {refusal(problem)} until it is "
                                   + ("restored to its size (repair)" if f is last else
                                      f"restored to its size; the rebuild reads its {f.limit} readable byte(s)"
                                      if f.limit is not None else
                                      "moved out of the commit-log directory; the rebuild leaves it out")))
    left_out = {f.path for f, _ in refused if f is not last and f.limit is None}   # cut by store.readable: read
    return [f for f in queue.files if f.length and f.path not in left_out]


def keeps_walk(store: Store, plan: DispatchPlan) -> bool:
    """Whether ``dispatched_facts`` yields every file's records as its walk found them (the correct state
    of a commit log without DLedger entries): no file left out after a cut or a stop, no record dropped."""
    return plan.as_broker is None and not store.commitlog.entry_header_size


def dispatched_facts(store: Store, names: QueueNames, plan: DispatchPlan, *, keys: bool = False,
                     props: bool = False, progress: Progress | None = None,
                     in_worker: Callable[[FileFacts, QueueNames], FileFacts] | None = None) -> Iterator[FileFacts]:
    """The records to dispatch, file by file; ``plan.damaged`` (and ``plan.cut``) filled as files go.
    ``in_worker``: facts.scan_files' step in each worker process, for a plan that keeps every file's
    records as walked (``keeps_walk``)."""
    if in_worker is not None and not keeps_walk(store, plan):
        raise ValueError("in_worker needs a plan that keeps every record walked")
    ledger = bool(store.commitlog.entry_header_size)
    if ledger:               # DLedger: every entry the log holds is dispatched (both versions)
        yield from valid_facts(store, names, keys=keys, props=props, progress=progress, jobs=plan.jobs)
        return
    files = loaded_files(store, plan.as_broker)
    start = len(files) if plan.as_broker is None else \
        normal_recovery_start([f.start for f in files], plan.as_broker, -1)
    # read by the broker's recovery (from ``start`` on): CRC checked
    items = [(f, {"deep": plan.as_broker is None or i >= start, "keys": keys, "props": props, "salvage": True})
             for i, f in enumerate(files)]
    for i, facts in enumerate(scan_files(items, names, plan.jobs, progress, in_worker)):
        recovered = i >= start
        tail = _recovered_tail(facts)
        if tail is not None:                         # the data's end, as every reader takes it
            facts.damaged = facts.damaged[:-1]
        plan.damaged += facts.damaged
        stop = recovery_stop(plan.as_broker, facts.damaged[0][0] if facts.damaged else None,
                             facts.oversized_blank) if plan.as_broker is not None and recovered else None
        if stop is not None:                         # CommitLog.recoverNormally: truncated here
            plan.cut = plan.end = stop
            yield facts.select(facts.columns["offset"] < stop)
            return
        plan.end = facts.end if tail is None else tail
        if plan.as_broker is not None and facts.damaged:
            at, _, kind = facts.damaged[0]
            if not reput_reads_size(kind):           # ReputMessageService.doReput: the rest of the file skipped
                facts = facts.select(facts.columns["offset"] < at)
        yield facts


def _recovered_tail(facts: FileFacts) -> int | None:
    """The offset of the file's last damaged record when it is the torn record a broker-recovered store keeps
    past its end (broker_model.recovered_tail), else None."""
    if not facts.damaged:
        return None
    at, f = facts.damaged[-1][0], facts.file
    return at if recovered_tail(f.path, f.read(), at - f.start) else None
