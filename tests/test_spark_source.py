"""The rocketmq data source as a PySpark user meets it: found by name in a plain SparkSession, BLANK
padding left out, filters pushed down (fewer files read, the same rows), the batch-queue kind.

The reader tests run the data source's planner and reader without a JVM; the tests marked spark run a
plain `SparkSession` in a child process (no rmqtool call in it), so no session of this process's other
Spark tests is involved.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pathlib import Path

from conftest import FIXTURES, ROOT, readback, run, store_path

pytest.importorskip("pyspark.sql.datasource")
from pyspark.sql.datasource import DataSourceReader, EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, Not  # noqa: E402

from rmqtool.ops import scan  # noqa: E402
from rmqtool.spark.datasource import PushdownReader, RocketMQDataSource, _topic_offsets  # noqa: E402


def rows(reader) -> list[dict]:
    return [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]


def info_messages(store) -> int:
    return json.loads(run("info", str(store), "-f", "json").output)["messages"]


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x", "dev-dledger-5x"])
def test_blank_padding_left_out_unless_kept(name):
    path = str(store_path(name))
    got = rows(RocketMQDataSource({"path": path}).reader(None))
    assert len(got) == info_messages(path) and {r["type"] for r in got} == {"message"}
    kept = rows(RocketMQDataSource({"path": path, "includeBlank": "true"}).reader(None))
    assert len(kept) > len(got) and {r["type"] for r in kept} == {"message", "blank"}


def _at(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def test_pushed_filters_read_fewer_files_and_keep_the_rows(generated):
    files = scan.list_files([generated])
    firsts = [scan.first_store_timestamp(f) for f in files]
    assert len(files) == 6 and firsts == sorted(firsts)
    everything = rows(RocketMQDataSource({"path": generated}).reader(None))
    cut = firsts[3] + 1                                   # inside the fourth file
    filters = [EqualTo(("topic",), "Topic-01"), GreaterThan(("store_timestamp",), _at(cut)),
               In(("queue_id",), (0, 2)), Not(EqualTo(("flag",), 1)), LessThan(("physical_offset",), 5 * 65536)]
    reader = PushdownReader([generated], "commitlog", False, False, False)
    left = list(reader.pushFilters(filters))
    assert left == [filters[3]]                           # Not(...) and other columns stay with Spark
    parts = reader.partitions()
    assert [p.value.name for p in parts] == [f.name for f in files[3:5]]    # 4 of 6 files never opened
    want = [r for r in everything if r["topic"] == "Topic-01" and r["queue_id"] in (0, 2)
            and r["store_timestamp"] > _at(cut) and r["physical_offset"] < 5 * 65536]
    assert rows(reader) == want and want


def with_late_topic(generated, where) -> str:
    """A copy of the generated store (6 files, five topics in every file) and three messages of a topic
    ``Late`` appended to its last file by rmqtool's writer (with their consume-queue units)."""
    import shutil

    store = where / "late" / "store"
    shutil.copytree(generated, store)
    for i in range(3):
        assert run("put", store, "--topic", "Late", "--body", f"late-{i}", "--backup", where / f"bk{i}",
                   "--apply").exit_code == 0
    return str(store)


def _pushed(path: str, *filters) -> PushdownReader:
    reader = PushdownReader([path], "commitlog", False, False, False)
    assert list(reader.pushFilters(list(filters))) == []
    return reader


def test_a_topic_filter_reads_only_the_files_its_queues_point_into(generated, tmp_path):
    store = with_late_topic(generated, tmp_path)
    files = scan.list_files([store])
    everything = rows(RocketMQDataSource({"path": store}).reader(None))
    late = [r for r in everything if r["topic"] == "Late"]
    assert len(files) == 6 and len(late) == 3
    reader = _pushed(store, EqualTo(("topic",), "Late"))
    assert [p.value.name for p in reader.partitions()] == [files[5].name]     # 5 of 6 files never opened
    assert rows(reader) == late
    option = RocketMQDataSource({"path": store, "topics": " Late"}).reader(None)     # no pushdown needed
    assert type(option).pushFilters is DataSourceReader.pushFilters
    assert [p.value.name for p in option.partitions()] == [files[5].name] and rows(option) == late
    both = _pushed(store, In(("topic",), ("Late", "Topic-01")))
    assert len(both.partitions()) == 6
    assert rows(both) == [r for r in everything if r["topic"] in ("Late", "Topic-01")]
    assert len(_pushed(store, EqualTo(("topic",), "Late"), LessThan(("physical_offset",), files[5].start))
               .partitions()) == 1                                                 # the empty partition
    # records past the furthest unit of any queue may not be dispatched yet: their files stay
    cq = Path(store) / "consumequeue" / "Late" / "0" / "00000000000000000000"
    cq.write_bytes(bytes(cq.stat().st_size))
    assert [p.value.name for p in _pushed(store, EqualTo(("topic",), "Late")).partitions()] == [files[5].name]
    assert rows(_pushed(store, EqualTo(("topic",), "Late"))) == late


@pytest.mark.parametrize("change", ["abort", "no queues", "missing queue file"])
def test_topic_pruning_reads_every_file_when_the_queues_cannot_tell(generated, tmp_path, change):
    import shutil

    store = with_late_topic(generated, tmp_path)
    if change == "abort":                               # a crashed store (or a running broker)
        (Path(store) / "abort").write_bytes(b"")
    elif change == "no queues":                         # e.g. 5.x RocksDB queues
        shutil.rmtree(Path(store) / "consumequeue" / "Late")
    else:                                               # a gap in one of Topic-01's queues (file 1000 gone)
        queue = Path(store) / "consumequeue" / "Topic-01" / "0"
        (queue / "00000000000000001000").rename(queue / "00000000000000002000")
    everything = rows(RocketMQDataSource({"path": store}).reader(None))
    unknown = {"abort": {"Late", "Topic-01"}, "no queues": {"Late"}, "missing queue file": {"Topic-01"}}[change]
    assert {topic for topic in ("Late", "Topic-01") if _topic_offsets(store, {topic}) is None} == unknown
    for topic in ("Late", "Topic-01"):
        reader = _pushed(store, EqualTo(("topic",), topic))
        assert len(reader.partitions()) == (1 if topic == "Late" and change == "missing queue file" else 6)
        assert rows(reader) == [r for r in everything if r["topic"] == topic]


def test_topic_pruning_never_drops_a_matching_row():
    """Every topic of every fixture store (clean, crashed, torn, damaged, DLedger, LMQ, batch, timer,
    compaction, RocksDB queues)."""
    for store in sorted(FIXTURES.glob("dev-*/store")):
        path = str(store)
        everything = rows(RocketMQDataSource({"path": path, "mode": "permissive"}).reader(None))
        for topic in sorted({r["topic"] for r in everything}):
            reader = PushdownReader([path], "commitlog", False, False, True)
            list(reader.pushFilters([EqualTo(("topic",), topic)]))
            assert rows(reader) == [r for r in everything if r["topic"] == topic], (store, topic)


def test_time_options_prune_without_pushdown(generated):
    files = scan.list_files([generated])
    first = scan.first_store_timestamp(files[2])
    reader = RocketMQDataSource({"path": generated, "since": str(first), "until": _at(first + 5).isoformat()}) \
        .reader(None)
    assert type(reader).pushFilters is DataSourceReader.pushFilters   # safe in a session without pushdown
    assert len(reader.partitions()) <= 2
    everything = rows(RocketMQDataSource({"path": generated}).reader(None))
    assert rows(reader) == [r for r in everything if _at(first) <= r["store_timestamp"] <= _at(first + 5)]
    with pytest.raises(ValueError, match="option since takes milliseconds"):
        RocketMQDataSource({"path": generated, "since": "yesterday"}).reader(None)


def test_time_pruning_never_drops_a_matching_row():
    """Every record of the torn and crash sets, cut at each record's own store time."""
    for name in ("dev-sample", "dev-sample-5x-crash"):
        path = str(store_path(name))
        everything = rows(RocketMQDataSource({"path": path, "mode": "permissive"}).reader(None))
        for ms in sorted({int(r["store_timestamp"].timestamp() * 1000) for r in everything})[::7]:
            reader = PushdownReader([path], "commitlog", False, False, True)
            list(reader.pushFilters([GreaterThanOrEqual(("store_timestamp",), _at(ms)),
                                     LessThan(("store_timestamp",), _at(ms + 3))]))
            assert rows(reader) == [r for r in everything if _at(ms) <= r["store_timestamp"] < _at(ms + 3)]


def test_batch_consume_queue_kind_matches_readback():
    path = str(store_path("dev-batchcq-5x"))
    got = rows(RocketMQDataSource({"path": path, "kind": "batchconsumequeue"}).reader(None))
    want = [(q["topic"], q["queueId"], u["msgBaseOffset"], u["physOffset"], u["size"], u["tagsCode"],
             u["storeTime"], u["batchSize"]) for q in readback("dev-batchcq-5x")["batchConsumeQueues"]
            for u in q["units"]]
    assert sorted((r["topic"], r["queue_id"], r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"],
                   int(r["store_timestamp"].timestamp() * 1000), r["batch_size"]) for r in got) == sorted(want)
    # kind=consumequeue leaves no queue out: the 20-byte units and the batch units
    every = rows(RocketMQDataSource({"path": path, "kind": "consumequeue"}).reader(None))
    plain = sum(len(q["units[queueOffset,commitLogOffset,size,tagsCode]"])
                for q in readback("dev-batchcq-5x")["consumeQueues"])
    assert len(every) == plain + len(want)
    assert sum(r["batch_size"] is not None for r in every) == len(want)


def broker_message_counts(name: str) -> dict[str, int]:
    """Messages per topic as the broker counts them: a batch topic's queues advance by each inner batch's
    INNER_NUM (readback maxOffsetInQueue), any other topic by one per record."""
    rb = readback(name)
    counts: dict[str, int] = {}
    for r in rb["commitlogRecords"]:
        if r["type"] == "MESSAGE":
            counts[r["topic"]] = counts.get(r["topic"], 0) + 1
    batch = {}
    for q in rb["batchConsumeQueues"]:
        batch[q["topic"]] = batch.get(q["topic"], 0) + q["maxOffsetInQueue"]
    return {**counts, **batch}


def test_commitlog_rows_carry_the_message_count():
    """Each commit-log row's messages: an inner batch's INNER_NUM, 1 for any other message, 0 for a BLANK
    (facts.message_counts, grep's column), summing per topic to the broker's batch-queue maxima."""
    path = str(store_path("dev-batchcq-5x"))
    got = rows(RocketMQDataSource({"path": path, "includeBlank": "true"}).reader(None))
    summed: dict[str, int] = {}
    for r in got:
        if r["type"] == "message":
            summed[r["topic"]] = summed.get(r["topic"], 0) + r["messages"]
    want = broker_message_counts("dev-batchcq-5x")
    assert summed == want and sum(want.values()) > len([r for r in got if r["type"] == "message"])
    assert {r["messages"] for r in got if r["type"] == "blank"} == {0}
    grepped = [json.loads(line) for line in run("grep", path, "-f", "jsonl").stdout.splitlines()]
    assert [(r["physical_offset"], r["messages"]) for r in got if r["type"] == "message"] == \
        [(r["physical_offset"], r["messages"]) for r in grepped]


MESSAGES_SESSION = r"""
import json, sys
from pyspark.sql import SparkSession, functions as F
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate())
df = spark.read.format("rocketmq").load(sys.argv[1])
out = {"type": dict(df.dtypes)["messages"],
       "by_topic": {r.topic: r.n for r in df.groupBy("topic").agg(F.sum("messages").alias("n")).collect()}}
print("RESULT " + json.dumps(out))
spark.stop()
"""


@pytest.mark.spark
def test_spark_sums_messages_as_the_broker_counts(tmp_path):
    """In a plain SparkSession, the messages column (int) of dev-batchcq-5x sums per topic to what the
    broker counts."""
    script = tmp_path / "messages.py"
    script.write_text(MESSAGES_SESSION)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT), "TZ": "UTC"}
    done = subprocess.run([sys.executable, str(script), str(store_path("dev-batchcq-5x"))], capture_output=True,
                          text=True, env=env, timeout=600, cwd=tmp_path)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and result, done.stderr[-3000:]
    out = json.loads(result[0][len("RESULT "):])
    assert out == {"type": "int", "by_topic": broker_message_counts("dev-batchcq-5x")}


def export_shapes(tmp_path) -> dict[str, str]:
    from rmqtool.ops import dataset
    from rmqtool.ops.export import export

    stores = [str(store_path("dev-sample")), str(store_path("dev-sample-5x"))]
    export(stores, tmp_path / "one.parquet")
    dataset.export_dataset(stores, tmp_path / "flat")
    dataset.export_dataset(stores, tmp_path / "hive", partition_by=("topic", "date"))
    return {"one": str(tmp_path / "one.parquet"), "flat": str(tmp_path / "flat"), "hive": str(tmp_path / "hive")}


# -- a plain SparkSession ----------------------------------------------------------------------------
PLAIN_SESSION = r"""
import datetime as dt, json, sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.session.timeZone", "UTC").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
path, cut, late = sys.argv[1], int(sys.argv[2]), sys.argv[3]
df = spark.read.format("rocketmq").load(path)
out = {"count": df.count(), "partitions": df.rdd.getNumPartitions()}
where = f"topic = 'Topic-01' AND store_timestamp > timestamp_millis({cut})"
plain = df.where(where)
out["unpushed"] = [plain.rdd.getNumPartitions(), sorted(r.physical_offset for r in plain.collect())]
spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
base = spark.read.format("rocketmq").load(path)            # pushdown on in Spark, not asked of the source
out["default"] = [base.where(where).count(), base.count()]
base = spark.read.format("rocketmq").option("pushFilters", "true").load(path)
pushed = base.where(where)
out["pushed"] = [pushed.rdd.getNumPartitions(), sorted(r.physical_offset for r in pushed.collect())]
out["after"] = sorted(r.physical_offset for r in df.collect() if r.topic == "Topic-01"
                      and r.store_timestamp.replace(tzinfo=dt.timezone.utc) > dt.datetime.fromtimestamp(cut / 1000, dt.timezone.utc))
# topic pruning: pushed down, and as the load option; the default on the leak path (filtered, then the whole)
whole = spark.read.format("rocketmq").load(late)
out["late"] = [whole.where("topic = 'Late'").count(), whole.count(),
               sorted(r.physical_offset for r in whole.collect() if r.topic == "Late")]
for name, reader in (("late_pushed", spark.read.format("rocketmq").option("pushFilters", "true")),
                     ("late_option", spark.read.format("rocketmq").option("topics", "Late"))):
    q = reader.load(late).where("topic = 'Late'")
    out[name] = [q.rdd.getNumPartitions(), sorted(r.physical_offset for r in q.collect())]
leaky = spark.read.format("rocketmq").option("pushFilters", "true").load(late)   # the README's why
out["leak"] = [leaky.where("topic = 'Late'").count(), leaky.count()]
for shape in sys.argv[4:]:        # the export shapes of tests/test_export_schema.py, read back by Spark
    back = spark.read.parquet(shape)
    out[shape] = [{f.name: f.dataType.simpleString() for f in back.schema.fields},
                  sorted([r.store, r.physical_offset, r.topic, int(r.store_timestamp.replace(tzinfo=dt.timezone.utc)
                          .timestamp() * 1000)] for r in back.select("store", "physical_offset", "topic",
                                                                     "store_timestamp").collect())]
print("RESULT " + json.dumps(out))
spark.stop()
"""


@pytest.mark.spark
def test_plain_session_finds_the_source_and_pushes_filters_down(generated, tmp_path):
    """A plain session (no rmqtool call) finds format("rocketmq"); pushed-down topic / time filters and the
    load options read fewer files (partitions counted) and return the rows of the unfiltered read filtered
    afterwards; with the defaults, a DataFrame read after a filtered query of it still reads every row."""
    files = scan.list_files([generated])
    cut = scan.first_store_timestamp(files[4]) + 1
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SESSION)
    # the user's environment: this interpreter (with rmqtool and pyspark installed) is Spark's Python
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT), "TZ": "UTC"}
    shapes = export_shapes(tmp_path)
    late = with_late_topic(generated, tmp_path)
    done = subprocess.run([sys.executable, str(script), generated, str(cut), late, *shapes.values()], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and result, done.stderr[-3000:]
    out = json.loads(result[0][len("RESULT "):])
    assert out["count"] == info_messages(generated) and out["partitions"] == len(files)
    assert out["unpushed"] == [len(files), out["after"]]          # pushdown off (Spark's default): all files
    assert out["pushed"] == [2, out["after"]] and out["after"]    # on: the last 2 of 6 files, the same rows
    # off by default: PySpark (<= 4.3) would hand the filtered read to the DataFrame it came from
    assert out["default"] == [len(out["after"]), out["count"]]
    # a topic: 1 of 6 files read, the rows of the whole read filtered afterwards; the default does not leak
    assert out["late"][:2] == [3, info_messages(late)] and len(out["late"][2]) == 3
    assert out["late_pushed"] == out["late_option"] == [1, out["late"][2]]
    # why pushFilters stays off by default (README): PySpark <= 4.3 hands the pushed read to the whole
    # DataFrame; when this fails, the installed PySpark keeps it per scan and pushdown can be the default
    assert out["leak"] == [3, 3], "PySpark no longer leaks the pushed-down read: pushFilters can default to on"
    # Spark reads every export shape with one schema (timestamp, not timestamp_ntz) and the same rows
    one = pq.read_table(shapes["one"])
    millis = one.column("store_timestamp").cast(pa.int64()).to_pylist()
    want = sorted([r["store"], r["physical_offset"], r["topic"], ms]
                  for r, ms in zip(one.select(["store", "physical_offset", "topic"]).to_pylist(), millis))
    for name, path in shapes.items():
        types, got = out[path]
        assert types["store_timestamp"] == types["born_timestamp"] == "timestamp", name
        assert types["store"] == types["commitlog_file"] == "string", name
        assert got == want, name
