"""repair: what the broker's crash recovery would do, as a plan that can then be applied safely.

Mirrors DefaultMessageStore.load/recover: IndexService.load (after an abnormal exit, index files newer
than the checkpoint go), ConsumeQueue.recover, CommitLog.recoverAbnormally (start file chosen by the
checkpoint, every valid record re-dispatched to consume queues and index) or recoverNormally (last
three files), truncateDirtyFiles / truncateDirtyLogicFiles at the first invalid record. Unlike the
broker it zeroes what it cuts off, so a later crash cannot resurrect stale records or units. The
abort file goes (5.x: it becomes abort.bak, as the broker's restart leaves it).

Planning reads shared facts and rules only: the records (``ops.facts`` via ``ops.dispatch_plan.valid_facts``),
the version's recovery start (``store.broker_model``), DLedger's recovery (``ops.dledger.plan_dledger_recovery``,
pure). Every byte it plans comes from a store helper (``cut_copy``, ``patched``, ``CqWriter``,
``IndexBuilder``, ``rewrite_index_units``); ``apply_plan`` hands them to one ``Transaction``.
"""

from __future__ import annotations

import bisect
import struct
import warnings
from functools import partial
from itertools import chain
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from rmqtool import constants as C
from rmqtool.errors import StoreError, StoreWarning
from rmqtool.format.batchcq import UNIT as BCQ_UNIT_STRUCT
from rmqtool.format.checkpoint import Checkpoint, encode_checkpoint
from rmqtool.format.commitlog import Buffer, Message, encode_message
from rmqtool.format.consumequeue import FILLER_UNIT, UNIT, valid_prefix
from rmqtool.format.indexfile import Geometry
from rmqtool.ops.dledger import plan_dledger_recovery
from rmqtool.ops.dispatch_plan import valid_facts
from rmqtool.ops.facts import FileFacts, Progress, QueueNames, scan_file, scan_files
from rmqtool.store import layout as L
from rmqtool.store.atomic import Transaction, failed
from rmqtool.store.bounds import PlanSize, file_data
from rmqtool.store.broker_model import V4, V5, abnormal_recovery_start, normal_recovery_start
from rmqtool.store.filequeue import QueueFile, cut_copy, first_nonzero, patched
from rmqtool.store.index_builder import IndexBuilder, continue_copies
from rmqtool.store.metadata import batch_cq_topics, bcq_recovered_end
from rmqtool.store.dledger import DEFAULT_INDEX_FILE_SIZE
from rmqtool.store.queue_writer import BcqFileWriter, CqWriter, safe_topic_dir
from rmqtool.store.store import Store
from rmqtool.store.output import ScratchDir


# What repair plans nothing for, and what does (said beside each finding left after --apply)
LEFT_TO = {
    "stray_file": "repair removes no file it did not write: move it out of the store",
    "cq_file_size": "rebuild-cq rebuilds the queue from the commit log",
    "cq_missing_unit": "rebuild-cq rebuilds the queue from the commit log",
    "cq_missing_queue": "rebuild-cq rebuilds the queue from the commit log",
    "cq_unit_mismatch": "rebuild-cq rebuilds the queue from the commit log",
    "cq_queue_offset_mismatch": "the record's stored queue offset is damage (rule reput_misplaced): its unit is "
                                "where the broker's dispatch and rebuild-cq put it; repair does not rewrite records",
    "index_bad_slot": "rebuild-index rebuilds the index",
    "index_entry_time": "rebuild-index rebuilds the index",
    "index_missing_entry": "rebuild-index rebuilds the index",
    "timer_bad_chain": "repair does not rewrite the timer store",
    "dledger_crc_mismatch": "repair does not rewrite a DLedger entry: copy it from another replica of the group "
                            "(its data file), or accept that message's loss",
    "config_empty_table": "repair does not rewrite config files: restore this one from a backup, or accept "
                          "an empty table",
    "config_refused": "repair does not rewrite config files: restore the file and its .bak from a backup (a "
                      "missing .bak gives an empty table)",
    "config_kv_refused": "repair never writes into a RocksDB database: restore the config database from a "
                         "backup",
    "timer_read_moved": "no offline fix: any start this late skips those slots; rmqtool timer lists their "
                        "messages to send again",
    "static_queue_unmapped": "repair does not rewrite config files: restore topicQueueMapping.json from a backup "
                             "or name the queue again (mqadmin updateStaticTopic)",
}
# repair plans no change of these stores' files: what verify finds in them is named, with this
LEFT_TO.update(dict.fromkeys(["compaction_checkpoint", "compaction_cq_mismatch", "compaction_log_differs",
                              "compaction_log_record", "compaction_lost_record", "compaction_not_newest",
                              "compaction_unreadable"],
                             "repair does not rewrite compaction logs, their queues or position checkpoint: a "
                             "compaction topic's consumers read them as they are"))
LEFT_TO.update(dict.fromkeys(["rocksdb_max_offset", "rocksdb_min_offset", "rocksdb_missing_queue",
                              "rocksdb_missing_unit", "rocksdb_past_commitlog", "rocksdb_store_time",
                              "rocksdb_stray_unit", "rocksdb_unit_mismatch"],
                             "repair never writes into a RocksDB database: the consume queue stays as it is"))
NO_FIX = "repair has no change for it"       # an error of a kind LEFT_TO does not name


def left_unrepaired(store: Store) -> list[tuple[str, str, str]]:
    """(path, problem, what fixes it) of what the broker's load refuses and repair plans nothing for, found
    without reading data: entries of the data directories the load refuses (recognition.refused_entries)
    and consume-queue files of the wrong size (MappedFileQueue.load)."""
    from rmqtool.store.recognition import refused_entries

    out = [(store.rel(path), reason, LEFT_TO["stray_file"])
           for path, refused, reason in refused_entries(store.root, broker_5x=store.is_5x) if refused] \
        if store.is_store_root else []
    for cq in store.consume_queues():
        out += [(store.rel(f.path), problem, LEFT_TO["cq_file_size"]) for f, problem in cq.queue.problems()
                if f is not None and f.length != cq.queue.file_size]
    return out


@dataclass
class Action:
    kind: str          # truncate_commitlog, delete_file, rewrite_cq, delete_cq, index_delete, index_write, ...
    path: str
    detail: str

    def row(self) -> dict:
        return {"action": self.kind, "path": self.path, "detail": self.detail}


@dataclass
class RepairPlan:
    store: Store
    abnormal: bool
    process_offset: int
    recover_from: int
    lost: int = 0                 # valid messages after the cut (beyond the torn tail): refused unless accepted
    actions: list[Action] = field(default_factory=list)
    writes: dict[str, Buffer | Path] = field(default_factory=dict)   # bytes-like, or a
    #                                                                       file built in ``scratch``
    scratch: ScratchDir | None = None   # outside the store, removed by close()
    deletes: list[str] = field(default_factory=list)
    renames: list[tuple[str, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.writes or self.deletes or self.renames)

    def size(self) -> PlanSize:
        """What the plan creates (files new to the store), changes and deletes (store.bounds)."""
        size = PlanSize()
        for rel, data in self.writes.items():
            n, length = file_data(data) if isinstance(data, Path) else (memoryview(data).nbytes,) * 2
            if self.store.path(rel).exists():
                size.changed += 1
                size.data += n
            else:
                size.create(rel, n, length)
        size.deleted = len(self.deletes)
        return size

    def close(self) -> None:
        """Remove the scratch directory (an OSError names the file that could not go)."""
        if self.scratch is not None:
            scratch, self.scratch = self.scratch, None
            scratch.remove()


def _cq_max_phy(store: Store) -> int:
    """The consume queues' highest physical offset (each queue's last file), -1 without any unit."""
    reach = -1
    for cq in store.consume_queues():
        files = list(cq.queue)
        if files:
            reach = max(reach, valid_prefix(files[-1].read())[1])
    return reach


def _lost_after(files: list[QueueFile], process: int) -> int:
    """Valid records at or after ``process`` (a walk that steps over damaged records)."""
    lost = 0
    for f in files:
        if f.start + f.length > process:
            facts = scan_file(f, QueueNames(), deep=True, salvage=True)
            lost += int((facts.columns["offset"] >= process).sum())
    return lost


SALVAGED_TOPIC = C.SALVAGED_TOPIC


def placeholder(offset: int, size: int) -> bytes:
    """A record of exactly ``size`` bytes at ``offset`` that the broker's checks accept and its dispatch
    leaves alone: a rollback-type message (CommitLogDispatcherBuildConsumeQueue and IndexService.buildIndex
    skip TRANSACTION_ROLLBACK_TYPE) on topic rmqtool-salvaged, its body zeros."""
    empty = Message(SALVAGED_TOPIC, sys_flag=int(C.TransactionType.ROLLBACK), physical_offset=offset)
    room = size - empty.total_size
    if room < 0:
        raise StoreError(f"the damaged record at {offset} spans {size} bytes, fewer than a placeholder "
                         f"record ({empty.total_size}): --salvage cannot keep what follows it")
    return encode_message(replace(empty, body=bytes(room)))


def _salvage_scan(store: Store, files: list[QueueFile], names: QueueNames, keys: bool, progress: Progress | None,
                  jobs: int | None, props: bool) -> tuple[list[FileFacts], list[tuple[int, int]], int]:
    """Every readable record from the first of ``files`` on (damaged ones stepped over): the facts, the
    damaged ranges followed by valid records (to be replaced by placeholders), and the end of the data
    (the last damaged record when nothing valid follows it: the torn tail, cut as the broker does)."""
    ledger = bool(store.commitlog.entry_header_size)
    options = {"deep": True, "keys": keys, "props": props, "ledger": ledger, "salvage": True}
    scanned = list(scan_files([(f, options) for f in files], names, jobs, progress))
    last = max((int(fa.columns["offset"][-1]) for fa in scanned if len(fa)), default=-1)
    ranges = [(at, size) for fa in scanned for at, size, _ in fa.damaged if at < last]
    tail = [at for fa in scanned for at, _, _ in fa.damaged if at > last]
    end = tail[0] if tail else next((fa.end for fa in reversed(scanned) if len(fa) or fa.stop == "blank"),
                                    files[0].start if files else 0)
    return scanned, ranges, end


def plan_repair(store: Store, *, salvage: bool = True, as_broker: bool = False, cq_file_size: int | None = None,
                index_geometry: Geometry | None = None, progress: Progress | None = None,
                jobs: int | None = None) -> RepairPlan:
    """The broker's recovery as a plan (rmqtool.store.broker_model, per version). Only the files recovery
    reads are read: from the start file (chosen from first records and the checkpoint after a crash, else
    CommitLog.recoverNormally's) to the first invalid record; older files only by a header walk to the BLANK
    that ends them (rule blank_size: a mismatched TOTALSIZE is rewritten wherever it is). ``plan.lost`` counts
    the valid messages the cut would delete beyond it (a bad record before the torn tail). ``salvage`` (beyond
    the broker): keep them, each damaged record before the torn tail replaced by a placeholder of its size
    (``placeholder``), its consume-queue unit by a blank unit. ``jobs``: worker processes for the walk
    (facts.scan_files). ``as_broker``: where the broker's recovery leaves records unindexed (4.9.7 DLedger),
    leave them so too instead of indexing them. ``cq_file_size`` / ``index_geometry``: the broker's sizes for the
    queue and index files repair creates where the store has none to take them from (refused without them)."""
    queue = store.commitlog.queue
    fsize = queue.file_size or C.DEFAULT_COMMITLOG_FILE_SIZE
    for f, problem in queue.problems():     # MappedFileQueue.load refuses it; which files belong is not a guess
        if f is not None and queue.files and f is not queue.files[-1] and f.length != queue.file_size:
            raise StoreError(f"{problem}: not a commit-log file the broker maps here; repair does not guess "
                             "which files belong (move it out of the store)", path=str(f.path))
    abnormal = store.abort_path.exists()
    cp = store.checkpoint() or Checkpoint()
    v5 = store.is_5x
    if abnormal and store.broker_version is None:
        warnings.warn(StoreWarning(f"{store.root}: the files do not tell a 4.x from a 5.x broker; repair follows "
                                   "4.9.7's recovery (no abort.bak, confirmPhyOffset left as it is), which "
                                   "drops no record that 5.x would keep"), stacklevel=2)
    files = [f for f in queue if f.length > 0]
    if abnormal:
        start = abnormal_recovery_start(store)
    else:
        start = normal_recovery_start([f.start for f in files], V5 if v5 else V4, _cq_max_phy(store))
    ledger = plan_dledger_recovery(store, broker_5x=v5) if store.commitlog.entry_header_size else None
    names = QueueNames()
    recover_from = files[start].start if files else 0
    # DLedger: the broker dispatches a body-damaged entry again (no CRC check in the reput), so no CRC stop
    ranges: list[tuple[int, int]] = []
    older: list[FileFacts] = []
    batch = batch_cq_topics(store)       # their re-read records need INNER_BASE / INNER_NUM
    if salvage and ledger is None and files:
        scanned, ranges, process = _salvage_scan(store, files[start:], names, abnormal, progress, jobs,
                                                 bool(batch))
        # files the recovery does not read: a 4.9.7 broker's dispatch still reads them (skipping the rest of a
        # file at a bad magic code, serving a damaged body as it is), and their consume-queue units point there
        older, old_ranges, _ = _salvage_scan(store, files[:start], names, False, progress, jobs, False) \
            if start else ([], [], 0)
        old_ranges += [(at, size) for fa in older for at, size, _ in fa.damaged if (at, size) not in old_ranges]
        ranges = old_ranges + ranges
    else:
        scanned = list(valid_facts(store, names, start=recover_from, deep=ledger is None, keys=abnormal,
                                   props=abnormal and bool(batch), progress=progress, jobs=jobs)) if files else []
        process = scanned[-1].stop_offset if scanned else 0     # checkCRCOnRecover defaults to true
    if ledger is not None:             # DLedgerCommitLog recovers to DLedger's write position, not a CRC walk
        process = ledger.end_pos
    plan = RepairPlan(store, abnormal, process, recover_from)
    if store.pending_change is not None:       # --apply finishes or undoes it before it plans anything
        plan.actions.append(Action("finish_journal", store.rel(store.pending_change),
                                   "an interrupted change: --apply first finishes or undoes it"))
    if ledger is None and files:
        plan.lost = _lost_after(files, process)
    tidy = abnormal or plan.lost > 0     # zero what is cut off; after a normal start the bytes past the
    #                                      recovered end are cut again, logically, on every load: left as they are

    # -- commit log: delete empty or later files, zero after the cut --------------------------------
    if ledger is not None:
        _ledger_files(plan, store, ledger)
    for f in queue if ledger is None else ():
        rel = store.rel(f.path)
        if f.length == 0:
            plan.deletes.append(rel)
            plan.actions.append(Action("delete_file", rel, "empty commit-log file"))
        elif f.start + fsize > process:
            if process >= f.start:
                cut = process - f.start
                if f.length != fsize or (tidy and first_nonzero(f.path, cut) is not None):
                    plan.writes[rel] = cut_copy(f.path, cut, fsize)
                    plan.actions.append(Action("truncate_commitlog", rel,
                                               f"keep {cut} bytes (up to offset {process}), zero the rest"))
            else:
                plan.deletes.append(rel)
                plan.actions.append(Action("delete_file", rel, f"commit-log file after offset {process}"))
    for at, size in ranges:
        f, pos = queue.locate(at)
        rel = store.rel(f.path)
        plan.writes[rel] = patched(f.path, pos, placeholder(at, size), plan.writes.get(rel))
        plan.actions.append(Action("salvage_record", rel, f"damaged record at {at} ({size} bytes) replaced by a "
                                   f"placeholder the broker steps over; the records after it are kept"))

    # rule blank_size, in every commit-log file: those the recovery reads by their walk, older ones (which
    # only the dispatch reads, and a 5.3.3 broker's recovery without consume queues) by a header walk
    for f in files[:start] if ledger is None else ():
        pos = store.commitlog.end_blank(f)
        if pos is not None:
            _fix_blank_size(plan, f, pos)
    for fa in scanned if ledger is None else ():
        if fa.stop == "blank":
            _fix_blank_size(plan, fa.file, fa.stop_offset - fa.file.start)

    # -- consume queues: recover, re-dispatch (abnormal), truncate dirty units ----------------------
    cq_size = store.cq_file_size(cq_file_size)
    writers: dict[tuple[str, int], CqWriter] = {}
    originals: dict[tuple[str, int], dict[int, bytes]] = {}
    reach = _record_reach(scanned, names) if abnormal else {}
    untouched = set()
    for cq in store.consume_queues():
        size = cq.queue.file_size or cq_size
        name = (cq.topic, cq.queue_id)
        if any(f.length != size for f in list(cq.queue)[:-1]):
            untouched.add(name)            # the load refuses it; rebuild-cq rebuilds it (left_unrepaired)
            continue
        if not ranges and _untouched(cq, size, process, reach.get(name, -1)):
            untouched.add(name)            # most queues of a big store: nothing read but their tails
            continue
        writers[name] = CqWriter.load(cq, size)
        originals[name] = {f.start: bytes(f.read()) for f in cq.queue}
    batch_queues = {n for n in names.names if n[0] in batch}

    def dispatch(records, **kw) -> None:      # a queue new to the store gets files of cq_size
        try:
            _dispatch(records, names, writers, cq_size, skip=untouched | batch_queues, **kw)
        except StoreError as exc:
            raise exc.at(path=str(store.path(L.CONSUMEQUEUE))) from None

    if abnormal:
        dispatch(scanned)
    if ranges:    # beyond the broker: every record at its queue offset, a blank unit where a salvaged one was,
        #           so that no start's dispatch appends them at another queue offset (rule reput_misplaced)
        salvaged = sorted(at for at, _ in ranges)
        for w in writers.values():
            w.fill_gaps = True
        dispatch(older + scanned, fill_gaps=True, skipped_before=partial(bisect.bisect_left, salvaged))
        for w in writers.values():
            w.finish()
        if set(writers) - set(originals) and not (cq_file_size or store.cq_file_size_known):
            raise StoreError("repair writes the consume queues of the records after a salvaged one (so that no "
                             "start appends them at another queue offset), but no consume-queue file tells their "
                             "size: give --cq-file-size (the broker's mappedFileSizeConsumeQueue)",
                             path=str(store.consumequeue_dir))
    for w in writers.values():
        w.truncate_dirty(process)
        if ranges:
            _blank_units(w, {at for at, _ in ranges})
    for (topic, qid), w in sorted(writers.items()):
        new = w.file_bytes()
        old = originals.get((topic, qid), {})
        for start in sorted(set(old) | set(new)):
            rel = L.queue_file(topic, qid, start)
            if start not in new:
                plan.deletes.append(rel)
                plan.actions.append(Action("delete_cq", rel, f"every unit points at or after {process}"))
            elif old.get(start) != new[start] and (tidy or _units_differ(old.get(start), new[start], process)):
                plan.writes[rel] = new[start]
                plan.actions.append(Action("rewrite_cq", rel, f"units up to logical offset {w.write_pos}; zero after"))

    _batch_queues(plan, store, scanned, names, batch, tidy)

    # -- index (abnormal exit only): drop files newer than the checkpoint, rebuild from the start file
    new_cp = cp
    if abnormal:
        refs = store.index_files()
        # beyond the broker (salvage, a cut that loses messages, a torn tail the broker had indexed before it
        # crashed: IndexService.load keeps such entries): older files holding entries of the damaged, lost
        # or cut records are rebuilt too, from their first offset
        first_bad = ranges[0][0] if ranges else process if plan.lost or ledger is None else None
        kept, stale = [], []
        for ref in refs:
            rel = store.rel(ref.path)
            if ref.header.end_timestamp > cp.index_msg_timestamp:
                plan.deletes.append(rel)
                plan.actions.append(Action("index_delete", rel, "end timestamp after the checkpoint's "
                                           f"indexMsgTimestamp {cp.index_msg_timestamp}"))
            elif first_bad is not None and ref.header.end_phy_offset >= first_bad:
                stale.append(ref)
            else:
                kept.append(ref)
        if refs and (ledger is None or ledger.reindex_from is not None):
            reread = _readable(store, min(r.header.begin_phy_offset for r in stale), recover_from) if stale else ()
            builder = _index_files(plan, store, refs[0].geometry, kept, stale,
                                   chain(reread, _reindexed(scanned, ledger)),
                                   f"holds entries at or after the damaged or lost record at {first_bad}")
            if builder.full_end_timestamp is not None:
                new_cp = new_cp._replace(index_msg_timestamp=builder.full_end_timestamp)
        elif not as_broker and files:    # a 4.9.7 DLedger recovery indexes nothing again (DLedgerCommitLog.recover),
            #                              so records the kept files do not hold stay unindexed: beyond the broker
            # from the last kept file's endPhyOffset: a record whose keys filled it may have more (IndexService.
            # buildIndex skips only records below endPhyOffset, so the broker would re-add it too)
            covered = max([r.header.end_phy_offset for r in kept] + [store.commitlog.queue.min_offset])
            _index_files(plan, store, _geometry(store, refs, index_geometry), kept, [],
                         _readable(store, covered, process), "")
        last_cq = [int(f.columns["store_timestamp"][f.gets_cq_unit()][-1]) for f in scanned if f.gets_cq_unit().any()]
        if ledger is not None:         # DLedger: 4.9.x leaves the checkpoint; 5.x stamps the last record
            last = next((int(f.columns["store_timestamp"][-1]) for f in reversed(scanned) if len(f)), None)
            if v5 and last is not None:
                new_cp = new_cp._replace(physic_msg_timestamp=last, logics_msg_timestamp=last)
        elif last_cq:
            new_cp = new_cp._replace(logics_msg_timestamp=last_cq[-1])
    if v5 and ledger is None and (abnormal or cp.confirm_phy_offset > process):
        last_msg = next((int(f.columns["offset"][-1]) for f in reversed(scanned) if len(f)), process)
        new_cp = new_cp._replace(confirm_phy_offset=last_msg)
    if plan.lost:
        new_cp = _after_cut(plan, store, scanned, new_cp) if not abnormal else _times_back(scanned, new_cp)
    if ranges and not abnormal:
        _index_salvaged(plan, store, ranges[0][0], index_geometry)
    elif not abnormal and not plan.lost and ledger is None and files:     # a torn tail cut on a normal start
        _reindex(plan, store, process, f"holds entries at or after the recovered end {process}")
    length = store.checkpoint_length()
    short = length is not None and length < C.CHECKPOINT_FILE_SIZE
    if short:
        new_cp = _lost_fields(store, scanned, cp, new_cp, length)
    if length is not None and (new_cp != cp or short):
        plan.writes[L.CHECKPOINT] = encode_checkpoint(new_cp)
        plan.actions.append(Action("checkpoint", L.CHECKPOINT, ", ".join(
            ([f"{length} bytes -> {C.CHECKPOINT_FILE_SIZE}"] if short else [])
            + [f"{k} {getattr(cp, k)} -> {getattr(new_cp, k)}" for k in Checkpoint._fields[:5]
               if getattr(cp, k) != getattr(new_cp, k)])))
    if abnormal:
        if v5:
            plan.writes[L.ABORT_BAK] = store.abort_path.read_bytes()
            plan.actions.append(Action("abort", L.ABORT, "remove (its content goes to abort.bak, as in 5.x)"))
        else:
            plan.actions.append(Action("abort", L.ABORT, "remove"))
        plan.deletes.append(L.ABORT)
    return plan


class _InMemory:
    """A queue writer's sink over whole queue files held in memory (start offset -> bytes)."""

    def __init__(self, files: dict[int, bytearray], size: int):
        self.files, self.size = files, size

    def create(self, name: str, size: int) -> None:
        self.files.setdefault(int(name), bytearray(size))

    def write_at(self, name: str, offset: int, data: bytes) -> None:
        self.create(name, self.size)
        self.files[int(name)][offset:offset + len(data)] = data


def _batch_queues(plan: RepairPlan, store: Store, scanned: list[FileFacts], names: QueueNames, batch: set[str],
                  tidy: bool) -> None:
    """Batch queues (5.x) as the broker's start leaves them (rmqtool.store.metadata.bcq_recovered_end:
    BatchConsumeQueue.recover and truncateDirtyLogicFiles at the recovered end), after a crash with the
    re-read batch records appended (putBatchMessagePositionInfo: only records after the last unit's
    physical offset); what is cut off zeroed (``tidy``), later files deleted."""
    from rmqtool.ops.rebuild import batch_units

    unit, size = C.BCQ_STORE_UNIT_SIZE, store.bcq_file_size()
    process = plan.process_offset
    queues = {(q.topic, q.queue_id): q for q in store.batch_consume_queues()}
    added: dict[tuple[str, int], list[np.ndarray]] = {}
    codes = [c for c, (t, _) in enumerate(names.names) if t in batch]
    for facts in scanned if plan.abnormal and codes else ():
        rows = np.flatnonzero(facts.gets_cq_unit())
        rows = rows[np.isin(facts.columns["queue"][rows], codes)]
        queue, rec, packed = batch_units(facts, rows)
        cols = facts.columns
        for code in np.unique(queue).tolist():
            at = queue == code
            r = rec[at]
            added.setdefault(names.names[code], []).append(np.stack(
                [cols["offset"][r], cols["size"][r], cols["tags_code"][r], cols["store_timestamp"][r],
                 packed[at] >> 16, packed[at] & 0xFFFF], axis=1).astype(np.int64))
    for name in sorted(set(queues) | set(added)):
        files = list(queues[name].queue) if name in queues else []
        old = {f.start: bytes(f.read()) for f in files}
        new = {start: bytearray(data) for start, data in old.items()}
        end = bcq_recovered_end(queues[name].queue, process) if files else 0
        last_phy = -1
        if end > (files[0].start if files else 0):
            start = max(s for s in new if s < end)
            last_phy = BCQ_UNIT_STRUCT.unpack_from(new[start], end - unit - start)[0]
        if tidy:
            for start, buf in new.items():
                cut = min(len(buf), max(0, end - start))
                buf[cut:] = bytes(len(buf) - cut)
        rows = np.concatenate(added[name]) if name in added else np.empty((0, 6), np.int64)
        w = BcqFileWriter(size, None, _InMemory(new, size))     # putBatchMessagePositionInfo after ``end``
        w.units, w.last_phy = end // unit, last_phy
        w.stream.at(end - end % size, end)
        w.put_many(*rows.T)
        w.flush()
        pos = w.units * unit
        topic, qid = name
        for start in sorted(new):
            rel = L.queue_file(topic, qid, start, batch=True)
            if start > end and start >= pos and tidy:
                plan.deletes.append(rel)
                plan.actions.append(Action("delete_cq", rel, f"batch units after the recovered end {process}"))
            elif bytes(new[start]) != old.get(start):
                plan.writes[rel] = bytes(new[start])
                plan.actions.append(Action("rewrite_cq", rel, f"batch units up to logical offset {max(pos, end)}; "
                                           "zero after"))


def _blank_units(w: CqWriter, offsets: set[int]) -> None:
    """Units pointing at a salvaged (replaced) record become blank units, which consumers step over."""
    for buf in w.files.values():
        for pos in range(0, len(buf) - C.CQ_STORE_UNIT_SIZE + 1, C.CQ_STORE_UNIT_SIZE):
            if UNIT.unpack_from(buf, pos)[0] in offsets and UNIT.unpack_from(buf, pos)[1] > 0:
                buf[pos:pos + C.CQ_STORE_UNIT_SIZE] = UNIT.pack(*FILLER_UNIT)


def _units_differ(old: bytes | None, new: bytes, process: int) -> bool:
    """Whether a rewritten queue file changes a unit recovery keeps (not just zeroes stale ones after
    them, which ConsumeQueue.recover and truncateDirtyLogicFiles drop on every load)."""
    if old is None:
        return True
    valid = valid_prefix(new)[0] * C.CQ_STORE_UNIT_SIZE
    return old[:valid] != new[:valid] or valid_prefix(old, process)[0] * C.CQ_STORE_UNIT_SIZE != valid


def _reindex(plan: RepairPlan, store: Store, first_bad: int, why: str) -> None:
    """Index files holding entries at or after ``first_bad`` rebuilt from the readable records before the
    logical end (damaged ones stepped over), as IndexService.buildIndex would have built them."""
    process = plan.process_offset
    refs = store.index_files()
    stale = [r for r in refs if r.header.end_phy_offset >= first_bad]
    if not stale:
        return
    kept = [r for r in refs if r not in stale]
    _index_files(plan, store, refs[0].geometry, kept, stale,
                 _readable(store, min(r.header.begin_phy_offset for r in stale), process), why)


def _geometry(store: Store, refs: list, given: Geometry | None) -> Geometry:
    """The index geometry of the files repair creates: the store's files', ``given``, the sizes chosen at init;
    refused otherwise (a file of another geometry than the broker's is read with the wrong slots)."""
    if refs:
        return refs[0].geometry
    if given is None and not store.index_geometry_known:
        raise StoreError("repair writes index files, but no index file tells their geometry: give --slots and "
                         "--max-entries (the broker's maxHashSlotNum and maxIndexNum)", path=str(store.index_dir))
    return given or store.index_geometry()


def _index_salvaged(plan: RepairPlan, store: Store, first_bad: int, given: Geometry | None) -> None:
    """Index files holding entries from the salvaged record at ``first_bad`` on rebuilt, and the records no
    index file holds yet (a store whose index is gone) indexed after them: once their queues are whole, no
    start's dispatch (which reputs from the queues' end) indexes them."""
    refs = store.index_files()
    stale = [r for r in refs if r.header.end_phy_offset >= first_bad]
    kept = [r for r in refs if r not in stale]
    lo = min(r.header.begin_phy_offset for r in stale) if stale else \
        max([r.header.end_phy_offset for r in kept] + [store.commitlog.queue.min_offset])
    _index_files(plan, store, _geometry(store, refs, given), kept, stale, _readable(store, lo, plan.process_offset),
                 f"holds entries from the salvaged record at {first_bad} on")


def _index_files(plan: RepairPlan, store: Store, geometry, kept: list, stale: list, facts, why: str) -> IndexBuilder:
    """IndexService.buildIndex over ``facts`` after the ``kept`` index files: the last kept one continued and
    new ones made as sparse files in the plan's scratch directory (streamed, so memory stays small whatever
    the geometry); ``stale`` files not rebuilt under their own name are deleted."""
    if plan.scratch is None:
        plan.scratch = ScratchDir("rmqtool-repair-index-")
    builder = IndexBuilder(geometry, continue_copies(kept[-1:], plan.scratch.path), directory=plan.scratch.path)
    for f in facts:
        builder.add_facts(f)
    builder.close()
    written = {name for name, _ in builder.files if name in builder.changed}
    for r in stale:
        if r.name not in written:          # a rebuilt file may take a deleted one's name
            plan.deletes.append(store.rel(r.path))
            plan.actions.append(Action("index_delete", store.rel(r.path), why))
    for name, w in builder.files:
        if name in builder.changed:
            rel = L.index_file(name)
            plan.writes[rel] = plan.scratch.path / name
            plan.actions.append(Action("index_write", rel, f"{w.header.entry_count} entries, up to offset "
                                       f"{w.header.end_phy_offset}"))
    for rel in [d for d in plan.deletes if d in plan.writes]:     # rebuilt under a name planned for deletion:
        plan.deletes.remove(rel)                                 # written, not deleted after its write
        plan.actions = [a for a in plan.actions if not (a.kind == "index_delete" and a.path == rel)]
    return builder


def _readable(store: Store, lo: int, hi: int):
    """The readable records in [lo, hi) (damaged ones stepped over), as one FileFacts per commit-log file."""
    ledger = bool(store.commitlog.entry_header_size)
    for f in store.commitlog.queue:
        if f.length and f.start + f.length > lo and f.start < hi:
            facts = scan_file(f, QueueNames(), deep=not ledger, keys=True, ledger=ledger, salvage=not ledger)
            offset = facts.columns["offset"]
            yield facts.select((offset >= lo) & (offset < hi))


def _after_cut(plan: RepairPlan, store: Store, scanned: list[FileFacts], cp: Checkpoint) -> Checkpoint:
    """After a cut that deletes messages on a normal start: index files reaching the cut are rebuilt up to it
    and the checkpoint's times brought back to the last kept record (what the cut leaves stale)."""
    _reindex(plan, store, plan.process_offset, f"holds entries at or after the cut {plan.process_offset}")
    return _times_back(scanned, cp)


def _lost_fields(store: Store, scanned: list[FileFacts], cp: Checkpoint, new_cp: Checkpoint, length: int) -> Checkpoint:
    """A checkpoint file of ``length`` bytes, shorter than its page (broker_model "checkpoint": the broker reads
    zeros past its end and its next StoreCheckpoint.flush writes every field): each field it lacks that recovery
    left as read gets what the broker's flushes write after this recovery: physicMsgTimestamp the last record's
    store time, logicsMsgTimestamp the last record with a consume-queue unit's (ConsumeQueue.putMessagePositionInfo),
    indexMsgTimestamp the newest index file's end timestamp (IndexService.flush); masterFlushedOffset and
    confirmPhyOffset 0, as a clean shutdown leaves them."""
    last = next((int(f.columns["store_timestamp"][-1]) for f in reversed(scanned) if len(f)), 0)
    last_cq = next((int(f.columns["store_timestamp"][f.gets_cq_unit()][-1]) for f in reversed(scanned)
                    if f.gets_cq_unit().any()), 0)
    found = {"physic_msg_timestamp": last, "logics_msg_timestamp": last_cq,
             "index_msg_timestamp": max((r.header.end_timestamp for r in store.index_files()), default=0)}
    return new_cp._replace(**{k: found.get(k, 0) for i, k in enumerate(Checkpoint._fields[:5])
                              if length < 8 * (i + 1) and getattr(new_cp, k) == getattr(cp, k)})


def _times_back(scanned: list[FileFacts], cp: Checkpoint) -> Checkpoint:
    """The checkpoint's times no later than the last kept record (after a cut that deletes messages)."""
    last = next((int(f.columns["store_timestamp"].max()) for f in reversed(scanned) if len(f)), None)
    if last is not None:
        cp = cp._replace(**{k: min(getattr(cp, k), last) for k in
                            ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp")})
    return cp


def _ledger_files(plan: RepairPlan, store: Store, ledger) -> None:
    """DLedgerMmapFileStore.recover: data and index files cut at the last accepted entry (zeroed after it),
    wrong index units rewritten, and the checkpoint (and its .bak) DLedger persists afterwards; currterm
    gets the .bak DLedger's next persist leaves."""
    from rmqtool.format import dledger as D

    files = store.dledger
    index = files.index_queue()
    index_size = index.file_size or store.saved_sizes.get("dledgerMappedFileSizeForEntryIndex") \
        or DEFAULT_INDEX_FILE_SIZE
    maps: dict[Path, Buffer] = {}
    for path, keep in ledger.data_cut:
        maps[path] = cut_copy(path, keep, path.stat().st_size)
    for path, keep in ledger.index_cut:                  # a short index file comes back at full size
        maps[path] = cut_copy(path, keep, index_size)
    files.rewrite_index_units(maps, ledger.index_rewrite, index_size)
    for path in ledger.data_delete + ledger.index_delete:
        plan.deletes.append(store.rel(path))
        plan.actions.append(Action("delete_file", store.rel(path), f"after the last entry {ledger.end_index}"))
    for path, mm in maps.items():
        rel = store.rel(path)
        plan.writes[rel] = mm
        plan.actions.append(Action("truncate_dledger", rel, f"keep entries up to index {ledger.end_index} "
                                   f"(position {ledger.end_pos}), rewrite their index units, zero the rest"))
    text = None if ledger.ledger_checkpoint is None else D.encode_ledger_checkpoint(ledger.ledger_checkpoint).encode()
    main = files.checkpoint_path
    if text is not None and not (main.is_file() and main.read_bytes() == text):
        # the pair, as DLedger's IOUtils.string2File writes it; a .bak beside a right checkpoint is left: DLedger
        # reads the checkpoint and overwrites the .bak at its next persist (verify finds nothing there)
        for path in (main, main.with_name(main.name + ".bak")):
            rel = store.rel(path)
            if not path.is_file() or path.read_bytes() != text:
                plan.writes[rel] = text
                plan.actions.append(Action("dledger_checkpoint", rel, f"committedIndex = endIndex = {ledger.end_index}"))
    term = files.currterm_path
    bak = term.with_name(term.name + ".bak")
    if plan.abnormal and term.is_file() and not bak.is_file():   # the restart's persist
        plan.writes[store.rel(bak)] = term.read_bytes()
        plan.actions.append(Action("dledger_currterm", store.rel(bak), "copy of currterm"))


def _reindexed(scanned: list[FileFacts], ledger) -> list[FileFacts]:
    """The records the broker indexes again: all re-read ones; on DLedger (5.x) those from the first
    dropped index file's begin offset, and the last record once more (its restart dispatches it again,
    as the fixture's recovered index shows)."""
    if ledger is None:
        return scanned
    out = [f.select(f.columns["offset"] >= ledger.reindex_from) for f in scanned]
    last = next((f for f in reversed(out) if len(f)), None)
    if last is not None:
        keep = np.zeros(len(last), bool)
        keep[-1] = True
        out.append(last.select(keep))
    return out


def _record_reach(scanned: list[FileFacts], names: QueueNames) -> dict[tuple[str, int], int]:
    """Per queue, the end (offset + size) of its last re-read record that gets a unit."""
    reach: dict[tuple[str, int], int] = {}
    for facts in scanned:
        rows = np.flatnonzero(facts.gets_cq_unit())
        queue, end = facts.columns["queue"][rows], facts.columns["offset"][rows] + facts.columns["size"][rows]
        for code in np.unique(queue).tolist():
            reach[names.names[code]] = max(reach.get(names.names[code], -1), int(end[queue == code].max()))
    return reach


def _fix_blank_size(plan: RepairPlan, f: QueueFile, pos: int) -> None:
    """An end-of-file BLANK whose TOTALSIZE is not the rest of its file gets that size: 5.3.x's recovery
    stops at an oversized one and deletes every later file, 4.9.7 ignores the field (broker_model
    "blank_size"); so both keep every record."""
    rel = plan.store.rel(f.path)
    size = struct.unpack(">i", f.read_at(pos, 4))[0]
    if size == f.length - pos:
        return
    plan.writes[rel] = patched(f.path, pos, struct.pack(">i", f.length - pos), plan.writes.get(rel))
    plan.actions.append(Action("fix_blank_size", rel, f"the BLANK at offset {f.start + pos} gets TOTALSIZE "
                               f"{f.length - pos} (the rest of the file) instead of {size}"))


def _untouched(cq, file_size: int, process: int, reach: int) -> bool:
    """Whether recovery leaves a queue as it is: full-size files, nothing after the valid units of
    its last three files, no unit at or after ``process``, and every re-read record (ending by
    ``reach``) already covered (ConsumeQueue.putMessagePositionInfo skips those)."""
    files = list(cq.queue)
    if any(f.length != file_size for f in files):
        return False
    max_phy = -1
    tail = files[max(0, len(files) - 3):]
    for i, f in enumerate(tail):
        buf = f.read()
        valid, end = valid_prefix(buf)
        max_phy = max(max_phy, end)
        if valid < len(buf) // C.CQ_STORE_UNIT_SIZE:
            if i + 1 < len(tail) or first_nonzero(f.path, valid * C.CQ_STORE_UNIT_SIZE) is not None:
                return False
            break
    return max_phy <= process and reach <= max_phy


def _dispatch(scanned: list[FileFacts], names: QueueNames, writers: dict[tuple[str, int], CqWriter],
              file_size: int, skip: set, fill_gaps: bool = False, skipped_before=None) -> None:
    """CommitLogDispatcherBuildConsumeQueue over the re-read records, one queue's run at a time."""
    for facts in scanned:
        cols = facts.columns
        rows = np.flatnonzero(facts.gets_cq_unit())
        rows = rows[np.argsort(cols["queue"][rows], kind="stable")]
        codes, first = np.unique(cols["queue"][rows], return_index=True)
        for code, run in zip(codes.tolist(), np.split(rows, first[1:])):
            name = names.names[code]
            if name in skip:
                continue
            w = writers.get(name)
            if w is None:
                safe_topic_dir(name[0], int(cols["offset"][run[0]]))
                w = writers[name] = CqWriter(file_size)
                w.fill_gaps = fill_gaps
            if skipped_before is not None:
                w.skipped_before = skipped_before
            w.put_many(cols["offset"][run], cols["size"][run], cols["tags_code"][run], cols["queue_offset"][run])


def apply_plan(plan: RepairPlan, backup: Path | None = None) -> Path | None:
    """Back up, stage and swap the planned changes in one transaction; the abort file goes last. The
    plan's scratch directory goes after the commit."""
    both = set(plan.writes) & set(plan.deletes)
    if both:             # a delete staged after a write of the same name would undo the write
        raise ValueError(f"repair plan both writes and deletes {sorted(both)}")
    txn = Transaction(plan.store.root, backup, label="repair")
    for rel, data in plan.writes.items():
        txn.write(rel, data)
    for rel in plan.deletes:
        txn.delete(rel)
    saved = txn.commit()
    try:
        plan.close()
    except OSError as exc:
        raise failed(exc, f"the change is applied (backup in {saved}); remove this scratch file outside the "
                          "store by hand") from None
    return saved
