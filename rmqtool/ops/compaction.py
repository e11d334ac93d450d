"""Compaction topics checked (verify) and summarised (info, stats, topics).

Checks, per compaction queue (the compaction log is a commit-log-format file; the commit log is read at
the units of the compaction topics' consume queues): each compaction-log record equals its commit-log
record (the same topic, queue and queue offset) but for the PHYSICALOFFSET field, which holds its
compaction-log offset (CompactionLog.asyncPutMessage); the part compacted up to the position checkpoint
holds exactly the newest record per KEYS string and every later keyed record is present
(CompactionLog.doCompaction); the sparse queue's units name the log's records one for one.

The records are read by one of two paths into the same numpy columns (``QueueFacts``), which the checks
then read: up to ``FEW_RECORDS`` records, one at a time (the record-at-a-time decoder: no pyarrow, its
compute functions or the scan kernel to load, which cost a small store more than its bytes); beyond, or
where a record might read otherwise than on the columnar scan (damage, ``scan.Irregular``), the columnar
scan (the compaction logs walked by ``iter_record_batches``, the commit log's records gathered by
``records_at``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from rmqtool import constants as C
from rmqtool.errors import RmqError
from rmqtool.format.batchcq import BatchCqUnit
from rmqtool.format.commitlog import Message
from rmqtool.ops.findings import ERROR, WARNING, Finding
from rmqtool.ops.scan import Irregular, odd_property
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
# Records read one at a time at most (compaction-log records and the commit-log records the topics' consume
# queues name): ~30 us each, 2,000 cost less than importing pyarrow and pyarrow.compute (~0.1 CPU-s).
FEW_RECORDS = 2000
# The numpy columns of a queue's log records (QueueFacts.log), int64; topic: codes into QueueFacts.log_topics
_LOG_COLUMNS = ("physical_offset", "total_size", "queue_offset", "store_timestamp", "tags_code", "queue_id")


@dataclass
class QueueFacts:
    """One compaction queue, in numpy columns from either path: its log's records, and its topic's keyed
    commit-log records."""

    queue: CompactionQueue
    log: dict | None = None               # the log's MESSAGE records up to its end: _LOG_COLUMNS, "stored"
    #                                       (their PHYSICALOFFSET field) and "topic"; None: the log not read
    log_topics: list = field(default_factory=list)    # the topics the log's "topic" codes name
    copies: object = None                 # the same records as the path read them (pyarrow Table or rows)
    keyed_qo: list = field(default_factory=list)      # numpy parts: queue offsets of the keyed records
    keyed_keys: list = field(default_factory=list)    # their whole KEYS strings: Arrow arrays or lists of str
    differ: int = 0                       # log records whose commit-log record differs beyond PHYSICALOFFSET
    first_differ: int | None = None
    cq_range: tuple[int, int] | None = None   # the topic's consume queue: [first, end) queue offsets; None: none

    def keyed(self):
        """(queue offsets, KEYS as group codes) of the keyed records the consume queue holds, in queue-offset
        order."""
        import numpy as np

        qo = np.concatenate(self.keyed_qo) if self.keyed_qo else np.zeros(0, np.int64)
        if all(isinstance(part, list) for part in self.keyed_keys):
            codes: dict[str, int] = {}
            keys = np.array([codes.setdefault(k, len(codes)) for part in self.keyed_keys for k in part], np.int64)
        else:
            import pyarrow as pa

            keys = pa.concat_arrays(self.keyed_keys).dictionary_encode().indices.to_numpy()
        order = np.argsort(qo, kind="stable")
        return qo[order], keys[order]


def queue_facts(store: Store, queues: list[CompactionQueue], logs: bool) -> tuple[list[QueueFacts], list[Finding]]:
    """The facts of compaction queues (with ``logs``, their logs' records against their commit-log records),
    and a finding for each queue whose log does not read (it has no facts)."""
    if not queues:                    # a 5.x store without compaction topics: nothing to import or scan
        return [], []
    try:
        return _few_facts(store, queues, logs), []
    except (Irregular, RmqError, OSError, ValueError):
        pass                          # the columnar scan: its findings, errors and exit status
    return _scanned_facts(store, queues, logs)


def _cq_ranges(store: Store, facts: list[QueueFacts]):
    """Set each queue's ``cq_range`` from its topic's consume queue; the physical offsets their units name
    (sorted, unique: numpy)."""
    import numpy as np

    offsets = []
    for f in facts:
        topic, qid = f.queue.topic, f.queue.queue_id
        if topic in store.topics() and qid in [c.queue_id for c in store.consume_queues(topic)]:
            cq = store.consume_queue(topic, qid)
            first, count = cq.extent()
            f.cq_range = (first, first + count)
            offsets.append(_unit_offsets(cq))
    return _unique(np.concatenate(offsets)) if offsets else np.zeros(0, np.int64)


def _compaction_sees(sys_flag, keys_length):
    """CommitLogDispatcherCompaction: the records the consume queue gets, with KEYS (records without KEYS are
    never copied)."""
    import numpy as np

    return np.isin(sys_flag & 0xC, _DISPATCHED) & (keys_length > 0)


def _note_keyed(facts: dict, cols: dict, topics: list[str], keys_where: Callable, same_where: Callable) -> None:
    """Add the keyed records among commit-log records (numpy ``cols``: sys_flag, keys_length, topic codes into
    ``topics``, queue_id, queue_offset) to their queues' facts; where a queue's log is read, count its records
    that differ from theirs. ``keys_where(mask)``: the KEYS of the records where ``mask``; ``same_where(f, mask,
    at)``: whether each record where ``mask`` equals log record ``at`` of ``f`` in every SAME_FIELDS value."""
    import numpy as np

    keyed = _compaction_sees(cols["sys_flag"], cols["keys_length"])
    qo = cols["queue_offset"]
    for code, topic in enumerate(topics):
        ours = keyed & (cols["topic"] == code)
        for qid in _unique(cols["queue_id"][ours]).tolist():
            f = facts.get((topic, qid))
            if f is None or f.cq_range is None:
                continue
            mine = ours & (cols["queue_id"] == qid) & (qo >= f.cq_range[0]) & (qo < f.cq_range[1])
            f.keyed_qo.append(qo[mine])
            f.keyed_keys.append(keys_where(mine))
            if f.log is None:
                continue
            log_qo = f.log["queue_offset"]
            at = np.minimum(np.searchsorted(log_qo, qo[mine]), max(len(log_qo) - 1, 0))
            hit = log_qo[at] == qo[mine] if len(log_qo) else np.zeros(len(at), bool)
            if not hit.any():
                continue
            copied = mine.copy()
            copied[mine] = hit
            bad = at[hit][~same_where(f, copied, at[hit])]
            if len(bad):
                f.differ += len(bad)
                off = int(f.log["physical_offset"][bad].min())
                f.first_differ = off if f.first_differ is None else min(f.first_differ, off)


def _log_facts(f: QueueFacts, columns: dict, topic_codes, topics: list[str], copies) -> None:
    import numpy as np

    f.log = {k: np.asarray(columns[k], np.int64) for k in _LOG_COLUMNS}
    f.log["topic"] = topic_codes
    f.log["stored"] = stored_physical_offsets(f.queue, f.log["physical_offset"])
    f.log_topics, f.copies = topics, copies


# sorted and compared, not np.unique and its set functions: they import numpy.ma (~0.02 CPU-s of a small store)
def _unique(values):
    """The distinct values, sorted (np.unique)."""
    import numpy as np

    values = np.sort(values)
    return values[np.concatenate([[True], values[1:] != values[:-1]])] if len(values) else values


def _among(values, distinct):
    """Whether each of ``values`` is one of ``distinct`` (sorted, no repeats)."""
    import numpy as np

    at = np.minimum(np.searchsorted(distinct, values), max(len(distinct) - 1, 0))
    return distinct[at] == values if len(distinct) else np.zeros(len(values), bool)


# -- the small path: records one at a time -----------------------------------------------------------------
def _few_facts(store: Store, queues: list[CompactionQueue], logs: bool) -> list[QueueFacts]:
    """``queue_facts`` of a few records, read one at a time by the record-at-a-time decoder (a log record as
    the row cat-commitlog prints), with numpy; ``scan.Irregular`` beyond FEW_RECORDS or where the columnar
    scan might read a record otherwise, a FormatError where a record does not decode."""
    from rmqtool.format.rows import entry_row

    facts = [QueueFacts(q) for q in queues]
    offsets = _cq_ranges(store, facts)
    budget = FEW_RECORDS - len(offsets)
    if budget < 0 or (logs and sum(len(q.unit_array) for q in queues) > budget):
        raise Irregular
    if logs:
        for f in facts:
            rows = _few_log_rows(f.queue, budget)
            budget -= len(rows)
            columns = {k: [r[k] for r in rows] for k in _LOG_COLUMNS}
            columns["tags_code"] = [-1 if code is None else code for code in columns["tags_code"]]
            _log_facts(f, columns, *_codes([r["topic"] for r in rows]), rows)
    topics = {f.queue.topic for f in facts}
    records = [(offset, msg, keys) for offset, msg, keys in _few_records_at(store.commitlog, offsets)
               if msg.topic in topics]
    cols = {k: _ints([getattr(msg, k) for _, msg, _ in records]) for k in ("sys_flag", "queue_id", "queue_offset")}
    cols["keys_length"] = _ints([len(keys or "") for _, _, keys in records])
    cols["topic"], names = _codes([msg.topic for _, msg, _ in records])

    def same_where(f: QueueFacts, mask, at) -> object:
        import numpy as np

        originals = [entry_row(msg, offset) for (offset, msg, _), m in zip(records, mask.tolist()) if m]
        return np.array([all(f.copies[i][k] is not None and f.copies[i][k] == r[k] for k in SAME_FIELDS)
                         for i, r in zip(at.tolist(), originals)], bool)

    _note_keyed({(f.queue.topic, f.queue.queue_id): f for f in facts}, cols, names,
                lambda mask: [keys for (_, _, keys), m in zip(records, mask.tolist()) if m], same_where)
    return facts


def _few_log_rows(q: CompactionQueue, budget: int) -> list[dict]:
    """``log_table``'s records one at a time, as rows: the MESSAGE records of the log before its end."""
    from rmqtool.format.rows import entry_row, row_type

    log, rows = q.log, []
    for read, loc in enumerate(log.iter_entries(include_blank=False)):
        if read >= budget:
            raise Irregular
        if (log.end is None or loc.offset < log.end) and row_type(loc.entry) == "message":
            msg = loc.entry
            if msg.topic == C.RMQ_SYS_SCHEDULE_TOPIC:        # its tagsCode: the DELAY level's deliver time
                raise Irregular
            _regular(msg, C.PROPERTY_TAGS)
            rows.append(entry_row(msg, loc.offset))
    return rows


def _few_records_at(cl, offsets) -> Iterator[tuple[int, Message, str | None]]:
    """``records_at``'s MESSAGE records one at a time: (offset, record, its KEYS); ``scan.Irregular`` where
    ``records_at`` might read otherwise (a record it would skip: not there, a BLANK; a DLedger commit log)."""
    from rmqtool.format.commitlog import Blank, decode_entry
    from rmqtool.format.rows import row_type

    if cl.entry_header_size:
        raise Irregular
    buffers: dict = {}
    for offset in offsets.tolist():
        f, pos = cl.queue.locate(offset)
        if pos >= f.readable:
            raise Irregular
        buf = buffers.get(f.start)
        if buf is None:
            buf = buffers[f.start] = f.read()
        entry = decode_entry(buf, pos)
        if isinstance(entry, Blank):
            raise Irregular
        if row_type(entry) == "message":
            yield offset, entry, _regular(entry, C.PROPERTY_KEYS).get(C.PROPERTY_KEYS)


def _regular(msg: Message, name: str) -> dict[str, str]:
    """The record's properties; ``scan.Irregular`` where the columnar scan might read its topic (not UTF-8) or
    property ``name`` (named twice, holding a separator) otherwise."""
    props = msg.properties
    if msg.topic_raw is not None or odd_property(msg.properties_raw, name, props):
        raise Irregular
    return props


def _ints(values: list[int]):
    import numpy as np

    return np.array(values, np.int64)


def _codes(values: list[str]) -> tuple[object, list[str]]:
    """(a code per value, the values the codes name)."""
    codes: dict[str, int] = {}
    return _ints([codes.setdefault(v, len(codes)) for v in values]), list(codes)


# -- the columnar scan -----------------------------------------------------------------------------------
def _scanned_facts(store: Store, queues: list[CompactionQueue], logs: bool) -> tuple[list[QueueFacts], list[Finding]]:
    """``queue_facts`` from the columnar scan: the compaction logs walked, the commit log's records gathered
    (``records_at``), once for every compaction topic."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    facts, unreadable = [], []
    for q in queues:
        f = QueueFacts(q)
        if logs:
            try:
                table = log_table(q)
            except RmqError as exc:
                unreadable.append(Finding(ERROR, "compaction_unreadable", exc.path, exc.offset,
                                          str(exc).split(": ")[-1]))
                continue
            topic = table.column("topic").combine_chunks().dictionary_encode()
            _log_facts(f, {k: (table.column(k).cast(pa.int64()) if k == "store_timestamp" else
                               table.column(k).fill_null(-1) if k == "tags_code" else table.column(k)).to_numpy()
                           for k in _LOG_COLUMNS}, topic.indices.to_numpy(), topic.dictionary.to_pylist(), table)
        facts.append(f)
    offsets = _cq_ranges(store, facts)
    if not len(offsets):
        return facts, unreadable
    by_queue = {(f.queue.topic, f.queue.queue_id): f for f in facts}
    topics = pa.array(sorted({t for t, _ in by_queue}), pa.string())
    for batch in records_at(store.commitlog, offsets):
        batch = batch.filter(pc.and_(pc.equal(batch.column("type"), "message"),
                                     pc.is_in(batch.column("topic"), topics)))
        if not batch.num_rows:
            continue
        keys = pc.map_lookup(batch.column("properties"), pa.scalar(C.PROPERTY_KEYS), "first")
        topic = batch.column("topic").dictionary_encode()
        cols = {k: batch.column(k).to_numpy().astype(np.int64) for k in ("sys_flag", "queue_id", "queue_offset")}
        cols["keys_length"] = pc.utf8_length(keys).fill_null(0).to_numpy()
        cols["topic"] = topic.indices.to_numpy()

        def same_where(f: QueueFacts, mask, at, batch=batch) -> object:
            originals, copies = batch.filter(pa.array(mask)), f.copies.take(pa.array(at))
            same = pa.array(np.ones(len(at), bool))
            for name in SAME_FIELDS:
                same = pc.and_(same, pc.fill_null(pc.equal(copies.column(name), originals.column(name)), False))
            return same.to_numpy(zero_copy_only=False)

        _note_keyed(by_queue, cols, topic.dictionary.to_pylist(), lambda mask, keys=keys: keys.filter(pa.array(mask)),
                    same_where)
    return facts, unreadable


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


def queue_summary(store: Store, q: CompactionQueue, facts: QueueFacts | None = None) -> dict:
    """One compaction queue: its sparse queue's offsets, the records kept and the keyed records of the
    topic's consume queue that compaction removed (records without KEYS are never copied)."""
    checkpoint = store.compaction.loaded_position()[0].get((q.topic, q.queue_id))
    facts = facts or queue_facts(store, [q], logs=False)[0][0]
    keyed = None if facts.cq_range is None else sum(len(a) for a in facts.keyed_qo)
    kept = len(q.unit_array)
    return {"topic": q.topic, "queue_id": q.queue_id, "min_offset": q.min_offset, "max_offset": q.max_offset,
            "compacted_to": checkpoint, "log_files": len(q.log_queue), "records": kept,
            "keyed_records": keyed, "removed": None if keyed is None else keyed - kept}


def queue_summaries(store: Store) -> list[dict]:
    """Every compaction queue's summary, from one scan of the commit log."""
    return [queue_summary(store, f.queue, f) for f in queue_facts(store, store.compaction.queues(), logs=False)[0]]


def checkpoint_unread(comp, exc: RmqError) -> tuple[str, int | None, str]:
    """(path, offset, text) of a position checkpoint that does not decode, and what the broker does then."""
    return (exc.path or str(comp.checkpoint_path), exc.offset,
            f"{exc.message}: the broker starts with no compaction position and compacts again")


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
    checkpoint, unread = comp.loaded_position()
    if unread is not None:
        path, offset, text = checkpoint_unread(comp, unread)
        yield Finding(WARNING, "compaction_checkpoint_unread", path, offset,
                      f"{text} (what the compaction must have kept is not checked)")
    known = unread is None
    queues = comp.queues()
    for key in sorted(set(checkpoint) - {(q.topic, q.queue_id) for q in queues}):
        yield Finding(ERROR, "compaction_checkpoint", str(comp.checkpoint_path), None,
                      f"the checkpoint names {key[0]}/{key[1]}, which has no compaction log")
    facts, unreadable = queue_facts(store, queues, logs=True)
    yield from unreadable
    for f in facts:
        yield from _queue_findings(f, checkpoint.get((f.queue.topic, f.queue.queue_id)), known)


def _queue_findings(f: QueueFacts, checkpoint: int | None, position_known: bool) -> Iterator[Finding]:
    import numpy as np

    q, log = f.queue, f.log
    name, where = f"{q.topic}/{q.queue_id}", str(q.log_queue.files[0].path.parent) if len(q.log_queue) else None
    offsets = log["physical_offset"]
    # the sparse queue against the log: one unit per record, in order
    units = q.unit_array
    n = min(len(units), len(offsets))
    have = np.stack([units[c][:n].astype(np.int64) for c in ("physical_offset", "size", "msg_base_offset",
                                                             "store_time", "tags_code")])
    want = np.stack([log[c][:n] for c in ("physical_offset", "total_size", "queue_offset", "store_timestamp",
                                          "tags_code")])
    bad = np.flatnonzero((have != want).any(axis=0))
    if len(bad) or len(units) != len(offsets):
        yield Finding(ERROR, "compaction_cq_mismatch", where, int(offsets[bad[0]]) if len(bad) else None,
                      f"{name}: {len(units)} sparse-queue unit(s) for {len(offsets)} compaction-log record(s); "
                      f"{len(bad)} differ from their record", len(offsets), len(units))
    stored, topic = log["stored"], log["topic"]
    ours = np.array([t == q.topic for t in f.log_topics], bool)
    wrong = np.flatnonzero((stored != offsets) | ~ours[topic] | (log["queue_id"] != q.queue_id))
    for i in wrong.tolist():
        yield Finding(ERROR, "compaction_log_record", where, int(offsets[i]),
                      f"{name}: record of {f.log_topics[topic[i]]}/{int(log['queue_id'][i])} "
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
    kept = log["queue_offset"]
    cut = checkpoint if checkpoint is not None else -1
    upto = keyed_qo <= cut
    # the newest queue offset of each key up to the checkpoint, and every keyed record after it
    newest = np.full(int(keys.max()) + 1 if len(keys) else 0, -1, np.int64)
    np.maximum.at(newest, keys[upto], keyed_qo[upto])
    want_qo = _unique(np.concatenate([newest[_unique(keys[upto])], keyed_qo[~upto]]))
    lowest = keyed_qo[0] if len(keyed_qo) else 0    # records below the commit log's first are gone with it
    kept = _unique(kept)
    lost = want_qo[~_among(want_qo, kept)]
    lost = lost[(lost >= lowest) & (lost >= q.min_offset)]
    extra = kept[_among(kept, _unique(keyed_qo))]
    extra = extra[~_among(extra, want_qo)]
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

