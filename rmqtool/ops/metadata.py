"""Broker metadata as rows: topics, subscription groups, consumer offsets with lag, delay-level offsets,
and the config files themselves (which file was read, data version)."""

from __future__ import annotations

import re
from typing import Collection, Iterator

from rmqtool import constants as C
from rmqtool.format.fastjson import DataVersion
from rmqtool.format.java import parse_delay_levels
from rmqtool.format.timer import decode_timer_metrics
from rmqtool.store import layout as L
from rmqtool.store.config import Loaded, load_config
from rmqtool.store.metadata import CONFIG_FILES, Table, cq_max_offset, load
from rmqtool.store.store import Store

TOPIC_FIELDS = ["topic", "queue_type", "cleanup_policy", "read_queue_nums", "write_queue_nums", "perm", "order",
                "queues_on_disk", "compaction_queues", "topic_filter_type", "topic_sys_flag", "attributes"]
OFFSET_FIELDS = ["group", "topic", "queue_id", "offset", "max_offset", "lag", "last_consumed_timestamp"]
STATIC_OFFSET_FIELDS = ["logical_queue_id", "logical_offset", "logical_max_offset"]      # static topics only
DELAY_FIELDS = ["level", "delay_ms", "queue_id", "offset", "max_offset", "pending"]
CONFIG_FIELDS = ["file", "read_from", "entries", "data_version_counter", "data_version_timestamp",
                 "state_version", "fallback_reason"]


def topic_rows(loaded: Loaded[Table], store: Store) -> Iterator[dict]:
    """One row per topic, by name; ``queues_on_disk`` counts its consume-queue directories,
    ``compaction_queues`` its compaction logs (compaction/compactionLog/<topic>/<queueId>)."""
    compacted = {}
    if store.compaction is not None:
        for q in store.compaction.queues():
            compacted[q.topic] = compacted.get(q.topic, 0) + 1
    for name in sorted(loaded.value.entries):
        tc = loaded.value.entries[name]
        yield {"topic": name, "queue_type": tc.queue_type, "cleanup_policy": tc.cleanup_policy,
               "read_queue_nums": tc.read_queue_nums, "write_queue_nums": tc.write_queue_nums,
               "perm": tc.perm_text, "order": tc.order, "queues_on_disk": _queue_dirs(store, name),
               "compaction_queues": compacted.get(name, 0), "topic_filter_type": tc.topic_filter_type,
               "topic_sys_flag": tc.topic_sys_flag, "attributes": tc.attributes}


def _queue_dirs(store: Store, topic: str) -> int:
    if store.consumequeue_is_rocksdb:
        return len(store.rocksdb_consumequeue.queue_ids(topic))
    return sum(1 for batch in (False, True) if store.path(L.queue_dir(topic, batch=batch)).is_dir()
               for q in store.path(L.queue_dir(topic, batch=batch)).iterdir() if q.is_dir() and q.name.isdigit())


def group_rows(loaded: Loaded[Table]) -> Iterator[dict]:
    """One row per subscription group, by name: its stored fields in snake_case, and ``forbidden``: its
    topics in the forbidden table with their bits (``1 << forbiddenIndex``, as updateForbidden sets them)."""
    for name in sorted(loaded.value.entries):
        fields = {snake(k): v for k, v in loaded.value.entries[name].items() if k != "groupName"}
        yield {"group": name, **fields, "forbidden": loaded.value.forbidden.get(name, {})}


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def crash_recovered_end(store: Store) -> int | None:
    """After a crash (``abort`` present), the commit log's end as the broker's abnormal recovery will
    leave it; its consume queues lose the units pointing at or after it (truncateDirtyLogicFiles), so
    queue maxima are capped there. None for a cleanly shut down store, and for DLedger, whose recovery
    keeps every entry DLedger holds."""
    if not store.is_store_root or not store.abort_path.exists() or store.commitlog.entry_header_size:
        return None
    from rmqtool.store.broker_model import abnormal_recovery_start

    files = [f for f in store.commitlog.queue if f.length > 0]
    return store.commitlog.recovered_end(files[abnormal_recovery_start(store)].start if files
                                         else store.commitlog.min_offset)


def offset_rows(loaded: Loaded[Table], store: Store, *, groups: Collection[str] = (),
                topics: Collection[str] = (), phy_end: int | None = None) -> Iterator[dict]:
    """Committed offset, the queue's max offset, lag = max - committed and the store time of the last
    consumed message (mqadmin consumerProgress's LastTime: getMessageStoreTimeStamp at offset - 1), per
    group/topic/queue (of any of ``groups`` and ``topics`` when given). max_offset and lag are None when the
    store has no such queue (e.g. an unused retry topic); ``phy_end`` caps the maxima (see
    crash_recovered_end). A static topic's queue (its physical queue: ConsumerManageProcessor stores the
    physical offset) adds its logical queue, the logical offset queryConsumerOffset answers and the logical
    max offset (computeStaticQueueOffsetStrictly of both)."""
    from rmqtool.ops.mqadmin import static_queues, store_time_at

    mapped = static_queues(store)
    maxima: dict[tuple[str, int], int | None] = {}
    for (t, g), queues in sorted(loaded.value.entries.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if (groups and g not in groups) or (topics and t not in topics):
            continue
        for queue_id in sorted(queues):
            if (t, queue_id) not in maxima:
                maxima[(t, queue_id)] = cq_max_offset(store, t, queue_id, phy_end)
            high = maxima[(t, queue_id)]
            offset = queues[queue_id]
            row = {"group": g, "topic": t, "queue_id": queue_id, "offset": offset, "max_offset": high,
                   "lag": None if high is None else high - offset,
                   "last_consumed_timestamp": store_time_at(store, t, queue_id, offset - 1) if high else None}
            if (found := mapped.get((t, queue_id))) is not None:
                logical, item = found
                row.update(logical_queue_id=logical, logical_offset=item.static_offset_strictly(offset),
                           logical_max_offset=None if high is None else item.static_offset_strictly(high))
            yield row


def totals(rows: Iterator[dict], by: tuple[str, ...]) -> Iterator[dict]:
    """Offset rows summed per ``by`` (e.g. ("group", "topic")): queues, and lag over the queues the store
    has (None when it has none of them)."""
    out: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(row[k] for k in by)
        acc = out.setdefault(key, {**dict(zip(by, key)), "queues": 0, "lag": 0, "unknown_queues": 0})
        acc["queues"] += 1
        if row["lag"] is None:
            acc["unknown_queues"] += 1
        else:
            acc["lag"] += row["lag"]
    for acc in out.values():
        if acc["unknown_queues"] == acc["queues"]:
            acc["lag"] = None
        yield acc


def delay_rows(loaded: Loaded[Table], store: Store, levels: str = C.DEFAULT_DELAY_LEVELS,
               phy_end: int | None = None) -> Iterator[dict]:
    """Per delay level: its delay, SCHEDULE_TOPIC_XXXX queue, the offset delivered up to, that queue's max
    offset (capped at ``phy_end``, see crash_recovered_end) and the messages still waiting there."""
    delays = parse_delay_levels(levels)
    for level in sorted(loaded.value.entries):
        offset = loaded.value.entries[level]
        high = cq_max_offset(store, C.RMQ_SYS_SCHEDULE_TOPIC, level - 1, phy_end)
        yield {"level": level, "delay_ms": delays[level - 1] if 1 <= level <= len(delays) else None,
               "queue_id": level - 1, "offset": offset, "max_offset": high,
               "pending": None if high is None else high - offset}


def config_rows(store: Store) -> Iterator[dict]:
    """Each metadata file the store has (and timermetrics): which file was read (.bak when the broker
    would; the RocksDB database, ``topics/`` etc., on a RocksDB-config store), entries and data version."""
    for name in CONFIG_FILES:
        loaded = load(store, name)
        if loaded is not None:
            yield _config_row(name, loaded, len(loaded.value.entries), loaded.value.data_version)
    if store.is_store_root:
        metrics = load_config(store.path(L.config_file("timermetrics")), decode_timer_metrics)
        if metrics is not None:
            yield _config_row("timermetrics", metrics, len(metrics.value.timing_count), metrics.value.data_version)


def _config_row(name: str, loaded: Loaded, entries: int, dv: DataVersion | None) -> dict:
    read_from = loaded.path.name + ("/" if loaded.path.is_dir() else "")    # a RocksDB database
    return {"file": name, "read_from": read_from, "entries": entries,
            "data_version_counter": dv.counter if dv else None, "data_version_timestamp": dv.timestamp if dv else None,
            "state_version": dv.state_version if dv else None, "fallback_reason": loaded.fallback}
