"""Compaction topics checked (verify) and summarised (info, stats, topics).

Checks, per compaction queue: each compaction-log record equals its commit-log record (the same topic,
queue and queue offset, found through the topic's consume queue) but for the PHYSICALOFFSET field, which
holds its compaction-log offset (CompactionLog.asyncPutMessage); the part compacted up to the position
checkpoint holds exactly the newest record per KEYS string and every later keyed record is present
(CompactionLog.doCompaction); the sparse queue's units name the log's records one for one.
"""

from __future__ import annotations

from typing import Iterator

from rmqtool.errors import RmqError
from rmqtool.format.batchcq import BatchCqUnit
from rmqtool.format.commitlog import Message, encode_entry
from rmqtool.ops.findings import ERROR, Finding
from rmqtool.store.compaction import CompactionQueue
from rmqtool.store.store import Store

_PHY = slice(28, 36)     # the PHYSICALOFFSET field of a record


def keyed_records(store: Store, topic: str, queue_id: int) -> list[tuple[int, Message]] | None:
    """(queue offset, record) of the queue's records that carry KEYS, read through its consume queue
    (CommitLogDispatcherCompaction copies only those); None when the store has no such consume queue."""
    if topic not in store.topics() or queue_id not in [q.queue_id for q in store.consume_queues(topic)]:
        return None
    out = []
    for qo, unit in store.consume_queue(topic, queue_id).iter_units():
        if unit.is_filler or unit.physical_offset < store.commitlog.min_offset:
            continue
        msg = store.commitlog.read_at(unit.physical_offset)
        if isinstance(msg, Message) and msg.properties.get("KEYS"):
            out.append((qo, msg))
    return out


def queue_summary(store: Store, q: CompactionQueue) -> dict:
    """One compaction queue: its sparse queue's offsets, the records kept and the keyed records of the
    topic's consume queue that compaction removed (records without KEYS are never copied)."""
    checkpoint = (store.compaction.position_checkpoint() or {}).get((q.topic, q.queue_id))
    keyed = keyed_records(store, q.topic, q.queue_id)
    kept = len(q.units)
    return {"topic": q.topic, "queue_id": q.queue_id, "min_offset": q.min_offset, "max_offset": q.max_offset,
            "compacted_to": checkpoint, "log_files": len(q.log_queue), "records": kept,
            "keyed_records": None if keyed is None else len(keyed),
            "removed": None if keyed is None else len(keyed) - kept}


def unit_problems(unit: BatchCqUnit, record) -> list[str]:
    """How a sparse-queue unit disagrees with the compaction-log record it names (empty: it agrees)."""
    if not isinstance(record, Message):
        return ["names no message"]
    want = (record.total_size, record.queue_offset, record.store_timestamp, record.tags_code())
    names = ("size", "queue offset", "store time", "tagsCode")
    have = (unit.size, unit.msg_base_offset, unit.store_time, unit.tags_code)
    return [f"{n} {h} != {w} from the record" for n, h, w in zip(names, have, want) if h != w]


def compaction_findings(store: Store) -> Iterator[Finding]:
    comp = store.compaction
    try:
        checkpoint = comp.position_checkpoint() or {}
    except RmqError as exc:
        yield Finding(ERROR, "compaction_checkpoint", str(comp.checkpoint_path), None, str(exc))
        checkpoint = {}
    queues = comp.queues()
    for key in sorted(set(checkpoint) - {(q.topic, q.queue_id) for q in queues}):
        yield Finding(ERROR, "compaction_checkpoint", str(comp.checkpoint_path), None,
                      f"the checkpoint names {key[0]}/{key[1]}, which has no compaction log")
    for q in queues:
        try:
            yield from _queue_findings(store, q, checkpoint.get((q.topic, q.queue_id)))
        except RmqError as exc:
            yield Finding(ERROR, "compaction_unreadable", exc.path, exc.offset, str(exc).split(": ")[-1])


def _queue_findings(store: Store, q: CompactionQueue, checkpoint: int | None) -> Iterator[Finding]:
    name, where = f"{q.topic}/{q.queue_id}", str(q.log_queue.files[0].path.parent) if len(q.log_queue) else None
    log = [(loc.offset, loc.entry) for loc in q.records() if isinstance(loc.entry, Message)]
    # the sparse queue against the log: one unit per record, in order
    units = q.units
    pairs = list(zip(units, log))
    bad = [(u, off, m) for u, (off, m) in pairs
           if (u.physical_offset, u.size, u.msg_base_offset, u.store_time, u.tags_code) !=
           (off, m.total_size, m.queue_offset, m.store_timestamp, m.tags_code())]
    if bad or len(units) != len(log):
        u, off, _ = bad[0] if bad else (None, None, None)
        yield Finding(ERROR, "compaction_cq_mismatch", where, off,
                      f"{name}: {len(units)} sparse-queue unit(s) for {len(log)} compaction-log record(s); "
                      f"{len(bad)} differ from their record", len(log), len(units))
    for off, m in log:
        if m.physical_offset != off or m.topic != q.topic or m.queue_id != q.queue_id:
            yield Finding(ERROR, "compaction_log_record", where, off,
                          f"{name}: record of {m.topic}/{m.queue_id} with PHYSICALOFFSET {m.physical_offset}",
                          off, m.physical_offset)
    keyed = keyed_records(store, q.topic, q.queue_id)
    if keyed is None:
        return
    source = dict(keyed)
    differ = [off for off, m in log if m.queue_offset in source and not _same_but_offset(m, source[m.queue_offset])]
    if differ:
        yield Finding(ERROR, "compaction_log_differs", where, differ[0],
                      f"{name}: {len(differ)} compaction-log record(s) differ from their commit-log record "
                      "beyond the PHYSICALOFFSET field")
    kept = {m.queue_offset for _, m in log}
    cut = checkpoint if checkpoint is not None else -1
    newest: dict[str, int] = {}
    for qo, m in keyed:
        if qo <= cut:
            newest[m.properties["KEYS"]] = qo
    want = set(newest.values()) | {qo for qo, _ in keyed if qo > cut}
    lowest = keyed[0][0] if keyed else 0    # records below the commit log's first are gone with it
    lost = sorted(qo for qo in want - kept if qo >= lowest and qo >= q.min_offset)
    extra = sorted(qo for qo in kept - want if qo in source)
    if lost:
        yield Finding(ERROR, "compaction_lost_record", where, None,
                      f"{name}: {len(lost)} keyed record(s) the compaction must keep are missing; first: queue "
                      f"offset {lost[0]}", lost[0], None)
    if extra:
        yield Finding(ERROR, "compaction_not_newest", where, None,
                      f"{name}: {len(extra)} record(s) up to the checkpoint ({cut}) are not the newest of their "
                      f"key; first: queue offset {extra[0]}", None, extra[0])


def _same_but_offset(copy: Message, original: Message) -> bool:
    a, b = bytearray(encode_entry(copy)), bytearray(encode_entry(original))
    a[_PHY] = b[_PHY] = bytes(8)
    return a == b


def consumer_view_split(stores: list[str], where) -> tuple[bool, object, list]:
    """How export reads stores whose compaction topics ``where`` names (``--topic``): (whether to read
    their commit logs, the filter for them: ``where`` without those topics; the compaction-log files of the
    named compaction topics, read as their consumers see them: ``scan.consumer_view``)."""
    from dataclasses import replace

    from rmqtool.ops import scan

    if where is None or not where.topics:
        return True, where, []
    try:
        logs = scan.list_files(stores, "compactionlog")
    except RmqError:
        return True, where, []            # no store root: a commit-log directory or file has no compaction
    compacted = {f.topic for f in logs} & set(where.topics)
    logs = [f for f in logs if f.topic in compacted and (not where.queue_ids or f.queue_id in where.queue_ids)]
    rest = tuple(t for t in where.topics if t not in compacted)
    return bool(rest), replace(where, topics=rest) if compacted and rest else where, logs


COMPACTION_FIELDS = ["compaction_kept", "compaction_removed"]


def with_compaction(rows: list[dict], stores) -> tuple[list[dict], list[str]]:
    """``--by topic`` rows with, for compaction topics, the records their compaction logs keep and the keyed
    records compaction removed (the columns only when a local store has a compaction topic)."""
    totals: dict[str, list[int]] = {}
    for path in stores:
        try:
            store = Store.open(path)
            queues = store.compaction.queues() if store.compaction is not None else []
            summaries = [queue_summary(store, q) for q in queues]
        except (RmqError, OSError):
            continue                      # a remote store or none: no compaction
        for s in summaries:
            t = totals.setdefault(s["topic"], [0, 0])
            t[0] += s["records"]
            t[1] += s["removed"] or 0
    if not totals:
        return rows, []
    return [{**r, **dict(zip(COMPACTION_FIELDS, totals.get(r["topic"], (None, None))))} for r in rows], \
        COMPACTION_FIELDS
