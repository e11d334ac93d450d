"""Every record, consume-queue unit, index header and index look-up of the real-broker fixtures equals
what RocketMQ itself read back (readback.json / recovery-readback.json)."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import zlib

import pytest

from conftest import ALL_SETS, CLEAN_SETS, CRASH_SETS, FIXTURES, index_queries, readback, store_path
from rmqtool.errors import FormatError
from rmqtool.format.commitlog import Blank
from rmqtool.format.java import body_crc
from rmqtool.store.store import Store, query_index

# (set name, store directory the readback describes)
READBACK_STORES = [(n, store_path(n)) for n in CLEAN_SETS] + \
    [(n, FIXTURES / n / "recovered-store") for n in CRASH_SETS]


def _host_matches(host, expected: dict) -> bool:
    return (host.address == ipaddress.ip_address(expected["ip"]).packed and host.port == expected["port"]
            and host.ipv6 == expected["ipv6"])


@pytest.mark.parametrize("name,path", READBACK_STORES, ids=[n for n, _ in READBACK_STORES])
def test_every_record_matches_readback(name, path):
    expected = readback(name)["commitlogRecords"]
    # Recovered torn stores keep the torn record's first bytes past the logical end: the broker's
    # reader stops at the first invalid record, and so does this walk.
    got = list(Store.open(path).commitlog.iter_entries(check_crc=True, stop_at_damage=name.endswith("torn")))
    assert len(got) == len(expected)
    assert got[-1].offset + got[-1].entry.total_size == readback(name)["maxPhyOffset"]
    for loc, exp in zip(got, expected):
        entry = loc.entry
        assert loc.offset == exp["physicalOffset"]
        assert entry.total_size == exp["totalSize"]
        assert f"0x{entry.magic_code:08x}" == exp["magicCode"]
        if exp["type"] == "BLANK":
            assert isinstance(entry, Blank) and entry.total_size == exp["blankLength"]
            continue
        props = entry.properties
        assert exp["type"] == "MESSAGE"
        assert entry.physical_offset == exp["physicalOffset"]
        assert entry.version == (2 if exp.get("version") == "V2" else 1)
        assert entry.topic == exp["topic"]
        assert entry.queue_id == exp["queueId"]
        assert entry.queue_offset == exp["queueOffset"]
        assert entry.sys_flag == exp["sysFlag"]
        assert entry.born_timestamp == exp["bornTimestamp"]
        assert entry.store_timestamp == exp["storeTimestamp"]
        assert _host_matches(entry.born_host, exp["bornHost"])
        assert _host_matches(entry.store_host, exp["storeHost"])
        assert entry.tags_code() == exp["tagsCode"]
        assert props.get("KEYS") == (exp["keys"] or None)
        assert entry.uniq_key == exp["uniqKey"]
        assert entry.msg_id == exp["msgId"]
        assert entry.body_crc == exp["bodyCRC"] == (body_crc(entry.body) if entry.body else entry.body_crc)
        assert entry.flag == exp["flag"]
        assert entry.reconsume_times == exp["reconsumeTimes"]
        assert entry.prepared_transaction_offset == exp["preparedTransactionOffset"]
        assert props == exp["properties"]
        assert len(entry.body) == exp["bodyLength"]
        assert hashlib.sha256(entry.body).hexdigest() == exp["bodySha256"]
        if "bodyBase64" in exp:
            assert entry.body == base64.b64decode(exp["bodyBase64"])
        if "compressionType" in exp:
            plain = entry.decompressed_body()
            assert entry.compressed
            assert len(plain) == exp["decompressedBodyLength"]
            assert hashlib.sha256(plain).hexdigest() == exp["decompressedBodySha256"]


@pytest.mark.parametrize("name,path", READBACK_STORES, ids=[n for n, _ in READBACK_STORES])
def test_consume_queue_units_match_readback(name, path):
    store = Store.open(path)
    end = readback(name)["maxPhyOffset"]
    for exp in readback(name)["consumeQueues"]:
        if not exp["files"]:   # queues the broker created in memory only (delay levels): no files
            assert not (store.consumequeue_dir / exp["topic"] / str(exp["queueId"])).exists()
            continue
        cq = store.consume_queue(exp["topic"], exp["queueId"])
        assert [f.path.name for f in cq.queue] == exp["files"]
        units = [[qo, u.physical_offset, u.size, u.tags_code] for qo, u in cq.iter_units(commitlog_end=end)]
        want = exp["units[queueOffset,commitLogOffset,size,tagsCode]"]
        # The broker's view starts at minOffsetInQueue; units before it are fillers.
        assert units[len(units) - len(want):] == want
        assert len(units) == exp["maxOffsetInQueue"]
        if units:
            last = units[-1]
            assert last[1] + last[2] == exp["maxPhysicOffset"]
    listed = {(q["topic"], q["queueId"]) for q in readback(name)["consumeQueues"] if q["files"]}
    assert {(q.topic, q.queue_id) for q in store.consume_queues()} == listed


@pytest.mark.parametrize("name,path", READBACK_STORES, ids=[n for n, _ in READBACK_STORES])
def test_index_headers_match_readback(name, path):
    refs = Store.open(path).index_files()
    expected = readback(name)["indexFiles"]
    assert [r.name for r in refs] == [e["file"] for e in expected]
    for ref, exp in zip(refs, expected):
        h = ref.header
        assert (h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset) == (
            exp["beginTimestamp"], exp["endTimestamp"], exp["beginPhyOffset"], exp["endPhyOffset"])
        assert h.hash_slot_count == int(exp["hashSlotCount"])
        assert max(h.index_count, 1) == exp["indexCount"]   # loaded headers treat <= 0 as 1


@pytest.mark.parametrize("name,path", READBACK_STORES, ids=[n for n, _ in READBACK_STORES])
def test_index_lookups_match_broker(name, path):
    refs = Store.open(path).index_files()
    queries = index_queries(readback(name))
    assert queries
    for q in queries:
        hits = [phy for phy, _ in query_index(refs, q["topic"], q["key"])]
        assert sorted(hits) == q["phyOffsets"], q["indexKey"]


def test_index_geometry_inferred_from_files():
    assert {r.geometry for r in Store.open(store_path("dev-sample")).index_files()} == {(16, 64)}
    assert {r.geometry for r in Store.open(store_path("dev-sample-crash")).index_files()} == {(23, 100)}


@pytest.mark.parametrize("name,path", READBACK_STORES, ids=[n for n, _ in READBACK_STORES])
def test_checkpoint_matches_readback(name, path):
    cp = Store.open(path).checkpoint()
    exp = readback(name)["checkpointAfterShutdown"]
    assert cp.physic_msg_timestamp == exp["physicMsgTimestamp"]
    assert cp.logics_msg_timestamp == exp["logicsMsgTimestamp"]
    assert cp.index_msg_timestamp == exp["indexMsgTimestamp"]
    assert cp.min_timestamp == exp["minTimestamp"]
    assert cp.min_timestamp_index == exp["minTimestampIndex"]
    for field in ("masterFlushedOffset", "confirmPhyOffset"):
        if field in exp:
            assert getattr(cp, "master_flushed_offset" if field == "masterFlushedOffset"
                           else "confirm_phy_offset") == exp[field]


@pytest.mark.parametrize("name", CRASH_SETS)
def test_checkpoint_before_recovery(name):
    before = readback(name)["beforeRecovery"]
    store = Store.open(store_path(name))
    assert store.abort_path.exists() == before["abortFileExisted"]
    cp = store.checkpoint()
    exp = before["checkpointBeforeRecovery"]
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (
        exp["physicMsgTimestamp"], exp["logicsMsgTimestamp"], exp["indexMsgTimestamp"])


@pytest.mark.parametrize("name", ALL_SETS)
def test_manifest_puts_are_found_at_their_offsets(name):
    """Every acknowledged put is a record at the broker's wroteOffset with its msgId and store time."""
    from conftest import manifest
    store = Store.open(store_path(name))
    tear = FIXTURES / name / "tear.json"
    torn = json.loads(tear.read_text())["tornRecordPhysicalOffset"] if tear.exists() else None
    for put in manifest(name)["puts"]:
        result = put["result"]
        if result.get("putMessageStatus") != "PUT_OK":
            continue
        if result["wroteOffset"] == torn:   # the record the tear destroyed
            with pytest.raises(FormatError) as err:
                store.commitlog.read_at(torn)
            assert err.value.offset == torn
            continue
        msg = store.commitlog.read_at(result["wroteOffset"])
        assert msg.msg_id == result["msgId"].split(",")[0]
        assert msg.store_timestamp == result["storeTimestamp"]
        if result.get("msgNum", 1) == 1:
            assert msg.total_size == result["wroteBytes"]
        if put["kind"] not in ("txn-half", "raw") and put.get("input", {}).get("sysFlag", 0) & 0xC not in (4, 0xC):
            assert msg.queue_offset == result["logicsOffset"]
        assert zlib.crc32(msg.body) & 0x7FFFFFFF == msg.body_crc
