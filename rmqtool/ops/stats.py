"""stats: message counts, bytes, store-time range, retry/DLQ shares, transaction and delay counts.

Computed per commit-log file as a small Arrow table of partial sums (``file_stats``), merged with
``merge`` and finished into rows with ``stats_rows``: the single-process and the Spark engine run the
same three steps, so their output is identical. In total, by topic and by queue without a filter,
``WindowSums`` sums most windows of the scan from the compiled facts pass, without Arrow columns (the same
sums). BLANK records are not counted. ``messages`` counts as the
broker does: an inner batch (one record of a BatchCQ topic) is its INNER_NUM messages (see
``facts.message_counts``); ``bytes`` and the other counts are per record.

Retries and dead letters count for the topic they came from: ``--by topic`` files a ``%RETRY%<group>`` or
``%DLQ%<group>`` record under its RETRY_TOPIC property (the original topic the broker keeps there), and
``--by group`` groups by the consumer group those topics name (null for other records).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Callable, Iterable

from rmqtool import constants as C
from rmqtool.ops import scan

if TYPE_CHECKING:
    import pyarrow as pa
# pyarrow is imported where it is used: a small store's stats totals its records without it

GROUPINGS = {"topic": ["topic"], "queue": ["topic", "queue_id"], "hour": ["hour"],
             "store_host": ["store_host"], "tag": ["tags"], "store": ["store"], "group": ["group"]}
COUNTS = ["messages", "bytes", "retries", "dlq", "transaction_half", "transaction_commit",
          "transaction_rollback", "transaction_op", "delayed"]
STATS_FIELDS = ["messages", "bytes", "min_store_timestamp", "max_store_timestamp", "retries", "retry_share",
                "dlq", "dlq_share", "transaction_half", "transaction_commit", "transaction_rollback",
                "transaction_op", "delayed"]
_AGGREGATES = [(c, "sum") for c in COUNTS] + [("min_store_timestamp", "min"), ("max_store_timestamp", "max")]


def _key_columns(batch: pa.RecordBatch, f: scan.StoreFile, keys: list[str]) -> dict[str, pa.Array]:
    import pyarrow as pa
    import pyarrow.compute as pc

    out = {}
    for key in keys:
        if key == "topic" and keys == ["topic"]:
            out[key] = original_topic(batch)
        elif key == "group":
            out[key] = consumer_group(batch.column("topic"))
        elif key == "store":
            out[key] = pa.repeat(f.store, batch.num_rows)
        elif key == "hour":
            out[key] = pc.floor_temporal(batch.column("store_timestamp"), unit="hour")
        else:
            out[key] = batch.column(key)
    return out


def _retry_or_dlq(topic: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return pc.or_(pc.starts_with(topic, C.RETRY_GROUP_TOPIC_PREFIX), pc.starts_with(topic, C.DLQ_GROUP_TOPIC_PREFIX))


def original_topic(batch: pa.RecordBatch) -> pa.Array:
    """The topic a record was first sent to: RETRY_TOPIC for retry and DLQ records that carry it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    topic = batch.column("topic")
    retried = pc.fill_null(_retry_or_dlq(topic), False)
    if not pc.any(retried).as_py():
        return topic
    if C.PROPERTY_RETRY_TOPIC in batch.schema.names:           # decoded as a column (file_stats)
        first = batch.column(C.PROPERTY_RETRY_TOPIC)
    else:
        first = pc.map_lookup(batch.column("properties"), pa.scalar(C.PROPERTY_RETRY_TOPIC), "first")
    return pc.if_else(pc.and_(retried, pc.is_valid(first)), first, topic)


def consumer_group(topic: pa.Array) -> pa.Array:
    """The consumer group a %RETRY%<group> or %DLQ%<group> topic names (null for other topics)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    retry = pc.starts_with(topic, C.RETRY_GROUP_TOPIC_PREFIX)
    dlq = pc.starts_with(topic, C.DLQ_GROUP_TOPIC_PREFIX)
    return pc.if_else(retry, pc.utf8_slice_codeunits(topic, len(C.RETRY_GROUP_TOPIC_PREFIX)),
                      pc.if_else(dlq, pc.utf8_slice_codeunits(topic, len(C.DLQ_GROUP_TOPIC_PREFIX)),
                                 pa.scalar(None, pa.string())))


def _batch_partial(batch: pa.RecordBatch, f: scan.StoreFile, keys: list[str]) -> pa.Table:
    import pyarrow as pa
    import pyarrow.compute as pc

    from rmqtool.ops.facts import message_counts

    messages = pc.equal(batch.column("type"), "message")
    if not pc.all(messages).as_py():             # a BLANK row: filtered (a copy of every column)
        batch = batch.filter(messages)
    topic = batch.column("topic")
    ts = batch.column("store_timestamp").cast(pa.int64())
    cols = _key_columns(batch, f, keys)
    cols.update({"_topic": topic, "_tx": pc.bit_wise_and(batch.column("sys_flag"), C.TRANSACTION_MASK),
                 "messages": message_counts(batch), "bytes": batch.column("total_size").cast(pa.int64()),
                 "min_store_timestamp": ts, "max_store_timestamp": ts})
    # the other counts depend on a record's topic and transaction type only: taken per (key, topic, type) group
    inner = keys + ["_topic", "_tx"]
    groups = _group(pa.table(cols), inner, [("messages", "sum"), ("bytes", "sum"), ("bytes", "count"),
                                            ("min_store_timestamp", "min"), ("max_store_timestamp", "max")])
    topic, tx, records = groups.column("_topic"), groups.column("_tx"), groups.column("bytes_count")
    zero = pa.scalar(0, pa.int64())

    def count(mask) -> pa.Array:
        return pc.if_else(pc.fill_null(mask, False), records, zero)

    counts = {
        "retries": count(pc.starts_with(topic, C.RETRY_GROUP_TOPIC_PREFIX)),
        "dlq": count(pc.starts_with(topic, C.DLQ_GROUP_TOPIC_PREFIX)),
        "transaction_half": count(pc.or_(pc.equal(topic, C.RMQ_SYS_TRANS_HALF_TOPIC),
                                         pc.equal(tx, int(C.TransactionType.PREPARED)))),
        "transaction_commit": count(pc.equal(tx, int(C.TransactionType.COMMIT))),
        "transaction_rollback": count(pc.equal(tx, int(C.TransactionType.ROLLBACK))),
        "transaction_op": count(pc.equal(topic, C.RMQ_SYS_TRANS_OP_HALF_TOPIC)),
        "delayed": count(pc.equal(topic, C.RMQ_SYS_SCHEDULE_TOPIC)),
    }
    groups = groups.drop_columns(["_topic", "_tx", "bytes_count"])
    for name, values in counts.items():
        groups = groups.append_column(name, values)
    return _group(groups, keys, _AGGREGATES)


def _group(table: pa.Table, keys: list[str], aggregates) -> pa.Table:
    import pyarrow as pa

    if not keys:
        table = table.append_column("_all", pa.repeat(pa.scalar(0, pa.int8()), table.num_rows))
    out = table.group_by(keys or ["_all"], use_threads=False).aggregate(aggregates)
    names = [n.rsplit("_", 1)[0] if n.endswith(("_sum", "_min", "_max")) else n for n in out.schema.names]
    out = out.rename_columns(names)
    return out.drop_columns(["_all"]) if not keys else out


def file_stats(f: scan.StoreFile, by: str | None, on_damage: Callable[[Exception], None] | None = None,
               where=None, progress: Callable[[int], None] | None = None) -> pa.Table:
    """Partial sums of one commit-log file's messages that pass ``where`` (a ``RecordFilter``), grouped
    by ``by`` (None: one total row)."""
    from rmqtool.ops.filters import keep_records

    keys = GROUPINGS[by] if by else []
    sums = _sums(keys, where)
    parts = [_batch_partial(keep_records(b, where), f, keys)
             for b in scan.record_batches(f, on_damage=on_damage, progress=progress, columns=_columns(keys, where),
                                          windows=sums)
             if not _blank(b)]
    return merge(parts + ([sums.table()] if sums is not None else []), by)


def topic_counts(topic: str, by_type) -> dict[str, int]:
    """The counts other than messages and bytes of records of ``topic`` (their own, not the one they are filed
    under), ``by_type`` of them of each transaction type (NOT, PREPARED, COMMIT, ROLLBACK): the rules of
    ``_batch_partial`` for the record-by-record and the windows' sums."""
    records = sum(by_type)
    return {"retries": records if topic.startswith(C.RETRY_GROUP_TOPIC_PREFIX) else 0,
            "dlq": records if topic.startswith(C.DLQ_GROUP_TOPIC_PREFIX) else 0,
            "transaction_half": records if topic == C.RMQ_SYS_TRANS_HALF_TOPIC else by_type[1],
            "transaction_commit": by_type[2], "transaction_rollback": by_type[3],
            "transaction_op": records if topic == C.RMQ_SYS_TRANS_OP_HALF_TOPIC else 0,
            "delayed": records if topic == C.RMQ_SYS_SCHEDULE_TOPIC else 0}


def _blank(batch: pa.RecordBatch) -> bool:
    """A file's BLANK (a one-row batch): nothing to count."""
    return batch.num_rows == 1 and batch.column("type")[0].as_py() == "blank"


def _sums(keys: list[str], where) -> "WindowSums | None":
    """Where the facts pass sums windows: stats without a filter, in total, by topic or by queue."""
    return WindowSums(keys) if keys in ([], ["topic"], GROUPINGS["queue"]) and (where is None or where.is_empty) \
        else None


_MAX, _MIN = (1 << 63) - 1, -1 << 63          # int64's


class WindowSums:
    """``_batch_partial``'s sums for whole windows of the scan (``scan.record_batches(windows=)``), in total,
    by topic or by queue, from the compiled facts pass (each record's topic, or its topic and queue id, as a
    number) and numpy counts: no Arrow column and no group-by. By topic, a retry or DLQ record that names its
    RETRY_TOPIC is filed under it, as ``original_topic`` files it. A window whose records it cannot sum as the
    Arrow path does is left to that path: a topic or a property it reads that is not UTF-8 (no facts), an
    inner batch (INNER_NUM: its messages), repair's placeholder topic, a RETRY_TOPIC longer than 255 bytes."""

    def __init__(self, keys: list[str]):
        import numpy as np

        self.keys = keys
        # (topic the row is filed under, queue id or 0, the records' own topic) -> its row
        self.rows: dict[tuple[str, int, str], int] = {}
        self.tx = np.zeros((0, 4), np.int64)    # records per transaction type (NOT, PREPARED, COMMIT, ROLLBACK)
        self.bytes = np.zeros(0, np.int64)
        self.first = np.zeros(0, np.int64)      # store timestamps
        self.last = np.zeros(0, np.int64)

    def __call__(self, data, win, file_start: int) -> bool:
        import numpy as np

        from rmqtool.columnar.facts import split_pairs, window_facts, window_topic

        if not win.n or win.prop(C.PROPERTY_INNER_NUM)[0].max() >= 0:
            return False
        by_topic = self.keys == ["topic"]
        facts = window_facts(data, win, False, (C.PROPERTY_RETRY_TOPIC,) if by_topic else (), tags=False,
                             pairs=self.keys == GROUPINGS["queue"])
        if facts is None:
            return False
        topics = [window_topic(data, win, facts, t) for t in range(len(facts.first))]
        if C.SALVAGED_TOPIC in topics:
            return False
        if self.keys == GROUPINGS["queue"]:
            index, groups = facts.pair_index, [(topics[t], q, topics[t]) for t, q in zip(*split_pairs(facts.pairs))]
        else:
            index, groups = facts.topic_index, [(t, 0, t) for t in topics]
            if by_topic:
                index = _filed_under_retry_topic(data, win, index, groups)
                if index is None:
                    return False
        n = len(groups)
        rows = np.array([self._row(g) for g in groups], np.int64)
        tx = (win["sys_flag"] & C.TRANSACTION_MASK) >> 2
        self.tx[rows] += np.bincount(index * 4 + tx, minlength=4 * n).reshape(n, 4)
        self.bytes[rows] += np.bincount(index, weights=win["total"], minlength=n).astype(np.int64)  # < 2^53: exact
        ts = win["store_timestamp"]
        first, last = np.full(n, _MAX), np.full(n, _MIN)
        np.minimum.at(first, index, ts)
        np.maximum.at(last, index, ts)
        self.first[rows] = np.minimum(self.first[rows], first)
        self.last[rows] = np.maximum(self.last[rows], last)
        return True

    def _row(self, group: tuple[str, int, str]) -> int:
        import numpy as np

        row = self.rows.get(group)
        if row is None:
            row = self.rows[group] = len(self.rows)
            self.tx = np.vstack([self.tx, np.zeros((1, 4), np.int64)])
            self.bytes, self.first, self.last = (np.append(a, v) for a, v in
                                                 ((self.bytes, 0), (self.first, _MAX), (self.last, _MIN)))
        return row

    def table(self) -> pa.Table:
        """The partial sums of the windows taken (``_batch_partial``'s columns; no rows when none): the counts
        that depend on a record's own topic per row, then the rows filed under one key summed."""
        import numpy as np
        import pyarrow as pa

        from rmqtool.columnar.props import arrow, strings

        records = self.tx.sum(axis=1)
        by_topic = [topic_counts(t, by_type) for (_, _, t), by_type in zip(self.rows, self.tx.tolist())]
        sums = {"messages": records, "bytes": self.bytes,
                **{name: np.array([c[name] for c in by_topic], np.int64) for name in COUNTS[2:]},
                "min_store_timestamp": self.first, "max_store_timestamp": self.last}
        # (topic filed under, queue id) -> output row; a row whose records all moved to others is none's
        keys: dict[tuple[str, int], int] = {}
        out = np.array([keys.setdefault((k, q) if self.keys else ("", 0), len(keys)) if n else -1
                        for (k, q, _), n in zip(self.rows, records.tolist())], np.int64)
        sums = {name: values[out >= 0] for name, values in sums.items()}
        out = out[out >= 0]
        columns = {"topic": strings([k for k, _ in keys])} if self.keys else {}
        if len(self.keys) == 2:
            columns["queue_id"] = arrow(np.array([q for _, q in keys], np.int32), pa.int32())
        columns.update({name: arrow(values, pa.int64()) for name, values in _folded(out, len(keys), sums).items()})
        return pa.table(columns)


def _filed_under_retry_topic(data, win, index, groups: list[tuple[str, int, str]]):
    """``index`` with the retry and DLQ records that name their RETRY_TOPIC (valid UTF-8: the facts were
    taken) moved to groups of their own, (that topic, 0, their own topic), appended to ``groups``; None for
    a RETRY_TOPIC longer than 255 bytes (no topic is: the Arrow path takes it)."""
    import numpy as np

    retried = [g for g, (topic, _, _) in enumerate(groups)
               if topic.startswith((C.RETRY_GROUP_TOPIC_PREFIX, C.DLQ_GROUP_TOPIC_PREFIX))]
    if not retried:
        return index
    start, end = win.prop(C.PROPERTY_RETRY_TOPIC)
    moved = np.flatnonzero(np.isin(index, retried) & (start >= 0))
    if not len(moved):
        return index
    at, length = start[moved], end[moved] - start[moved]
    width = int(length.max())
    if width > 255:
        return None
    cols = np.arange(width)
    text = np.where(cols < length[:, None], data[np.minimum(at[:, None] + cols, len(data) - 1)], 0)
    # each record's key: its RETRY_TOPIC's bytes, their length and its own topic's number, as one value
    key = np.column_stack([text.astype(np.uint8), length.astype(np.uint8),
                           index[moved].astype(">u4").view(np.uint8).reshape(-1, 4)])
    _, first, inverse = np.unique(np.ascontiguousarray(key).view(np.dtype((np.void, key.shape[1]))).ravel(),
                                  return_index=True, return_inverse=True)
    for r in moved[first].tolist():
        groups.append((bytes(data[start[r]:end[r]]).decode(), 0, groups[index[r]][2]))
    index = index.copy()
    index[moved] = len(groups) - len(first) + inverse.reshape(-1)
    return index


def _columns(keys: list[str], where=None) -> list[str] | None:
    """The columns ``_batch_partial`` reads (a scan that copies no bodies and makes no properties map); every
    column (None) for a filter ``where``."""
    if where is not None and not where.is_empty:
        return None
    from rmqtool.columnar.facts import DISPATCH_PROPERTIES

    by = {"hour": ["store_timestamp"], "store": [], "group": ["topic"],
          "topic": ["topic", C.PROPERTY_RETRY_TOPIC] if keys == ["topic"] else ["topic"]}
    return list(dict.fromkeys(["type", "topic", "sys_flag", "store_timestamp", "total_size", *DISPATCH_PROPERTIES,
                               *(c for k in keys for c in by.get(k, [k]))]))


def merge(partials: Iterable[pa.Table], by: str | None) -> pa.Table:
    """One row per key of the partial sums of several files or windows (each grouped already): the sums
    added, the store-time ranges widened. The rows are few (a file's keys), so a dict finds each row's key
    and numpy folds the columns, without Arrow's group-by (importing pyarrow.compute and Acero costs more
    than the fold: ~0.07 CPU-s, after the workers end)."""
    import numpy as np
    import pyarrow as pa

    partials = [p for p in partials if p.num_rows]
    if not partials:
        return pa.table({})
    if len(partials) == 1:                   # grouped already (``file_stats``, ``_batch_partial``)
        return partials[0]
    keys = GROUPINGS[by] if by else []
    table = pa.concat_tables(partials)
    groups: dict[tuple, int] = {}
    # a timestamp key (the hour) as its int64: a datetime cannot hold every value a record's time may have
    times = {k for k in keys if pa.types.is_timestamp(table.schema.field(k).type)}
    values = zip(*([v for c in table.column(k).chunks for v in (c.view(pa.int64()) if k in times else c).to_pylist()]
                   for k in keys)) if keys else [()] * table.num_rows
    index = np.fromiter((groups.setdefault(v, len(groups)) for v in values), np.int64, table.num_rows)
    columns = {k: pa.array([g[i] for g in groups], pa.int64() if k in times else table.schema.field(k).type)
               for i, k in enumerate(keys)}
    columns.update({k: columns[k].view(table.schema.field(k).type) for k in times})
    columns.update(_folded(index, len(groups), {name: np.concatenate([c.to_numpy() for c in table.column(name).chunks])
                                                for name, _ in _AGGREGATES}))
    return pa.table(columns)


def _folded(index, groups: int, values: dict) -> dict:
    """Each aggregate's int64 values folded into ``groups`` rows (``index``: each value's row): the counts
    added, the store-time ranges widened (``_AGGREGATES``, as Arrow's group-by takes them)."""
    import numpy as np

    out = {}
    for name, how in _AGGREGATES:
        fold, start = {"sum": (np.add, 0), "min": (np.minimum, _MAX), "max": (np.maximum, _MIN)}[how]
        out[name] = np.full(groups, start, np.int64)
        fold.at(out[name], index, values[name])
    return out


def stats_rows(table: pa.Table, by: str | None) -> list[dict]:
    """Rows sorted by their key, with the shares; timestamps in epoch ms (the partial sums' int64)."""
    keys = GROUPINGS[by] if by else []
    if not table.num_rows:
        return []
    if "hour" in keys:
        import pyarrow.compute as pc

        hours = pc.strftime(table.column("hour"), format="%Y-%m-%d %H:00")
        table = table.set_column(table.schema.get_field_index("hour"), "hour", hours)
    return _finish(table.select(keys + [c for c in STATS_FIELDS if c in table.schema.names]).to_pylist(), keys)


def _finish(rows: list[dict], keys: list[str]) -> list[dict]:
    """The rows with their shares, sorted by their key (both engines and the small-store path)."""
    for row in rows:
        row["retry_share"] = round(row["retries"] / row["messages"], 6)
        row["dlq_share"] = round(row["dlq"] / row["messages"], 6)
    rows.sort(key=lambda r: tuple((r[k] is None, r[k]) for k in keys))
    return [{k: r[k] for k in keys + STATS_FIELDS} for r in rows]


def _few_stats(files: list[scan.StoreFile], by: str | None, progress: Callable[[int], None] | None) -> list[dict]:
    """``stats_local`` of a small store without a filter, record by record (the record-at-a-time decoder: no
    numpy, pyarrow or kernel to import), with the Arrow path's rules. Raises on damage and on a record whose
    properties, topic or time the Arrow path might read differently."""
    from datetime import datetime, timezone

    keys = GROUPINGS[by] if by else []
    prefixes = (C.RETRY_GROUP_TOPIC_PREFIX, C.DLQ_GROUP_TOPIC_PREFIX)
    named, retry = (C.PROPERTY_TAGS,), (C.PROPERTY_RETRY_TOPIC,)
    totals: dict[tuple, dict] = {}
    for f in files:
        for msg in scan.cut_commitlog(f.uri, f.size).iter_messages():
            topic, props, ts = msg.topic, msg.properties, msg.store_timestamp
            if msg.topic_raw is not None or not 0 <= ts < 253402300800000:     # not UTF-8, year > 9999
                raise scan.Irregular
            used = [*(named if "tags" in keys else ()),
                    *(retry if keys == ["topic"] and topic.startswith(prefixes) else ())]
            if any(scan.odd_property(msg.properties_raw, k, props) for k in used):
                raise scan.Irregular
            messages = scan.record_messages(msg.properties_raw, props)
            tx = msg.sys_flag & C.TRANSACTION_MASK
            by_type = [0, 0, 0, 0]
            by_type[tx >> 2] = 1
            if topic == C.SALVAGED_TOPIC and tx == C.TransactionType.ROLLBACK:
                continue                                   # repair's placeholder: not a message
            key = []
            for k in keys:
                if k == "topic":
                    key.append(props.get(C.PROPERTY_RETRY_TOPIC, topic)
                               if keys == ["topic"] and topic.startswith(prefixes) else topic)
                elif k == "group":
                    key.append(next((topic[len(p):] for p in prefixes if topic.startswith(p)), None))
                elif k == "store":
                    key.append(f.store)
                elif k == "hour":
                    hour = datetime.fromtimestamp(ts // 3_600_000 * 3600, timezone.utc)
                    key.append(hour.strftime("%Y-%m-%d %H:00"))
                elif k == "store_host":
                    key.append(str(msg.store_host))
                elif k == "tags":
                    key.append(props.get(C.PROPERTY_TAGS))
                else:
                    key.append(msg.queue_id)
            t = totals.get(tuple(key))
            if t is None:
                t = totals[tuple(key)] = dict(zip(keys, key), min_store_timestamp=ts, max_store_timestamp=ts,
                                              **dict.fromkeys(COUNTS, 0))
            t["messages"] += messages
            t["bytes"] += msg.total_size
            for name, count in topic_counts(topic, by_type).items():
                t[name] += count
            t["min_store_timestamp"] = min(t["min_store_timestamp"], ts)
            t["max_store_timestamp"] = max(t["max_store_timestamp"], ts)
        if progress:
            progress(f.size)
    return _finish(list(totals.values()), keys)


def stats_local(files: list[scan.StoreFile], by: str | None,
                on_damage: Callable[[Exception], None] | None = None,
                progress: Callable[[int], None] | None = None, where=None, jobs: int | None = None) -> list[dict]:
    """The local engine: the files' partial sums in ``jobs`` processes (default: ``workers.default_jobs``),
    merged here; ``on_damage`` told of each file's damage in file order (``progress(n)``: bytes scanned)."""
    from rmqtool.errors import FormatError, StoreError
    from rmqtool.ops.workers import default_jobs, process_map

    total = sum(f.size for f in files)
    if jobs is None and default_jobs(total, len(files)) == 1 and total <= scan.FEW_BYTES and \
            (where is None or where.is_empty) and all(f.kind == "commitlog" and "://" not in f.uri for f in files):
        try:                               # one process, no --jobs asked for: the record-at-a-time totals
            return _few_stats(files, by, progress)
        except (FormatError, StoreError, OSError, scan.Irregular):
            pass                           # the Arrow path: its output, its warnings and exit status
    jobs = default_jobs(total, len(files)) if jobs is None else jobs
    if jobs > 1 and len(files) > 1:
        from rmqtool.ops.filters import keep_records
        keys = GROUPINGS[by] if by else []
        scan.warm(files[0], lambda b: _batch_partial(keep_records(b.slice(0, 1), where), files[0], keys),
                  _sums(keys, where),
                  columns=_columns(keys, where))       # the workers' decode: its code loaded once, here
    parts = process_map(partial(_file_stats_apart, by=by, where=where), files, jobs, progress)
    for _, damage in parts:
        for warning in damage:
            if on_damage:
                on_damage(warning)
    return stats_rows(merge([table for table, _ in parts], by), by)


def _file_stats_apart(f: scan.StoreFile, progress: Callable[[int], None] | None, *, by: str | None,
                      where) -> tuple[pa.Table, list[str]]:
    """``file_stats`` in a worker: (its partial sums, the damage it skipped, as text)."""
    damage: list[str] = []
    return file_stats(f, by, lambda exc: damage.append(str(exc)), where, progress), damage


TOPIC_CONFIG_FIELDS = ["queue_type", "write_queue_nums"]


def with_topic_config(rows: list[dict], stores: Iterable[str]) -> list[dict]:
    """``--by topic`` rows with the topic table's queue type and queue count (config/topics.json of the
    local stores that have one; None for topics no table names)."""
    from rmqtool.errors import RmqError
    from rmqtool.store.metadata import topic_table
    from rmqtool.store.store import Store

    known: dict[str, tuple[str, int]] = {}
    for path in stores:
        try:
            table = topic_table(Store.open(path)) or {}
        except (RmqError, OSError):
            continue                      # a remote store or none: no table
        known.update({name: (t.queue_type, t.write_queue_nums) for name, t in table.items()})
    return [{**r, **dict(zip(TOPIC_CONFIG_FIELDS, known.get(r["topic"], (None, None))))} for r in rows]
