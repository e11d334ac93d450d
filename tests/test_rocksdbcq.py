"""The RocksDB consume queue (dev-rocksdbcq-5x) against what RocketMQ 5.3.3 read back through its own
RocksDB handle: every unit and offset entry; the database byte-identical, without new files, after reads."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from rmqtool.format.rocksdbcq import OffsetEntry, RocksCqUnit, decode_offset, decode_unit, encode_offset, encode_unit
from rmqtool.store.store import Store
from tests.conftest import readback, run, store_path

pytest.importorskip("rocksdict")
SET = "dev-rocksdbcq-5x"
DB = store_path(SET) / "consumequeue"


def _rb() -> dict:
    return readback(SET)["rocksdbConsumeQueue"]


def _field(d: dict, prefix: str):
    return next(v for k, v in d.items() if k.startswith(prefix))


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a hash of its bytes (names, sizes and contents)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_unit_as_the_broker_reads_it():
    before = tree(DB)
    db = Store.open(store_path(SET)).rocksdb_consumequeue
    assert tree(DB) == before
    for q in _rb()["queues"]:
        mine = db.queue(q["topic"], q["queueId"])
        assert (mine.min_offset, mine.max_offset) == (q["minOffsetInQueue"], q["maxOffsetInQueue"])
        assert [[qo, u.physical_offset, u.size, u.tags_code] for qo, u in mine.iter_units()] == _field(q, "units")
        assert mine.units[-1].physical_offset == q["maxPhysicOffset"]
    assert db.checkpoint_offset == _rb()["maxPhyOffsetInConsumeQueue"]
    assert sorted((t, q) for t in db.topics() for q in db.queue_ids(t)) == \
        sorted((q["topic"], q["queueId"]) for q in _rb()["queues"])


def test_every_default_entry_byte_exact():
    db = Store.open(store_path(SET)).rocksdb_consumequeue
    mine = [encode_unit(u) for (t, q), units in sorted(db.units.items()) for u in units]
    want = [(bytes.fromhex(k), bytes.fromhex(v)) for k, v in _field(_rb(), "kv[default]")]
    assert sorted(mine) == sorted(want)


def test_every_offset_entry():
    """The store on disk holds the max entries and the checkpoint; the readback's min entries were written
    by the broker when it reopened its copy (they are absent from the SST file, see sst-dump/)."""
    db = Store.open(store_path(SET)).rocksdb_consumequeue
    want = [decode_offset(bytes.fromhex(k), bytes.fromhex(v)) for k, v in _field(_rb(), "kv[offset]")]
    on_disk = [e for e in want if e.kind == "max" and e.topic != "CHECKPOINT_TOPIC"]
    assert sorted(db.offsets.values()) == sorted(on_disk)
    for e in want:
        if e.kind == "min":
            assert db.queue(e.topic, e.queue_id).min_offset == e.queue_offset
    for k, v in _field(_rb(), "kv[offset]"):
        assert encode_offset(decode_offset(bytes.fromhex(k), bytes.fromhex(v))) == (bytes.fromhex(k), bytes.fromhex(v))


def test_deleted_topic_tombstones_are_counted():
    """TopicTmp was deleted: one DeleteRange per queue in default, point deletes of max/min in offset."""
    db = Store.open(store_path(SET)).rocksdb_consumequeue
    assert db.deletions == {"default": (0, 2), "offset": (4, 0)}
    assert "TopicTmp" not in db.topics()


def test_open_leaves_no_file_behind(tmp_path):
    before = tree(DB), sorted(os.listdir(DB))
    for _ in range(2):
        Store.open(store_path(SET)).rocksdb_consumequeue
    assert (tree(DB), sorted(os.listdir(DB))) == before


names = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF), min_size=1, max_size=20)
i32, i64 = st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)


@given(names, i32, i64, i64, i32, st.integers(-2**63, 2**63 - 1), i64)
def test_unit_codec_round_trips(topic, qid, qo, phy, size, tags, ts):
    unit = RocksCqUnit(topic, qid, qo, phy, size, tags, ts)
    assert decode_unit(*encode_unit(unit)) == unit


@given(names, st.sampled_from(["max", "min"]), i32, i64, i64)
def test_offset_codec_round_trips(topic, kind, qid, phy, qo):
    entry = OffsetEntry(topic, kind, qid, phy, qo)
    assert decode_offset(*encode_offset(entry)) == entry


def test_missing_binding_is_one_line(monkeypatch):
    import sys
    from rmqtool.errors import StoreError
    from rmqtool.store.rocksdbcq import RocksDbConsumeQueues

    monkeypatch.setitem(sys.modules, "rocksdict", None)
    with pytest.raises(StoreError, match=r"rmqtool\[rocksdb\]"):
        RocksDbConsumeQueues.read(DB)


# -- commands ------------------------------------------------------------------------------------------
STORE = store_path(SET)


def _read_commands(tmp: Path) -> list[tuple[int, tuple]]:
    """(exit status, arguments) of every read command on the store (and the refused rebuild dry run)."""
    return [
        (0, ("info", STORE, "-f", "json")), (0, ("verify", STORE)), (0, ("verify", STORE, "--check-crc")),
        (0, ("cat-cq", STORE, "TopicA", 1)), (0, ("cat-cq", STORE, "TopicA", 1, "--resolve")),
        (0, ("cat-cq", STORE, "TopicB", 0, "--message", "-f", "jsonl")), (0, ("stats", STORE)),
        (0, ("query-key", STORE, "TopicB", "key-82")), (0, ("cat-commitlog", STORE, "-n", 3)),
        (4, ("rebuild-cq", STORE, "--dry-run")), (0, ("rebuild-cq", STORE, "--out", tmp / "out")),
        (0, ("export", STORE, "--to", tmp / "export.parquet")), (0, ("checkpoint", STORE)),
        (0, ("export", STORE, "--topic", "TopicA", "--to", tmp / "topic.jsonl")),
        (0, ("export", STORE, "--topic", "TopicB", "--to", tmp / "dataset")),
    ]


def test_store_unchanged_by_every_read_command(tmp_path):
    before = tree(STORE)
    for status, args in _read_commands(tmp_path):
        res = run(*args)
        assert res.exit_code == status, (args, res.output)
        assert tree(STORE) == before, args


def test_verify_clean():
    res = run("verify", STORE, "-f", "jsonl")
    assert res.exit_code == 0, res.output


def test_cat_cq_every_unit():
    import json
    for q in _rb()["queues"]:
        res = run("cat-cq", STORE, q["topic"], q["queueId"], "--resolve", "-f", "jsonl")
        assert res.exit_code == 0, res.output
        rows = [json.loads(line) for line in res.stdout.splitlines()]
        assert [[r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"]] for r in rows] == _field(q, "units")
        assert {r["status"] for r in rows} == {"ok"}


def test_cat_cq_message_is_the_record():
    import json
    q = _rb()["queues"][4]
    qo, phy, size, _ = _field(q, "units")[7]
    res = run("cat-cq", STORE, q["topic"], q["queueId"], "--offset", qo, "-n", 1, "--message", "-f", "jsonl")
    row = json.loads(res.stdout)
    want = next(r for r in readback(SET)["commitlogRecords"] if r["physicalOffset"] == phy)
    assert (row["physical_offset"], row["queue_offset"], row["uniq_key"]) == (phy, qo, want["uniqKey"])


def test_deleted_topic_is_not_a_queue():
    res = run("cat-cq", STORE, "TopicTmp", 0)
    assert res.exit_code == 4 and "unknown topic 'TopicTmp'" in res.stderr


@pytest.mark.parametrize("args", [("rebuild-cq", "--apply"), ("rebuild-cq",),
                                  ("rebuild-cq", "--topic", "TopicA", "--apply"),
                                  ("put", "--topic", "TopicA", "--body", "x", "--apply"),
                                  ("put", "--topic", "TopicA", "--body", "x", "--dry-run")])
def test_writes_into_the_database_are_refused(store_copy, args):
    root = store_copy(SET)
    before = tree(root)
    res = run(args[0], root, *args[1:])
    assert res.exit_code == 4
    assert "RocksDB database" in res.stderr and "never writes into it" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert tree(root) == before


def test_rebuild_out_matches_the_database(tmp_path):
    """rebuild-cq --out writes classic file queues with the database's units (plus the deleted topic's)."""
    from rmqtool.store.filequeue import FileQueue
    from rmqtool.store.store import ConsumeQueue
    out = tmp_path / "cq"
    assert run("rebuild-cq", STORE, "--out", out).exit_code == 0
    for q in _rb()["queues"]:
        cq = ConsumeQueue(q["topic"], q["queueId"], FileQueue.from_dir(out / q["topic"] / str(q["queueId"])))
        assert [[qo, *u] for qo, u in cq.iter_units()] == _field(q, "units")
    assert sorted(p.name for p in out.iterdir()) == ["TopicA", "TopicB", "TopicTmp"]


def test_offsets_lag_from_the_database(store_copy):
    import json
    root = store_copy(SET)
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "consumerOffset.json").write_text(json.dumps(
        {"offsetTable": {"TopicA@g1": {"0": 5, "3": 24}, "TopicB@g1": {"1": 0}}}))
    res = run("offsets", root, "-f", "jsonl")
    assert res.exit_code == 0, res.output
    rows = {(r["topic"], r["queue_id"]): r for r in map(json.loads, res.stdout.splitlines())}
    assert (rows[("TopicA", 0)]["max_offset"], rows[("TopicA", 0)]["lag"]) == (21, 16)
    assert (rows[("TopicA", 3)]["lag"], rows[("TopicB", 1)]["lag"]) == (0, 20)


def test_verify_finds_a_missing_and_a_changed_unit(store_copy):
    from rocksdict import Options, Rdict
    from rmqtool.ops.verify import verify_store

    root = store_copy(SET)
    db = Rdict(str(root / "consumequeue"), options=Options(raw_mode=True),
               column_families={"offset": Options(raw_mode=True)})
    units = [decode_unit(k, v) for k, v in db.items()]
    gone, changed = units[5], units[40]
    del db[encode_unit(gone)[0]]
    key, value = encode_unit(changed._replace(size=changed.size + 1))
    db[key] = value
    db.close()
    kinds = {(f.kind, f.offset) for f in verify_store(str(root), jobs=1)}
    assert ("rocksdb_missing_unit", gone.physical_offset) in kinds
    assert ("rocksdb_unit_mismatch", changed.physical_offset) in kinds


def test_topics_count_the_database_queues_and_verify_stays_clean(store_copy):
    import json
    root = store_copy(SET)
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": {
        "TopicA": {"topicName": "TopicA", "readQueueNums": 4, "writeQueueNums": 4},
        "TopicB": {"topicName": "TopicB", "readQueueNums": 2, "writeQueueNums": 2}}}))
    rows = {r["topic"]: r for r in map(json.loads, run("topics", root, "-f", "jsonl").stdout.splitlines())}
    assert (rows["TopicA"]["queues_on_disk"], rows["TopicB"]["queues_on_disk"]) == (4, 2)
    assert run("verify", root).exit_code == 0     # TopicTmp, gone from the table, is a deleted topic
