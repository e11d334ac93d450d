"""Compaction topics checked (verify) and summarised (info, stats, topics).

Checks, per compaction queue, on the columnar scan (the compaction log is a commit-log-format file,
walked by ``iter_record_batches``; the commit log once for every compaction topic): each compaction-log
record equals its commit-log record (the same topic, queue and queue offset) but for the PHYSICALOFFSET
field, which holds its compaction-log offset (CompactionLog.asyncPutMessage); the part compacted up to
the position checkpoint holds exactly the newest record per KEYS string and every later keyed record is
present (CompactionLog.doCompaction); the sparse queue's units name the log's records one for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from rmqtool import constants as C
from rmqtool.errors import RmqError
from rmqtool.format.batchcq import BatchCqUnit
from rmqtool.format.commitlog import Message
from rmqtool.ops.findings import ERROR, WARNING, Finding
from rmqtool.store.compaction import CompactionQueue
from rmqtool.store.store import Store

_PHY = 28                # the PHYSICALOFFSET field of a record: bytes 28..36
# The fields a compaction-log copy shares with its commit-log record: all but PHYSICALOFFSET (and the msgId
# it shows); with magic code, CRC, hosts, body and raw properties, every byte of the record.
SAME_FIELDS = ("total_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset", "sys_flag",
               "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
               "prepared_transaction_offset", "topic", "body_length", "body", "properties_raw")
# CommitLogDispatcherCompaction sees what the consume queue gets: no prepared or rolled-back half message
_DISPATCHED = (int(C.TransactionType.NOT_TYPE), int(C.TransactionType.COMMIT))


@dataclass
class QueueFacts:
    """One compaction queue, column by column: its log's records, and its topic's keyed commit-log records."""

    queue: CompactionQueue
    log: object = None                    # pyarrow Table of the log's MESSAGE records up to its end
    stored_offsets: object = None         # numpy: each log record's PHYSICALOFFSET field
    keyed_qo: list = field(default_factory=list)      # numpy parts: queue offsets of the keyed records
    keyed_keys: list = field(default_factory=list)    # Arrow parts: their whole KEYS strings
    differ: int = 0                       # log records whose commit-log record differs beyond PHYSICALOFFSET
    first_differ: int | None = None
    cq_range: tuple[int, int] | None = None   # the topic's consume queue: [first, end) queue offsets; None: none

    def keyed(self):
        """(queue offsets, KEYS) of the keyed records the consume queue holds, in queue-offset order."""
        import numpy as np
        import pyarrow as pa

        qo = np.concatenate(self.keyed_qo) if self.keyed_qo else np.zeros(0, np.int64)
        keys = pa.concat_arrays(self.keyed_keys) if self.keyed_keys else pa.array([], pa.string())
        order = np.argsort(qo, kind="stable")
        return qo[order], keys.take(pa.array(order))


def log_table(q: CompactionQueue):
    """The MESSAGE records of the queue's compaction log up to its end (the sparse queue's last unit; the
    broker cuts the last file there on load), from the scan kernel."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from rmqtool.columnar import iter_record_batches, record_schema

    log, batches, damage = q.log, [], []
    for batch in iter_record_batches(log, on_damage=damage.append):
        batches.append(batch.filter(pc.equal(batch.column("type"), "message")))
    if damage and (log.end is None or damage[0].offset is None or damage[0].offset < log.end):
        raise damage[0]
    table = pa.Table.from_batches(batches, schema=record_schema())
    return table if log.end is None else table.filter(pc.less(table.column("physical_offset"), log.end))


def stored_physical_offsets(q: CompactionQueue, offsets):
    """The PHYSICALOFFSET field of the log records at ``offsets`` (numpy), read from the log's files."""
    import numpy as np

    out = np.zeros(len(offsets), np.int64)
    for f in q.log.queue.files:
        sel = np.flatnonzero((offsets >= f.start) & (offsets + _PHY + 8 <= f.start + f.length))
        if len(sel):
            data = np.frombuffer(f.read(), np.uint8)
            at = (offsets[sel] - f.start)[:, None] + np.arange(_PHY, _PHY + 8)
            out[sel] = data[at].copy().view(">i8").ravel()
    return out


def compaction_facts(store: Store, queues: list[QueueFacts]) -> list[QueueFacts]:
    """Fill in the facts of compaction queues from one scan of the commit log (the records of compaction
    topics only): the keyed records, and where a queue's ``log`` is read, each log record against its
    commit-log record."""
    if not queues:                    # a 5.x store without compaction topics: nothing to import or scan
        return []
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    facts = {(f.queue.topic, f.queue.queue_id): f for f in queues}
    offsets = []
    for f in facts.values():
        topic, qid = f.queue.topic, f.queue.queue_id
        if topic in store.topics() and qid in [c.queue_id for c in store.consume_queues(topic)]:
            cq = store.consume_queue(topic, qid)
            first, count = cq.extent()
            f.cq_range = (first, first + count)
            offsets.append(_unit_offsets(cq))
    topics = pa.array(sorted({t for t, _ in facts}), pa.string())
    if not offsets:
        return list(facts.values())
    for batch in records_at(store.commitlog, np.unique(np.concatenate(offsets))):
        batch = batch.filter(pc.and_(pc.equal(batch.column("type"), "message"), pc.is_in(batch.column("topic"), topics)))
        if not batch.num_rows:
            continue
        tx = pc.bit_wise_and(batch.column("sys_flag"), 0xC)
        keys = pc.map_lookup(batch.column("properties"), pa.scalar(C.PROPERTY_KEYS), "first")
        keyed = pc.fill_null(pc.and_(pc.is_in(tx, pa.array(_DISPATCHED, pa.int32())),
                                     pc.greater(pc.utf8_length(keys), 0)), False)
        batch, keys = batch.filter(keyed), keys.filter(keyed)
        pairs = pc.unique(pc.binary_join_element_wise(batch.column("topic"),
                                                     pc.cast(batch.column("queue_id"), pa.string()), "\x00"))
        for pair in pairs.to_pylist():
            topic, qid = pair.rsplit("\x00", 1)
            f = facts.get((topic, int(qid)))
            if f is None or f.cq_range is None:
                continue
            qo = batch.column("queue_offset").to_numpy()
            mine = (pc.equal(batch.column("topic"), topic).to_numpy(zero_copy_only=False)
                    & (batch.column("queue_id").to_numpy() == int(qid)) & (qo >= f.cq_range[0]) & (qo < f.cq_range[1]))
            rows = batch.filter(pa.array(mine))
            f.keyed_qo.append(qo[mine])
            f.keyed_keys.append(keys.filter(pa.array(mine)))
            if f.log is not None:
                _compare(f, rows)
    return list(facts.values())


def _unit_offsets(cq):
    """The physical offsets of a consume queue's units (those ``extent`` counts), read as columns."""
    import numpy as np

    from rmqtool.format.consumequeue import UNIT_FIELDS, valid_prefix

    parts = []
    for f in cq.queue:
        buf = f.read()
        valid, _ = valid_prefix(buf)
        parts.append(np.frombuffer(buf, UNIT_FIELDS, valid)["phy"].astype(np.int64))
        if valid < len(buf) // C.CQ_STORE_UNIT_SIZE:
            break
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def records_at(cl, offsets) -> Iterator:
    """Record batches of the commit-log records at ``offsets`` (sorted) on the scan kernel: each file's
    records gathered into one buffer and scanned as one chain (a record is self-contained), their
    physical_offset set back to where they are. A record that does not decode ends its file's part here
    (verify's commit-log checks name it). A DLedger commit log is scanned whole."""
    import numpy as np
    import pyarrow as pa

    from rmqtool.columnar import iter_record_batches
    from rmqtool.columnar.decode import decode_batch
    from rmqtool.columnar.kernel import gather_spans, scan_window, words
    from rmqtool.columnar.walk import WINDOW_BYTES

    files = cl.queue.files
    if cl.entry_header_size:
        yield from iter_record_batches(cl)
        return
    which = np.searchsorted(np.array([f.start for f in files], np.int64), offsets, side="right") - 1
    for i in np.unique(which[which >= 0]).tolist():
        f = files[i]
        data = np.frombuffer(f.read(), np.uint8)
        pos = offsets[which == i] - f.start
        pos = pos[pos + 4 <= len(data)]
        sizes = data[pos[:, None] + np.arange(4)].copy().view(">i4").ravel().astype(np.int64)
        pos, sizes = pos[(sizes > 0) & (pos + sizes <= len(data))], sizes[(sizes > 0) & (pos + sizes <= len(data))]
        spans, buf = gather_spans(data, pos, pos + sizes)
        d64, at = words(buf), 0
        while at < len(buf):
            win = scan_window(buf, at, at + WINDOW_BYTES, items=True, data64=d64)
            if win.n:
                batch = decode_batch(buf, win, 0, False)
                where = pos[np.searchsorted(spans[:-1], win.starts)] + f.start
                yield batch.set_column(batch.schema.get_field_index("physical_offset"), "physical_offset",
                                       pa.array(where, pa.int64()))
            if win.bad >= 0 or win.next <= at:
                break
            at = win.next


def _compare(f: QueueFacts, rows) -> None:
    """Count the log records whose commit-log record (among ``rows``) differs beyond PHYSICALOFFSET."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    log_qo = f.log.column("queue_offset").to_numpy()
    qo = rows.column("queue_offset").to_numpy()
    at = np.minimum(np.searchsorted(log_qo, qo), max(len(log_qo) - 1, 0))
    hit = (len(log_qo) > 0) & (log_qo[at] == qo) if len(log_qo) else np.zeros(len(qo), bool)
    if not hit.any():
        return
    originals, copies = rows.filter(pa.array(hit)), f.log.take(pa.array(at[hit]))
    same = pa.array(np.ones(len(copies), bool))
    for name in SAME_FIELDS:
        same = pc.and_(same, pc.fill_null(pc.equal(copies.column(name), originals.column(name)), False))
    bad = np.flatnonzero(~same.to_numpy(zero_copy_only=False))
    if len(bad):
        f.differ += len(bad)
        off = int(copies.column("physical_offset")[int(bad[0])].as_py())
        f.first_differ = off if f.first_differ is None else min(f.first_differ, off)


def queue_summary(store: Store, q: CompactionQueue, facts: QueueFacts | None = None) -> dict:
    """One compaction queue: its sparse queue's offsets, the records kept and the keyed records of the
    topic's consume queue that compaction removed (records without KEYS are never copied)."""
    checkpoint = (store.compaction.position_checkpoint() or {}).get((q.topic, q.queue_id))
    facts = facts or compaction_facts(store, [QueueFacts(q)])[0]
    keyed = None if facts.cq_range is None else sum(len(a) for a in facts.keyed_qo)
    kept = len(q.unit_array)
    return {"topic": q.topic, "queue_id": q.queue_id, "min_offset": q.min_offset, "max_offset": q.max_offset,
            "compacted_to": checkpoint, "log_files": len(q.log_queue), "records": kept,
            "keyed_records": keyed, "removed": None if keyed is None else keyed - kept}


def queue_summaries(store: Store) -> list[dict]:
    """Every compaction queue's summary, from one scan of the commit log."""
    return [queue_summary(store, f.queue, f) for f in compaction_facts(store, [QueueFacts(q) for q in store.compaction.queues()])]


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
    except RmqError as exc:             # CompactionPositionMgr's constructor ignores a failed load
        yield Finding(WARNING, "compaction_checkpoint_unread", exc.path or str(comp.checkpoint_path), exc.offset,
                      f"{exc.message}: the broker starts with no compaction position and compacts again (what "
                      "the compaction must have kept is not checked)")
        checkpoint = None
    known = checkpoint is not None
    checkpoint = checkpoint or {}
    queues = comp.queues()
    for key in sorted(set(checkpoint) - {(q.topic, q.queue_id) for q in queues}):
        yield Finding(ERROR, "compaction_checkpoint", str(comp.checkpoint_path), None,
                      f"the checkpoint names {key[0]}/{key[1]}, which has no compaction log")
    readable = []
    for q in queues:
        try:
            facts = QueueFacts(q, log_table(q))
        except RmqError as exc:
            yield Finding(ERROR, "compaction_unreadable", exc.path, exc.offset, str(exc).split(": ")[-1])
            continue
        readable.append(facts)
    for f in compaction_facts(store, readable):
        yield from _queue_findings(f, checkpoint.get((f.queue.topic, f.queue.queue_id)), known)


def _queue_findings(f: QueueFacts, checkpoint: int | None, position_known: bool) -> Iterator[Finding]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    q, log = f.queue, f.log
    name, where = f"{q.topic}/{q.queue_id}", str(q.log_queue.files[0].path.parent) if len(q.log_queue) else None
    offsets = log.column("physical_offset").to_numpy()
    # the sparse queue against the log: one unit per record, in order
    units = q.unit_array
    n = min(len(units), len(offsets))
    have = np.stack([units[c][:n].astype(np.int64) for c in ("physical_offset", "size", "msg_base_offset",
                                                             "store_time", "tags_code")])
    want = np.stack([offsets[:n], log.column("total_size").to_numpy()[:n], log.column("queue_offset").to_numpy()[:n],
                     log.column("store_timestamp").cast("int64").to_numpy()[:n],
                     log.column("tags_code").fill_null(-1).to_numpy()[:n]])
    bad = np.flatnonzero((have != want).any(axis=0))
    if len(bad) or len(units) != len(offsets):
        yield Finding(ERROR, "compaction_cq_mismatch", where, int(offsets[bad[0]]) if len(bad) else None,
                      f"{name}: {len(units)} sparse-queue unit(s) for {len(offsets)} compaction-log record(s); "
                      f"{len(bad)} differ from their record", len(offsets), len(units))
    stored = stored_physical_offsets(q, offsets)
    wrong = np.flatnonzero((stored != offsets) | ~pc.equal(log.column("topic"), q.topic).to_numpy(zero_copy_only=False)
                           | (log.column("queue_id").to_numpy() != q.queue_id))
    for i in wrong.tolist():
        yield Finding(ERROR, "compaction_log_record", where, int(offsets[i]),
                      f"{name}: record of {log.column('topic')[i].as_py()}/{log.column('queue_id')[i].as_py()} "
                      f"with PHYSICALOFFSET {int(stored[i])}", int(offsets[i]), int(stored[i]))
    if f.cq_range is None:
        return
    if f.differ:
        yield Finding(ERROR, "compaction_log_differs", where, f.first_differ,
                      f"{name}: {f.differ} compaction-log record(s) differ from their commit-log record "
                      "beyond the PHYSICALOFFSET field")
    if not position_known:
        return
    keyed_qo, keys = f.keyed()
    kept = log.column("queue_offset").to_numpy()
    cut = checkpoint if checkpoint is not None else -1
    upto = keyed_qo <= cut
    # the newest queue offset of each key up to the checkpoint (numpy, not Arrow's group_by: its threads)
    groups = keys.filter(pa.array(upto)).dictionary_encode(null_encoding="encode")
    newest = np.full(len(groups.dictionary), -1, np.int64)
    np.maximum.at(newest, groups.indices.to_numpy(), keyed_qo[upto])
    want_qo = np.union1d(newest, keyed_qo[~upto])
    lowest = keyed_qo[0] if len(keyed_qo) else 0    # records below the commit log's first are gone with it
    lost = np.setdiff1d(want_qo, kept)
    lost = lost[(lost >= lowest) & (lost >= q.min_offset)]
    extra = np.setdiff1d(np.intersect1d(kept, keyed_qo), want_qo)
    if len(lost):
        yield Finding(ERROR, "compaction_lost_record", where, None,
                      f"{name}: {len(lost)} keyed record(s) the compaction must keep are missing; first: queue "
                      f"offset {int(lost[0])}", int(lost[0]), None)
    if len(extra):
        yield Finding(ERROR, "compaction_not_newest", where, None,
                      f"{name}: {len(extra)} record(s) up to the checkpoint ({cut}) are not the newest of their "
                      f"key; first: queue offset {int(extra[0])}", None, int(extra[0]))


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
            summaries = queue_summaries(store) if store.compaction is not None else []
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
