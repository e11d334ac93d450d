"""The Spark engine on a real Spark: an embedded local[2] session and a standalone cluster on loopback
(a master and two 1-core workers started from the pyspark package's spark-class).

Every test runs on both. Parity: the `rocketmq` data source, export, stats, verify and grep give
exactly what the single-process engine gives, on every fixture store and a generated multi-file store;
the data source's consume-queue rows equal what RocketMQ itself read back.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from conftest import ALL_SETS, CLEAN_SETS, FIXTURES, ROOT, readback, run, store_path
from helpers_spark import StandaloneCluster
from rmqtool.errors import FormatError
from rmqtool.ops import dataset, grep, scan, stats
from rmqtool.ops.filters import RecordFilter
from rmqtool.ops.verify import verify_store
from rmqtool.store.store import Store

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.spark

ALL_STORES = [str(store_path(name)) for name in ALL_SETS]
LOCAL_ONLY = pytest.mark.parametrize("spark", ["local[2]"], indirect=True)   # the rest runs on both


@pytest.fixture(scope="module", params=["local[2]", "standalone"])
def spark(request, tmp_path_factory):
    from rmqtool.spark.session import get_session, stop_session

    stop_session()            # a session an earlier module left (get_session reuses a running one as it is)
    cluster = None
    saved = os.environ.get("SPARK_LOCAL_IP")
    if request.param == "standalone":
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        cluster = StandaloneCluster(tmp_path_factory.mktemp("cluster"))
    try:
        session = get_session(cluster.url if cluster else request.param, progress=False)
        assert session.sparkContext.master == (cluster.url if cluster else "local[2]")
        yield session
    finally:
        stop_session()
        if cluster:
            cluster.stop()
        if saved is None:
            os.environ.pop("SPARK_LOCAL_IP", None)
        else:
            os.environ["SPARK_LOCAL_IP"] = saved


def local_rows(paths, **options) -> pa.Table:
    """The messages the single-process engine decodes, with store and commitlog_file."""
    import pyarrow.compute as pc

    from rmqtool.spark.schema import file_batches

    batches = [b for f in scan.list_files(paths) for b in file_batches(f, "commitlog", **options)]
    table = pa.Table.from_batches(batches)
    return table.filter(pc.equal(table.column("type"), "message"))


def sort_rows(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["store"], r["commitlog_file"], r["physical_offset"]))


# -- the data source --------------------------------------------------------------------------------
def test_data_source_rows_equal_local_decoder(spark, generated):
    paths = [str(store_path("dev-sample-5x")), generated]
    df = spark.read.format("rocketmq").option("checkCrc", "true").option("decompress", "true").load(paths)
    assert df.rdd.getNumPartitions() == len(scan.list_files(paths))   # one partition per commit-log file
    got = sort_rows([r.asDict(recursive=True) for r in df.collect()])
    want = local_rows(paths, check_crc=True, decompress=True)
    want = want.set_column(want.schema.get_field_index("born_timestamp"), "born_timestamp",
                           want.column("born_timestamp").cast(pa.timestamp("us", "UTC")))
    want = want.set_column(want.schema.get_field_index("store_timestamp"), "store_timestamp",
                           want.column("store_timestamp").cast(pa.timestamp("us", "UTC")))
    want_rows = sort_rows(want.to_pylist())
    for row in got + want_rows:
        row["properties"] = dict(row["properties"]) if row["properties"] is not None else None
        for k in ("born_timestamp", "store_timestamp"):        # collect() gives naive local times, arrow UTC
            row[k] = None if row[k] is None else row[k].astimezone(dt.timezone.utc)
    assert len(got) == len(want_rows) > 500
    assert got == want_rows
    assert all(r["crc_ok"] for r in got if r["type"] == "message")


@LOCAL_ONLY
def test_data_source_store_column_and_glob(spark):
    df = spark.read.format("rocketmq").option("mode", "permissive").load(str(FIXTURES / "dev-sample*" / "store"))
    counts = {r["store"]: r["count"] for r in df.groupBy("store").count().collect()}
    assert set(counts) == {str(store_path(n)) for n in ALL_SETS}
    rb = readback("dev-sample")
    messages = [rec for rec in rb["commitlogRecords"] if rec["type"] != "BLANK"]      # BLANK padding left out
    assert counts[str(store_path("dev-sample"))] == len(messages)
    topics = {r["topic"]: r["count"] for r in
              df.where(df.store == str(store_path("dev-sample"))).groupBy("topic").count().collect()}
    want: dict = {}
    for rec in messages:
        key = rec.get("topic")
        want[key] = want.get(key, 0) + 1
    assert topics == want


@LOCAL_ONLY
@pytest.mark.parametrize("name", CLEAN_SETS)
def test_data_source_consume_queues_match_readback(spark, name):
    df = spark.read.format("rocketmq").option("kind", "consumequeue").load(str(store_path(name)))
    got = sorted((r["topic"], r["queue_id"], r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"])
                 for r in df.collect())
    want = sorted((cq["topic"], cq["queueId"], u[0], u[1], u[2], u[3])
                  for cq in readback(name)["consumeQueues"]
                  for u in cq["units[queueOffset,commitLogOffset,size,tagsCode]"])
    assert got == want


@LOCAL_ONLY
def test_data_source_index_entries_match_headers(spark):
    name = "dev-sample"
    df = spark.read.format("rocketmq").option("kind", "index").load(str(store_path(name)))
    per_file = {os.path.basename(r["index_file"]): r["count"] for r in df.groupBy("index_file").count().collect()}
    want = {f["file"]: f["indexCount"] - 1 for f in readback(name)["indexFiles"] if f["indexCount"] > 1}
    assert per_file == want


@LOCAL_ONLY
def test_data_source_errors(spark):
    with pytest.raises(Exception, match="option kind must be one of"):
        spark.read.format("rocketmq").option("kind", "bogus").load(str(store_path("dev-sample"))).count()
    torn = str(store_path("dev-sample-crash-torn"))
    with pytest.raises(Exception, match="offset 279071: stored total size 266 differs"):
        spark.read.format("rocketmq").load(torn).count()
    kept = spark.read.format("rocketmq").option("mode", "permissive").load(torn)
    assert kept.count() == sum(b.column("type").to_pylist().count("message") for f in scan.list_files([torn])
                               for b in scan.record_batches(f, on_damage=lambda e: None))


# -- export / stats / grep / verify -----------------------------------------------------------------
def read_dataset(path) -> list[dict]:
    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table()
    return sort_rows(table.to_pylist())


def test_export_parity(spark, generated, tmp_path):
    from rmqtool.spark.jobs import export_spark

    paths = ALL_STORES + [generated]      # the torn sets' damaged tails stop their files alike
    local = dataset.export_dataset(paths, tmp_path / "local", "parquet", ("topic", "date"), read_anyway=True)
    remote = export_spark(spark, paths, tmp_path / "spark", "parquet", ("topic", "date"), read_anyway=True)
    assert (remote.records, remote.messages, remote.input_bytes, remote.parts, remote.damaged) == \
        (local.records, local.messages, local.input_bytes, local.parts, local.damaged)
    assert len(local.damaged) == 2
    rows = read_dataset(tmp_path / "spark")
    assert rows == read_dataset(tmp_path / "local")
    assert len(rows) == local.records == local.messages          # BLANK padding left out
    assert len(pd.read_parquet(tmp_path / "spark")) == local.records
    # Spark reads the dataset back with the same rows.
    back = spark.read.parquet(str(tmp_path / "spark"))
    assert back.count() == local.records
    assert sorted(r["topic"] or "" for r in back.select("topic").distinct().collect()) == \
        sorted({r["topic"] or "" for r in rows})
    # jsonl parts hold the cat-commitlog rows
    export_spark(spark, paths[:1], tmp_path / "jsonl", "jsonl")
    dataset.export_dataset(paths[:1], tmp_path / "jsonl-local", "jsonl")
    for part in sorted(os.listdir(tmp_path / "jsonl-local")):
        assert (tmp_path / "jsonl" / part).read_bytes() == (tmp_path / "jsonl-local" / part).read_bytes()


@LOCAL_ONLY
def test_export_damage_fails_alike(spark, tmp_path):
    from rmqtool.spark.jobs import export_spark

    torn = [str(store_path("dev-sample-crash-torn"))]
    with pytest.raises(FormatError) as local:
        dataset.export_dataset(torn, tmp_path / "a")
    with pytest.raises(FormatError) as remote:
        export_spark(spark, torn, tmp_path / "b")
    assert str(remote.value) == str(local.value)
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.tmp-*"))
    kept = export_spark(spark, torn, tmp_path / "c", read_anyway=True)
    assert kept.damaged == dataset.export_dataset(torn, tmp_path / "d", read_anyway=True).damaged != []


@pytest.mark.parametrize("by", [None, "queue", "hour", "tag"])
def test_stats_parity(spark, generated, by):
    from rmqtool.spark.jobs import stats_spark

    files = scan.list_files(ALL_STORES + [generated])
    local_damage, spark_damage = [], []
    want = stats.stats_local(files, by, on_damage=lambda e: local_damage.append(str(e)))
    assert stats_spark(spark, files, by, on_damage=spark_damage.append) == want
    assert spark_damage == local_damage and len(local_damage) == 2    # the two torn sets


FILTERS = [
    RecordFilter(topics=("TopicA", "TopicB"), queue_ids=(0, 2)),
    RecordFilter(keys=("key-95", "key-40"), body_regex="rocket"),
    RecordFilter(tags=("TagA", "Tag2"), since=1795216389500, until=1795216389800),
]


@pytest.mark.parametrize("where", FILTERS)
@pytest.mark.parametrize("by", [None, "topic", "group"])
def test_filtered_stats_parity(spark, generated, where, by):
    from rmqtool.spark.jobs import stats_spark

    files = scan.list_files(ALL_STORES + [generated])
    want = stats.stats_local(files, by, on_damage=lambda e: None, where=where)
    assert stats_spark(spark, files, by, on_damage=lambda e: None, where=where) == want and want


@pytest.mark.parametrize("where", FILTERS)
def test_filtered_export_parity(spark, generated, where, tmp_path):
    from rmqtool.spark.jobs import export_spark

    paths = ALL_STORES[:2] + [generated]
    local = dataset.export_dataset(paths, tmp_path / "local", "parquet", where=where)
    remote = export_spark(spark, paths, tmp_path / "spark", "parquet", where=where)
    assert (remote.records, remote.messages) == (local.records, local.messages) and local.records
    read = [ds.dataset(tmp_path / d).to_table().sort_by([("store", "ascending"), ("physical_offset", "ascending")])
            for d in ("local", "spark")]
    assert read[0].equals(read[1]) and set(read[0].column("type").to_pylist()) == {"message"}


@pytest.mark.parametrize("where", [
    RecordFilter(topics=("TopicA", "TopicB")),
    RecordFilter(keys=("key-95", "key-40"), body_regex="rocket"),
    RecordFilter(tags=("TagA", "Tag2"), since=1767225600000 + 200, until=1767225600000 + 900),
])
def test_grep_parity(spark, generated, where):
    from rmqtool.spark.jobs import grep_spark

    files = scan.list_files(ALL_STORES + [generated])
    want = list(grep.hit_rows(list(grep.grep_local(files, where, decompress=True, on_damage=lambda e: None))))
    got = list(grep.hit_rows(list(grep_spark(spark, files, where, decompress=True, on_damage=lambda e: None))))
    assert got == want and want


@pytest.mark.parametrize("name", ALL_SETS + ["generated"])
def test_verify_parity(spark, generated, name):
    from rmqtool.spark.jobs import verify_spark

    path = generated if name == "generated" else str(store_path(name))
    deep = name in CLEAN_SETS or name == "generated"
    want = list(verify_store(path, deep=deep))
    assert list(verify_spark(spark, path, deep=deep)) == want
    assert bool(want) == (name not in CLEAN_SETS + ["generated"])


@pytest.mark.parametrize("deep", [False, True])
def test_verify_parity_on_damage_and_only_findings_travel(spark, generated, damaged, deep):
    """Same findings as the local engine; what the tasks send back does not grow with the records."""
    import pickle

    from rmqtool.spark.jobs import spark_map

    sizes = []

    def runner(fn, items):
        results = spark_map(spark, fn, items)
        sizes.extend((len(pickle.dumps(r)), len(r.findings) + sum(map(len, r.unit_findings.values()))
                      + sum(map(len, r.entry_findings.values()))) for r in results)
        return results

    want = list(verify_store(damaged, deep=deep))
    assert list(verify_store(damaged, deep=deep, run_files=runner)) == want
    kinds = {f.kind for f in want}
    assert {"cq_file_size", "index_entry_no_record", "cq_missing_unit"} <= kinds
    assert "bad_magic" in kinds            # outside the broker's recovery window, behind the queues: no cut
    assert sum(1 for _ in Store.open(generated).commitlog.iter_entries()) > 300    # records: many
    for size, findings in sizes:     # a few hundred bytes of summary per queue, not per record
        assert size < 8000 + 600 * findings


# -- the commands -----------------------------------------------------------------------------------
def test_cli_engines_agree(spark, generated, tmp_path):
    for args in (["stats", generated, "--by", "topic", "-f", "jsonl"],
                 ["grep", str(store_path("dev-sample")), "--topic", "TopicA", "-f", "jsonl"],
                 ["verify", str(store_path("dev-sample-crash")), "-f", "jsonl"]):
        local, remote = run(*args, "--engine", "local"), run(*args, "--engine", "spark")
        assert (remote.exit_code, remote.stdout) == (local.exit_code, local.stdout)
        assert local.stdout
    local = run("export", generated, "--to", tmp_path / "l", "--engine", "local", "--partition-by", "topic")
    remote = run("export", generated, "--to", tmp_path / "s", "--engine", "spark", "--partition-by", "topic")
    assert local.exit_code == remote.exit_code == 0, local.output + remote.output
    assert read_dataset(tmp_path / "s") == read_dataset(tmp_path / "l")
    stats_rows = [json.loads(line) for line in run("stats", generated, "--engine", "spark", "-f", "jsonl")
                  .stdout.splitlines()]
    assert stats_rows[0]["messages"] == sum(1 for r in read_dataset(tmp_path / "s") if r["type"] == "message")


def test_scan_copies_remote_files():
    """URIs go through pyarrow.fs (file:// here; hdfs:// and s3:// the same way)."""
    uri = f"file://{store_path('dev-sample')}"
    files = scan.list_files([uri])
    assert files and all(f.uri.startswith("file:///") for f in files)
    rows = sum(b.num_rows for f in files for b in scan.record_batches(f))
    assert rows == len(readback("dev-sample")["commitlogRecords"])


TOPICS_JOB = """
import json, sys
import rmqtool
from rmqtool.spark.session import get_session
spark = get_session()   # the spark-submit session, with the rocketmq data source registered
rows = spark.read.format("rocketmq").option("mode", "permissive").load(sys.argv[1:]) \\
    .groupBy("store", "topic").count().collect()
print(json.dumps({"package": rmqtool.__file__, "master": spark.sparkContext.master,
                  "counts": sorted(([r["store"], r["topic"], r["count"]] for r in rows), key=json.dumps)}))
"""


def test_spark_submit_with_the_package_zip(tmp_path):
    """The README's spark-submit recipe: the package zipped from the checkout, shipped with --py-files."""
    subprocess.run([sys.executable, "-m", "zipfile", "-c", str(tmp_path / "rmqtool.zip"), "rmqtool"],
                   cwd=ROOT, check=True)
    (tmp_path / "topics.py").write_text(TOPICS_JOB)
    stores = [str(store_path(n)) for n in ("dev-sample", "dev-sample-crash-torn")]
    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                           "--py-files", "rmqtool.zip", "topics.py", *stores],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert ".zip" in got["package"] and got["master"] == "local[2]"
    want: dict = {}
    for f in scan.list_files(stores):
        for batch in scan.record_batches(f, on_damage=lambda e: None):
            for topic, kind in zip(batch.column("topic").to_pylist(), batch.column("type").to_pylist()):
                if kind == "message":                 # the data source leaves BLANK padding out
                    want[(f.store, topic)] = want.get((f.store, topic), 0) + 1
    assert got["counts"] == sorted(([s, t, n] for (s, t), n in want.items()), key=json.dumps)


COUNT_JOB = """
import sys
from rmqtool.spark.session import get_session
print(get_session().read.format("rocketmq").load(sys.argv[1]).count())
"""


# The README's plain session: nothing of rmqtool imported, no activated virtualenv.
PLAIN_JOB = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
print(spark.read.format("rocketmq").load(sys.argv[1]).count())
"""


def cron_env(tmp_path) -> dict:
    """The environment cron gives `.venv/bin/python job.py`: PATH without the venv, whose `python3` here
    cannot import rmqtool."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\necho 'not the interpreter rmqtool is installed in' >&2\nexit 1\n")
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "VIRTUAL_ENV"))}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", PYTHONPATH=str(ROOT))
    return env


PINNED = """
import os, sys
before = os.environ.get("PYSPARK_DRIVER_PYTHON")
if sys.argv[1:] == ["import"]:
    import pyspark  # noqa: F401
print(before, os.environ.get("PYSPARK_DRIVER_PYTHON"), os.environ.get("PYSPARK_PYTHON"))
"""


@pytest.mark.parametrize("imports, chosen, expect", [
    (True, {}, "None {python} None"),                            # pinned when PySpark is imported
    (False, {}, "None None None"),                               # a program without PySpark: untouched
    (True, {"PYSPARK_PYTHON": "/opt/py"}, "None None /opt/py"),  # the user's choice stands
    (True, {"PYSPARK_DRIVER_PYTHON": "/opt/py"}, "/opt/py /opt/py None"),
])
def test_the_install_pins_sparks_python_workers_when_pyspark_is_imported(tmp_path, imports, chosen, expect):
    env = {**cron_env(tmp_path), **chosen}
    proc = subprocess.run([sys.executable, "-c", PINNED, *(["import"] if imports else [])], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.split() == expect.format(python=sys.executable).split()


def messages(name: str) -> int:
    return sum(r["type"] != "BLANK" for r in readback(name)["commitlogRecords"])


@pytest.mark.slow
def test_without_an_activated_venv_and_without_warnings(tmp_path):
    """Run as cron runs it: rmqtool's session pins Spark's Python workers to its own interpreter, and
    neither the job nor `make demo`'s command print a warning (PySpark's pandas-3 FutureWarning included)."""
    (tmp_path / "job.py").write_text(COUNT_JOB)
    env = cron_env(tmp_path)
    store = str(store_path("dev-sample"))
    job = subprocess.run([sys.executable, "job.py", store], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert job.returncode == 0, job.stderr[-3000:]
    assert int(job.stdout) == messages("dev-sample")
    demo = subprocess.run([sys.executable, "-m", "rmqtool", "stats", store, "--by", "topic", "--engine", "spark",
                           "-f", "plain"], env=env, capture_output=True, text=True, timeout=600)
    assert demo.returncode == 0 and demo.stdout.startswith("topic ")
    assert demo.stderr == "" and "Warning" not in job.stderr, demo.stderr + job.stderr


@pytest.mark.slow
def test_a_plain_session_without_an_activated_venv(tmp_path):
    """A session the script builds itself, importing nothing of rmqtool, run as cron runs it: the install's
    rmqtool-pyspark.pth pins the workers that look up and plan Python data sources to the script's
    interpreter (else Spark's bare DATA_SOURCE_NOT_FOUND)."""
    (tmp_path / "job.py").write_text(PLAIN_JOB)
    store = str(store_path("dev-sample"))
    job = subprocess.run([sys.executable, "job.py", store], cwd=tmp_path, env=cron_env(tmp_path),
                         capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stderr[-3000:]
    assert int(job.stdout) == messages("dev-sample")
