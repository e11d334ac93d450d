"""RocksDB config metadata (storeType=defaultRocksDB, the 5.3.3 broker/config/v1 managers) against what fresh
RocksDB managers loaded back from a copy (readback.json -> rocksdbConfig): topic and group tables, data
versions, the forbidden table, consumer offsets with lag; the config databases byte-identical, without new
files, after every command that reads them."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from rmqtool.ops.metadata import group_rows, offset_rows, snake
from rmqtool.store import layout as L
from rmqtool.store.metadata import load
from rmqtool.store.store import Store
from tests.conftest import ROCKSDB_CONFIG_SETS, readback, run, store_path

pytest.importorskip("rocksdict")


@pytest.fixture(params=ROCKSDB_CONFIG_SETS)
def name(request):
    return request.param


def _field(d: dict, prefix: str):
    return next(v for k, v in d.items() if k.startswith(prefix))


def loaded_md(name: str) -> dict:
    """What the managers loaded (``metadata``)."""
    return _field(readback(name)["rocksdbConfig"], "metadata")


def persisted(name: str, db: str, family: str) -> list[list[str]]:
    """[key, value, key hex] of one column family as persisted (before any manager loaded it)."""
    kv = _field(readback(name)["rocksdbConfig"], "kvAsPersisted")[f"config/{db}"]
    return _field(kv, f"kv[{family}]")


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_topic_table_as_loaded(name):
    loaded = load(Store.open(store_path(name)), "topics.json")
    want = loaded_md(name)["topicConfigTable"]
    assert {t: {"topicName": tc.topic_name, "readQueueNums": tc.read_queue_nums,
                "writeQueueNums": tc.write_queue_nums, "perm": tc.perm, "topicFilterType": tc.topic_filter_type,
                "topicSysFlag": tc.topic_sys_flag, "order": tc.order, "attributes": tc.attributes}
            for t, tc in loaded.value.entries.items()} == want
    assert loaded.value.data_version.to_json() == loaded_md(name)["topicConfigManager.dataVersion"]
    # keys as persisted (raw UTF-8; deleted ones absent) plus what init() puts into the table alone
    keys = {bytes.fromhex(h).decode("utf-8") for _, _, h in persisted(name, L.KV_CONFIG_DIRS["topics.json"],
                                                                       "default")}
    assert set(want) - keys == {"rmq_sys_wheel_timer"} and keys <= set(want)


def test_groups_and_forbidden_table(name):
    loaded = load(Store.open(store_path(name)), "subscriptionGroup.json")
    want = loaded_md(name)["subscriptionGroupTable"]
    rows = {r.pop("group"): r for r in group_rows(loaded)}
    assert {g: {k: v for k, v in r.items() if k != "forbidden"} for g, r in rows.items()} == \
        {g: {snake(k): v for k, v in w.items() if k != "groupName"} for g, w in want.items()}
    forbidden = _field(readback(name)["rocksdbConfig"], "forbiddenTable")
    assert loaded.value.forbidden == forbidden
    assert {g: r["forbidden"] for g, r in rows.items() if r["forbidden"]} == \
        {g: f for g, f in forbidden.items() if g in want}
    assert loaded.value.data_version.to_json() == loaded_md(name)["subscriptionGroupManager.dataVersion"]


def test_offsets_and_lag(name):
    store = Store.open(store_path(name))
    loaded = load(store, "consumerOffset.json")
    queues = {(q["topic"], q["queueId"]) for q in readback(name)["rocksdbConsumeQueue"]["queues"]}
    want = []
    for o in loaded_md(name)["consumerOffsets"]:
        assert o["queryOffset"] == o["committedOffset"]
        # getMaxOffsetInQueue answers 0 for a queue the database lacks; rmqtool leaves max and lag empty
        absent = (o["topic"], o["queueId"]) not in queues and o["cqMaxOffset"] == 0
        want.append((o["group"], o["topic"], o["queueId"], o["committedOffset"],
                     None if absent else o["cqMaxOffset"], None if absent else o["lag"]))
    rows = [(r["group"], r["topic"], r["queue_id"], r["offset"], r["max_offset"], r["lag"])
            for r in offset_rows(loaded, store)]
    assert rows == sorted(want)
    # the offsets database holds no kvDataVersion: the broker's is a fresh DataVersion (counter 0) at load
    assert loaded.value.data_version is None and persisted(name, "consumerOffsets", "kvDataVersion") == []
    assert loaded_md(name)["consumerOffsetManager.dataVersion"]["counter"] == 0


def test_commands_read_the_databases_and_write_nothing(name):
    root = store_path(name)
    before = tree(root / L.CONFIG), tree(root / L.CONSUMEQUEUE)
    md = loaded_md(name)
    topics = [json.loads(line)["topic"] for line in run("topics", root, "-f", "jsonl").stdout.splitlines()]
    assert topics == sorted(md["topicConfigTable"])
    groups = run("groups", root, "-f", "plain")
    assert groups.exit_code == 0 and groups.stdout.count("\n") == len(md["subscriptionGroupTable"]) + 2
    lag = {}
    for o in md["consumerOffsets"]:
        lag[o["group"]] = lag.get(o["group"], 0) + o["lag"]
    by_group = run("offsets", root, "--by", "group", "-f", "jsonl")
    assert {r["group"]: r["lag"] for r in map(json.loads, by_group.stdout.splitlines())} == lag
    config = [json.loads(line) for line in run("config", root, "-f", "jsonl").stdout.splitlines()]
    assert [(r["file"], r["read_from"], r["entries"]) for r in config][:3] == [
        ("topics.json", "topics/", len(md["topicConfigTable"])),
        ("subscriptionGroup.json", "subscriptionGroups/", len(md["subscriptionGroupTable"])),
        ("consumerOffset.json", "consumerOffsets/", len({o["key"] for o in md["consumerOffsets"]}))]
    status = run("topic-status", root, "-f", "jsonl")
    assert [(r["topic"], r["queue_id"], r["min_offset"], r["max_offset"])
            for r in map(json.loads, status.stdout.splitlines())] == sorted(
        (q["topic"], q["queueId"], q["minOffsetInQueue"], q["maxOffsetInQueue"])
        for q in readback(name)["rocksdbConsumeQueue"]["queues"])
    committed = {(o["topic"], o["group"], o["queueId"]): o["committedOffset"] for o in md["consumerOffsets"]}
    record = next(r for r in readback(name)["commitlogRecords"]
                  if r.get("uniqKey") and any(t == r["topic"] for t, _, _ in committed))
    track = [json.loads(line) for line in run("query-id", root, record["uniqKey"], "--track", "-f", "jsonl").stdout
             .splitlines()]
    assert [(t["group"], t["offset"], t["consumed"]) for t in track] == sorted(
        (g, off, off > record["queueOffset"]) for (t, g, q), off in committed.items()
        if (t, q) == (record["topic"], record["queueId"]))
    verify = run("verify", root, "-f", "plain")
    assert verify.exit_code == 0 and "5.3.3: safe to start" in verify.stdout + verify.stderr
    assert (tree(root / L.CONFIG), tree(root / L.CONSUMEQUEUE)) == before


def test_a_database_that_does_not_open_is_refused(name, store_copy):
    root = store_copy(name)
    db = root / L.CONFIG / L.KV_CONFIG_DIRS["subscriptionGroup.json"]
    (db / "CURRENT").write_text("MANIFEST-999999\n")
    result = run("groups", root)
    assert result.exit_code == 4 and result.stdout == ""
    assert result.stderr.startswith(f"rmqtool: error: {db}: cannot open the RocksDB config database: ")
    assert "rmqtool-rocksdb-" not in result.stderr
    verify = run("verify", root, "-f", "jsonl")
    found = [json.loads(line) for line in verify.stdout.splitlines()]
    assert verify.exit_code == 1 and [(f["kind"], f["path"]) for f in found] == [("config_kv_refused", str(db))]
    assert "5.3.3: refuses to start" in run("verify", root, "-f", "plain").stderr


def test_config_v2_database_is_refused(name, store_copy):
    root = store_copy(name)
    shutil.copytree(root / L.CONFIG / "topics", root / L.CONFIG / L.KV_CONFIG_V2_DIR)
    for command in ("topics", "groups", "offsets", "config"):
        result = run(command, root)
        assert result.exit_code == 4 and "configManagerVersion=v2" in result.stderr, command
    verify = run("verify", root, "-f", "jsonl")
    assert verify.exit_code == 0
    assert [json.loads(line)["kind"] for line in verify.stdout.splitlines()] == ["config_not_read"]


def test_newer_json_file_is_merged(name, store_copy):
    """RocksDBTopicConfigManager.merge: topics.json with a higher dataVersion counter is put over the table."""
    root = store_copy(name)
    counter = loaded_md(name)["topicConfigManager.dataVersion"]["counter"]
    (root / L.config_file("topics.json")).write_text(json.dumps({
        "dataVersion": {"counter": counter + 5, "stateVersion": 0, "timestamp": 1},
        "topicConfigTable": {"MergedTopic": {"topicName": "MergedTopic", "readQueueNums": 3, "writeQueueNums": 3,
                                             "perm": 6}}}))
    loaded = load(Store.open(root), "topics.json")
    assert set(loaded.value.entries) == set(loaded_md(name)["topicConfigTable"]) | {"MergedTopic"}
    assert loaded.value.data_version.counter == counter + 6 and "merged" in loaded.fallback
    (root / L.config_file("topics.json")).write_text('{"dataVersion":{"counter":1}}')
    assert load(Store.open(root), "topics.json").fallback is None


def _database(path: Path, default: dict[bytes, bytes], families: tuple[str, ...] = ()) -> None:
    """A RocksDB database written here by rocksdict (in a test's own directory, never a fixture's)."""
    from rocksdict import Options, Rdict

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(str(path), options=opts)
    for family in families:
        db.create_column_family(family, Options(raw_mode=True))
    for k, v in default.items():
        db[k] = v
    db.close()


def test_a_value_that_does_not_decode_or_another_family_is_refused(name, store_copy):
    root = store_copy(name)
    db = root / L.CONFIG / L.KV_CONFIG_DIRS["topics.json"]
    shutil.rmtree(db)
    _database(db, {"坏".encode(): b'{"topicName":'}, ("kvDataVersion", "forbidden"))
    result = run("topics", root)
    assert result.exit_code == 4 and result.stderr.startswith(f"rmqtool: error: {db}: key '坏': not fastjson")
    shutil.rmtree(db)
    _database(db, {b"T": b'{"topicName":"T"}'}, ("kvDataVersion", "other"))
    result = run("topics", root)
    assert result.exit_code == 4 and "column family 'other' beside default" in result.stderr
