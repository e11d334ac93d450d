"""The trace kind of the rocketmq data source and of ``export --kind trace``: one row per message-trace
context and bean, the rows of ``rmqtool trace STORE -f jsonl``. The data source's planner and reader run
without a JVM."""

from __future__ import annotations

import csv
import datetime as dt
import json

import pytest

from tests.conftest import run, store_path
from tests.test_trace import SET, _trace, damage_a_trace_body

pytest.importorskip("pyspark.sql.datasource")
from rmqtool.spark.datasource import RocketMQDataSource  # noqa: E402

STORE = store_path(SET)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def trace_rows() -> list[dict]:
    result = run("trace", STORE, "-f", "jsonl")
    assert result.exit_code == 0
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == sum(len(m["contexts(TraceDataEncoder.decoderFromTraceDataString)"])
                            for m in _trace()["traceMessages"])
    return rows


def source_rows(path, **options) -> list[dict]:
    """The rows the data source reads, time_stamp back in milliseconds since the epoch (as trace prints it)."""
    reader = RocketMQDataSource({"path": str(path), "kind": "trace", **options}).reader(None)
    rows = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
    for r in rows:
        r["time_stamp"] = r["time_stamp"] and (r["time_stamp"] - EPOCH) // dt.timedelta(milliseconds=1)
    return rows


def test_data_source_rows_are_the_trace_rows(trace_rows):
    source = RocketMQDataSource({"path": str(STORE), "kind": "trace"})
    assert source.schema().fieldNames() == list(trace_rows[0])
    assert source.schema()["time_stamp"].dataType.typeName() == "timestamp"
    assert source_rows(STORE) == trace_rows
    assert source_rows(STORE, traceTopic="TopicA") == []        # records of another topic are no trace records
    with pytest.raises(ValueError, match="traceTopic .* not with kind commitlog"):
        RocketMQDataSource({"path": str(STORE), "traceTopic": "X"}).reader(None)
    with pytest.raises(ValueError, match="option kind must be one of .*trace"):
        RocketMQDataSource({"path": str(STORE), "kind": "traces"}).reader(None)


def test_export_rows_are_the_trace_rows(trace_rows, tmp_path):
    import pyarrow.parquet as pq

    out = {fmt: tmp_path / f"t.{fmt}" for fmt in ("jsonl", "csv", "parquet")}
    for fmt, path in out.items():
        result = run("export", STORE, "--kind", "trace", "--to", path)
        assert result.exit_code == 0, result.stderr
        assert f"exported {len(trace_rows)} trace contexts ({len(_trace()['traceMessages'])} trace messages)" \
            in result.stderr
    assert [json.loads(line) for line in out["jsonl"].read_text("utf-8").splitlines()] == trace_rows
    def cell(v) -> str:                     # as trace -f csv writes a value
        return "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
    with out["csv"].open(encoding="utf-8", newline="") as fh:
        assert list(csv.DictReader(fh)) == [{k: cell(v) for k, v in r.items()} for r in trace_rows]
    table = pq.read_table(out["parquet"])
    assert str(table.schema.field("time_stamp").type) == "timestamp[ms, tz=UTC]"
    rows = table.to_pylist()
    for r in rows:
        r["time_stamp"] = r["time_stamp"] and (r["time_stamp"] - EPOCH) // dt.timedelta(milliseconds=1)
    assert rows == trace_rows


@pytest.mark.parametrize("args", [["--partition-by", "topic"], ["--topic", "TopicA"], ["--engine", "spark"],
                                  ["--check-crc"], ["--to-dir"]])
def test_export_refuses_what_kind_trace_does_not_do(tmp_path, args):
    to = tmp_path / ("dataset" if args == ["--to-dir"] else "t.jsonl")
    args = [] if args == ["--to-dir"] else args
    result = run("export", STORE, "--kind", "trace", "--to", to, *args)
    assert result.exit_code == 2 and "--kind trace" in result.stderr
    assert ("rmqtool trace" if args[:1] in (["--topic"], ["--check-crc"]) else "data source") in result.stderr
    assert not to.exists()


def test_trace_topic_goes_with_kind_trace(tmp_path):
    result = run("export", STORE, "--trace-topic", "X", "--to", tmp_path / "t.jsonl")
    assert result.exit_code == 2 and "--kind trace" in result.stderr


def test_an_undecodable_trace_body(store_copy, tmp_path, trace_rows):
    """As ``trace``: an error (exit 3, nothing written; failfast raises), or with --read-anyway (mode
    permissive) that trace message is left out and the rest is there."""
    store, damaged, _ = damage_a_trace_body(store_copy)
    rest = [r for r in trace_rows if r["trace_physical_offset"] != damaged["physicalOffset"]]
    to = tmp_path / "t.jsonl"
    result = run("export", store, "--kind", "trace", "--to", to)
    assert result.exit_code == 3 and f"offset {damaged['physicalOffset']}" in result.stderr and not to.exists()
    result = run("export", store, "--kind", "trace", "--to", to, "--read-anyway")
    assert result.exit_code == 3 and "that trace message skipped" in result.stderr
    assert [json.loads(line) for line in to.read_text("utf-8").splitlines()] == rest
    with pytest.raises(Exception, match=f"offset {damaged['physicalOffset']}"):
        source_rows(store)
    assert source_rows(store, mode="permissive") == rest


def test_the_trace_topic_follows_broker_properties(store_copy, tmp_path, trace_rows):
    """Each store's msgTraceTopicName (config/broker.properties), unless traceTopic / --trace-topic."""
    store = store_copy(SET)
    (store / "config").mkdir(exist_ok=True)
    (store / "config" / "broker.properties").write_text("msgTraceTopicName=MyTraces\n", "latin-1")
    assert source_rows(store) == []
    assert source_rows(store, traceTopic="RMQ_SYS_TRACE_TOPIC") == trace_rows
    to = tmp_path / "t.jsonl"
    assert run("export", store, "--kind", "trace", "--to", to).exit_code == 0 and to.read_text() == ""
    assert run("export", store, "--kind", "trace", "--to", to, "--force",
               "--trace-topic", "RMQ_SYS_TRACE_TOPIC").exit_code == 0
    assert [json.loads(line) for line in to.read_text("utf-8").splitlines()] == trace_rows
