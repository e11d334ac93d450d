"""Every record, consume-queue unit, index header and index look-up of the real-broker fixtures equals
what RocketMQ itself read back (readback.json / recovery-readback.json)."""

from __future__ import annotations

import json
import zlib

import pytest

from conftest import (ALL_SETS, CLEAN_SETS, CRASH_SETS, DLEDGER_CRASH_SETS, FEATURE_SETS, FIXTURES, index_queries,
                      readback, store_path)
from helpers_readback import assert_record_matches
from rmqtool.errors import FormatError
from rmqtool.store.store import Store, query_index

# (set name, store directory the readback describes)
READBACK_STORES = [(n, store_path(n)) for n in CLEAN_SETS + FEATURE_SETS] + \
    [(n, FIXTURES / n / "recovered-store") for n in CRASH_SETS + DLEDGER_CRASH_SETS]


@pytest.mark.parametrize("name,path", READBACK_STORES, ids=[n for n, _ in READBACK_STORES])
def test_every_record_matches_readback(name, path):
    expected = readback(name)["commitlogRecords"]
    # Recovered torn stores keep the torn record's first bytes past the logical end: the broker's
    # reader stops at the first invalid record, and so does this walk. DLedger readbacks list BLANKs apart.
    got = list(Store.open(path).commitlog.iter_entries(check_crc=True, stop_at_damage=name.endswith("torn"),
                                                       include_blank="dledgerBlanks" not in readback(name)))
    assert len(got) == len(expected)
    assert got[-1].offset + got[-1].entry.total_size == readback(name)["maxPhyOffset"]
    for loc, exp in zip(got, expected):
        assert_record_matches(loc.offset, loc.entry, exp)


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
