"""Arrow batches of each data-source kind, in types Spark accepts, and their Spark schemas.

Spark takes no Arrow view or dictionary types and wants microsecond UTC timestamps, so batches are
cast to ``spark_type`` of each field before they leave a task.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

from rmqtool import constants as C
from rmqtool.errors import FormatError
from rmqtool.format.batchcq import UNIT_FIELDS, valid_units
from rmqtool.format.indexfile import decode_header, infer_geometry
from rmqtool.ops import scan

CQ_DTYPE = np.dtype([("physical_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
BCQ_DTYPE = np.dtype(UNIT_FIELDS)
assert BCQ_DTYPE.itemsize == C.BCQ_STORE_UNIT_SIZE
INDEX_DTYPE = np.dtype([("key_hash", ">i4"), ("physical_offset", ">i8"), ("time_diff", ">i4"),
                        ("prev_index", ">i4")])

# Consume-queue units of every layout: a batch unit (batchconsumequeue/, and a compaction topic's sparse
# queue, kind compactioncq, whose physical_offset is the compaction-log offset) adds its store time and batch
# size and its queue_offset is its msgBaseOffset; a RocksDB unit adds its store time; a 20-byte unit has
# neither (null).
CQ_SCHEMA = pa.schema([("topic", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()),
                       ("physical_offset", pa.int64()), ("size", pa.int32()), ("tags_code", pa.int64()),
                       ("store_timestamp", pa.timestamp("us", "UTC")), ("batch_size", pa.int32()),
                       ("store", pa.string()), ("cq_file", pa.string())])
INDEX_SCHEMA = pa.schema([("entry", pa.int32()), ("key_hash", pa.int32()), ("physical_offset", pa.int64()),
                          ("time_diff", pa.int32()), ("prev_index", pa.int32()),
                          ("begin_timestamp", pa.timestamp("us", "UTC")), ("store", pa.string()),
                          ("index_file", pa.string())])


def spark_type(t: pa.DataType) -> pa.DataType:
    """The nearest Arrow type Spark accepts: no views, no dictionaries, timestamps in UTC microseconds."""
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type)
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", "UTC")
    if t == pa.string_view():
        return pa.string()
    if t == pa.binary_view():
        return pa.binary()
    if pa.types.is_map(t):
        return pa.map_(spark_type(t.key_type), spark_type(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(spark_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(spark_type(f.type)) for f in t])
    return t


def record_schema(check_crc: bool) -> pa.Schema:
    """The record schema plus ``messages``, the messages the broker counts in each record (an inner batch's
    INNER_NUM, facts.message_counts: as grep, stats and export count them), and the record's location."""
    from rmqtool.columnar import record_schema as base_schema

    base = base_schema(check_crc)
    fields = [f.with_type(spark_type(f.type)) for f in base]
    return pa.schema(fields + [pa.field("messages", pa.int32()), pa.field("store", pa.string()),
                               pa.field("commitlog_file", pa.string())])


def trace_schema() -> pa.Schema:
    """Kind trace: ``rmqtool trace``'s row fields (ops.trace.context_row), in Spark's types."""
    from rmqtool.ops.trace import trace_schema as rows_schema

    return pa.schema([f.with_type(spark_type(f.type)) for f in rows_schema()])


def arrow_schema(kind: str, check_crc: bool = False) -> pa.Schema:
    if kind == "trace":
        return trace_schema()
    if kind in ("consumequeue", "batchconsumequeue", "compactioncq"):
        return CQ_SCHEMA
    if kind == "index":
        return INDEX_SCHEMA
    return record_schema(check_crc)


def spark_schema(kind: str, check_crc: bool = False):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema(kind, check_crc))


def _with_location(batch: pa.RecordBatch, f: scan.StoreFile, schema: pa.Schema) -> pa.RecordBatch:
    n = batch.num_rows
    cols = [batch.column(i).cast(schema.field(i).type) if batch.schema.field(i).type != schema.field(i).type
            else batch.column(i) for i in range(batch.num_columns)]
    cols += [pa.repeat(f.store, n), pa.repeat(f.uri, n)]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def file_batches(f: scan.StoreFile, kind: str, *, check_crc: bool = False, decompress: bool = False,
                 on_damage=None, trace_topic: str | None = None) -> Iterator[pa.RecordBatch]:
    """Batches of one store file in the data source's schema of ``kind``. Kind trace reads the records of
    ``trace_topic`` [default: RMQ_SYS_TRACE_TOPIC] and leaves out those ``on_damage`` is told of."""
    if kind == "trace":
        from rmqtool.ops.trace import DEFAULT_TRACE_TOPIC

        yield from trace_batches(f, trace_topic or DEFAULT_TRACE_TOPIC, on_damage=on_damage,
                                 on_undecodable=on_damage)
        return
    schema = arrow_schema(kind, check_crc)
    if f.kind == "rocksdbcq":
        yield from (_with_location(b, f, schema) for b in rocksdb_batches(f))
        return
    if f.kind in ("batchconsumequeue", "compactioncq"):
        batch = bcq_batch(f)
    elif f.kind == "consumequeue":
        batch = cq_batch(f)
    elif kind == "index":
        batch = index_batch(f)
    else:
        from rmqtool.ops.facts import message_counts

        for batch in scan.record_batches(f, check_crc=check_crc, decompress=decompress, on_damage=on_damage):
            if batch.num_rows:
                yield _with_location(batch.append_column("messages", message_counts(batch)), f, schema)
        return
    if batch.num_rows:
        yield _with_location(batch, f, schema)


def trace_batches(f: scan.StoreFile, topic: str, *, on_damage=None, on_undecodable=None) -> Iterator[pa.RecordBatch]:
    """Kind trace: one batch per record of the trace ``topic`` in a commit-log file, a row per context and
    bean (``ops.trace.file_trace_rows``)."""
    from rmqtool.ops.trace import file_trace_rows
    from rmqtool.ops.trace import trace_schema as rows_schema

    schema, spark = rows_schema(), trace_schema()
    for rows in file_trace_rows(f, topic, on_damage=on_damage, on_undecodable=on_undecodable):
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=schema).cast(spark)


def rocksdb_batches(f: scan.StoreFile) -> Iterator[pa.RecordBatch]:
    """Every unit of a RocksDB consume queue (the database read-only, store/rocksdbcq.py), one batch per queue
    in (topic, queue id) order, in the columns of a file queue plus each unit's store timestamp."""
    from rmqtool.store.rocksdbcq import RocksDbConsumeQueues

    with scan.local_dir(f) as path:
        db = RocksDbConsumeQueues(path)
        try:
            for (topic, queue_id), units in sorted(db.units.items()):
                n = len(units)
                qo, phy, size, tags, ts = np.array([u[2:] for u in units], np.int64).reshape(n, 5).T
                yield pa.RecordBatch.from_arrays(
                    [pa.repeat(topic, n), pa.repeat(pa.scalar(queue_id, pa.int32()), n), pa.array(qo),
                     pa.array(phy), pa.array(size.astype(np.int32)), pa.array(tags),
                     pa.array(ts * 1000, CQ_SCHEMA.field("store_timestamp").type), pa.nulls(n, pa.int32())],
                    names=CQ_SCHEMA.names[:8])
        finally:
            db.close()


def cq_batch(f: scan.StoreFile) -> pa.RecordBatch:
    """The units of one consume-queue file up to the first one failing recovery's test."""
    buf = scan.read_bytes(f)
    units = np.frombuffer(buf, CQ_DTYPE, count=len(buf) // CQ_DTYPE.itemsize)
    bad = np.flatnonzero((units["physical_offset"] < 0) | (units["size"] <= 0))
    units = units[:bad[0]] if len(bad) else units
    n = len(units)
    first = f.start // C.CQ_STORE_UNIT_SIZE
    return pa.RecordBatch.from_arrays(
        [pa.repeat(f.topic, n), pa.repeat(pa.scalar(f.queue_id, pa.int32()), n),
         pa.array(np.arange(first, first + n, dtype=np.int64)),
         pa.array(units["physical_offset"].astype(np.int64)), pa.array(units["size"].astype(np.int32)),
         pa.array(units["tags_code"].astype(np.int64)),
         pa.nulls(n, CQ_SCHEMA.field("store_timestamp").type), pa.nulls(n, pa.int32())],
        names=CQ_SCHEMA.names[:8])


def bcq_batch(f: scan.StoreFile) -> pa.RecordBatch:
    """The units of one batch consume-queue file up to the first one failing recovery's test
    (BatchConsumeQueue.recover, as ``BatchCqUnit.is_valid``)."""
    units = valid_units(scan.read_bytes(f))
    n = len(units)
    return pa.RecordBatch.from_arrays(
        [pa.repeat(f.topic, n), pa.repeat(pa.scalar(f.queue_id, pa.int32()), n),
         pa.array(units["msg_base_offset"].astype(np.int64)), pa.array(units["physical_offset"].astype(np.int64)),
         pa.array(units["size"].astype(np.int32)), pa.array(units["tags_code"].astype(np.int64)),
         pa.array(units["store_time"].astype(np.int64) * 1000, CQ_SCHEMA.field("store_timestamp").type),
         pa.array(units["batch_size"].astype(np.int32))],
        names=CQ_SCHEMA.names[:8])


def index_batch(f: scan.StoreFile) -> pa.RecordBatch:
    """The written entries (1 .. indexCount-1) of one index file."""
    buf = scan.read_bytes(f)
    count = 0
    try:
        header = decode_header(buf)
        geometry = infer_geometry(buf) if header.index_count > 1 else None
    except FormatError as exc:
        raise exc.at(path=f.shown) from None
    if geometry is not None:
        count = min(header.index_count, geometry.index_num) - 1
        start = geometry.entry_pos(1)
        entries = np.frombuffer(buf, INDEX_DTYPE, count=count, offset=start)
    else:
        entries = np.zeros(0, INDEX_DTYPE)
    begin = pa.scalar(header.begin_timestamp * 1000, pa.timestamp("us", "UTC"))
    return pa.RecordBatch.from_arrays(
        [pa.array(np.arange(1, count + 1, dtype=np.int32)), pa.array(entries["key_hash"].astype(np.int32)),
         pa.array(entries["physical_offset"].astype(np.int64)), pa.array(entries["time_diff"].astype(np.int32)),
         pa.array(entries["prev_index"].astype(np.int32)), pa.repeat(begin, count)],
        names=INDEX_SCHEMA.names[:6])
