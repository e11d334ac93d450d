"""Regenerate consume queues and index files from the commit log, as the broker's dispatch does.

The plan lives here: which records go to which queue (``dispatch_files``), where the files are built and
what is swapped in. The files are written by the store's writers (``rmqtool.store.queue_writer``,
``rmqtool.store.index_builder``), shared with repair and put/import. Records come from
``rmqtool.ops.facts``, one commit-log file at a time.
"""

from __future__ import annotations

import os
import shutil
from contextlib import closing, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rmqtool import constants as C
from rmqtool.columnar.joins import queue_rows, unbroken
from rmqtool.errors import FormatError, StoreError
from rmqtool.format.indexfile import Geometry
from rmqtool.ops.dispatch_plan import DispatchPlan, dispatched_facts, keeps_walk, valid_facts
from rmqtool.ops.facts import FileFacts, Progress, QueueNames, int_values, present, value_at
from rmqtool.store import layout as L
from rmqtool.store.atomic import BUILD, Transaction
from rmqtool.store.bounds import PlanSize, file_data
from rmqtool.store.broker_model import possible_queue_offset, stale_units_only
from rmqtool.store.filequeue import same_content
from rmqtool.store.index_builder import IndexBuilder
from rmqtool.store.metadata import batch_cq_topics
from rmqtool.store.queue_writer import (UNIT_DTYPE, BcqFileWriter, ComparedQueue, CqFileWriter, Misplaced,
                                        OpenQueueFiles, compare_run, safe_topic_dir, write_run)
from rmqtool.store.readable import unread_records_before
from rmqtool.store.store import Store


@dataclass
class RebuildResult:
    topics: list[str] = field(default_factory=list)     # the topics of the records seen
    changes: list[tuple[str, str, str]] = field(default_factory=list)   # dry run: (action, queue dir, detail)
    queues: int = 0
    files: int = 0
    units: int = 0
    target: str = ""
    backup: str | None = None
    damaged: list[tuple[int, int, str]] = field(default_factory=list)   # records skipped: (offset, bytes, kind)
    cut: int | None = None                                              # as_broker: the broker's truncation
    missing: list[str] = field(default_factory=list)    # topics asked for without a record
    misplaced: list[tuple[str, int, int, int, int | None, bool]] = field(default_factory=list)
    # units whose stored queue offset is not their place (rule reput_misplaced): (topic, queue id, record offset,
    # stored queue offset, placed at (None: skipped as repeated), first of its queue)
    size: PlanSize = field(default_factory=PlanSize)     # what the rebuild creates, replaces, deletes

    def lmq_placed(self) -> int:
        """How many of ``misplaced`` are LMQ units: the broker appends an LMQ unit at its queue's end whatever
        offset its record asks for (ConsumeQueue.putMessagePositionInfo of a multi-dispatch), so these are its
        own placement, not damage: nothing for a rebuild to do."""
        return sum(t.startswith(C.LMQ_PREFIX) for t, *_ in self.misplaced)


def rebuild_consume_queues(store: Store, *, topics: Sequence[str] = (), out: Path | None = None,
                           cq_file_size: int | None = None, bcq_file_size: int | None = None, dry_run: bool = False,
                           backup: Path | None = None, allow_empty: bool = True, as_broker: str | None = None,
                           progress: Progress | None = None, jobs: int | None = None,
                           check: Callable[[PlanSize], None] | None = None) -> RebuildResult:
    """Consume queues (all, or those of ``topics``) rebuilt from the commit log as the broker's dispatch
    writes them: classic and LMQ queues under ``consumequeue/``, BatchCQ topics' queues under
    ``batchconsumequeue/``. Into ``out`` (<topic>/<queueId>/ for every kind), compared with the store's files
    as they would be written (``dry_run``: nothing written), or built beside the store's directories and
    swapped in. When one of ``topics`` has no records, nothing
    changes unless ``allow_empty`` (``result.missing`` names them, ``result.topics`` lists the commit
    log's topics). Every readable record goes at its queue offset (damaged ones listed in
    ``result.damaged``), or as a broker of version ``as_broker`` dispatches them (rmqtool.ops.dispatch_plan).
    ``jobs``: worker processes for the walk; where each unit goes at its queue offset (not ``as_broker``,
    no DLedger), they write (a dry run: compare) the queue runs that go on where their queue stands, this
    process the rest (dispatch_files' ``place``). ``check`` sees the plan's size before anything is swapped
    in (and, with ``out``, before the rebuild returns; what it raises leaves ``out`` empty): store.bounds."""
    if store.consumequeue_is_rocksdb and out is None:
        from rmqtool.store.rocksdbcq import read_only_error
        raise read_only_error(store.consumequeue_dir)
    sizes = store.queue_file_sizes(cq_file_size, bcq_file_size)
    batch = batch_cq_topics(store)
    topics = list(dict.fromkeys(topics))
    for t in topics:
        safe_topic_dir(t)
    if topics:        # one directory per topic, keyed by topic
        rels = {t: L.queue_dir(t, batch=t in batch) for t in topics}
    else:             # one directory per kind, keyed by is_batch
        kinds = [False] + ([True] if batch or store.batch_consumequeue_dir.is_dir() else [])
        rels = {kind: L.BATCHCONSUMEQUEUE if kind else L.CONSUMEQUEUE for kind in kinds}
    result = RebuildResult(target=str(out or store.root / next(iter(rels.values()))))
    if out is not None and not dry_run:
        out = Path(out)
        if out.exists() and any(out.iterdir()):
            raise StoreError("output directory is not empty", path=str(out))
    made_out = out is not None and not dry_run and not out.exists()     # goes again if the rebuild fails
    built = {kind: store.root / (rel + BUILD) for kind, rel in rels.items()} if out is None and not dry_run else {}
    for path in built.values():
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)

    written = [out] if out is not None and not dry_run else []         # empty before the rebuild
    made = [*built.values(), *written]

    def undo() -> None:
        _clear(written)
        if made_out:
            with suppress(OSError):
                out.rmdir()
        for path in built.values():
            shutil.rmtree(path, ignore_errors=True)

    def dispatch(place: bool):
        plan = DispatchPlan(as_broker, jobs=jobs)
        # a dry run writes nothing: each queue's files compared with the store's as they would be written
        directory = _Compared(store.root) if dry_run else _Directories(out, built, bool(topics))
        return plan, directory, dispatch_files(store, directory, sizes, batch, topics=set(topics) or None,
                                               plan=plan, progress=progress, place=place and keeps_walk(store, plan))

    try:
        try:
            plan, directory, (writers, result.topics) = dispatch(True)
        except Misplaced:                        # a worker's run is not where one process puts it
            _clear(made)
            plan, directory, (writers, result.topics) = dispatch(False)
        result.damaged, result.cut = plan.damaged, plan.cut
        result.missing = [t for t in topics if not any(wt == t for wt, _ in writers)]
        if result.missing and not allow_empty:
            raise _NoRecords
    except BaseException as exc:                 # leave nothing half-built behind (``out`` was empty)
        undo()
        if isinstance(exc, _NoRecords):
            return result
        raise
    result.misplaced = sorted((t, qid, *m) for (t, qid), w in writers.items() for m in getattr(w, "misplaced", ()))
    result.queues, result.files = len(writers), sum(w.created for w in writers.values())
    result.units = sum((w.write_pos - (getattr(w, "first_created", 0) or 0)) // C.CQ_STORE_UNIT_SIZE
                       for w in writers.values())
    try:
        if dry_run:
            result.changes, result.size = _changes(store, {rel: directory.under(rel) for rel in rels.values()},
                                                   plan.end)
        elif out is not None:
            result.size.add_tree(out)
        else:
            _, result.size = _changes(store, {rels[key]: _Built(path) for key, path in built.items()}, plan.end)
        for t, qid, phy, stored, _, _ in result.misplaced:
            result.size.why[f"{t}/{qid}" if out is not None else L.queue_dir(t, qid)] = \
                f"queue offset {stored} of the record at {phy}"
        if check is not None and not dry_run:
            check(result.size)
    except BaseException:
        undo()
        raise
    if dry_run or out is not None:
        return result
    if all(_same_tree(path, store.root, rels[key], plan.end) for key, path in built.items()):
        for path in built.values():       # a rebuild of healthy queues changes nothing
            shutil.rmtree(path)
        return result
    txn = Transaction(store.root, backup, label="rebuild-cq")
    for key, path in built.items():
        txn.replace_dir(rels[key], path)
    result.backup = str(txn.commit())
    return result


@dataclass(frozen=True)
class _Directories:
    """Where a rebuild puts a queue's files (picklable: worker processes write there too): under ``out`` as
    <topic>/<queueId>, else in the built directories."""

    out: Path | None
    built: dict
    by_topic: bool

    def __call__(self, t: str, qid: int, is_batch: bool) -> Path:
        if self.out is not None:
            return self.out / t / str(qid)
        return self.built[t] / str(qid) if self.by_topic else self.built[is_batch] / t / str(qid)

    def run(self, t: str, qid: int, file_size: int, queue_offset: int, units: np.ndarray) -> list:
        """A worker's run of a classic queue written at its place (``place_runs``)."""
        write_run(self(t, qid, False), file_size, queue_offset, units, _KEPT)
        return []


class _Compared:
    """A dry run's queues: each one's writes compared with the store's files as they come
    (``queue_writer.ComparedQueue``), nothing written; a worker's runs are compared where it walks
    (``run``) and taken here in order (``ComparedQueue.took``)."""

    def __init__(self, root: Path):
        self.root = root
        self.queues: dict[str, ComparedQueue] = {}

    def run(self, t: str, qid: int, file_size: int, queue_offset: int, units: np.ndarray) -> list:
        return compare_run(self.root / L.queue_dir(t, qid), file_size, queue_offset, units)

    def __call__(self, t: str, qid: int, is_batch: bool) -> ComparedQueue:
        rel = L.queue_dir(t, qid, batch=is_batch)
        if rel not in self.queues:
            self.queues[rel] = ComparedQueue(self.root / rel)
        return self.queues[rel]

    def under(self, rel: str) -> "_ComparedTree":
        """The files compared below the store's directory ``rel``, by their path under it."""
        return _ComparedTree({f"{q[len(rel) + 1:]}/{name}": f for q, queue in self.queues.items()
                              if q.startswith(rel + "/") for name, f in queue.files.items()})


class _ComparedTree:
    """A dry run's rebuilt files below one store directory (path under it -> ``ComparedQueueFile``)."""

    def __init__(self, files: dict):
        self.files = files

    def names(self) -> list[str]:
        return sorted(self.files)

    def same(self, name: str, theirs: Path, stale_end: int | None) -> bool:
        return self.files[name].same(stale_end)

    def data(self, name: str) -> tuple[int, int]:
        return self.files[name].data, self.files[name].size


class _Built:
    """Rebuilt files in a directory (the built directory of one store directory), by their path under it."""

    def __init__(self, root: Path):
        self.root = root

    def names(self) -> list[str]:
        return sorted(_files_below(self.root))

    def same(self, name: str, theirs: Path, stale_end: int | None) -> bool:
        return _same_file(self.root / name, theirs, stale_end)

    def data(self, name: str) -> tuple[int, int]:
        return file_data(self.root / name)


def _clear(dirs: list[Path]) -> None:
    """Everything inside ``dirs`` removed (the directories stay)."""
    for d in dirs:
        for p in (list(d.iterdir()) if d.is_dir() else []):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _same_file(mine: Path, theirs: Path, stale_end: int | None) -> bool:
    """Whether the store's file ``theirs`` is the rebuilt ``mine``: byte for byte, or with ``stale_end`` (a
    classic queue's file and the commit log's end) one whose only other units are those the broker drops on
    every load (broker_model.stale_units_only: a broker-recovered store's stale unit past the end)."""
    return same_content(mine, theirs) or (stale_end is not None
                                          and stale_units_only(theirs.read_bytes(), mine.read_bytes(), stale_end))


def _stale_end(rel: str, end: int | None) -> int | None:
    """The commit log's end where the stale-unit rule holds for files below ``rel`` (classic queues), else None."""
    return end if rel.split("/")[0] == L.CONSUMEQUEUE else None


def _changes(store: Store, trees: dict, end: int | None) -> tuple[list[tuple[str, str, str]], PlanSize]:
    """What swapping each store directory's rebuilt files (``trees``: store directory -> its rebuilt files) in
    for the directory changes: (action, queue directory, detail) for each queue whose files differ, and the
    size (files new to the store created, those it changes, the rest of its files deleted). Each directory
    listed once, each file compared once."""
    out, size = [], PlanSize()
    for rel, tree in trees.items():
        theirs, stale_end = store.root / rel, _stale_end(rel, end)
        have, mine = _files_below(theirs), tree.names()
        same = {name: tree.same(name, theirs / name, stale_end) for name in mine if name in have}
        queues: dict[str, tuple[set[str], set[str]]] = {}
        for names, side in ((mine, 0), (have, 1)):
            for name in names:
                q, _, file = name.rpartition("/")
                queues.setdefault(q, (set(), set()))[side].add(file)
        for q, (files_a, files_b) in sorted(queues.items()):
            if not files_a:
                out.append(("delete_cq", f"{rel}/{q}", "the commit log has no record for this queue"))
            elif files_a != files_b or not all(same[f"{q}/{n}"] for n in files_a):
                out.append(("write_cq", f"{rel}/{q}", f"{len(files_a)} file(s) differ from the rebuilt ones"))
        for name in mine:
            if name in have:
                size.changed += not same[name]
            else:
                size.create(f"{rel}/{name}", *tree.data(name))
        size.deleted += len(have.difference(mine))
    return out, size


def _files_below(root: Path) -> set[str]:
    """The files below ``root`` by their path under it ('/'-separated; symbolic links to directories not
    followed)."""
    found = set()
    for top, _, files in os.walk(root):
        under = os.path.relpath(top, root)
        for name in files:
            if os.path.isfile(os.path.join(top, name)):
                found.add(name if under == "." else f"{under}/{name}")
    return found


def _same_tree(mine: Path, root: Path, rel: str, end: int | None) -> bool:
    """Whether the store's directory ``rel`` (under ``root``) holds the files under ``mine`` (``_same_file``)."""
    theirs = root / rel
    names = _files_below(mine)
    return theirs.is_dir() and names == _files_below(theirs) \
        and all(_same_file(mine / n, theirs / n, _stale_end(rel, end)) for n in names)


class _NoRecords(Exception):
    """The topic asked for has no records: nothing is rebuilt."""


Writer = CqFileWriter | BcqFileWriter


def dispatch_files(store: Store, directory, sizes: tuple[int, int], batch_topics: set[str], *,
                   topics: set[str] | None = None, plan: DispatchPlan | None = None,
                   progress: Progress | None = None, place: bool = False) -> tuple[dict[tuple[str, int], Writer], list[str]]:
    """The broker's dispatch over the whole commit log, one file's records at a time: each record's
    consume-queue unit (a batch unit on a BatchCQ topic) and its multi-dispatch (LMQ) units, each queue's
    run put as one block. ``directory(topic, queue_id, is_batch)`` says where a queue's files go.
    ``plan``: the records of ``rmqtool.ops.dispatch_plan`` (default: those up to the first invalid one),
    each unit at its queue offset unless ``plan.as_broker``.
    ``place`` (a plan that ``keeps_walk``; ``directory`` picklable, with ``run``): worker processes that walk
    files write their queue runs whose units go at their queue offsets themselves (``place_runs``; a dry
    run's compare them), this process takes them in order (CqFileWriter.placed); when one would not go where
    ``put_many`` puts it, ``Misplaced`` is raised (the files are then not the rebuild's: start again without
    ``place``).
    Returns the writers by queue and the topics of the records seen."""
    from rmqtool.format.dispatch import is_lmq

    names = QueueNames()
    writers: dict[int, Writer] = {}
    if plan is None:
        records = valid_facts(store, names, props=True, progress=progress)
    else:
        in_worker = partial(place_runs, directory=directory, file_size=sizes[0], batch_topics=batch_topics,
                            topics=topics) if place else None
        records = dispatched_facts(store, names, plan, props=True, progress=progress, in_worker=in_worker)

    def writer(code: int, is_batch: bool, at: int) -> Writer:
        w = writers.get(code)
        if w is None:
            t, qid = names.names[code]
            safe_topic_dir(t, at)
            kind, where = BcqFileWriter if is_batch else CqFileWriter, directory(t, qid, is_batch)
            w = writers[code] = kind(sizes[is_batch], None, where) if isinstance(where, ComparedQueue) else \
                kind(sizes[is_batch], where)
            if not is_batch and plan is not None and plan.as_broker is None and not is_lmq(t):
                w.fill_gaps = True           # LMQ offsets are the broker's dispatch, not the record's own
                w.skipped_before = partial(_skipped_before, plan.damaged, store.commitlog.skipped)
        return w

    with closing(records):                   # stops the workers before the caller cleans up
        for facts in records:
            skip = None
            if facts.placed is not None:
                parts = iter(facts.compared.tolist())
                part = next(parts, None)
                for i, (code, offset, count, phy, first_end, last_end) in enumerate(facts.placed.tolist()):
                    if not writer(code, False, phy).placed(offset, count, first_end, last_end):
                        raise Misplaced
                    while part is not None and part[0] == i:     # a dry run's: compared where it was walked
                        _, start, pos, n, differs, nonzero_end = part
                        directory(*names.names[code], False).took(C.offset_to_file_name(start), sizes[0], pos, n,
                                                                  None if differs < 0 else differs,
                                                                  None if nonzero_end < 0 else nonzero_end)
                        part = next(parts, None)
                skip = facts.placed[:, 0]
            for is_batch, first, phy, size, tags, offset, rest in queue_runs(facts, names, batch_topics, topics, skip):
                for code in np.flatnonzero(first[1:] > first[:-1]).tolist():
                    lo, hi = int(first[code]), int(first[code + 1])
                    w = writer(code, is_batch, int(phy[lo]))
                    if is_batch:
                        w.put_many(phy[lo:hi], size[lo:hi], tags[lo:hi], rest[lo:hi], offset[lo:hi] >> 16,
                                   offset[lo:hi] & 0xFFFF)
                    else:
                        units, whole, _ = rest
                        w.put_many(phy[lo:hi], size[lo:hi], tags[lo:hi], offset[lo:hi], units[lo:hi], bool(whole[code]))
    for w in writers.values():
        w.flush()
    return {names.names[c]: w for c, w in writers.items()}, sorted({t for t, _ in names.names})


def _skipped_before(damaged: list[tuple[int, int, str]], unread: tuple, phy: int) -> int:
    """The records the dispatch stepped over before commit-log offset ``phy`` (CqWriter.skipped_before): the
    damaged ones, and those the parts not read (``unread``: a read anyway's skipped parts) can hold."""
    return sum(1 for at, _, _ in damaged if at < phy) + unread_records_before(unread, phy)


def queue_runs(facts: FileFacts, names: QueueNames, batch_topics: set[str], topics: set[str] | None,
               skip: np.ndarray | None = None):
    """A file's units grouped by queue code in record order, per kind: (is_batch, first, phy, size, tags,
    queue offset, rest) where code c's units are rows first[c]:first[c + 1], ``rest`` is the store
    times of batch units, (units encoded as UNIT_DTYPE, whether each queue's run is unbroken, their
    records) of the others. Multi-dispatch (LMQ) units follow the records' own; queues of ``topics`` only, none of ``skip``."""
    cols = facts.columns
    rows = np.flatnonzero(facts.gets_cq_unit())
    on_batch = np.isin(cols["queue"][rows], _codes(names, batch_topics))
    kinds = [(False, _with_multi_dispatch(facts, names, rows[~on_batch])), (True, batch_units(facts, rows[on_batch]))]
    del rows, on_batch                  # each array below goes as soon as it is used: a worker's peak is here
    while kinds:
        is_batch, (queue, rec, offset) = kinds.pop(0)
        keep = None if topics is None else np.isin(queue, _codes(names, topics))
        if skip is not None:
            keep = ~np.isin(queue, skip) if keep is None else keep & ~np.isin(queue, skip)
        if keep is not None:
            queue, rec, offset = queue[keep], rec[keep], offset[keep]
            del keep
        if len(rec) > 1 and (rec[1:] < rec[:-1]).any():     # multi-dispatch units follow the records' own
            order = np.argsort(rec, kind="stable")
            queue, rec, offset = queue[order], rec[order], offset[order]
        order, first = queue_rows(queue.astype(np.int32, copy=False), len(names.names))   # by queue, record order within
        del queue
        rec, offset = rec[order], offset[order]
        del order
        if is_batch:
            yield True, first, cols["offset"][rec], cols["size"][rec], cols["tags_code"][rec], offset, \
                cols["store_timestamp"][rec]
            continue
        units = np.empty(len(rec), UNIT_DTYPE)       # the units, encoded once; their fields serve as the columns
        for name, col in (("phy", "offset"), ("size", "size"), ("tags", "tags_code")):
            units[name] = cols[col][rec]
        phy, size = units["phy"], units["size"]
        whole = unbroken(first, offset, np.add(phy, size, dtype=np.int64))
        yield False, first, phy, size, units["tags"], offset, (units, whole, rec)


def _codes(names: QueueNames, topics: set[str]) -> list[int]:
    return [c for c, (t, _) in enumerate(names.names) if t in topics]


def place_runs(facts: FileFacts, names: QueueNames, *, directory, file_size: int, batch_topics: set[str],
               topics: set[str] | None) -> FileFacts:
    """In a worker process, after its walk of one file: each classic and LMQ queue's run of the file
    whose queue offsets step by one and whose ends rise written at its queue offsets (``directory.run``:
    ``write_run``, a dry run's ``compare_run``), as ``put_many`` writes it when the run goes on where the
    queue stands (``CqFileWriter.placed`` checks that in order). Returned: the facts of the records with
    units left to put (batch units, broken runs), ``placed`` naming the runs written, ``compared`` a dry
    run's comparisons. Topics are checked (safe_topic_dir) as ``dispatch_files``
    checks them, in the same order, before anything is written. LMQ queues are left to the caller:
    ConsumeQueue.putMessagePositionInfo appends an LMQ unit at its queue's end whatever offset it asked
    for (a gap in INNER_MULTI_QUEUE_OFFSET is not kept), so their places need the queue's whole past."""
    from rmqtool.format.dispatch import is_lmq

    keep = np.zeros(len(facts), bool)
    placed, compared = [], []
    for is_batch, first, phy, size, _, offset, rest in queue_runs(facts, names, batch_topics, topics):
        if is_batch:                       # put by the caller
            keep |= np.isin(facts.columns["queue"], _codes(names, batch_topics))
            continue
        units, whole, rec = rest
        codes = np.flatnonzero(first[1:] > first[:-1]).tolist()
        for code in codes:
            safe_topic_dir(names.names[code][0], int(phy[first[code]]))
        for code in codes:
            lo, hi = int(first[code]), int(first[code + 1])
            t, qid = names.names[code]
            if not whole[code] or is_lmq(t) or not possible_queue_offset(int(phy[lo]), int(offset[lo])):
                # an LMQ unit goes where its queue stands, gap or not; an impossible offset where the caller says
                keep[rec[lo:hi]] = True
                continue
            compared += [(len(placed), *part) for part in directory.run(t, qid, file_size, int(offset[lo]),
                                                                         units[lo:hi])]
            placed.append((code, int(offset[lo]), hi - lo, int(phy[lo]), int(phy[lo]) + int(size[lo]),
                           int(phy[hi - 1]) + int(size[hi - 1])))
    out = facts.select(keep)
    out.placed = np.array(placed, np.int64).reshape(-1, 6)
    out.compared = np.array(compared, np.int64).reshape(-1, 6)
    return out


_KEPT = OpenQueueFiles()         # a worker's queue files, open from one file's runs to the next (place_runs)


def _with_multi_dispatch(facts: FileFacts, names: QueueNames,
                         rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(queue, record, queue offset asked for) of the records' own units, plus one per multi-dispatch
    target (INNER_MULTI_DISPATCH / INNER_MULTI_QUEUE_OFFSET, format.dispatch's rules)."""
    from rmqtool.format.dispatch import is_lmq, multi_dispatch_targets

    cols = facts.columns
    queue, rec, offset = [cols["queue"][rows]], [rows], [cols["queue_offset"][rows]]
    targets = facts.props[C.PROPERTY_INNER_MULTI_DISPATCH]
    asked = facts.props[C.PROPERTY_INNER_MULTI_QUEUE_OFFSET]
    extra = []
    for r in rows[present(targets)[rows]].tolist():
        topic, qid = names.names[int(cols["queue"][r])]
        props = {C.PROPERTY_INNER_MULTI_DISPATCH: value_at(targets, r),
                 C.PROPERTY_INNER_MULTI_QUEUE_OFFSET: value_at(asked, r) or ""}
        for name, text in multi_dispatch_targets(topic, props):
            if "/" in name:
                continue
            try:
                extra.append((names.code((name, 0 if is_lmq(name) else qid)), r, int(text)))
            except ValueError:
                break                     # Long.parseLong fails: the broker stops there
    if extra:
        e = np.array(extra, np.int64)
        queue.append(e[:, 0]), rec.append(e[:, 1]), offset.append(e[:, 2])
    return np.concatenate(queue), np.concatenate(rec), np.concatenate(offset)


def batch_units(facts: FileFacts, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(queue, record, msgBaseOffset << 16 | batchSize) of records on BatchCQ topics: INNER_BASE and
    INNER_NUM when both are set (CommitLog.setBatchSizeIfNeeded), else the queue offset and 1."""
    cols = facts.columns
    base = cols["queue_offset"][rows].copy()
    size = np.ones(len(rows), np.int64)
    num, inner = facts.props[C.PROPERTY_INNER_NUM], facts.props[C.PROPERTY_INNER_BASE]
    both = (present(num) & present(inner))[rows]
    if both.any():
        try:
            base[both] = int_values(inner, rows[both])
            size[both] = int_values(num, rows[both])
        except ValueError as exc:                       # pyarrow's ArrowInvalid
            raise FormatError(f"bad INNER_BASE/INNER_NUM: {exc}", path=str(facts.file.path)) from None
    return cols["queue"][rows], rows, base << 16 | size


def rebuild_index(store: Store, *, slots: int | None = None, max_entries: int | None = None,
                  dry_run: bool = False, backup: Path | None = None, plan: DispatchPlan | None = None,
                  progress: Progress | None = None, size: PlanSize | None = None,
                  check: Callable[[PlanSize], None] | None = None) -> tuple[list[tuple[str, int, bool]], Path | None]:
    """All index files rebuilt from the commit log, as (file name, entries, same as the existing file);
    swapped in for ``index/`` unless dry_run. Files are built as sparse files beside ``index/``; a dry run
    writes none: each is compared with the existing files as it would be written. ``plan``: which records
    (rmqtool.ops.dispatch_plan; its damaged records are listed there). ``size`` gets the plan's size, which
    ``check`` sees before the swap."""
    geometry = store.index_geometry(slots, max_entries)
    plan = plan or DispatchPlan()
    size = size if size is not None else PlanSize()
    if dry_run:                           # nothing in the store changes, not even a directory's time
        files = _build_index(store, geometry, None, plan, progress, size)[0]
        return files, None
    built = store.path(L.INDEX + BUILD)
    if built.exists():
        shutil.rmtree(built)
    built.mkdir(parents=True)
    try:
        files, builder = _build_index(store, geometry, built, plan, progress, size)
        if check is not None:
            check(size)
    except BaseException:                 # leave nothing half-built behind
        shutil.rmtree(built, ignore_errors=True)
        raise
    if all(same for _, _, same in files) and len(files) == len(store.index_files()):
        shutil.rmtree(built)              # a rebuild of a healthy index changes nothing
        return files, None
    txn = Transaction(store.root, backup, label="rebuild-index")
    txn.replace_dir(L.INDEX, built)
    cp = store.checkpoint()
    if cp is not None and builder.full_end_timestamp is not None:
        from rmqtool.format.checkpoint import encode_checkpoint
        txn.write(L.CHECKPOINT, encode_checkpoint(cp._replace(index_msg_timestamp=builder.full_end_timestamp)))
    return files, txn.commit()


def _build_index(store: Store, geometry: Geometry, built: Path | None, plan: DispatchPlan,
                 progress: Progress | None, size: PlanSize) -> tuple[list[tuple[str, int, bool]], IndexBuilder]:
    """Index files for the whole commit log, built in ``built`` (None: compared with the existing files as
    they would be written, nothing written), each named as ``_kept_names`` says and compared with the existing
    file of its name; ``size`` gets the files created (not among the store's), changed and deleted."""
    old_dir = store.index_dir
    old = sorted(ref.name for ref in store.index_files())
    against = (lambda i, name: [old_dir / n for n in (*old[i:i + 1], name)]) if built is None else None
    builder = IndexBuilder(geometry, directory=built, against=against)
    trim = _index_facts if keeps_walk(store, plan) else None
    for facts in dispatched_facts(store, QueueNames(), plan, keys=True, progress=progress, in_worker=trim):
        builder.add_facts(facts)
    builder.close()
    names, writers = [name for name, _ in builder.files], [w for _, w in builder.files]
    compared: dict[tuple[int, str], bool] = {}

    def equal(i: int, name: str) -> bool:
        """Whether the new file at place i holds the bytes of the existing file ``name``."""
        if built is None:
            return old_dir / name in writers[i].same_as
        if (i, name) not in compared:
            compared[i, name] = (old_dir / name).is_file() and same_content(old_dir / name, built / names[i])
        return compared[i, name]

    kept = _kept_names(names, old, equal)
    files = [(name, w.index_count - 1, equal(i, name)) for i, (name, w) in enumerate(zip(kept, writers))]
    if built is not None:
        moved = [(name, have) for name, have in zip(names, kept) if name != have]
        for name, _ in moved:                      # out of the way first: a new name may be another's old one
            (built / name).rename(built / f".{name}.kept")
        for name, have in moved:
            (built / f".{name}.kept").rename(built / have)
    for (name, _, same), w in zip(files, writers):
        if name in old:
            size.changed += not same
        else:
            size.create(L.index_file(name), *(file_data(built / name) if built is not None
                                               else (w.data, geometry.file_size)))
    size.deleted += len(set(old) - set(kept))
    return files, builder


def _index_facts(facts: FileFacts, names: QueueNames) -> FileFacts:
    """A worker's facts with only what IndexBuilder.add_facts reads (offsets, store times, sys flags, key
    hashes): ~60 % of the bytes sent back (a GiB of commit log: 67 MiB instead of 113), each a page this
    process maps."""
    facts.columns = {k: facts.columns[k] for k in INDEX_COLUMNS}
    return facts


INDEX_COLUMNS = ("offset", "store_timestamp", "sys_flag")


def _kept_names(names: list[str], old: list[str], equal: Callable[[int, str], bool]) -> list[str]:
    """The rebuilt files' names, each replaced by that of the existing file at its place in the order when
    the two hold the same bytes (``equal(place, existing name)``: the broker names a file by the time it
    created it, which no rebuild knows), where the order stays: all of them at once where that keeps the
    names in order (a broker-written index: the time a file was created may pass its successor's first
    store time, so one renamed alone could seem out of order), else each one whose neighbours' names leave
    room for it."""
    kept = [have if have != name and equal(i, have) else name
            for i, (name, have) in enumerate(zip(names, old))] + names[len(old):]
    if kept != names and all(a < b for a, b in zip(kept, kept[1:])):
        return kept
    out = list(names)
    for i, (name, have) in enumerate(zip(names, old)):
        later = out[i + 1] if i + 1 < len(out) else None
        if have != name and (i == 0 or out[i - 1] < have) and (later is None or have < later) \
                and have not in out and equal(i, have):
            out[i] = have
    return out
