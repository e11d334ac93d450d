"""One Parquet schema for every export shape: a single file, a dataset directory, a Hive-partitioned
dataset (laid out as pyarrow.dataset.write_dataset lays it out), either engine. Timestamps are timestamp[ms, UTC]; every
row says its store and commit-log file. pyarrow, pandas and DuckDB read the same rows from every shape
(Spark does too: tests/test_spark_source.py)."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from conftest import store_path
from rmqtool.ops import dataset, scan
from rmqtool.ops.export import export, export_schema

STORES = [str(store_path("dev-sample")), str(store_path("dev-sample-5x"))]
KEY = [("store", "ascending"), ("physical_offset", "ascending")]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """The same two stores exported as one file, a dataset directory and a topic,date-partitioned one."""
    out = tmp_path_factory.mktemp("shapes")
    single = export(STORES, out / "one.parquet")
    flat = dataset.export_dataset(STORES, out / "flat")
    hive = dataset.export_dataset(STORES, out / "hive", partition_by=("topic", "date"))
    assert single.records == flat.records == hive.records == single.messages
    return out


def read_shape(out, name) -> pa.Table:
    if name == "one":
        return pq.read_table(out / "one.parquet")
    if name == "flat":
        return ds.dataset(out / "flat", format="parquet").to_table()
    keys = pa.schema([("topic", pa.string()), ("date", pa.string())])
    table = ds.dataset(out / "hive", format="parquet", partitioning=ds.partitioning(keys, flavor="hive")).to_table()
    return table.select(export_schema().names)          # the partition keys come back last


def test_one_schema_for_every_shape(shapes):
    want = export_schema()
    assert want.field("store_timestamp").type == want.field("born_timestamp").type == pa.timestamp("ms", "UTC")
    assert want.names[-2:] == ["store", "commitlog_file"]
    tables = {name: read_shape(shapes, name) for name in ("one", "flat", "hive")}
    for name, table in tables.items():
        assert table.schema.remove_metadata() == want, name
    rows = tables["one"].sort_by(KEY)
    assert tables["flat"].sort_by(KEY).equals(rows)
    assert tables["hive"].sort_by(KEY).equals(rows)


def test_every_shape_writes_with_the_documented_options(shapes):
    """Snappy everywhere; store and commitlog_file dictionary-encoded (the one file hands them to the writer
    as dictionary arrays yet reads them back as strings); delta-encoded offsets and times; statistics where
    they can prune."""
    for part in [shapes / "one.parquet", next((shapes / "flat").glob("*.parquet"))]:
        group = pq.ParquetFile(part).metadata.row_group(0)
        columns = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
        assert {c.compression for c in columns.values()} == {"SNAPPY"}, part
        for name in ("store", "commitlog_file", "topic"):
            assert "RLE_DICTIONARY" in columns[name].encodings, (part, name)
        for name in ("physical_offset", "queue_offset", "store_timestamp"):
            assert "DELTA_BINARY_PACKED" in columns[name].encodings and columns[name].is_stats_set, (part, name)
        assert not columns["body"].is_stats_set and not columns["born_host"].is_stats_set
        assert "DELTA_BINARY_PACKED" not in columns["body_crc"].encodings


def test_two_stores_in_one_file_say_where_each_row_came_from(shapes):
    table = pq.read_table(shapes / "one.parquet")
    files = {f.uri: f.store for f in scan.list_files(STORES)}
    stores = table.column("store").to_pylist()
    assert set(stores) == set(STORES)
    assert all(files[f] == s for f, s in zip(table.column("commitlog_file").to_pylist(), stores))
    for store in STORES:     # each store's messages, in its own commit-log order
        mine = table.filter(pa.compute.equal(table.column("store"), store)).column("physical_offset").to_pylist()
        assert mine == sorted(mine) and mine


def test_hive_partitions_keep_their_keys_in_the_path(shapes):
    dirs = sorted(p.relative_to(shapes / "hive").parent.as_posix() for p in (shapes / "hive").rglob("*.parquet"))
    assert dirs and all(d.startswith("topic=") and "/date=20" in d for d in dirs)
    for part in (shapes / "hive").rglob("*.parquet"):           # keys live in the path only
        assert "topic" not in pq.read_schema(part).names and "date" not in pq.read_schema(part).names


@pytest.mark.parametrize("keys", [("topic",), ("date", "topic")])
def test_hive_partitions_as_write_dataset_lays_them_out(tmp_path, monkeypatch, keys):
    """The same directories (escaped topics, null partitions) and, in each, the same rows in the same order as
    pyarrow.dataset.write_dataset; with two files open at most, a partition written again starts file 1."""
    from pyarrow import fs

    monkeypatch.setattr(dataset, "_OPEN_PARTS", 2)
    monkeypatch.setattr("rmqtool.ops.export.ROW_GROUP_ROWS", 50)          # a flush every other batch
    topics = ["%RETRY%g|x", "a b/c~._-", "TopicA", None, "%DLQ%g"]
    schema = pa.schema([("topic", pa.string()), ("store_timestamp", pa.timestamp("ms", "UTC")), ("n", pa.int64())])
    batches = [pa.record_batch([pa.array([topics[(i * 7 + b) % 5] for i in range(40)]),
                                pa.array([86_400_000 * (i % 3) for i in range(40)], pa.timestamp("ms", "UTC")),
                                pa.array(range(b * 40, b * 40 + 40))], schema=schema) for b in range(4)]
    written: list[str] = []
    dataset._write_partitioned(iter(batches), schema, fs.LocalFileSystem(), str(tmp_path / "ours"), "p", keys, written)
    date = pa.array(["1970-01-0%d" % (1 + i % 3) for i in range(40)] * 4)
    table = pa.Table.from_batches(batches).append_column("date", date)
    ds.write_dataset(table, tmp_path / "theirs", format="parquet", partitioning=ds.partitioning(
        pa.schema([(k, pa.string()) for k in keys]), flavor="hive"), basename_template="p-{i}.parquet", preserve_order=True)

    def parts(root):
        return {p.parent.relative_to(root).as_posix() for p in root.rglob("*.parquet")}

    assert parts(tmp_path / "ours") == parts(tmp_path / "theirs")
    assert sorted(written) == sorted(str(p) for p in (tmp_path / "ours").rglob("*.parquet"))
    assert any(p.endswith("-1.parquet") for p in written)           # the cap closed and reopened a partition
    for part in parts(tmp_path / "theirs"):
        files = sorted((tmp_path / "ours" / part).glob("*.parquet"), key=lambda p: int(p.stem.split("-")[-1]))
        ours = pa.concat_tables(pq.read_table(p) for p in files)
        theirs = pq.read_table(tmp_path / "theirs" / part / "p-0.parquet")
        assert ours.column("n").to_pylist() == theirs.column("n").to_pylist(), part
        assert set(keys).isdisjoint(pq.read_schema(next((tmp_path / "ours" / part).glob("*.parquet"))).names)


def test_pandas_reads_the_same_rows_from_every_shape(shapes):
    pd = pytest.importorskip("pandas")
    frames = [pd.read_parquet(shapes / "one.parquet"), pd.read_parquet(shapes / "flat"),
              pd.read_parquet(shapes / "hive")[export_schema().names]]
    for frame in frames:
        assert str(frame["store_timestamp"].dtype) == "datetime64[ms, UTC]"
    want = frames[0].sort_values(["store", "physical_offset"]).reset_index(drop=True)
    for frame in frames[1:]:
        got = frame.sort_values(["store", "physical_offset"]).reset_index(drop=True)
        got["topic"] = got["topic"].astype(str)
        assert got[["store", "commitlog_file", "physical_offset", "topic", "store_timestamp"]].equals(
            want[["store", "commitlog_file", "physical_offset", "topic", "store_timestamp"]])


def test_duckdb_reads_the_same_rows_from_every_shape(shapes):
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    sources = [f"'{shapes / 'one.parquet'}'", f"'{shapes / 'flat'}/*.parquet'",
               f"'{shapes / 'hive'}/**/*.parquet', hive_partitioning = true"]
    query = ("SELECT store, commitlog_file, physical_offset, topic, store_timestamp, epoch_ms(store_timestamp) "
             "FROM read_parquet({}) ORDER BY store, physical_offset")
    results = [con.execute(query.format(src)).fetchall() for src in sources]
    assert results[0] == results[1] == results[2] and len(results[0]) == 318
    types = {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet({sources[0]})").fetchall()}
    assert types["store_timestamp"] == types["born_timestamp"] == "TIMESTAMP WITH TIME ZONE"
    want = pq.read_table(shapes / "one.parquet").sort_by(KEY)
    assert [r[5] for r in results[0]] == [t.value for t in want.column("store_timestamp")]


def test_partitioned_dataset_is_parquet(tmp_path):
    from rmqtool.errors import StoreError

    with pytest.raises(StoreError, match="--partition-by writes Parquet"):
        dataset.export_dataset(STORES[:1], tmp_path / "j", "jsonl", ("topic",))


def test_every_field_documented_in_the_readme_and_the_man_page():
    from conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    man = (ROOT / "man" / "rmqtool-export.1").read_text().replace("\\-", "-")
    for f in export_schema(check_crc=True):
        arrow = str(f.type).replace("list<item: string>", "list<string>").replace(", string>", ",string>")
        assert f"| `{f.name}` | {arrow} |" in readme, f.name
        assert re.search(rf"^\s*{f.name}\s+{re.escape(arrow)}\s", man, re.M), f.name


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_every_shape_counts_messages_as_the_broker(tmp_path, fmt):
    """An inner batch record (a BatchCQ topic's MessageBatch) holds INNER_NUM messages; a classic batch is
    one record per message: the manifest of what the producer put says how many messages the store holds."""
    store = str(store_path("dev-batchcq-5x"))
    puts = json.loads((store_path("dev-batchcq-5x").parent / "manifest.json").read_text())["puts"]
    want = sum(int(p["kind"].split("(")[1].rstrip(")")) if "(" in p["kind"] else 1 for p in puts)
    single = export([store], tmp_path / f"one.{fmt}", fmt)
    flat = dataset.export_dataset([store], tmp_path / "flat", fmt)
    assert single.records < want
    assert single.messages == flat.messages == want
    if fmt == "jsonl":              # a part per commit-log file, in order: the single file's lines
        parts = sorted((tmp_path / "flat").glob("*.jsonl"))
        assert len(parts) == 2 and b"".join(p.read_bytes() for p in parts) == (tmp_path / "one.jsonl").read_bytes()
    else:
        assert pq.read_table(tmp_path / "flat").equals(pq.read_table(tmp_path / "one.parquet"))
