"""put/import into DLedger stores, BatchCQ topics and LMQ: what rmqtool writes is what the broker wrote,
byte for byte (DLedger data and index files, checkpoint, consume and batch consume queues)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DLEDGER_SETS, manifest, readback, run, store_path
from helpers_readback import assert_record_matches
from rmqtool.errors import UnsafeWrite
from rmqtool.format.commitlog import Message
from rmqtool.format.hosts import Host
from rmqtool.format.indexfile import Geometry
from rmqtool.ops.dledger import check_dledger, plan_dledger_recovery
from rmqtool.store.metadata import batch_cq_topics
from rmqtool.format.rows import entry_row
from rmqtool.ops.write import StoreWriter, build_message, init_store, message_from_row, with_inner_base
from rmqtool.store.store import Store
from test_columnar import assert_parity

GEOMETRY = dict(commitlog_file_size=65536, cq_file_size=160, geometry=Geometry(16, 64))


def _files(root, sub: str) -> dict[str, bytes]:
    base = root / sub
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()} \
        if base.is_dir() else {}


def _import_all(src: Store, dst_root, **writer) -> None:
    w = StoreWriter(Store.open(dst_root), **writer)
    for loc in src.commitlog.iter_entries(include_blank=False):
        w.append(message_from_row(entry_row(loc.entry, loc.offset, body_encoding="base64")))
    w.commit()


@pytest.mark.parametrize("name", DLEDGER_SETS)
def test_dledger_import_is_byte_identical(name, tmp_path):
    src = Store.open(store_path(name))
    dst = tmp_path / "s"
    init_store(dst, **GEOMETRY, dledger_self_id="n0", dledger_index_file_size=2048)
    _import_all(src, dst)
    for sub in ("dledger-n0/data", "dledger-n0/index", "consumequeue"):
        assert _files(dst, sub) == _files(src.root, sub), sub
    for name_ in ("checkpoint", "checkpoint.bak", "currterm"):
        assert (dst / "dledger-n0" / name_).read_bytes() == (src.root / "dledger-n0" / name_).read_bytes()
    got = list(Store.open(dst).commitlog.iter_entries(check_crc=True, include_blank=False))
    for loc, exp in zip(got, readback(name)["commitlogRecords"], strict=True):
        assert_record_matches(loc.offset, loc.entry, exp)
    assert check_dledger(Store.open(dst), deep=True) == []


def test_put_appends_to_a_dledger_store(store_copy):
    root = store_copy("dev-dledger")
    before = readback("dev-dledger")["dledgerStore"]
    for i in range(40):                                 # enough to fill the second data file's tail
        result = run("put", root, "--topic", "TopicA", "--queue-id", "1", "--key", f"k{i}", "--body", "x" * 900,
                     "--apply")
        assert result.exit_code == 0, result.stderr
    store = Store.open(root)
    assert check_dledger(store, deep=True) == []
    entries = [le for le in store.commitlog.iter_ledger() if le.blank is None]
    assert entries[-1].header.index == before["ledgerEndIndex"] + 40
    assert len(list((root / "dledger-n0" / "data").iterdir())) == 3
    rows = [json.loads(line) for line in run("cat-commitlog", root, "--topic", "TopicA", "--queue-id", "1",
                                             "-f", "jsonl").stdout.splitlines()]
    assert [r["queue_offset"] for r in rows] == list(range(len(rows)))
    assert rows[-1]["physical_offset"] == entries[-1].pos + 48
    assert store.dledger.checkpoint().end_index == entries[-1].header.index


def test_put_refuses_a_damaged_dledger_log(store_copy):
    root = store_copy("dev-dledger")
    index = root / "dledger-n0" / "index" / "00000000000000000000"
    data = bytearray(index.read_bytes())
    data[40] ^= 1
    index.write_bytes(bytes(data))
    with pytest.raises(UnsafeWrite, match="dledger_index_mismatch"):
        StoreWriter(Store.open(root))


@pytest.mark.parametrize("name", ["dev-batchcq-5x", "dev-config-5x", "dev-lmq-5x", "dev-timer-5x"])
def test_feature_import_is_byte_identical(name, tmp_path):
    """BatchCQ topics (from batchconsumequeue/ of the source, config/topics.json of the target) and LMQ
    multi-dispatch: commit log, consume queues and batch consume queues as the broker wrote them."""
    src = Store.open(store_path(name))
    dst = tmp_path / "s"
    init_store(dst, **GEOMETRY)
    sizes = {q.queue.file_size for q in src.batch_consume_queues()}
    _import_all(src, dst, batch_topics=src.batch_topics(), bcq_file_size=max(sizes) if sizes else None)
    for sub in ("commitlog", "consumequeue", "batchconsumequeue"):
        assert _files(dst, sub) == _files(src.root, sub), sub


def test_batch_topics_come_from_the_topic_table(tmp_path):
    dst = tmp_path / "s"
    init_store(dst, **GEOMETRY)
    (dst / "config" / "topics.json").write_bytes((store_path("dev-config-5x") / "config" / "topics.json").read_bytes())
    assert "BatchTopic" in StoreWriter(Store.open(dst)).batch_topics
    assert batch_cq_topics(Store.open(store_path("dev-config-5x"))) == {"BatchTopic"}


def _message(put: dict) -> Message:
    """The message a put handed to the store (bodies over 1 KiB are listed by length only: zeros)."""
    inp, hook = put["input"], put.get("afterBrokerHook") or {}
    if "encodedBatchBodyBase64" in inp:
        body = base64.b64decode(inp["encodedBatchBodyBase64"])
    else:
        body = base64.b64decode(inp["bodyBase64"]) if "bodyBase64" in inp else bytes(inp["bodyLength"])
    props = hook.get("propertiesString", inp["propertiesString"])
    v6 = (0x10 if inp["bornHost"]["ipv6"] else 0) | (0x20 if inp["storeHost"]["ipv6"] else 0)   # set by the broker
    return Message(topic=hook.get("topic", inp["topic"]), queue_id=hook.get("queueId", inp["queueId"]), body=body,
                   properties_raw=props.encode(), flag=inp["flag"], sys_flag=inp["sysFlag"] | v6,
                   born_timestamp=inp["bornTimestamp"], born_host=_host(inp["bornHost"]),
                   store_host=_host(inp["storeHost"]), store_timestamp=put["result"]["storeTimestamp"])


def _host(h: dict) -> Host:
    return Host.parse(f"[{h['ip']}]:{h['port']}" if h["ipv6"] else f"{h['ip']}:{h['port']}")


def test_put_adds_lmq_offsets_as_the_broker_does(tmp_path):
    """Puts without INNER_MULTI_QUEUE_OFFSET get it (empty for the non-LMQ name) in the stored bytes."""
    name = "dev-lmq-5x"
    dst = tmp_path / "s"
    init_store(dst, **GEOMETRY)
    src = Store.open(store_path(name))
    w = StoreWriter(Store.open(dst))
    puts = [p for p in manifest(name)["puts"] if p["result"].get("putMessageStatus") == "PUT_OK"]
    assert any("INNER_MULTI_QUEUE_OFFSET" not in p["input"]["propertiesString"]
               and "INNER_MULTI_DISPATCH" in p["input"]["propertiesString"] for p in puts)
    for put in puts:
        stored = w.append(_message(put))
        assert stored.physical_offset == put["result"]["wroteOffset"]
        assert stored.properties_raw == src.commitlog.read_at(stored.physical_offset).properties_raw
    w.commit()
    assert _files(dst, "consumequeue") == _files(src.root, "consumequeue")


def test_inner_base_added_as_the_broker_does():
    """INNER_BASE put into the properties map and re-serialized in HashMap order, as stored."""
    store = Store.open(store_path("dev-batchcq-5x"))
    puts = [p for p in manifest("dev-batchcq-5x")["puts"] if p["kind"].startswith("inner-batch")]
    for put in puts:
        msg = _message(put)
        assert b"INNER_BASE" not in msg.properties_raw
        stored = with_inner_base(msg, put["result"]["logicsOffset"])
        assert stored.properties_raw == store.commitlog.read_at(put["result"]["wroteOffset"]).properties_raw
        assert with_inner_base(stored, put["result"]["logicsOffset"]) is stored


@settings(max_examples=25, deadline=None)
@given(bodies=st.lists(st.binary(max_size=400), min_size=1, max_size=30),
       data_size=st.sampled_from([1024, 1500]), index_size=st.sampled_from([64, 96, 320]))
def test_written_dledger_logs_read_back(tmp_path_factory, bodies, data_size, index_size):
    """Any geometry: entries, BLANKs at file ends, index units across index files, all read back clean
    by both decoders, and the recovery plan keeps everything."""
    root = tmp_path_factory.mktemp("d") / "s"
    init_store(root, commitlog_file_size=data_size, cq_file_size=100, geometry=Geometry(5, 12),
               dledger_self_id="n7", dledger_index_file_size=index_size)
    w = StoreWriter(Store.open(root))
    for i, body in enumerate(bodies):
        w.append(build_message("T", body, queue_id=i % 2, keys=f"k{i}", store_timestamp=1_700_000_000_000 + i))
    w.commit()
    store = Store.open(root)
    assert [m.body for m in store.commitlog.iter_messages(check_crc=True)] == bodies
    assert check_dledger(store, deep=True) == []
    assert_parity(root, batch_rows=3)
    plan = plan_dledger_recovery(store)
    assert plan.end_index == len(bodies) - 1 and not (plan.data_cut or plan.index_rewrite or plan.index_cut)
    assert store.dledger.currterm() == (0, "n7")


def test_put_to_a_batch_topic(store_copy):
    root = store_copy("dev-batchcq-5x")
    bcq = Store.open(root).batch_consume_queue("BatchTopic", 1)
    end = bcq.offsets()[1]
    result = run("put", root, "--topic", "BatchTopic", "--queue-id", "1", "--tag", "TagZ", "--body", "one", "--apply")
    assert result.exit_code == 0, result.stderr
    store = Store.open(root)
    units = store.batch_consume_queue("BatchTopic", 1).units()
    msg = store.commitlog.read_at(units[-1].physical_offset)
    assert (units[-1].msg_base_offset, units[-1].batch_size, msg.queue_offset) == (end, 1, end)
    assert units[-1].tags_code == msg.tags_code() and units[-1].store_time == msg.store_timestamp
    assert not (root / "consumequeue" / "BatchTopic").exists()
    rows = json.loads(run("cat-cq", root, "BatchTopic", "1", "--resolve", "-f", "json").stdout)
    assert {r["status"] for r in rows} == {"ok"} and rows[-1]["queue_offset"] == end


def _java_expected_crc(record: bytes) -> int | None:
    """CommitLog.checkMessageAndReturnSize's forceVerifyPropCRC reading of __CRC32#, written out here."""
    marker = record.rfind(b"__CRC32#\x01")
    if marker < 0:
        return None
    digits = record[marker + 9:record.index(b"\x02", marker)].decode()
    expected = 0
    for ch in reversed(digits):
        expected = expected * 10 + (ord(ch) - 48)
    return expected


@pytest.mark.parametrize("dledger", [False, True])
def test_whole_record_crc_written_and_checked(tmp_path, dledger):
    """A store that uses enabledAppendPropCRC (5.2+): put/import append __CRC32# (UtilAll.crc32 of the
    record minus its 20-byte tail, digits least significant first) and verify --check-crc checks it."""
    import zlib

    from rmqtool.format.commitlog import CRC32_RESERVED_LEN
    from rmqtool.ops.verify import verify_store

    root = tmp_path / "s"
    init_store(root, commitlog_file_size=65536, cq_file_size=160, geometry=Geometry(16, 64),
               **({"dledger_self_id": "n0", "dledger_index_file_size": 2048} if dledger else {}))
    w = StoreWriter(Store.open(root))
    assert not w.prop_crc
    w.prop_crc = True             # as a broker with enabledAppendPropCRC writes: the store then uses it
    w.append(build_message("TopicA", b"first", tags="t", keys="k1", store_timestamp=1_795_000_000_000))
    w.commit()
    assert run("put", root, "--topic", "TopicB", "--body", "second", "--key", "k2", "--apply").exit_code == 0
    src = Store.open(store_path("dev-sample-5x"))
    w = StoreWriter(Store.open(root))
    assert w.prop_crc
    for loc in list(src.commitlog.iter_entries(include_blank=False))[:20]:      # import: rows of another store
        w.append(message_from_row(entry_row(loc.entry, loc.offset, body_encoding="base64")))
    w.commit()
    store = Store.open(root)
    records = []
    for loc in store.commitlog.iter_entries(include_blank=False, check_crc=True):
        f, pos = store.commitlog.queue.locate(loc.offset)
        records.append((loc.offset, f, pos, bytes(f.read()[pos:pos + loc.entry.total_size])))
    assert len(records) == 22
    for _, _, _, record in records:
        assert record.endswith(b"\x02") and record[-CRC32_RESERVED_LEN:].startswith(b"__CRC32#\x01")
        assert record.count(b"__CRC32#") == 1
        assert _java_expected_crc(record) == zlib.crc32(record[:-CRC32_RESERVED_LEN]) & 0x7FFFFFFF
    assert [f.kind for f in verify_store(root, deep=True, jobs=1)] == []
    offset, f, pos, record = records[5]
    data = bytearray(f.path.read_bytes())
    data[pos + 16] ^= 1                    # a bit of the flag field: the body CRC cannot see it
    f.path.write_bytes(bytes(data))
    found = [x for x in verify_store(root, deep=True, jobs=1) if x.kind == "prop_crc_mismatch"]
    assert [(x.severity, x.offset) for x in found] == [("warning", offset)]
    assert [x.kind for x in verify_store(root, deep=False, jobs=1)] == []


def test_put_leaves_out_the_crc_property_in_a_store_without_it(store_copy):
    root = store_copy("dev-sample-5x")
    result = run("put", root, "--topic", "TopicA", "--body", "x", "--property", "__CRC32#=0000000000", "--apply")
    assert result.exit_code == 0, result.output
    last = list(Store.open(root).commitlog.iter_messages())[-1]
    assert b"__CRC32#" not in last.properties_raw


@given(st.integers(0, 2**31 - 1), st.binary(max_size=60))
def test_crc32_property_codec_round_trip(crc, props):
    from rmqtool.format.commitlog import (CRC32_RESERVED_LEN, encode_crc32_property, reserve_crc32,
                                          stored_crc32, without_crc32)

    tail = encode_crc32_property(crc)
    assert len(tail) == CRC32_RESERVED_LEN and stored_crc32(b"x" + tail) == crc
    props = props.replace(b"__CRC32#", b"")
    reserved = reserve_crc32(props)
    assert stored_crc32(reserved) == 0 and without_crc32(reserved) == props + (b"" if not props or
                                                                              props.endswith(b"\x02") else b"\x02")
