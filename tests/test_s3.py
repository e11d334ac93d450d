"""Stores on S3 and datasets written to S3, through pyarrow.fs, against a real S3 protocol server on
loopback (moto's server; endpoint and keys come from the AWS_* environment, as for any S3 client).

The same bytes read from s3:// and from the local fixture give the same files, records, stats and
dataset rows; the Spark engine (a fresh process, as a user runs it) reads and writes S3 alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from moto.server import ThreadedMotoServer
from pyarrow import fs

from conftest import ROOT, run, store_path
from rmqtool.cli.exitcodes import ExitCode
from rmqtool.errors import StoreError
from rmqtool.ops import dataset, scan
from rmqtool.ops.stats import file_stats, merge, stats_rows

BUCKET = "rmq"
STORES = {"broker-a": "dev-sample", "broker-b": "dev-sample-5x"}
LOCATION = ("store", "commitlog_file")    # columns naming where a row came from


@pytest.fixture(scope="module")
def s3():
    """An S3 server on 127.0.0.1 holding both clean fixture stores under s3://rmq/<broker>/store."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_EC2_METADATA_DISABLED": "true"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        s3fs = fs.S3FileSystem(endpoint_override=env["AWS_ENDPOINT_URL"], allow_bucket_creation=True)
        s3fs.create_dir(BUCKET)
        for broker, name in STORES.items():
            fs.copy_files(str(store_path(name)), f"{BUCKET}/{broker}/store",
                          source_filesystem=fs.LocalFileSystem(), destination_filesystem=s3fs)
        yield s3fs
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        server.stop()


def uri(broker: str) -> str:
    return f"s3://{BUCKET}/{broker}/store"


def shape(files: list[scan.StoreFile]) -> list[tuple]:
    return [(f.name, f.start, f.size, f.kind, f.topic, f.queue_id) for f in files]


@pytest.mark.parametrize("kind", ["commitlog", "consumequeue", "index"])   # the fixtures have no batch queues
def test_listing_matches_local(s3, kind):
    for broker, name in STORES.items():
        remote = scan.list_files([uri(broker)], kind)
        assert remote and all(f.uri.startswith(f"{uri(broker)}/") and f.store == uri(broker) for f in remote)
        assert shape(remote) == shape(scan.list_files([str(store_path(name))], kind))


def test_glob_names_every_store(s3):
    files = scan.list_files([f"s3://{BUCKET}/broker-*/store"])
    assert sorted({f.store for f in files}) == [uri(b) for b in sorted(STORES)]
    with pytest.raises(StoreError, match="no store matches"):
        scan.list_files([f"s3://{BUCKET}/nobody-*/store"])


def rows_without_location(tables) -> list[dict]:
    table = pa.concat_tables(tables)
    return table.drop_columns([c for c in LOCATION if c in table.column_names]).to_pylist()


def test_records_match_local(s3):
    for broker, name in STORES.items():
        remote = [pa.Table.from_batches([b]) for f in scan.list_files([uri(broker)]) for b in scan.record_batches(f)]
        local = [pa.Table.from_batches([b]) for f in scan.list_files([str(store_path(name))])
                 for b in scan.record_batches(f)]
        assert len(rows_without_location(remote)) > 100
        assert rows_without_location(remote) == rows_without_location(local)


@pytest.mark.parametrize("args", [["stats", "--by", "topic"], ["grep", "--topic", "TopicA"]])
def test_commands_read_s3(s3, args):
    remote = run(args[0], f"s3://{BUCKET}/broker-*/store", *args[1:], "--engine", "local", "-f", "jsonl")
    local = run(args[0], *[store_path(n) for n in STORES.values()], *args[1:], "--engine", "local", "-f", "jsonl")
    assert remote.exit_code == local.exit_code == 0, remote.output
    strip = (lambda rows: [{k: v for k, v in r.items() if k not in LOCATION} for r in rows])
    assert strip(map(json.loads, remote.stdout.splitlines())) == strip(map(json.loads, local.stdout.splitlines()))
    assert remote.stdout


def read_s3_dataset(s3fs, prefix: str) -> list[dict]:
    table = ds.dataset(f"{BUCKET}/{prefix}", filesystem=s3fs, format="parquet", partitioning="hive").to_table()
    return sorted(rows_without_location([table]), key=lambda r: (r["topic"] or "", r["physical_offset"]))


def test_export_writes_a_dataset_to_s3(s3, tmp_path):
    stores = [uri(b) for b in STORES]
    result = run("export", *stores, "--to", f"s3://{BUCKET}/out/plain", "--engine", "local")
    assert result.exit_code == 0, result.output
    local = dataset.export_dataset([str(store_path(n)) for n in STORES.values()], tmp_path / "local")
    want = sorted(rows_without_location([ds.dataset(tmp_path / "local", format="parquet").to_table()]),
                  key=lambda r: (r["topic"] or "", r["physical_offset"]))
    assert read_s3_dataset(s3, "out/plain") == want and len(want) == local.records
    # partitioned, and replaced only with --force; no staging directory left behind
    args = ["export", *stores, "--to", f"s3://{BUCKET}/out/by-topic", "--partition-by", "topic"]
    assert run(*args).exit_code == 0
    again = run(*args)
    assert again.exit_code == ExitCode.IO_ERROR
    assert again.stderr.strip() == "rmqtool: error: s3://rmq/out/by-topic: output exists (use --force to replace it)"
    assert run(*args, "--force").exit_code == 0
    listed = [i.path for i in s3.get_file_info(fs.FileSelector(f"{BUCKET}/out", recursive=True))]
    assert any("/topic=TopicA/" in p for p in listed) and not any(".tmp-" in p for p in listed)
    assert len(read_s3_dataset(s3, "out/by-topic")) == sum(1 for r in want if r["type"] == "message")


SPARK_JOB = """
import json, sys
from rmqtool.ops.stats import stats_rows
from rmqtool.ops import scan
from rmqtool.spark.jobs import export_spark, stats_spark
from rmqtool.spark.session import get_session

stores, out = sys.argv[1:-1], sys.argv[-1]
spark = get_session("local[2]", progress=False)
counts = {kind: spark.read.format("rocketmq").option("kind", kind).load(stores).count() for kind in scan.KINDS}
exported = export_spark(spark, stores, out, partition_by=("topic",))
stats = stats_spark(spark, scan.list_files(stores), "topic")
print(json.dumps({"counts": counts, "records": exported.records, "stats": stats}, default=str))
"""


@pytest.mark.spark
def test_spark_reads_and_writes_s3(s3):
    from rmqtool.spark.schema import file_batches

    stores = [uri(b) for b in STORES]
    done = subprocess.run([sys.executable, "-c", SPARK_JOB, *stores, f"s3://{BUCKET}/out/spark"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    local_stores = [str(store_path(n)) for n in STORES.values()]
    for kind, count in got["counts"].items():
        assert count == sum(b.num_rows if kind != "commitlog" else b.column("type").to_pylist().count("message")
                            for f in scan.list_files(local_stores, kind) for b in file_batches(f, kind))
    want = stats_rows(merge([file_stats(f, "topic") for f in scan.list_files(local_stores)], "topic"), "topic")
    assert got["stats"] == json.loads(json.dumps(want, default=str))
    assert len(read_s3_dataset(s3, "out/spark")) == got["records"] > 100


def test_trace_kind_reads_s3(s3):
    """The data source's kind trace on a store on S3 (its broker.properties and records read through
    pyarrow.fs) gives the rows it gives locally."""
    from rmqtool.spark.datasource import RocketMQDataSource

    fs.copy_files(str(store_path("dev-trace-5x")), f"{BUCKET}/traced/store", source_filesystem=fs.LocalFileSystem(),
                  destination_filesystem=s3)
    s3.create_dir(f"{BUCKET}/traced/store/config")
    with s3.open_output_stream(f"{BUCKET}/traced/store/config/broker.properties") as out:
        out.write(b"msgTraceTopicName=MyTraces\n")

    def rows(path: str, **options) -> list[dict]:
        reader = RocketMQDataSource({"path": path, "kind": "trace", **options}).reader(None)
        return [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
    local, remote = rows(str(store_path("dev-trace-5x"))), f"s3://{BUCKET}/traced/store"
    assert len(local) > 100 and rows(remote, traceTopic="RMQ_SYS_TRACE_TOPIC") == local
    assert rows(remote) == []
