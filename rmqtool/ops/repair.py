"""repair: what the broker's crash recovery would do, as a plan that can then be applied safely.

Mirrors DefaultMessageStore.load/recover: IndexService.load (after an abnormal exit, index files newer
than the checkpoint go), ConsumeQueue.recover, CommitLog.recoverAbnormally (start file chosen by the
checkpoint, every valid record re-dispatched to consume queues and index) or recoverNormally (last
three files), truncateDirtyFiles / truncateDirtyLogicFiles at the first invalid record. Unlike the
broker it zeroes what it cuts off, so a later crash cannot resurrect stale records or units. The
abort file goes (5.x: it becomes abort.bak, as the broker's restart leaves it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rmqtool import constants as C
from rmqtool.format.checkpoint import Checkpoint, encode_checkpoint
from rmqtool.format.commitlog import peek_header
from rmqtool.format.indexfile import IndexWriter
from rmqtool.ops.rebuild import CqWriter, IndexBuilder, dispatch_to_queues, store_cq_file_size
from rmqtool.ops.verify import FileScan, Progress, RecordInfo, scan_commitlog
from rmqtool.store.atomic import Transaction
from rmqtool.store.store import Store


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
    actions: list[Action] = field(default_factory=list)
    writes: dict[str, bytes] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    renames: list[tuple[str, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.writes or self.deletes or self.renames)


def is_5x_store(store: Store) -> bool:
    """abort.bak, a PID in abort, compaction/ or a confirmPhyOffset: written by 5.x brokers only."""
    root = store.root
    abort = store.abort_path
    cp = store.checkpoint()
    return ((root / "abort.bak").exists() or (root / "compaction").is_dir()
            or (abort.is_file() and abort.stat().st_size > 0) or bool(cp and cp.confirm_phy_offset))


def _first_record_matches(scan: FileScan, cp: Checkpoint) -> bool:
    """CommitLog.isMappedFileMatchedRecover (4.6+ / 5.x file mode): the first record's magic is a
    message magic, its store time is set and not after the checkpoint's min timestamp."""
    buf = scan.file.read()
    if len(buf) < 8:
        return False
    _, magic = peek_header(buf, 0)
    if magic not in (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2) or not scan.records:
        return False
    ts = scan.records[0].store_timestamp
    return ts != 0 and ts <= cp.min_timestamp


def _recovery_walk(scans: list[FileScan], start: int) -> tuple[int, list[RecordInfo]]:
    """(processOffset, records passed) of the broker's recovery loop from file ``start``."""
    records: list[RecordInfo] = []
    for i in range(start, len(scans)):
        s = scans[i]
        records += s.records
        if s.stop != "blank" or i == len(scans) - 1:
            return s.stop_offset, records
    return (scans[-1].stop_offset if scans else 0), records


def plan_repair(store: Store, *, progress: Progress | None = None) -> RepairPlan:
    root = store.root
    queue = store.commitlog.queue
    fsize = queue.file_size or C.DEFAULT_COMMITLOG_FILE_SIZE
    abnormal = store.abort_path.exists()
    cp = store.checkpoint() or Checkpoint()
    v5 = is_5x_store(store)
    scans = scan_commitlog(store, deep=True, progress=progress)    # checkCRCOnRecover defaults to true
    scans = [s for s in scans if s.file.length > 0]
    if abnormal:
        start = next((i for i in range(len(scans) - 1, -1, -1) if _first_record_matches(scans[i], cp)), 0)
    else:
        start = max(0, len(scans) - 3)
    process, dispatched = _recovery_walk(scans, start)
    plan = RepairPlan(store, abnormal, process, scans[start].file.start if scans else 0)

    # -- commit log: delete empty or later files, zero after the cut --------------------------------
    for f in queue:
        rel = str(f.path.relative_to(root))
        if f.length == 0:
            plan.deletes.append(rel)
            plan.actions.append(Action("delete_file", rel, "empty commit-log file"))
        elif f.start + fsize > process:
            if process >= f.start:
                cut = process - f.start
                data = bytes(f.read())
                if any(data[cut:]) or len(data) != fsize:
                    plan.writes[rel] = data[:cut] + bytes(fsize - cut)
                    plan.actions.append(Action("truncate_commitlog", rel,
                                               f"keep {cut} bytes (up to offset {process}), zero the rest"))
            else:
                plan.deletes.append(rel)
                plan.actions.append(Action("delete_file", rel, f"commit-log file after offset {process}"))

    # -- consume queues: recover, re-dispatch (abnormal), truncate dirty units ----------------------
    cq_size = store_cq_file_size(store) or C.DEFAULT_CQ_FILE_SIZE
    writers: dict[tuple[str, int], CqWriter] = {}
    originals: dict[tuple[str, int], dict[int, bytes]] = {}
    for cq in store.consume_queues():
        size = cq.queue.file_size or cq_size
        writers[(cq.topic, cq.queue_id)] = CqWriter.load(cq, size)
        originals[(cq.topic, cq.queue_id)] = {f.start: bytes(f.read()) for f in cq.queue}
    if abnormal:
        dispatch_to_queues(dispatched, writers, cq_size)
    for w in writers.values():
        w.truncate_dirty(process)
    for (topic, qid), w in sorted(writers.items()):
        new = w.file_bytes()
        old = originals.get((topic, qid), {})
        qrel = f"consumequeue/{topic}/{qid}"
        for start in sorted(set(old) | set(new)):
            rel = f"{qrel}/{C.offset_to_file_name(start)}"
            if start not in new:
                plan.deletes.append(rel)
                plan.actions.append(Action("delete_cq", rel, f"every unit points at or after {process}"))
            elif old.get(start) != new[start]:
                plan.writes[rel] = new[start]
                plan.actions.append(Action("rewrite_cq", rel, f"units up to logical offset {w.write_pos}; zero after"))

    # -- index (abnormal exit only): drop files newer than the checkpoint, rebuild from the start file
    new_cp = cp
    if abnormal:
        refs = store.index_files()
        kept = []
        for ref in refs:
            rel = str(ref.path.relative_to(root))
            if ref.header.end_timestamp > cp.index_msg_timestamp:
                plan.deletes.append(rel)
                plan.actions.append(Action("index_delete", rel, "end timestamp after the checkpoint's "
                                           f"indexMsgTimestamp {cp.index_msg_timestamp}"))
            else:
                kept.append((ref.name, IndexWriter.from_bytes(ref.read(), ref.geometry)))
        if refs:
            builder = IndexBuilder(refs[0].geometry, kept)
            for r in dispatched:
                builder.add(r)
            for name, w in builder.files:
                if name in builder.changed:
                    rel = f"index/{name}"
                    plan.writes[rel] = w.to_bytes()
                    plan.actions.append(Action("index_write", rel, f"{w.header.entry_count} entries, up to "
                                               f"offset {w.header.end_phy_offset}"))
            if builder.full_end_timestamp is not None:
                new_cp = new_cp._replace(index_msg_timestamp=builder.full_end_timestamp)
        last_cq = [r for r in dispatched if r.gets_cq_unit]
        if last_cq:
            new_cp = new_cp._replace(logics_msg_timestamp=last_cq[-1].store_timestamp)
    if v5:
        last_msg = next((r.offset for s in reversed(scans) for r in reversed(s.records) if r.offset < process),
                        process)
        new_cp = new_cp._replace(confirm_phy_offset=last_msg)
    if store.is_store_root and new_cp != cp and (root / "checkpoint").exists():
        plan.writes["checkpoint"] = encode_checkpoint(new_cp)
        plan.actions.append(Action("checkpoint", "checkpoint", ", ".join(
            f"{k} {getattr(cp, k)} -> {getattr(new_cp, k)}" for k in Checkpoint._fields[:5]
            if getattr(cp, k) != getattr(new_cp, k))))
    if abnormal:
        if v5:
            plan.writes["abort.bak"] = store.abort_path.read_bytes()
            plan.actions.append(Action("abort", "abort", "remove (its content goes to abort.bak, as in 5.x)"))
        else:
            plan.actions.append(Action("abort", "abort", "remove"))
        plan.deletes.append("abort")
    return plan


def apply_plan(plan: RepairPlan, backup: Path | None = None) -> Path | None:
    """Back up, stage and swap the planned changes in one transaction; the abort file goes last."""
    txn = Transaction(plan.store.root, backup, label="repair")
    for rel, data in plan.writes.items():
        txn.write(rel, data)
    for rel in plan.deletes:
        txn.delete(rel)
    return txn.commit()
