"""verify: every problem of a store with its file and byte offset, in memory flat in the store's size.

Three steps, none holding state per record of the whole store:

1. Consume queues and index files alone (``plan_store``): unit and entry sequences,
   file sizes, headers, chains. Each file's checkable units/entries become a ``Segment``: an index
   range whose physical offsets are known to rise, so any commit-log window can find its part by
   bisection.
2. One commit-log file at a time (``check_file``; in worker processes, or a Spark task each): the
   columnar walk (``rmqtool.ops.facts``), then the units and entries pointing into the file are
   joined to its records as numpy arrays. Only findings and small per-queue summaries leave it.
3. ``verify_store`` merges: the commit-log sequence, the written end (units past it), units missing
   per queue, queues missing, the index header's end time, the checkpoint.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from rmqtool import constants as C
from rmqtool.columnar.joins import join_entries, join_units, queue_rows, unmatched_keys
from rmqtool.columnar.units import new_state, walk_units
from rmqtool.errors import FormatError, StoreError
from rmqtool.ops.facts import FileFacts, Progress, QueueNames, scan_file
from rmqtool.ops.findings import ERROR, WARNING, Finding
from rmqtool.store.metadata import batch_cq_topics
from rmqtool.ops.workers import default_jobs, process_map
from rmqtool.store import layout as L
from rmqtool.store.atomic import pending_journal
from rmqtool.store.broker_model import (DAMAGE_KINDS, V5, VERSIONS, FileSummary, abnormal_recovery_start, level_of,
                                        normal_recovery_start,
                                        refused_files, start_outcome)
from rmqtool.store.filequeue import (FileQueue, QueueFile, first_difference, first_nonzero, first_nonzero_at,
                                     first_nonzero_byte, open_random, read_data, read_exact)
from rmqtool.store.readable import commitlog_view, unread_spans
from rmqtool.store.recognition import refused_entries
from rmqtool.store.lock import lock_is_held
from rmqtool.store.store import IndexFileRef, Store
from rmqtool.store.output import ScratchDir

UNIT_DTYPE = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
ENTRY_DTYPE = np.dtype([("hash", ">i4"), ("phy", ">i8"), ("time_diff", ">i4"), ("prev", ">i4")])
CHUNK = 1 << 16                       # units or entries checked per numpy pass
JOIN_RECORDS = 1 << 18                # records of a file whose index entries are joined at a time
JOIN_UNITS = 1 << 18                  # consume-queue units joined at a time (whole queues)
SEEK_ITEMS = 256                      # units or entries read around a guess where a file cuts a segment
_NO_END = (1 << 63) - 1            # the last file's window reaches to the end of offsets


# -- step 1: consume queues and index files alone ------------------------------------------------------
@dataclass
class Segment:
    """Checkable units (or entries) ``lo..hi`` of one file; ``ordered``: their offsets rise, with
    nothing uncheckable in between (else they are filtered one chunk at a time)."""

    path: Path
    lo: int
    hi: int
    first_phy: int
    last_phy: int
    ordered: bool = True


@dataclass
class QueuePlan:
    topic: str
    queue_id: int
    directory: Path
    segments: list[Segment] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    files: list[QueueFile] = field(default_factory=list)
    backwards: bool = False                   # offsets go backwards somewhere: see _QueueWalk
    order_findings: list[Finding] = field(default_factory=list)


@dataclass
class IndexPlan:
    ref: IndexFileRef
    segment: Segment | None = None
    findings: list[Finding] = field(default_factory=list)


def _read(path, dtype: np.dtype | str, count: int, offset: int) -> np.ndarray:
    """``count`` items at byte ``offset`` of a file (a path, or a file open already), read (not mapped:
    nothing stays resident)."""
    if not hasattr(path, "fileno"):
        with open(path, "rb") as fh:
            return _read(fh, dtype, count, offset)
    width = np.dtype(dtype).itemsize
    data = read_exact(path, count * width, offset)
    return np.frombuffer(data, dtype, len(data) // width)


def plan_store(store: Store, min_offset: int, jobs: int = 1) -> tuple[list[QueuePlan], list[IndexPlan], list[Finding]]:
    """Step 1 in ``jobs`` processes: each index file checked alone (``plan_index_file``), and every classic
    consume queue's unit sequence checked alone (ConsumeQueue.recover's view of it), the topics' directories
    listed and walked a few groups of topics a process (the plans are small; the walks read every entry and
    unit); index files are handed out first (the largest items). The queues' plans, the index files' plans,
    in the store's order, and the index directory's findings. LMQ queues (``%LMQ%``) are checked against the
    dispatch instead (``feature_queue_findings``)."""
    try:
        refs, index_findings = store.index_files(), []
    except FormatError as exc:
        refs, index_findings = [], [Finding(ERROR, "index_file_size", exc.path, None, exc.message)]
    topics = [t for t in store.topics() if not t.startswith(C.LMQ_PREFIX)]
    parts = max(1, min(4 * jobs if jobs > 1 else 1, len(topics)))
    groups = [topics[len(topics) * i // parts:len(topics) * (i + 1) // parts] for i in range(parts)]
    plans = process_map(partial(_plan_item, store=store, min_offset=min_offset), refs + groups, jobs)
    return [p for part in plans[len(refs):] for p in part], plans[:len(refs)], index_findings


def _plan_item(item, progress, store: Store, min_offset: int):
    return _plan_topics(item, store, min_offset) if isinstance(item, list) else plan_index_file(item, min_offset)


def _plan_topics(topics: list[str], store: Store, min_offset: int) -> list[QueuePlan]:
    plans = []
    for cq in (cq for t in topics for cq in store.consume_queues(t)):
        plan = QueuePlan(cq.topic, cq.queue_id, store.consumequeue_dir / cq.topic / str(cq.queue_id))
        for sub in cq.queue.directories:
            plan.findings.append(Finding(ERROR, "cq_file_size", str(sub), None, "a directory in place of a "
                                         "consume-queue file: the broker's load fails (MappedFileQueue.load)"))
        for f, problem in cq.queue.problems():
            plan.findings.append(Finding(ERROR, "cq_file_size" if "bytes" in problem else "missing_file",
                                         str(f.path) if f else str(plan.directory), None, problem,
                                         cq.queue.file_size, f.length if f else None))
        plan.files = list(cq.queue)
        state = _QueueWalk(plan, min_offset)
        for f in plan.files:
            state.file(f)
        plans.append(plan)
    return plans


def order_findings(plan: QueuePlan, min_offset: int, end: int) -> list[Finding]:
    """The cq_order findings of a queue whose offsets go backwards, past-end units left out."""
    if not plan.backwards:
        return []
    again = QueuePlan(plan.topic, plan.queue_id, plan.directory)
    walk = _QueueWalk(again, min_offset, end)
    for f in plan.files:
        walk.file(f)
    return again.order_findings


class _QueueWalk:
    """The per-unit rules of ConsumeQueue.recover's view, a read of units at a time (``walk_units``).

    A unit past the commit log's written end does not take part in the order check; that end is
    known only after the commit-log walk, so the first walk (``end`` None) just marks queues whose
    offsets go backwards (``plan.backwards``) and a second one with ``end`` names the units.
    """

    def __init__(self, plan: QueuePlan, min_offset: int, end: int | None = None):
        self.plan, self.min_offset, self.end = plan, min_offset, -1 if end is None else end
        self.ended = False
        self.state = new_state()

    def file(self, f: QueueFile) -> None:
        path, size = str(f.path), f.length
        whole = size - size % C.CQ_STORE_UNIT_SIZE
        if size % C.CQ_STORE_UNIT_SIZE:
            self.plan.findings.append(Finding(ERROR, "cq_file_size", path, whole,
                                              f"consume-queue file size {size} is not a multiple of 20", whole, size))
        count = whole // C.CQ_STORE_UNIT_SIZE
        if self.ended:
            self._stale(f, 0, whole)
            return
        base = f.start // C.CQ_STORE_UNIT_SIZE
        seg: Segment | None = None
        lo, chunk = 0, 1024               # growing reads: a pre-allocated file is mostly empty
        fd = open_random(f.path)
        try:
            while lo < count:
                data = os.pread(fd, min(chunk, count - lo) * C.CQ_STORE_UNIT_SIZE, lo * C.CQ_STORE_UNIT_SIZE)
                chunk = min(chunk * 4, CHUNK)
                n = len(data) // C.CQ_STORE_UNIT_SIZE
                w = walk_units(data, self.min_offset, self.end, self.state)
                for i in w.late.tolist():
                    self.plan.findings.append(Finding(ERROR, "cq_filler_unit", path, (lo + i) * C.CQ_STORE_UNIT_SIZE,
                                                      "blank unit after real units"))
                self.plan.backwards = self.plan.backwards or bool(len(w.back))
                if self.end >= 0:
                    for i, prev in zip(w.back.tolist(), w.back_prev.tolist()):
                        unit = lo + i
                        phy = struct.unpack_from(">q", data, i * C.CQ_STORE_UNIT_SIZE)[0]
                        self.plan.order_findings.append(Finding(
                            ERROR, "cq_order", path, unit * C.CQ_STORE_UNIT_SIZE,
                            f"queue offset {base + unit}: physical offsets go backwards", f"> {prev}", phy))
                if w.count:
                    # rising offsets, every unit checkable: a segment a window cuts by bisection
                    clean = not len(w.back) and w.count == w.last - w.first + 1
                    if seg is None:
                        seg = Segment(f.path, lo + w.first, lo + w.last + 1, w.min_phy, w.max_phy, clean)
                    else:
                        seg.ordered = seg.ordered and clean and seg.hi == lo + w.first and seg.last_phy < w.first_phy
                        seg.hi, seg.first_phy = lo + w.last + 1, min(seg.first_phy, w.min_phy)
                        seg.last_phy = max(seg.last_phy, w.max_phy)
                if w.stop < n:
                    at = lo + w.stop
                    unit = struct.unpack_from(">qiq", data, w.stop * C.CQ_STORE_UNIT_SIZE)
                    if any(unit):
                        self.plan.findings.append(Finding(ERROR, "cq_bad_unit", path, at * C.CQ_STORE_UNIT_SIZE,
                                                          "invalid unit ends the queue here", actual=list(unit)))
                    self.ended = True
                    # the bytes read after that unit first, then the file past them
                    after = (w.stop + 1) * C.CQ_STORE_UNIT_SIZE
                    hit = first_nonzero_byte(data[after:])
                    self._stale_at(f, (lo * C.CQ_STORE_UNIT_SIZE + after + hit) if hit is not None else
                                   first_nonzero_at(fd, lo * C.CQ_STORE_UNIT_SIZE + len(data), whole))
                    break
                if not n:                 # the file shrank under the walk
                    break
                lo += n
        finally:
            os.close(fd)
        if seg is not None:
            self.plan.segments.append(seg)

    def _stale(self, f: QueueFile, start: int, end: int) -> None:
        self._stale_at(f, first_nonzero(f.path, start, end))

    def _stale_at(self, f: QueueFile, hit: int | None) -> None:
        """A cq_stale_unit finding at ``hit``, the first non-zero byte after the queue's end (None: none)."""
        if hit is not None:
            pos = hit - hit % C.CQ_STORE_UNIT_SIZE
            self.plan.findings.append(Finding(ERROR, "cq_stale_unit", str(f.path), pos,
                                              "unit after the end of the queue (recovery ignores it)"))


def plan_index_file(ref: IndexFileRef, min_offset: int) -> IndexPlan:
    """An index file checked alone: capacity, stale entries, header offsets and slot count, chains."""
    plan = IndexPlan(ref)
    g, h, path = ref.geometry, ref.header, str(ref.path)
    count = max(h.index_count, 1)
    if count > g.index_num:
        plan.findings.append(Finding(ERROR, "index_header_mismatch", path, 36, "indexCount beyond capacity",
                                     g.index_num, h.index_count))
        return plan
    if first_nonzero(ref.path, g.entry_pos(count), g.file_size) is not None:
        plan.findings.append(Finding(ERROR, "index_stale_entries", path, g.entry_pos(count),
                                     f"non-zero bytes after entry {count - 1} (indexCount {h.index_count})"))
    slots = _read(ref.path, ">i4", g.hash_slot_num, C.INDEX_HEADER_SIZE)
    for i in np.flatnonzero((slots < 0) | (slots >= count)).tolist():
        plan.findings.append(Finding(ERROR, "index_bad_slot", path, C.INDEX_HEADER_SIZE + 4 * i,
                                     f"hash slot {i} holds {int(slots[i])}, not one of the {count - 1} "
                                     "written entries", f"0..{count - 1}", int(slots[i])))
    used = int(np.count_nonzero(slots))
    n = count - 1
    if n:
        first, last = (int(_read(ref.path, ">i8", 1, g.entry_pos(i) + 4)[0]) for i in (1, count - 1))
        for name, exp, act in (("begin_phy_offset", first, h.begin_phy_offset),
                               ("end_phy_offset", last, h.end_phy_offset)):
            if exp != act:
                plan.findings.append(Finding(ERROR, "index_header_mismatch", path, 0,
                                             f"header {name} disagrees with the entries", exp, act))
        if h.hash_slot_count not in (used, n):
            plan.findings.append(Finding(ERROR, "index_header_mismatch", path, 32,
                                         "hashSlotCount disagrees with the slots", used, h.hash_slot_count))
    seg = None
    prev_phy = -1
    for lo in range(1, count, CHUNK):
        hi = min(lo + CHUNK, count)
        e = _read(ref.path, ENTRY_DTYPE, hi - lo, g.entry_pos(lo))
        prev, phy = e["prev"].astype(np.int64), e["phy"].astype(np.int64)
        numbers = np.arange(lo, hi)
        for i in np.flatnonzero(~((prev >= 0) & (prev < numbers))).tolist():
            plan.findings.append(Finding(ERROR, "index_bad_chain", path, g.entry_pos(lo + i),
                                         f"entry {lo + i}: previous entry {int(prev[i])} is not older"))
        ok = np.flatnonzero(phy >= min_offset)
        if not len(ok):
            continue
        p = phy[ok]
        clean = bool((np.diff(p) >= 0).all()) and p[0] >= prev_phy and len(ok) == int(ok[-1]) - int(ok[0]) + 1
        prev_phy = int(p[-1])
        if seg is None:
            seg = Segment(ref.path, lo + int(ok[0]), lo + int(ok[-1]) + 1, int(p.min()), int(p.max()), clean)
        else:
            seg.ordered = seg.ordered and clean and seg.hi == lo + int(ok[0])
            seg.hi, seg.first_phy, seg.last_phy = lo + int(ok[-1]) + 1, min(seg.first_phy, int(p.min())), \
                max(seg.last_phy, int(p.max()))
    plan.segment = seg
    return plan


# -- step 2: one commit-log file -------------------------------------------------------------------
def _bisect(fd: int, lo: int, hi: int, phy: int, phy_pos: Callable[[int], int]) -> int:
    """First index in [lo, hi) whose physical offset is >= phy (offsets rising)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if struct.unpack(">q", os.pread(fd, 8, phy_pos(mid)))[0] < phy:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _seek(fd: int, seg: Segment, lo: int, phy: int, dtype: np.dtype, pos: Callable[[int], int]) -> int:
    """First index in [lo, seg.hi) whose physical offset is >= phy (an ordered segment): one read of the
    items around where evenly spread offsets put it, else a bisection of what that read leaves."""
    hi, width = seg.hi, SEEK_ITEMS
    phy_at = (lambda i: pos(i) + dtype.fields["phy"][1])
    guess = seg.lo + (phy - seg.first_phy) * (seg.hi - seg.lo) // max(seg.last_phy - seg.first_phy, 1)
    a = min(max(guess - width // 2, lo), hi)
    b = min(a + width, hi)
    if a < b:
        data = os.pread(fd, (b - a) * dtype.itemsize, pos(a))
        p = np.frombuffer(data, dtype, len(data) // dtype.itemsize)["phy"].astype(np.int64)
        k = int(np.searchsorted(p, phy))
        if len(p) < b - a:                        # a short read: the bisection decides
            return _bisect(fd, lo, hi, phy, phy_at)
        if (k or a == lo) and (k < len(p) or b == hi):
            return a + k
        lo, hi = (b, hi) if k == len(p) else (lo, a)
    return _bisect(fd, lo, hi, phy, phy_at)


def _pick(seg: Segment, lo_phy: int, hi_phy: int, dtype: np.dtype, pos: Callable[[int], int],
          min_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(indexes, items) of a segment whose physical offset lies in [lo_phy, hi_phy)."""
    if seg.last_phy < lo_phy or seg.first_phy >= hi_phy:
        return np.empty(0, np.int64), np.empty(0, dtype)
    if seg.ordered:
        a, b = seg.lo, seg.hi
        fd = open_random(seg.path)
        try:
            if seg.first_phy < lo_phy:                      # the window cuts the segment
                a = _seek(fd, seg, seg.lo, lo_phy, dtype, pos)
            if seg.last_phy >= hi_phy:
                b = _seek(fd, seg, a, hi_phy, dtype, pos)
            data = os.pread(fd, (b - a) * dtype.itemsize, pos(a))
        finally:
            os.close(fd)
        return np.arange(a, b), np.frombuffer(data, dtype, len(data) // dtype.itemsize)
    items = _read(seg.path, dtype, seg.hi - seg.lo, pos(seg.lo))
    phy = items["phy"].astype(np.int64)
    keep = (phy >= max(lo_phy, min_offset)) & (phy < hi_phy)
    if dtype is UNIT_DTYPE:
        size, tags = items["size"].astype(np.int64), items["tags"].astype(np.int64)
        keep &= (size > 0) & ~((phy == 0) & (size == C.CQ_FILLER_SIZE) & (tags == 0))
    idx = np.flatnonzero(keep)
    return idx + seg.lo, items[idx]


@dataclass
class Missing:
    """Records of one queue without a unit, split at the queue's first covered record."""

    count: int = 0
    first: tuple[int, int] | None = None          # (physical offset, queue offset)

    def add(self, count: int, first: tuple[int, int] | None) -> None:
        if count:
            self.count += count
            self.first = first if self.first is None else min(self.first, first)


@dataclass
class FileResult:
    """What one commit-log file contributes; no per-record data."""

    file: QueueFile
    stop: str
    stop_offset: int
    end: int
    has_records: bool
    findings: list[Finding]
    unit_findings: dict[tuple[str, int], list[tuple[int, int, int, Finding]]]   # queue -> (phy, size, q, finding)
    coverage: dict[tuple[str, int], tuple[bool, Missing, Missing]]         # queue -> (covered, before, after)
    no_queue: dict[tuple[str, int], tuple[int, int]]                       # queue -> (records, first offset)
    entry_findings: dict[str, list[Finding]]
    end_timestamps: dict[str, int]                                         # index file -> record's store time
    latest: int
    summary: FileSummary | None = None                                     # for the broker model
    unindexed: tuple[int, int, int] | None = None                          # keys without entry, first record, its time
    damaged: list[int] = field(default_factory=list)                       # offsets of damaged records (salvage walk)
    salvaged_stop: str = ""                                                 # where the walk past damage ended


def check_file(f: QueueFile, hi_phy: int, queues: list[QueuePlan], index: list[IndexPlan], min_offset: int,
               deep: bool = False, progress: Progress | None = None, ledger: bool = False,
               batch_topics: frozenset = frozenset()) -> FileResult:
    """Walk one commit-log file (a DLedger data file with ``ledger``) and join the units and index
    entries in [f.start, hi_phy) to it. Records of ``batch_topics`` have batch units, checked apart."""
    names = QueueNames()
    # DLedger: the broker dispatches a body-damaged record (check_dledger names it), so no CRC stop here
    facts = scan_file(f, names, deep=deep and not ledger, keys=bool(index), progress=progress, ledger=ledger,
                      salvage=not ledger)
    cols = facts.columns
    stop, stop_offset, end = facts.stop, facts.stop_offset, facts.end
    summary = FileSummary(f.start, len(facts))
    if facts.damaged:                 # the broker's walk stops at the first damage; ours went on past it
        at, _, kind = facts.damaged[0]
        before = int(np.searchsorted(cols["offset"], at))
        stop, stop_offset, end = "invalid", at, at
        summary = FileSummary(f.start, before, at, kind, len(facts) - before, kind == "crc_mismatch")
    summary.oversized_blank = facts.oversized_blank
    result = FileResult(f, stop, stop_offset, end, bool(len(facts)), facts.findings,
                        {}, {}, {}, {}, {}, int(cols["store_timestamp"].max()) if len(facts) else 0,
                        summary, salvaged_stop=facts.stop)
    covered = np.zeros(len(facts), bool)
    own = {(q.topic, q.queue_id) for q in queues}
    _join_queues(queues, f.start, hi_phy, facts, names, covered, min_offset, result)
    _coverage(facts, names, covered, own, batch_topics, result)
    offsets = cols["offset"]
    bounds = [f.start] + offsets[JOIN_RECORDS::JOIN_RECORDS].tolist() + [hi_phy]   # bounded reads
    matched = np.zeros(len(facts.key_hashes) if index else 0, bool)     # per key hash: an entry holds it
    for plan in index:
        for lo, hi in zip(bounds, bounds[1:]):
            _join_index(plan, lo, hi, facts, min_offset, result, matched)
    if index and len(facts):
        recovered = cols["offset"] < (facts.damaged[0][0] if facts.damaged else hi_phy)  # past it: the broker cuts
        count, first = unmatched_keys(facts.key_offsets, facts.key_hashes, matched, facts.indexed() & recovered)
        if count:
            result.unindexed = count, int(cols["offset"][first]), int(cols["store_timestamp"][first])
    result.damaged = [at for at, _, _ in facts.damaged]
    result.findings = result.findings + list(_salvaged(facts, names, str(f.path)))
    return result


def _salvaged(facts: FileFacts, names: QueueNames, path: str) -> Iterator[Finding]:
    """rmqtool repair's placeholders (rollback-type records on C.SALVAGED_TOPIC): what they stand for."""
    codes = [c for c, (topic, _) in enumerate(names.names) if topic == C.SALVAGED_TOPIC]
    if not codes:
        return
    cols = facts.columns
    rows = np.flatnonzero(np.isin(cols["queue"], codes) & ~facts.indexed())
    for r in rows.tolist():
        yield Finding(WARNING, "salvaged_record", path, int(cols["offset"][r]),
                      f"a placeholder rmqtool repair wrote over a damaged record ({int(cols['size'][r])} bytes): that "
                      "message is lost, the records around it kept; the broker's dispatch skips it")


def _check_item(item: tuple[QueueFile, int, bool], progress: Progress | None, **kw) -> FileResult:
    return check_file(item[0], item[1], deep=item[2], progress=progress, **kw)


def recovery_reads_from(store: Store, files: list[QueueFile], queues: list[QueuePlan]) -> int:
    """Index of the first commit-log file a broker start's recovery reads, with body CRCs checked
    (checkCRCOnRecover, true by default in 4.9.7 and 5.3.3): CommitLog.recoverNormally's start, or
    recoverAbnormally's with an abort file; the earliest over the versions the store may be. Verify checks
    those files' CRCs even without --check-crc: a CRC mismatch there is where the broker truncates."""
    if store.abort_path.exists():
        return abnormal_recovery_start(store)
    cq_max_phy = max((seg.last_phy for q in queues for seg in q.segments), default=-1)
    versions = [store.broker_version] if store.broker_version in VERSIONS else list(VERSIONS)
    return min(normal_recovery_start([f.start for f in files], v, cq_max_phy) for v in versions)


def _join_queues(queues: list[QueuePlan], lo: int, hi: int, facts: FileFacts, names: QueueNames,
                 covered: np.ndarray, min_offset: int, result: FileResult) -> None:
    """Every queue's units in [lo, hi), gathered and joined to the file's records some queues at a time
    (at least JOIN_UNITS units each: bounded temporaries)."""
    cols = facts.columns
    by_queue = queue_rows(cols["queue"], len(names.names))
    picked, count = [], 0
    for q in queues:
        code = names.codes.get((q.topic, q.queue_id), -1)
        for seg in q.segments:
            idx, u = _pick(seg, lo, hi, UNIT_DTYPE, lambda i: i * C.CQ_STORE_UNIT_SIZE, min_offset)
            if len(u):
                picked.append((q, seg, code, idx, u))
                count += len(u)
        if count >= JOIN_UNITS:
            _join_units(picked, facts, names, by_queue, covered, result)
            picked, count = [], 0
    if picked:
        _join_units(picked, facts, names, by_queue, covered, result)


def _join_units(picked: list, facts: FileFacts, names: QueueNames, by_queue: tuple[np.ndarray, np.ndarray],
                covered: np.ndarray, result: FileResult) -> None:
    """Gathered units (every one of their queues' units in the window) joined to the file's records
    (``rmqtool.columnar.joins.join_units``; ``by_queue``: its ``queue_rows``)."""
    u = np.concatenate([p[4] for p in picked])
    which = np.repeat(np.arange(len(picked)), [len(p[4]) for p in picked])
    code = np.array([p[2] for p in picked], np.int64)[which]
    qo = np.concatenate([int(p[1].path.name) // C.CQ_STORE_UNIT_SIZE + p[3] for p in picked])
    phy, size, tags = u["phy"].astype(np.int64), u["size"].astype(np.int64), u["tags"].astype(np.int64)
    cols = facts.columns
    at, bad = join_units(cols["offset"], cols["queue"], cols["queue_offset"], cols["size"], cols["tags_code"],
                         *by_queue, facts.end, phy, size, tags, qo, code, covered)
    for i in np.flatnonzero(bad).tolist():
        q, seg = picked[which[i]][:2]
        where = (str(seg.path), (int(qo[i]) - int(seg.path.name) // C.CQ_STORE_UNIT_SIZE) * C.CQ_STORE_UNIT_SIZE)
        p, s, qoff = int(phy[i]), int(size[i]), int(qo[i])
        out = result.unit_findings.setdefault((q.topic, q.queue_id), [])
        if at[i] < 0:
            out.append((p, s, qoff, Finding(ERROR, "cq_unit_no_record", *where,
                                            f"queue offset {qoff} points at {p}, where no record starts", actual=p)))
            continue
        r = int(at[i])
        topic, qid = names.names[int(cols["queue"][r])]
        for name, exp, act in (("size", int(cols["size"][r]), s), ("topic", topic, q.topic),
                               ("queue_id", qid, q.queue_id), ("queue_offset", int(cols["queue_offset"][r]), qoff),
                               ("tags_code", int(cols["tags_code"][r]), int(tags[i]))):
            if exp != act:
                out.append((p, s, qoff, Finding(ERROR, f"cq_{name}_mismatch", *where,
                                                f"queue offset {qoff} -> record {p}: {name} differs", exp, act)))


def _coverage(facts: FileFacts, names: QueueNames, covered: np.ndarray, own: set, batch_topics: frozenset,
              result: FileResult) -> None:
    """Per queue: records without a unit before / after the first covered record of this file."""
    if not len(facts):
        return
    cols = facts.columns
    need = np.flatnonzero(facts.gets_cq_unit())
    if covered[need].all():              # the usual case: every record has its unit
        for code in np.flatnonzero(np.bincount(cols["queue"][need])).tolist():
            if names.names[code][0] not in batch_topics:
                result.coverage[names.names[code]] = (True, Missing(), Missing())
        return
    need = need[np.argsort(cols["queue"][need], kind="stable")]      # by queue, in offset order within
    codes, starts = np.unique(cols["queue"][need], return_index=True)
    for code, rows in zip(codes.tolist(), np.split(need, starts[1:])):
        name = names.names[code]
        if name[0] in batch_topics:
            continue
        if name not in own:
            result.no_queue[name] = (len(rows), int(cols["offset"][rows[0]]))
            continue
        cov = covered[rows]
        first_cov = int(np.argmax(cov)) if cov.any() else len(rows)
        before, after = Missing(), Missing()
        for part, miss in ((rows[:first_cov], before), (rows[first_cov:][~cov[first_cov:]], after)):
            if len(part):
                miss.add(len(part), (int(cols["offset"][part[0]]), int(cols["queue_offset"][part[0]])))
        result.coverage[name] = (bool(cov.any()), before, after)


def _join_index(plan: IndexPlan, lo: int, hi: int, facts: FileFacts, min_offset: int, result: FileResult,
                matched: np.ndarray) -> None:
    """The plan's index entries in [lo, hi) joined to the file's records (``rmqtool.columnar.joins.join_entries``:
    ``matched`` flags the key hashes an entry holds)."""
    seg, ref = plan.segment, plan.ref
    if seg is None:
        return
    g = ref.geometry
    idx, e = _pick(seg, lo, hi, ENTRY_DTYPE, g.entry_pos, min_offset)
    path = str(ref.path)
    cols = facts.columns
    h = ref.header
    if lo <= h.end_phy_offset < hi and len(facts):
        at = int(np.searchsorted(cols["offset"], h.end_phy_offset))
        if at < len(facts) and cols["offset"][at] == h.end_phy_offset:
            result.end_timestamps[path] = int(cols["store_timestamp"][at])
    if not len(e):
        return
    phy, key_hash = e["phy"].astype(np.int64), e["hash"].astype(np.int64)
    at, ok = join_entries(cols["offset"], facts.key_offsets, facts.key_hashes, phy, key_hash, matched)
    out = result.entry_findings.setdefault(path, [])
    good = np.flatnonzero(ok)
    if len(good) and h.begin_timestamp > 0:      # IndexFile.putKey: seconds after the file's first store time,
        diff = (cols["store_timestamp"][at[good]].astype(np.int64) - h.begin_timestamp) // 1000
        np.clip(diff, 0, 2**31 - 1, out=diff)     # a Java int
        diff[idx[good] == 1] = 0                 # 0 for the first entry (put before the header has that time)
        for i in good[e["time_diff"][good] != diff].tolist():
            out.append(Finding(ERROR, "index_entry_time", path, g.entry_pos(int(idx[i])) + 12,
                               f"entry {int(idx[i])}: time diff {int(e['time_diff'][i])} s, not that of the record "
                               f"at {int(phy[i])}", int(diff[np.searchsorted(good, i)]), int(e["time_diff"][i])))
    for i in np.flatnonzero(~ok).tolist():
        n, p = int(idx[i]), int(phy[i])
        if at[i] < 0:
            out.append(Finding(ERROR, "index_entry_no_record", path, g.entry_pos(n),
                               f"entry {n} points at {p}, where no valid record starts", actual=p))
        else:
            out.append(Finding(ERROR, "index_entry_key_mismatch", path, g.entry_pos(n),
                               f"entry {n}: hash {int(key_hash[i])} matches no key of the record at {p}",
                               actual=int(key_hash[i])))


# -- step 3: the store -----------------------------------------------------------------------------
FileRunner = Callable[[Callable[[tuple[QueueFile, int]], FileResult], list[tuple[QueueFile, int]]], list[FileResult]]


def verify_store(path, deep: bool = False, progress: Progress | None = None,
                 run_files: FileRunner | None = None, jobs: int | None = None) -> Iterator[Finding]:
    """Every finding of the store at ``path``, at the level the broker model gives it (error: the
    broker refuses the store or leaves data unreachable; warning: the broker handles it on start), and
    per broker version what starting it will do. The per-file step runs in ``jobs`` worker processes
    (default: one per core for a large store), or through ``run_files(fn, items)`` (one Spark task per
    commit-log file). A store the broker refuses to load is checked as every reader reads it anyway
    (rmqtool.store.readable): its files cut to their whole records, those off the grid left out."""
    store = Store.open(path)
    whole = store.commitlog.queue
    store.commitlog, skipped = commitlog_view(store.commitlog, read_anyway=True)
    facts: dict = {}
    for f in _findings(store, whole, skipped, deep, progress, run_files, jobs, facts):
        level, says = level_of(f.kind, f.offset if f.kind in _MISSING else None, facts.get("reput_from", 0))
        if f.kind == "index_entry_no_record" and facts.get("abnormal") and f.actual >= facts["end"]:
            level, says = level_of("index_past_end_after_crash")
        elif f.kind in ("index_entry_no_record", "cq_unit_no_record") and f.actual in facts.get("damaged", ()):
            level, says = level_of("points_at_damage")
        elif f.offset in facts.get("lost_damage", ()) and f.kind in DAMAGE_KINDS:
            level, says = ERROR, "a broker start loses this message: see broker_start; repair salvages it"
        if level != f.severity or says:
            f = replace(f, severity=level, message=f"{f.message} ({says})" if says else f.message)
        yield f
    yield from facts.get("predictions", ())


_MISSING = ("cq_missing_unit", "cq_missing_queue", "index_missing_entry")     # the broker adds them only from reput on


def _findings(store: Store, whole: FileQueue, skipped, deep: bool, progress: Progress | None,
              run_files: FileRunner | None, jobs: int | None, facts: dict) -> Iterator[Finding]:
    """The findings as the checks make them (all errors but the few they mark), and ``facts``: the
    dispatch start and the broker's predicted actions. ``whole``: the commit log's files as they are,
    ``store.commitlog`` as readers read them, ``skipped`` what that skips (rmqtool.store.readable)."""
    root = store.root
    if pending_journal(root):
        yield Finding(ERROR, "interrupted_write", str(pending_journal(root)), None,
                      "an rmqtool change was interrupted; any rmqtool write command completes it")
    if store.abort_path.exists():
        yield Finding(ERROR, "abort_file", str(store.abort_path), None,
                      "abort file present: the broker did not shut down cleanly")
    if lock_is_held(store.lock_path):
        yield Finding(WARNING, "broker_running", str(store.lock_path), None,
                      "the lock file is held by another process: a broker may be running")
    if store.is_store_root:
        yield from _stray_files(store)
    queue = store.commitlog.queue
    if skipped:             # a store the broker refuses, read anyway: files off the grid left out, reported
        kept = {f.path for f in queue}
        stray = [(f, f"file is {f.length} bytes, expected {queue.file_size}" if f.length != queue.file_size else
                  f"named at offset {f.start}, between the starts of {queue.file_size}-byte files (it overlaps "
                  "its neighbours)") for f in whole if f.path not in kept]
    else:
        stray = [(f, problem) for f, problem in refused_files(queue) if f is not queue.files[-1]]
        queue = FileQueue([f for f in queue.files if all(f is not g for g, _ in stray)], queue.file_size)
    for f, problem in stray:    # not a file the broker maps there: reported, the rest checked without it
        kind = "wrong_file_size" if f.length != queue.file_size else "missing_file"
        yield Finding(ERROR, kind, str(f.path), f.start, problem, queue.file_size, f.length)
    cut = _Cut(skipped)
    for f, problem in queue.problems():
        kind = "empty_last_file" if "empty" in problem else \
            "missing_file" if "missing" in problem else "wrong_file_size"
        yield Finding(ERROR, kind, str(f.path) if f else None, f.start if f else None, problem,
                      queue.file_size, f.length if f else None)
    min_offset = queue.min_offset
    files = list(queue)
    if jobs is None:
        jobs = default_jobs(sum(f.length for f in files), len(files))
    queues, index, index_findings = plan_store(store, min_offset, 1 if run_files is not None else jobs)
    items = [(f, files[i + 1].start if i + 1 < len(files) else _NO_END) for i, f in enumerate(files)] \
        or [(QueueFile(store.path(L.COMMITLOG), 0, 0), _NO_END)]    # no commit log: every unit points past its end
    ledger = bool(store.commitlog.entry_header_size)
    batch = frozenset(batch_cq_topics(store))
    crc_from = 0 if deep else recovery_reads_from(store, files, queues)
    items = [(f, hi, i >= crc_from) for i, (f, hi) in enumerate(items)]
    check = partial(_check_item, queues=queues, index=index, min_offset=min_offset, ledger=ledger,
                    batch_topics=batch)
    if run_files is not None:
        results = run_files(lambda item: check(item, None), items)
    else:
        results = process_map(check, items, jobs, progress)
    queue_ends = [seg.last_phy for q in queues for seg in q.segments]
    facts["reput_from"] = max([p + 1 for p in queue_ends] + [min_offset])
    facts["end"], facts["abnormal"] = data_end(results), store.abort_path.exists()
    facts["damaged"] = {at for r in results for at in r.damaged}
    facts["predictions"], facts["lost_damage"] = _predictions(
        store, results, max(queue_ends, default=-1), min_offset, facts["reput_from"]) if not ledger else ([], set())
    yield from _commitlog_sequence(results)
    if deep:
        yield from crc32_property_findings(store)
    if ledger:
        from rmqtool.ops.dledger import check_dledger
        yield from check_dledger(store, deep=deep)
    end = data_end(results)
    if store.consumequeue_is_rocksdb:
        from rmqtool.ops.rocksdbcq import rocksdb_findings
        yield from rocksdb_findings(store, end, cut)
    elif store.is_store_root:           # a commit-log directory or file alone: its records, not their queues
        yield from _queue_findings(store, queues, results, end, min_offset, cut)
    if store.compaction is not None:
        from rmqtool.ops.compaction import compaction_findings
        yield from compaction_findings(store)
    if batch or any(t.startswith(C.LMQ_PREFIX) for t in store.topics()):
        yield from feature_queue_findings(store, batch, end, cut)
    yield from index_findings
    yield from _index_findings(index, results, cut)
    yield from cut.findings()
    yield from _unindexed_findings(store, results)
    yield from _verify_checkpoint(store, max((r.latest for r in results), default=0), end)
    if store.is_store_root:
        from rmqtool.ops.timer import timer_findings
        yield from timer_findings(store)
        yield from _config_findings(store)
        yield from static_topic_findings(store)


def _config_findings(store: Store) -> Iterator[Finding]:
    """config/*.json as the broker loads them (rule config_load): a fallback to the .bak, an empty table, a
    refused load; the RocksDB config databases of a storeType=defaultRocksDB broker (rule
    config_load_rocksdb): one that does not open or decode is a refused load. A configManagerVersion=v2
    database is not read: a warning."""
    from rmqtool.store.metadata import CONFIG_FILES, kv_config_store, load

    names = list(CONFIG_FILES)
    try:
        kv_config_store(store)
    except StoreError as exc:
        yield Finding(WARNING, "config_not_read", exc.path, None, exc.message)
        names = [n for n in names if n not in L.KV_CONFIG_DIRS]
    for name in names:
        try:
            loaded = load(store, name)
        except FormatError as exc:
            kind = "config_refused" if exc.path and exc.path.endswith(".bak") else "config_empty_table"
            yield Finding(ERROR, kind, exc.path or str(store.path(L.config_file(name))), exc.offset, exc.message)
            continue
        except StoreError as exc:       # a RocksDB config database the broker's load fails on
            yield Finding(ERROR, "config_kv_refused", exc.path, exc.offset, exc.message)
            continue
        if loaded is not None and loaded.fallback is not None:
            path = store.path(L.config_file(name))
            yield Finding(WARNING, "config_fallback", str(path), None,
                          loaded.fallback.removeprefix(f"{path}: "))


def static_topic_findings(store: Store) -> Iterator[Finding]:
    """Rule static_topic_mapping: each static topic's mapping against the topic table and the queues on disk."""
    from rmqtool.errors import RmqError
    from rmqtool.format.statictopic import MAPPING_FILE
    from rmqtool.store.metadata import cq_max_offset, static_topics, topic_table

    mappings = static_topics(store)
    if not mappings:
        return
    path = str(store.path(L.config_file(MAPPING_FILE)))
    try:
        table = topic_table(store) or {}
    except RmqError:
        table = {}                    # _config_findings reports it
    for topic, detail in mappings.items():
        mapped = detail.physical_queues()
        config = table.get(topic)
        if config is None:
            yield Finding(WARNING, "static_mapping_mismatch", path, None,
                          f"static topic {topic!r} is not in the topic table: sends to it fail (msgCheck), "
                          "its queues are served to no one")
        owners: dict[int, list[int]] = {}
        for logical, items in sorted(detail.hosted_queues.items()):
            for item in items:
                if item.bname == detail.bname:
                    owners.setdefault(item.queue_id, []).append(logical)
        for qid, logicals in sorted(owners.items()):
            if len(set(logicals)) > 1:
                yield Finding(WARNING, "static_mapping_mismatch", path, None,
                              f"{topic}: logical queues {', '.join(map(str, sorted(set(logicals))))} name one "
                              f"physical queue {qid}: each is served all of its messages", actual=qid)
            if config is not None and qid >= max(config.read_queue_nums, config.write_queue_nums):
                yield Finding(WARNING, "static_mapping_mismatch", path, None,
                              f"{topic}: logical queue {logicals[0]} names physical queue {qid}, beyond the "
                              f"topic's {max(config.read_queue_nums, config.write_queue_nums)} queue(s): its "
                              "sends and pulls fail (msgCheck: queueId illegal)", actual=qid)
        for qid in _physical_queue_ids(store, topic):
            high = cq_max_offset(store, topic, qid) or 0
            if qid in mapped and mapped[qid][1].logic_offset < 0 and high:
                yield Finding(WARNING, "static_mapping_mismatch", path, None,
                              f"{topic}: logical queue {mapped[qid][0]}'s item on physical queue {qid} has no logic "
                              f"offset yet (-1, a remap's first step): pulls skip it (findLogicQueueMappingItem) "
                              f"and sends are answered offset -1 until the remap sets it", actual=qid)
            elif qid not in mapped and high:
                yield Finding(ERROR, "static_queue_unmapped", str(store.path(L.queue_dir(topic, qid))), None,
                              f"{topic}: physical queue {qid} holds {high} queue offset(s) but no item of "
                              f"{detail.bname} names it: the static topic's consumers never read its messages",
                              actual=qid)


def _physical_queue_ids(store: Store, topic: str) -> list[int]:
    if store.consumequeue_is_rocksdb:
        return sorted(store.rocksdb_consumequeue.queue_ids(topic))
    return sorted(q.queue_id for q in store.consume_queues(topic))


ONLY_IN = {k: V5 for k in ("timer_read_moved", "timer_bad_chain", "timer_bad_unit", "timer_load",
                           "config_kv_refused", "static_queue_unmapped")}   # 5.x stores
REFUSED = ("wrong_file_size", "empty_last_file", "missing_file", "stray_file", "cq_file_size", "timer_load",
           "config_refused", "config_kv_refused")


def verdict(rows: list[dict], versions: list[str]) -> list[str]:
    """Per broker version, what starting it on the store verified into ``rows`` (Finding.row()s) does: "safe
    to start", "refuses to start", or "starting loses N message(s) / M unit(s)" (broker_start's counts)."""
    out = []
    for v in versions:
        errors = [r for r in rows if r["severity"] == ERROR and ONLY_IN.get(r["kind"], v) == v]
        mine = [r for r in errors if r["kind"] == "broker_start" and r.get("expected") == v]
        others = [r for r in errors if r["kind"] != "broker_start" and r["kind"] not in DAMAGE_KINDS]
        if any(r["kind"] in REFUSED for r in others):
            out.append(f"{v}: refuses to start")
        elif mine:
            c = mine[0]["counts"]
            out.append(f"{v}: starting loses {c['messages_lost']} message(s) / "
                       f"{c['units_missing'] + c['units_misplaced']} unit(s)")
        elif others or (errors and not any(r["kind"] == "broker_start" for r in errors)):
            out.append(f"{v}: not safe to start ({len(errors)} error(s))")
        else:
            out.append(f"{v}: safe to start")
    return out


def crc32_property_findings(store: Store) -> Iterator[Finding]:
    """5.2+ whole-record CRCs (__CRC32#, enabledAppendPropCRC) that do not match their record: a warning,
    since CommitLog.checkMessageAndReturnSize checks them only with forceVerifyPropCRC (default false),
    when it refuses the record. Read in the files whose first record carries one (a store that uses it)."""
    from rmqtool.errors import RmqError
    from rmqtool.format.commitlog import Message, record_crc32, stored_crc32

    cl = store.commitlog
    for f in cl.queue:
        try:
            first = cl.read_at(f.start + cl.entry_header_size) if f.length else None
        except RmqError:
            continue
        if not isinstance(first, Message) or stored_crc32(first.properties_raw) is None:
            continue
        import pyarrow.compute as pc           # here: the record batches make pyarrow import pandas

        from rmqtool.columnar import iter_record_batches
        buf = f.read()
        # damage ends the file's records here; the commit-log check above reports it
        for batch in iter_record_batches(type(cl)(FileQueue([f], cl.queue.file_size)), on_damage=lambda exc: None):
            batch = batch.filter(pc.equal(batch.column("type"), "message"))
            for offset, size in zip(batch.column("physical_offset").to_pylist(),
                                    batch.column("total_size").to_pylist()):
                record = memoryview(buf)[offset - f.start:offset - f.start + size]
                want = stored_crc32(record)
                if want is not None and want != record_crc32(record):
                    yield Finding(WARNING, "prop_crc_mismatch", str(f.path), offset,
                                  "whole-record CRC (__CRC32#) does not match the record: a broker with "
                                  "forceVerifyPropCRC refuses it", want, record_crc32(record))


def _predictions(store: Store, results: list[FileResult], cq_max_phy: int, min_offset: int,
                 reput_from: int) -> tuple[list[Finding], set[int]]:
    """What a broker of each version does on start (rmqtool.store.broker_model.start_outcome) and what it
    costs (rmqtool.ops.consequences): one finding per version that acts, an error when it loses or misplaces
    a message. The versions: the store's, or both when its files do not tell. Also the offsets of the
    damaged records that count as lost (not the torn tail)."""
    files = [r.summary for r in results if r.summary is not None and (r.has_records or r.summary.damage is not None)]
    if not files:
        return [], set()
    abnormal = abnormal_recovery_start(store) if store.abort_path.exists() else None
    versions = [store.broker_version] if store.broker_version in VERSIONS else list(VERSIONS)
    outcomes = [start_outcome(v, files, abnormal_start=abnormal, cq_max_phy=cq_max_phy, min_offset=min_offset)
                for v in versions]
    if not any(o.sentences() for o in outcomes) and not any(r.damaged for r in results):
        return [], set()
    from rmqtool.ops.consequences import losses

    counted, lost_damage = losses(store, outcomes, reput_from, store.cq_file_size())
    out = []
    for o, loss in zip(outcomes, counted):
        sentences = o.sentences()
        if not sentences and not loss.harmful:
            continue
        at = sentences[0][0] if sentences else min(lost_damage)
        text = "; ".join(t for _, t in sentences) or \
            f"a {o.version} broker starts without noticing the damaged record(s) (outside the files its recovery " \
            "reads, before its dispatch starts): their units point at what it cannot serve whole"
        where = next(r.file.path for r in reversed(results) if r.file.start <= at)
        out.append(Finding(ERROR if loss.harmful else WARNING, "broker_start", str(where), at,
                           f"{text}: {loss.said() or 'nothing readable is lost'}", expected=o.version,
                           counts=loss.fields()))
    return out, lost_damage if any(f.severity == ERROR for f in out) else set()


def _stray_files(store: Store) -> Iterator[Finding]:
    """Entries of the data directories that are not files the broker loads there (staged leftovers, ...);
    a store whose version cannot be told gets 4.9.7's rules, the stricter."""
    for path, refused, reason in refused_entries(store.root, broker_5x=store.is_5x):
        yield Finding(ERROR, "stray_file", str(path), None, reason) if refused else \
            Finding(WARNING, "skipped_file", str(path), None, reason)


def data_end(results: list[FileResult]) -> int:
    """Physical offset after the last valid entry of the commit log (as a full scan finds it)."""
    end = results[0].file.start if results else 0
    for r in results:
        if r.stop == "blank" or r.has_records:
            end = r.end
    return end


def _commitlog_sequence(results: list[FileResult]) -> Iterator[Finding]:
    """Per-file findings, plus files that end early while later files hold data (not a file cut to what is
    readable: its cut is a finding of its own, _Cut)."""
    last_data = max((i for i, r in enumerate(results) if r.has_records or r.stop == "blank"), default=-1)
    for i, r in enumerate(results):
        yield from r.findings
        if i < last_data and r.salvaged_stop != "blank" and r.file.limit is None:
            nxt = results[i + 1].file
            yield Finding(ERROR, "data_after_end", str(nxt.path), nxt.start,
                          f"later files hold records, but the data of the file before ends at {r.stop_offset}")


def _queue_findings(store: Store, queues: list[QueuePlan], results: list[FileResult], end: int,
                    min_offset: int, cut: "_Cut") -> Iterator[Finding]:
    for q in queues:
        name = (q.topic, q.queue_id)
        units, past = [], set()
        for r in results:
            for phy, size, qoff, finding in r.unit_findings.get(name, ()):
                if finding.kind == "cq_unit_no_record" and cut.holds(phy, "units"):
                    continue
                if phy + size > end:        # checked first, as recovery would: one finding per unit
                    if (finding.path, finding.offset) in past:
                        continue
                    past.add((finding.path, finding.offset))
                    finding = Finding(ERROR, "cq_unit_past_end", finding.path, finding.offset,
                                      f"queue offset {qoff} points past the written end {end}", end, phy + size)
                units.append(finding)
        units += order_findings(q, min_offset, end)
        yield from sorted(q.findings + units, key=lambda f: (f.path, f.offset if f.offset is not None else -1))
        covered_seen = False
        before, after = Missing(), Missing()
        for r in results:
            cov = r.coverage.get(name)
            if cov is None:
                continue
            has, b, a = cov
            if covered_seen:
                after.add(b.count, b.first)
            else:
                before.add(b.count, b.first)
            after.add(a.count, a.first)
            covered_seen = covered_seen or has
        if covered_seen:                 # records before the queue's first unit too (a lost first file)
            after.add(before.count, before.first)
        missing = after if covered_seen else before
        if missing.count:
            phy, qoff = missing.first
            yield Finding(ERROR, "cq_missing_unit", str(q.directory), phy,
                          f"{missing.count} record(s) have no unit; first: queue offset {qoff} at {phy}", qoff, None)
    lost: dict[tuple[str, int], list[int]] = {}
    for r in results:
        for name, (count, first) in r.no_queue.items():
            c, f = lost.get(name, (0, first))
            lost[name] = [c + count, min(f, first)]
    for (topic, qid), (count, first) in sorted(lost.items()):
        yield Finding(ERROR, "cq_missing_queue", str(store.consumequeue_dir / topic / str(qid)), first,
                      f"{count} record(s) of {topic}/{qid} but no consume queue")


def feature_queue_findings(store: Store, batch_topics: frozenset, end: int = _NO_END,
                           cut: "_Cut | None" = None) -> Iterator[Finding]:
    """Batch queues (batchconsumequeue/) and LMQ queues compared, file by file, with what the broker's
    dispatch writes for the commit log (rebuilt into a temporary directory: a second walk of the commit
    log, for stores that use these features). A batch unit whose record starts at or after the data's
    ``end`` is dropped on every load (BatchConsumeQueue.truncateDirtyLogicFiles): cq_unit_past_end."""
    from rmqtool.ops.rebuild import dispatch_files

    sizes = (store.cq_file_size(), store.bcq_file_size())
    with ScratchDir("rmqtool-verify-") as tmp:
        def directory(topic: str, qid: int, is_batch: bool) -> Path | None:
            if is_batch or topic.startswith(C.LMQ_PREFIX):
                return Path(tmp, L.queue_dir(topic, qid, batch=is_batch))
            return None

        dispatch_files(store, directory, sizes, set(batch_topics))
        for kind in (L.CONSUMEQUEUE, L.BATCHCONSUMEQUEUE):
            want_root, have_root = Path(tmp, kind), store.path(kind)
            queues = {p.relative_to(want_root) for p in want_root.glob("*/*")} if want_root.is_dir() else set()
            if have_root.is_dir():
                queues |= {p.relative_to(have_root) for p in have_root.glob("*/*") if p.is_dir()
                           and (kind == L.BATCHCONSUMEQUEUE or p.parent.name.startswith(C.LMQ_PREFIX))}
            for q in sorted(queues, key=str):
                yield from _compare_queue(want_root / q, have_root / q, kind, end, cut,
                                          sizes[kind == L.BATCHCONSUMEQUEUE])


def _compare_queue(want: Path, have: Path, kind: str, end: int, cut: "_Cut | None",
                   file_size: int) -> Iterator[Finding]:
    unit = C.BCQ_STORE_UNIT_SIZE if kind == L.BATCHCONSUMEQUEUE else C.CQ_STORE_UNIT_SIZE
    if not have.is_dir():
        yield Finding(ERROR, "cq_missing_queue", str(have), None, "the commit log dispatches to this queue, "
                      "but it has no files")
        return
    # each file's bytes up to its data's end (the rest is zeros) and its size
    wanted = {p.name: read_data(p) for p in want.iterdir()} if want.is_dir() else {}
    stored = {p.name: read_data(p) for p in have.iterdir() if p.is_file()}
    if cut is not None and cut.spans:
        wanted = {n: (b, len(b)) for n, b in cut.splice(*(_padded(files) for files in (wanted, stored)), unit,
                                                         file_size).items()}
    for name in sorted(wanted.keys() | stored.keys()):
        (a, a_size), (b, b_size) = wanted.get(name, (b"", 0)), stored.get(name, (b"", 0))
        at = first_difference(a, b)
        if at is None:
            continue
        at -= at % unit
        want_unit, have_unit = _unit(a, a_size, at, unit), _unit(b, b_size, at, unit)
        if kind == L.BATCHCONSUMEQUEUE and not want_unit.strip(b"\0") and len(have_unit) == unit:
            phy = struct.unpack_from(">q", have_unit)[0]
            if phy >= end:
                yield Finding(ERROR, "cq_unit_past_end", str(have / name), at,
                              f"batch unit points past the written end {end}", end, phy)
                continue
        yield Finding(ERROR, "cq_unit_mismatch", str(have / name), at,
                      "unit differs from what the broker's dispatch writes for the commit log",
                      want_unit.hex() or None, have_unit.hex() or None)


def _padded(files: dict[str, tuple[bytes, int]]) -> dict[str, bytes]:
    """Each file's whole bytes (its data, then zeros to its size)."""
    return {n: data.ljust(size, b"\0") for n, (data, size) in files.items()}


def _unit(data: bytes, size: int, at: int, unit: int) -> bytes:
    """The unit at ``at`` of a file of ``size`` bytes whose data is ``data`` (zeros after it)."""
    return data[at:at + unit].ljust(max(0, min(unit, size - at)), b"\0")


def _index_findings(index: list[IndexPlan], results: list[FileResult], cut: "_Cut") -> Iterator[Finding]:
    for plan in index:
        path = str(plan.ref.path)
        yield from plan.findings
        if plan.segment is None and not plan.ref.header.index_count > 1:
            continue
        ts = next((r.end_timestamps[path] for r in results if path in r.end_timestamps), None)
        if ts is not None and ts != plan.ref.header.end_timestamp:
            yield Finding(ERROR, "index_header_mismatch", path, 0, "header end_timestamp disagrees with the entries",
                          ts, plan.ref.header.end_timestamp)
        entries = [f for r in results for f in r.entry_findings.get(path, ())
                   if not (f.kind == "index_entry_no_record" and cut.holds(f.actual, "index_entries"))]
        yield from sorted(entries, key=lambda f: f.offset)


class _Cut:
    """What reading a store the broker refuses skips in the commit log's offsets (rmqtool.store.readable.
    unread_spans: a file's bytes past its last whole record, a missing file; a file off the grid is a
    finding of its own). One finding each, with the consume-queue units and index entries pointing into it
    counted there, not reported one by one.

    The rule for every queue kind: a unit pointing into a skipped part is unreadable, skipped -- counted
    there, never a mismatch (``unread``). A classic queue's other units are each checked against their
    record; a batch, LMQ or RocksDB queue is compared with the dispatch of the records read, laid out by
    ``place``."""

    def __init__(self, skipped):
        spans = unread_spans(skipped)
        self.skipped = [s for s, _, _ in spans]
        self.spans = [(lo, hi) for _, lo, hi in spans]
        self.counts = [{"units": 0, "index_entries": 0} for _ in self.skipped]

    def unread(self, phys: np.ndarray, what: str | None = None) -> np.ndarray:
        """Which of the commit-log offsets ``phys`` lie in a skipped part (each counted there as ``what``)."""
        inside = np.zeros(len(phys), bool)
        for (lo, hi), counts in zip(self.spans, self.counts):
            here = (phys >= lo) & (phys < hi)
            if what is not None:
                counts[what] += int(here.sum())
            inside |= here
        return inside

    def holds(self, phy: int, what: str | None = None) -> bool:
        """Whether ``phy`` lies in a skipped part (one of ``what`` counted there)."""
        return bool(self.unread(np.array([phy], np.int64), what)[0])

    def place(self, stored: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A queue against the dispatch of the records read: a stored unit pointing into a skipped part
        stands for its record (``unread``), and each dispatched unit after it goes one place further on,
        where the broker's dispatch of the whole commit log put it. ``stored``, ``wanted``: the units'
        commit-log offsets in queue order. Returns which stored units are unread, and by how many places
        each wanted unit moves."""
        unread = self.unread(stored, "units")
        return unread, np.searchsorted(np.sort(stored[unread]), wanted)

    def splice(self, wanted: dict[str, bytes], stored: dict[str, bytes], unit: int,
               file_size: int) -> dict[str, bytes]:
        """The files of a queue the dispatch of the records read writes (``wanted``, by file name), laid out
        by ``place`` against the queue's own files (``stored``): its units pointing into a skipped part in
        their places, the dispatched ones after them moved on."""
        starts = [int(n) for n in (*wanted, *stored)]
        if not starts:
            return wanted
        base = min(starts)

        def rows(files: dict[str, bytes]) -> np.ndarray:
            size = max((int(n) - base + len(b) for n, b in files.items()), default=0)
            out = np.zeros(-(-size // unit) * unit, np.uint8)
            for n, b in files.items():
                out[int(n) - base:int(n) - base + len(b)] = np.frombuffer(b, np.uint8)
            return out.reshape(-1, unit)

        def phys(units: np.ndarray) -> np.ndarray:           # a unit's first field, big-endian
            return units[:, :8].copy().view(">i8").ravel()

        have, want = rows(stored), rows(wanted)
        have_at, want_at = np.flatnonzero(have.any(axis=1)), np.flatnonzero(want.any(axis=1))
        unread, up = self.place(phys(have[have_at]), phys(want[want_at]))
        kept, moved = have_at[unread], want_at + up
        count = max(len(want), int(moved.max(initial=-1)) + 1, int(kept.max(initial=-1)) + 1)
        out = np.zeros((-(-count * unit // file_size) * file_size // unit, unit), np.uint8)    # whole files
        out[kept] = have[kept]
        out[moved] = want[want_at]
        data = out.tobytes()
        return {f"{base + i:0{C.FILE_NAME_DIGITS}d}": data[i:i + file_size] for i in range(0, len(data), file_size)}

    def findings(self) -> Iterator[Finding]:
        for s, counts in zip(self.skipped, self.counts):
            yield Finding(ERROR, "skipped_part", s.where, s.offset,
                          f"{s.bytes} bytes from offset {s.offset} not read ({s.why}): {s.records} record(s) on "
                          f"disk there; {counts['units']} consume-queue unit(s) and {counts['index_entries']} "
                          "index entries point into them", actual=s.bytes,
                          counts={"records": s.records, "bytes": s.bytes, **counts})


def _unindexed_findings(store: Store, results: list[FileResult]) -> Iterator[Finding]:
    """Record keys no index entry holds (query-key cannot find them), one warning per commit-log file: the
    broker starts and serves the rest (a 4.9.7 DLedger recovery leaves such records itself); rebuild-index
    indexes them."""
    cp = store.checkpoint()
    for r in results:
        if r.unindexed is None:
            continue
        keys, at, stored = r.unindexed
        lagging = cp is not None and stored > cp.index_msg_timestamp
        yield Finding(WARNING, "index_missing_entry", str(r.file.path), at,
                      f"{keys} key(s) of records from {at} on have no index entry (query-key misses them; "
                      "rebuild-index adds them)"
                      + ("; they are newer than the checkpoint's indexMsgTimestamp" if lagging else ""))


def _verify_checkpoint(store: Store, latest: int, end: int) -> Iterator[Finding]:
    cp = store.checkpoint()
    if cp is None or not store.is_store_root:
        return
    path = str(store.path(L.CHECKPOINT))
    length = store.checkpoint_length()
    if length < C.CHECKPOINT_FILE_SIZE:
        yield Finding(WARNING, "checkpoint_short", path, length, f"checkpoint is {length} bytes, not "
                      f"{C.CHECKPOINT_FILE_SIZE}", C.CHECKPOINT_FILE_SIZE, length)
    for pos, name in ((0, "physic_msg_timestamp"), (8, "logics_msg_timestamp"), (16, "index_msg_timestamp")):
        value = getattr(cp, name)
        if value > latest:
            yield Finding(ERROR, "checkpoint_ahead", path, pos,
                          f"{name} is later than the newest record's store time", latest, value)
    if cp.confirm_phy_offset > end:
        yield Finding(ERROR, "checkpoint_ahead", path, 32, "confirmPhyOffset lies past the written end",
                      end, cp.confirm_phy_offset)
