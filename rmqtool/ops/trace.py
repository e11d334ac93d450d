"""Message traces: the contexts the client's trace dispatcher stored in the trace topic, found by the message
they name (as ``mqadmin queryMsgTraceById``) or listed in bulk.

A trace message (AsyncTraceDispatcher.sendTraceDataByMQ) carries in KEYS every traced msgId (the client's
UNIQ_KEY) and key of its contexts, so the index of the trace topic finds them; the commit log is read
instead when the index has nothing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from rmqtool.errors import FormatError, RmqError
from rmqtool.format.commitlog import Message
from rmqtool.format.msgid import decode_message_id
from rmqtool.format.trace import TraceContext, decode_trace_body, java_split
from rmqtool.ops.query import _read_message, lookup_key
from rmqtool.store.store import Store

DEFAULT_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"         # TopicValidator.RMQ_SYS_TRACE_TOPIC
TRACE_TOPIC_SETTING = "msgTraceTopicName"           # BrokerConfig.msgTraceTopicName
CLOUD_TRACE_TOPIC_PREFIX = "rmq_sys_TRACE_DATA_"    # TraceConstants.TRACE_TOPIC_PREFIX (AccessChannel.CLOUD)


def trace_topic(store: Store, override: str | None = None) -> tuple[str, str]:
    """The trace topic and where its name comes from: ``override``, the broker's msgTraceTopicName in
    config/broker.properties (where the broker persists its configuration when started without -c), else
    RMQ_SYS_TRACE_TOPIC."""
    return properties_trace_topic(store.broker_properties(), override)


def properties_trace_topic(props: dict[str, str] | None, override: str | None = None) -> tuple[str, str]:
    """``trace_topic`` from a store's broker.properties (None: none)."""
    if override:
        return override, "given"
    name = (props or {}).get(TRACE_TOPIC_SETTING, "").strip()
    if name:
        return name, f"{TRACE_TOPIC_SETTING} in config/broker.properties"
    return DEFAULT_TRACE_TOPIC, "default"


def names_of(store: Store, msg_id: str) -> set[str]:
    """What an ID given to ``trace`` names: itself (a UNIQ_KEY or a key; upper-cased too when it is 32 or 56
    hex characters), and when it is the offsetMsgId of a record of the store, that record's UNIQ_KEY (the
    msgId the client traced)."""
    names = {msg_id}
    text = msg_id.upper()
    try:
        _, offset = decode_message_id(text)
    except FormatError:
        return names
    names.add(text)                           # IDs are upper-case hex (MessageClientIDSetter, UtilAll.bytes2string)
    found = _read_message(store.commitlog, offset) if offset >= 0 else None
    if found is not None and found.msg_id == text and found.uniq_key:
        names.add(found.uniq_key)
    return names


def index_trace_records(store: Store, topic: str, names: Iterable[str], *,
                        max_num: int) -> tuple[list[tuple[int, Message]], list[str]]:
    """The trace-topic records whose KEYS hold one of ``names``, through the index (IndexService.queryOffset
    per name, at most ``max_num`` hits each), in commit-log order; and the names whose hits reached
    ``max_num``."""
    found: dict[int, Message] = {}
    capped = []
    for name in dict.fromkeys(names):
        hit = lookup_key(store, topic, name, max_num=max_num, lmq_scan=False)
        if len(hit.hits) >= max_num:
            capped.append(name)
        found.update(hit.records)
    return sorted(found.items(), key=lambda item: item[0]), capped


def trace_records(store: Store, topic: str, *, progress: Callable[[int], None] | None = None,
                  on_damage=None) -> Iterator[tuple[int, Message]]:
    """Every record of the trace topic, in commit-log order (the columnar scan, then each record read)."""
    from rmqtool.ops.filters import RecordFilter, filtered_batches

    for batch in filtered_batches(store.commitlog, RecordFilter(topics=(topic,)), progress=progress,
                                  on_damage=on_damage):
        for offset in batch.column("physical_offset").to_pylist():
            msg = _read_message(store.commitlog, offset)
            if msg is not None:
                yield offset, msg


def record_contexts(offset: int, msg: Message) -> list[TraceContext]:
    """The contexts of a trace record (its body decompressed as a consumer's client does)."""
    try:
        return decode_trace_body(msg.decompressed_body())
    except FormatError as exc:
        raise FormatError(f"trace message {msg.uniq_key or msg.msg_id} does not decode: {exc.message}",
                          offset=offset) from None


def names_message(ctx: TraceContext, names: set[str]) -> bool:
    """Does the context name one of ``names``: as its msgId (UNIQ_KEY), its offsetMsgId or one of its keys?"""
    b = ctx.bean
    return (b.msg_id in names or (b.offset_msg_id or "") in names
            or bool(b.keys and names.intersection(java_split(b.keys, " "))))


def context_row(ctx: TraceContext, offset: int, msg: Message) -> dict:
    """One row per context and bean; client_host is the trace message's born host (TraceView) unless the
    line carries one."""
    b = ctx.bean
    return {"trace_type": ctx.trace_type, "time_stamp": ctx.time_stamp, "group": ctx.group_name, "topic": b.topic,
            "msg_id": b.msg_id, "offset_msg_id": b.offset_msg_id, "tags": b.tags, "keys": b.keys,
            "region_id": ctx.region_id, "cost_time": ctx.cost_time, "success": ctx.success, "status": ctx.status,
            "context_code": ctx.context_code, "retry_times": b.retry_times, "store_host": b.store_host,
            "client_host": b.client_host or msg.born_host.ip, "body_length": b.body_length,
            "msg_type": ctx.msg_type_name, "request_id": ctx.request_id, "transaction_id": b.transaction_id,
            "transaction_state": b.transaction_state, "from_transaction_check": b.from_transaction_check,
            "trace_physical_offset": offset, "trace_uniq_key": msg.uniq_key}


# context_row's fields as Arrow columns (the rocketmq data source's kind trace, export --kind trace): ints as
# TraceContext / TraceBean declare them (timeStamp long, the others int)
TRACE_FIELDS = (("trace_type", "string"), ("time_stamp", "timestamp"), ("group", "string"), ("topic", "string"),
                ("msg_id", "string"), ("offset_msg_id", "string"), ("tags", "string"), ("keys", "string"),
                ("region_id", "string"), ("cost_time", "int32"), ("success", "bool"), ("status", "string"),
                ("context_code", "int32"), ("retry_times", "int32"), ("store_host", "string"),
                ("client_host", "string"), ("body_length", "int32"), ("msg_type", "string"),
                ("request_id", "string"), ("transaction_id", "string"), ("transaction_state", "string"),
                ("from_transaction_check", "bool"), ("trace_physical_offset", "int64"),
                ("trace_uniq_key", "string"))


def trace_schema():
    """The Arrow schema of context rows; time_stamp (ms since the epoch) as a UTC timestamp."""
    import pyarrow as pa

    types = {"string": pa.string(), "timestamp": pa.timestamp("ms", "UTC"), "int32": pa.int32(),
             "int64": pa.int64(), "bool": pa.bool_()}
    return pa.schema([(name, types[t]) for name, t in TRACE_FIELDS])


def store_trace_topics(paths: Iterable[str], override: str | None = None) -> dict[str, str]:
    """The trace topic of each store (as ``trace_topic``; paths as ``scan.list_files`` names them), for
    readers of commit-log files that hold no Store."""
    from rmqtool.ops.scan import broker_properties

    return {p: properties_trace_topic(None if override else broker_properties(p), override)[0]
            for p in dict.fromkeys(paths)}


def file_trace_records(f, topic: str, *, on_damage=None,
                       progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, Message]]:
    """The records of the trace topic in one commit-log file (a ``scan.StoreFile``): its columnar batches
    filtered on the topic column, then each of those records read; ``progress``: as ``record_batches``."""
    from rmqtool.ops.filters import RecordFilter, keep_records
    from rmqtool.ops.scan import cut_commitlog, local_path, record_batches

    where = RecordFilter(topics=(topic,))
    with contextlib.ExitStack() as opened:
        cl = None                       # the file opened for reading records once it holds one of the topic
        for batch in record_batches(f, on_damage=on_damage, progress=progress):
            offsets = keep_records(batch, where, False).column("physical_offset").to_pylist()
            if offsets and cl is None:
                cl = cut_commitlog(opened.enter_context(local_path(f)), f.size)
            for offset in offsets:
                msg = _read_message(cl, offset)
                if msg is not None:
                    yield offset, msg


def file_trace_rows(f, topic: str, *, on_damage=None, on_undecodable: Callable[[FormatError], None] | None = None,
                    progress: Callable[[int], None] | None = None) -> Iterator[list[dict]]:
    """``context_row``s of each trace record of one commit-log file. A body that does not decode raises its
    FormatError, or is told to ``on_undecodable`` and skipped."""
    for offset, msg in file_trace_records(f, topic, on_damage=on_damage, progress=progress):
        try:
            contexts = record_contexts(offset, msg)
        except FormatError as exc:
            if on_undecodable is None:
                raise exc.at(path=f.shown) from None
            on_undecodable(exc.at(path=f.shown))
            continue
        yield [context_row(ctx, offset, msg) for ctx in contexts]


@dataclass
class ContextFilter:
    """The bulk filters of ``trace``: business topic, group, context time."""

    topic: str | None = None
    group: str | None = None
    since: int | None = None
    until: int | None = None
    topic_of: Callable[[str], bool] | None = None     # SubBefore/SubAfter: is this msgId a record of ``topic``?

    def __call__(self, ctx: TraceContext) -> bool:
        if self.group is not None and ctx.group_name != self.group:
            return False
        if self.since is not None or self.until is not None:
            t = ctx.time_stamp
            if t is None or (self.since is not None and t < self.since) or (self.until is not None and t > self.until):
                return False
        if self.topic is not None:
            if ctx.bean.topic is not None:
                return ctx.bean.topic == self.topic
            return self.topic_of is not None and self.topic_of(ctx.bean.msg_id)
        return True


def topic_resolver(store: Store, topic: str, published: dict[str, str]) -> Callable[[str], bool]:
    """Whether a msgId (UNIQ_KEY) is a message of ``topic``: from the Pub contexts seen (``published``:
    msgId -> topic), else from the index of ``topic`` (a SubBefore/SubAfter line has no topic)."""
    cache: dict[str, bool] = {}

    def resolve(msg_id: str) -> bool:
        if msg_id in published:
            return published[msg_id] == topic
        if msg_id not in cache:
            try:
                hit = lookup_key(store, topic, msg_id, lmq_scan=False)
                cache[msg_id] = any(m.uniq_key == msg_id for _, m in hit.records)
            except RmqError:
                cache[msg_id] = False
        return cache[msg_id]
    return resolve
