"""mqadmin's views, offline: per-queue status (topicStatus), the last consumed time (consumerProgress), whether
each group consumed a message (queryMsgById's track), and the in-doubt transactions the broker's
transaction check works from."""

from __future__ import annotations

import re
from typing import Iterable, Iterator

from rmqtool import constants as C
from rmqtool.errors import FormatError, StoreError
from rmqtool.format.statictopic import LogicQueueMappingItem
from rmqtool.store.metadata import cq_max_offset, static_topics
from rmqtool.store.store import Store

TOPIC_STATUS_FIELDS = ["topic", "queue_id", "min_offset", "max_offset", "last_updated_timestamp"]
STATIC_STATUS_FIELDS = ["logical_queue_id", "logical_min_offset", "logical_max_offset"]     # static topics only
TRACK_FIELDS = ["msg_id", "topic", "queue_id", "queue_offset", "group", "offset", "consumed"]
TRANSACTION_FIELDS = ["state", "half_offset", "queue_id", "queue_offset", "store_timestamp", "age_ms", "real_topic",
                      "uniq_key", "op_offset", "commit_offset"]


def _batch(store: Store, topic: str) -> bool:
    return topic not in store.topics() and topic in store.batch_topics()


def store_time_at(store: Store, topic: str, queue_id: int, queue_offset: int) -> int | None:
    """DefaultMessageStore.getMessageStoreTimeStamp: the store time of the message at ``queue_offset`` (its
    consume-queue unit's record; a batch unit's storeTime); None when the queue has no such message."""
    if queue_offset < 0:
        return None
    try:
        if _batch(store, topic):
            unit = store.batch_consume_queue(topic, queue_id).lookup(queue_offset)
            return None if unit is None else unit.store_time
        cq = (store.rocksdb_consumequeue.queue(topic, queue_id) if store.consumequeue_is_rocksdb
              else store.consume_queue(topic, queue_id))
        at = next((u for off, u in cq.iter_units(queue_offset) if off == queue_offset), None)
        if at is None or at.is_filler:
            return None
        return store.commitlog.read_at(at.physical_offset).store_timestamp
    except (StoreError, FormatError):
        return None


def _min_offset(store: Store, topic: str, queue_id: int) -> int:
    """ConsumeQueue.getMinOffsetInQueue (BatchConsumeQueue: after correctMinOffset, BatchConsumeQueue.offsets;
    RocksDBConsumeQueue: RocksDbConsumeQueue.min_offset)."""
    if store.consumequeue_is_rocksdb:
        return store.rocksdb_consumequeue.queue(topic, queue_id).min_offset
    if _batch(store, topic):
        return store.batch_consume_queue(topic, queue_id).offsets(store.commitlog.min_offset)[0]
    first, _ = store.consume_queue(topic, queue_id).extent()
    return first


def topic_status_rows(store: Store, topics: Iterable[str], phy_end: int | None = None) -> Iterator[dict]:
    """mqadmin topicStatus: per queue its min and max offset and the store time of its last message
    (AdminBrokerProcessor.getTopicStatsInfo: getMessageStoreTimeStamp(topic, queue, max - 1) when max > 0).
    ``phy_end`` caps the maxima after a crash (rmqtool.ops.metadata.crash_recovered_end). A queue of a static
    topic adds its logical queue and offsets as MQAdminUtils.convertPhysicalTopicStats gives them: the min
    through its item's computeStaticQueueOffsetLoosely, the max through computeStaticQueueOffsetStrictly."""
    mapped = static_queues(store)
    for topic in topics:
        if store.consumequeue_is_rocksdb:
            queue_ids = store.rocksdb_consumequeue.queue_ids(topic)
        else:
            queues = store.batch_consume_queues(topic) if _batch(store, topic) else store.consume_queues(topic)
            queue_ids = sorted(q.queue_id for q in queues)
        for queue_id in queue_ids:
            high = cq_max_offset(store, topic, queue_id, phy_end) or 0
            low = _min_offset(store, topic, queue_id)
            row = {"topic": topic, "queue_id": queue_id, "min_offset": low, "max_offset": high,
                   "last_updated_timestamp": store_time_at(store, topic, queue_id, high - 1) if high else None}
            if (found := mapped.get((topic, queue_id))) is not None:
                logical, item = found
                row.update(logical_queue_id=logical, logical_min_offset=max(item.static_offset_loosely(low), 0),
                           logical_max_offset=max(item.static_offset_strictly(high), 0))
            yield row


def static_queues(store: Store) -> dict[tuple[str, int], tuple[int, LogicQueueMappingItem]]:
    """(topic, physical queue id) -> (logical queue id, its item) of every static topic's queue on this broker
    (TopicQueueMappingDetail.physical_queues)."""
    return {(topic, qid): found for topic, detail in static_topics(store).items()
            for qid, found in detail.physical_queues().items()}


def with_logical(row: dict, found: tuple[int, LogicQueueMappingItem] | None) -> dict:
    """A record or unit row of a static topic's queue with its logical queue and logical queue offset (the
    offset the send path answered: computeStaticQueueOffsetLoosely); other rows as they are."""
    if found is not None and row.get("queue_offset") is not None:
        logical, item = found
        row.update(logical_queue_id=logical, logical_queue_offset=item.static_offset_loosely(row["queue_offset"]))
    return row


def track_rows(records: Iterable[dict], offsets: dict[tuple[str, str], dict[int, int]]) -> Iterator[dict]:
    """MQAdminImpl.messageTrackDetail, offline: for each group with a committed offset on the record's queue
    (config/consumerOffset.json, or lmqConsumerOffset.json: store.metadata.consumer_offsets), consumed when
    that offset is beyond the record's queue offset."""
    for r in records:
        for (topic, group), queues in sorted(offsets.items(), key=lambda kv: kv[0][1]):
            if topic == r["topic"] and r["queue_id"] in queues:
                committed = queues[r["queue_id"]]
                yield {"msg_id": r["msg_id"], "topic": topic, "queue_id": r["queue_id"],
                       "queue_offset": r["queue_offset"], "group": group, "offset": committed,
                       "consumed": committed > r["queue_offset"]}


def op_half_offsets(body: bytes | None) -> list[int]:
    """The half queue offsets an op record's body closes, as the broker's transaction check reads them.

    4.9.7 writes one offset per op record, its decimal digits alone (TransactionalMessageBridge.
    addRemoveTagInTransactionOp: ``String.valueOf(queueOffset)``, op queue = the half's queue id). 5.x queues
    ``offset + ","`` per closed half (TransactionalMessageServiceImpl.deletePrepareMessage, OFFSET_SEPARATOR)
    and TransactionalOpBatchService writes them per half queue id as one body, up to
    transactionOpMsgMaxSize (getOpMessage: "3,7,8,"; TransactionalMessageBridge.writeOp(queueId) ->
    getOpQueueByHalf: the same queue id, tag "d" in both). 5.x's fillOpRemoveMap splits on "," (Java's split
    drops the trailing empty part) and parses each part with Long.parseLong, a part that does not parse
    being -1 and so below every queue's minimum: skipped. 4.9.7's fillOpRemoveMap parses the whole body as
    one number, the same on every body a 4.x broker writes."""
    parts = (_queue_offset(part) for part in bytes(body or b"").decode("utf-8", "replace").split(","))
    return [offset for offset in parts if offset is not None]


def _queue_offset(text: str | None) -> int | None:
    """A queue offset as the check's getLong reads it (Long.valueOf), None where it reads -1 or a negative
    number, which names no half."""
    return int(text) if text is not None and re.fullmatch(r"\+?\d+", text) else None


def _prepared_queue_offset(half: dict) -> int | None:
    """The original half's queue offset a re-put half names, where the check looks it up: only a half with
    CHECK_IMMUNITY_TIME_IN_SECONDS reaches checkPrepareQueueOffset, which reads TRAN_PREPARED_QUEUE_OFFSET
    (TransactionalMessageBridge.renewImmunityHalfMessageInner sets it to the original's queue offset when
    putImmunityMsgBackToHalfQueue re-puts a half, and keeps it on every later re-put)."""
    props = dict(half["properties"] or ())
    if C.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS not in props:
        return None
    return _queue_offset(props.get(C.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET))


def transaction_rows(store: Store, half_offsets: dict[int, int], *, everything: bool = False) -> Iterator[dict]:
    """Half messages (RMQ_SYS_TRANS_HALF_TOPIC) and how they ended, in commit-log order.

    An op record (RMQ_SYS_TRANS_OP_HALF_TOPIC, tag "d", the half's queue id) names in its body the half
    queue offsets it closes (``op_half_offsets``). A commit is the real message EndTransactionProcessor writes: sysFlag
    TRANSACTION_COMMIT_TYPE, preparedTransactionOffset = the half's physical offset; a closed half without
    one was rolled back. An open half at or after the check's progress in its queue (group CID_RMQ_SYS_TRANS,
    ``half_offsets``) is in doubt: the broker's transaction check asks the producer about it; an open half
    before it was checked already (put back as a new half, or discarded). A half re-put by the check is also
    closed by an op record naming the original half's queue offset (TransactionalMessageServiceImpl.check,
    4.9.x and 5.x: the half's own offset in the op set first, then checkPrepareQueueOffset with
    ``_prepared_queue_offset``); the producer ended the original then, so its commit names the original's
    physical offset. The op records are read whole, wherever the check's progress stands (the check itself
    reads only those naming offsets at or after it: fillOpRemoveMap's miniOffset). Only in-doubt halves
    unless ``everything``; age_ms counts to the store's newest record."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from rmqtool.columnar import iter_record_batches

    halves, closed, commits, newest = [], {}, {}, 0
    columns = ["physical_offset", "topic", "queue_id", "queue_offset", "sys_flag", "store_timestamp", "tags",
               "real_topic", "uniq_key", "prepared_transaction_offset", "body", "properties"]
    system = pa.array([C.RMQ_SYS_TRANS_HALF_TOPIC, C.RMQ_SYS_TRANS_OP_HALF_TOPIC], pa.string())
    for batch in iter_record_batches(store.commitlog, batch_rows=16384):
        batch = batch.filter(pc.equal(batch.column("type"), "message"))
        if not batch.num_rows:
            continue
        stamps = batch.column("store_timestamp").cast(pa.int64())
        newest = max(newest, pc.max(stamps).as_py())
        keep = pc.or_(pc.is_in(batch.column("topic"), value_set=system),
                      pc.equal(pc.bit_wise_and(batch.column("sys_flag"), C.TRANSACTION_MASK),
                               int(C.TransactionType.COMMIT)))
        picked = batch.set_column(batch.schema.get_field_index("store_timestamp"), "store_timestamp", stamps) \
                      .filter(keep).select(columns)
        for r in picked.to_pylist():
            if r["topic"] == C.RMQ_SYS_TRANS_HALF_TOPIC:
                halves.append(r)
            elif r["topic"] == C.RMQ_SYS_TRANS_OP_HALF_TOPIC:
                if r["tags"] == C.TRANS_OP_REMOVE_TAG:
                    for offset in op_half_offsets(r["body"]):
                        closed.setdefault((r["queue_id"], offset), r["physical_offset"])
            else:
                commits.setdefault(r["prepared_transaction_offset"], r["physical_offset"])
    by_queue_offset = {(h["queue_id"], h["queue_offset"]): h["physical_offset"] for h in halves}
    for h in halves:
        op = closed.get((h["queue_id"], h["queue_offset"]))
        commit = commits.get(h["physical_offset"]) if op is not None else None
        prepared = _prepared_queue_offset(h) if op is None else None
        if prepared is not None:
            op = closed.get((h["queue_id"], prepared))
            original = by_queue_offset.get((h["queue_id"], prepared))
            commit = commits.get(h["physical_offset"], commits.get(original)) if op is not None else None
        if op is None:
            state = "in_doubt" if h["queue_offset"] >= half_offsets.get(h["queue_id"], 0) else "checked"
        else:
            state = "committed" if commit is not None else "rolled_back"
        if everything or state == "in_doubt":
            yield {"state": state, "half_offset": h["physical_offset"], "queue_id": h["queue_id"],
                   "queue_offset": h["queue_offset"], "store_timestamp": h["store_timestamp"],
                   "age_ms": newest - h["store_timestamp"], "real_topic": h["real_topic"],
                   "uniq_key": h["uniq_key"], "op_offset": op, "commit_offset": commit}
