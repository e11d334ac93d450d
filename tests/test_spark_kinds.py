"""The rocketmq data source's queue kinds of the two 5.x store kinds, against what RocketMQ 5.3.3's own
classes read back: a RocksDB consume queue read through kind ``consumequeue`` (the file queues' schema),
a compaction topic as its consumers see it (kind ``compactionlog``) and its sparse queue (``compactioncq``).

The reader tests run the data source's planner and reader without a JVM; the test marked spark reads the
kinds in a plain SparkSession in a child process, and checks the RocksDB store is byte-identical after.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, readback, store_path

pytest.importorskip("pyspark.sql.datasource")
from rmqtool.format.rocksdbcq import decode_unit  # noqa: E402
from rmqtool.spark.datasource import RocketMQDataSource  # noqa: E402
from rmqtool.spark.schema import CQ_SCHEMA, arrow_schema  # noqa: E402

ROCKS, COMPACT = "dev-rocksdbcq-5x", "dev-compaction-5x"


def rows(path, kind: str) -> list[dict]:
    reader = RocketMQDataSource({"path": str(path), "kind": kind}).reader(None)
    return [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]


def _field(d: dict, prefix: str):
    return next(v for k, v in d.items() if k.startswith(prefix))


def tree(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def rocksdb_want() -> list[tuple]:
    """Every unit the broker reads back (RocksDBConsumeQueue.get), with the store time its value holds."""
    rb = readback(ROCKS)["rocksdbConsumeQueue"]
    times = {(u.topic, u.queue_id, u.queue_offset): u.store_time
             for u in (decode_unit(bytes.fromhex(k), bytes.fromhex(v)) for k, v in _field(rb, "kv[default]"))}
    return sorted((q["topic"], q["queueId"], qo, phy, size, tags, times[(q["topic"], q["queueId"], qo)])
                  for q in rb["queues"] for qo, phy, size, tags in _field(q, "units"))


def consumer_want() -> list[tuple]:
    return [(q["topic"], q["queueId"], *v) for q in readback(COMPACT)["compaction"]["compactionLogs"]
            for v in _field(q, "consumerView")]


def sparse_want() -> list[tuple]:
    return [(q["topic"], q["queueId"], u["msgBaseOffset(queueOffset)"], u["physOffset(compaction log)"], u["size"],
             u["tagsCode"], u["storeTime"], u["batchSize"])
            for q in readback(COMPACT)["compaction"]["compactionLogs"] for u in _field(q, "cqUnits") if u["kind"] == "unit"]


def _ms(ts) -> int:
    return int(ts.timestamp() * 1000)


def test_rocksdb_consume_queue_is_the_consumequeue_kind():
    store = store_path(ROCKS)
    before = tree(store)
    got = rows(store, "consumequeue")
    assert sorted((r["topic"], r["queue_id"], r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"],
                   _ms(r["store_timestamp"])) for r in got) == rocksdb_want()
    assert {r["cq_file"] for r in got} == {str(store / "consumequeue")} and {r["batch_size"] for r in got} == {None}
    assert "TopicTmp" not in {r["topic"] for r in got}         # the deleted topic's range-deleted units
    assert tree(store) == before


def test_compaction_log_kind_is_the_consumer_view():
    got = rows(store_path(COMPACT), "compactionlog")
    assert arrow_schema("compactionlog") == arrow_schema("commitlog")
    assert [(r["topic"], r["queue_id"], r["queue_offset"], r["physical_offset"], " ".join(r["keys"]), r["uniq_key"],
             hashlib.sha256(r["body"]).hexdigest()) for r in got] == consumer_want()


def test_compaction_cq_kind_is_the_sparse_queue():
    got = rows(store_path(COMPACT), "compactioncq")
    assert arrow_schema("compactioncq") == CQ_SCHEMA
    assert [(r["topic"], r["queue_id"], r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"],
             _ms(r["store_timestamp"]), r["batch_size"]) for r in got] == sparse_want()


@pytest.mark.parametrize("name, kind", [(ROCKS, "consumequeue"), (COMPACT, "compactionlog"), (COMPACT, "compactioncq")])
def test_a_uri_reads_the_same_rows(name, kind):
    """Through pyarrow's filesystems (a URI): the database copied to a local directory, the sparse queue
    found beside the compaction log by name."""
    local = store_path(name)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("store", "cq_file", "commitlog_file")} for r in rs]
    assert strip(rows(f"file://{local}", kind)) == strip(rows(local, kind))


SESSION = r"""
import json, sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.session.timeZone", "UTC").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
rocks, compact = sys.argv[1], sys.argv[2]
out = {}
cq = spark.read.format("rocketmq").option("kind", "consumequeue").load(rocks)
out["rocks"] = [[r.topic, r.queue_id, r.queue_offset, r.physical_offset, r.size, r.tags_code,
                 int(r.store_timestamp.timestamp() * 1000)] for r in cq.collect()]
out["rocks_schema"] = cq.schema.json()
view = spark.read.format("rocketmq").option("kind", "compactionlog").load(compact)
out["view"] = [[r.topic, r.queue_id, r.queue_offset, r.physical_offset, " ".join(r["keys"]), r.uniq_key]
               for r in view.orderBy("topic", "queue_id", "queue_offset").collect()]
out["view_partitions"] = view.rdd.getNumPartitions()
sparse = spark.read.format("rocketmq").option("kind", "compactioncq").load(compact)
out["sparse"] = sparse.count()
out["file_schema"] = spark.read.format("rocketmq").option("kind", "consumequeue").load(compact).schema.json()
print("RESULT " + json.dumps(out))
spark.stop()
"""


@pytest.mark.spark
def test_spark_session_reads_both_kinds_and_leaves_the_database_alone(tmp_path):
    rocks, compact = store_path(ROCKS), store_path(COMPACT)
    before = tree(rocks), sorted(os.listdir(rocks / "consumequeue"))
    script = tmp_path / "kinds.py"
    script.write_text(SESSION)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT), "TZ": "UTC"}
    done = subprocess.run([sys.executable, str(script), str(rocks), str(compact)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and result, done.stderr[-3000:]
    out = json.loads(result[0][len("RESULT "):])
    assert sorted(map(tuple, out["rocks"])) == rocksdb_want()
    assert out["rocks_schema"] == out["file_schema"]               # the file queues' schema
    assert [tuple(v) for v in out["view"]] == [w[:6] for w in consumer_want()]
    assert out["view_partitions"] == len(list((compact / "compaction" / "compactionLog").glob("*/*/*")))
    assert out["sparse"] == len(sparse_want())
    assert (tree(rocks), sorted(os.listdir(rocks / "consumequeue"))) == before


@pytest.mark.spark
def test_spark_engine_exports_a_compaction_topic_as_its_consumers_see_it(tmp_path):
    import pyarrow.dataset as ds

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT), "TZ": "UTC"}
    done = subprocess.run([sys.executable, "-m", "rmqtool", "export", str(store_path(COMPACT)), "--topic", "CompactTopic",
                           "--to", str(tmp_path / "view"), "--engine", "spark", "--master", "local[1]"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = sorted(ds.dataset(tmp_path / "view", format="parquet").to_table().to_pylist(),
                  key=lambda r: (r["queue_id"], r["queue_offset"]))
    assert [(r["topic"], r["queue_id"], r["queue_offset"], r["physical_offset"], " ".join(r["keys"]), r["uniq_key"],
             hashlib.sha256(r["body"]).hexdigest()) for r in rows] == consumer_want()
