"""Batch consume queues, inner batches, LMQ multi-dispatch and the dispatch function, against what the
5.3.3 broker wrote and read back (readback.json ``consumeQueues``, ``batchConsumeQueues``, ``lmq``)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import (BATCHCQ_SETS, CLEAN_SETS, DLEDGER_SETS, FEATURE_SETS, LMQ_SETS, manifest, readback,
                      run, store_path)
from helpers_dispatch import QueueLayout, layout_store, queue_file_bytes
from rmqtool import constants as C
from rmqtool.errors import FormatError
from rmqtool.format import batchcq as B
from rmqtool.format.batch import BatchItem, decode_batch, encode_batch, inner_messages, is_inner_batch
from rmqtool.format.commitlog import Message
from rmqtool.format.dispatch import dispatch, java_split, multi_dispatch_targets
from rmqtool.ops.query import lookup_key
from rmqtool.store.store import Store

DISPATCH_SETS = CLEAN_SETS + FEATURE_SETS


def _layout(name: str) -> tuple[Store, QueueLayout]:
    store = Store.open(store_path(name))
    batch_topics = set(store.batch_topics())
    layout = QueueLayout()
    for loc in store.commitlog.iter_entries(include_blank=False):
        layout.add_record(loc.entry, loc.offset, batch_cq=loc.entry.topic in batch_topics)
    return store, layout


def _bcq_row(u: dict) -> list:
    return [u["physOffset"], u["size"], u["tagsCode"], u["storeTime"], u["msgBaseOffset"], u["batchSize"],
            u["compactedOffset"], u["reserved"]]


@pytest.mark.parametrize("name", DISPATCH_SETS)
def test_dispatch_reproduces_every_queue(name):
    """Every record dispatched in commit-log order gives exactly the broker's CQ, BCQ and LMQ units."""
    _, layout = _layout(name)
    rb = readback(name)
    expected = {(q["topic"], q["queueId"]) for q in rb["consumeQueues"] + rb.get("batchConsumeQueues", [])
                if q["files"]}
    assert set(layout.queues) == expected
    for q in rb["consumeQueues"]:
        if not q["files"]:
            continue
        placed = layout.queues[(q["topic"], q["queueId"])]
        got = [[placed.first + i, *u] for i, u in enumerate(placed.units)]
        want = q["units[queueOffset,commitLogOffset,size,tagsCode]"]
        assert got[len(got) - len(want):] == want, q["topic"]
        assert placed.end == q["maxOffsetInQueue"]
    for q in rb.get("batchConsumeQueues", []):
        placed = layout.queues[(q["topic"], q["queueId"])]
        assert [list(u) for u in placed.units] == [_bcq_row(u) for u in q["units"]]


@pytest.mark.parametrize("name", BATCHCQ_SETS)
def test_batch_units_match_readback(name):
    store = Store.open(store_path(name))
    rb = readback(name)["batchConsumeQueues"]
    assert {(q.topic, q.queue_id) for q in store.batch_consume_queues()} == {(q["topic"], q["queueId"]) for q in rb}
    for q in rb:
        bcq = store.batch_consume_queue(q["topic"], q["queueId"])
        assert [f.path.name for f in bcq.queue] == q["files"]
        located = list(bcq.iter_units())
        assert [[f.path.name, pos, *u] for f, pos, u in located] == \
            [[u["file"], u["pos"], *_bcq_row(u)] for u in q["units"]]
        assert [B.encode_unit(u).hex() for _, _, u in located] == [u["hex"] for u in q["units"]]
        assert bcq.offsets() == (q["minOffsetInQueue"], q["maxOffsetInQueue"])
        units = bcq.units()
        lookups = next(v for k, v in q.items() if k.startswith("lookup"))
        assert [qo for qo, *_ in lookups] == list(range(q["minOffsetInQueue"], q["maxOffsetInQueue"]))
        for qo, *want in lookups:
            u = bcq.lookup(qo, units)
            assert [u.msg_base_offset, u.batch_size, u.physical_offset, u.size, u.tags_code, u.store_time] == want
        assert bcq.lookup(q["maxOffsetInQueue"], units) is None


@pytest.mark.parametrize("name", BATCHCQ_SETS)
def test_batch_files_reencode_exactly(name):
    for bcq in Store.open(store_path(name)).batch_consume_queues():
        for f in bcq.queue:
            data = f.path.read_bytes()
            assert b"".join(B.encode_unit(u) for u in B.decode_units(data)) == data


@pytest.mark.parametrize("name", BATCHCQ_SETS)
def test_inner_batches_unwrap_to_the_client_messages(name):
    store = Store.open(store_path(name))
    records = {r["physicalOffset"]: r for r in readback(name)["commitlogRecords"]}
    puts = [p for p in manifest(name)["puts"] if p["kind"].startswith("inner-batch")]
    assert puts
    for put in puts:
        offset = put["result"]["wroteOffset"]
        msg = store.commitlog.read_at(offset)
        rec = records[offset]
        assert is_inner_batch(msg) and msg.sys_flag & 0xC0 == 0xC0
        raw = base64.b64decode(put["input"]["encodedBatchBodyBase64"])
        assert msg.body == raw and encode_batch(decode_batch(raw)) == raw
        inner = inner_messages(msg)
        items = put["input"]["items"]
        assert [m.properties for m in inner] == [i["properties"] for i in items]
        assert [m.body for m in inner] == [base64.b64decode(i["bodyBase64"]) for i in items]
        assert [m.flag for m in inner] == [i["flag"] for i in items]
        base = rec["dispatchMsgBaseOffset"]
        assert len(inner) == rec["dispatchBatchSize"] == put["result"]["msgNum"]
        assert [m.queue_offset for m in inner] == list(range(base, base + len(inner)))
        assert base == put["result"]["logicsOffset"]


def test_cat_commitlog_unwrap():
    root = store_path("dev-batchcq-5x")
    rb = readback("dev-batchcq-5x")
    out = run("cat-commitlog", root, "--topic", "BatchTopic", "--unwrap", "-f", "jsonl")
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    want = []
    for r in rb["commitlogRecords"]:
        if r.get("topic") == "BatchTopic":
            n = r.get("dispatchBatchSize", 1)
            base = r.get("dispatchMsgBaseOffset", r["queueOffset"])
            want += [(r["physicalOffset"], r["queueId"], base + i, i if "dispatchBatchSize" in r else None)
                     for i in range(n)]
    assert [(r["physical_offset"], r["queue_id"], r["queue_offset"], r["inner_index"]) for r in rows] == want
    # each message of BatchTopic's queues, as the consumer sees it, sits where the queue's look-up says
    store = Store.open(root)
    for q in store.batch_consume_queues("BatchTopic"):
        units = q.units()
        for r in rows:
            if r["queue_id"] == q.queue_id:
                assert q.lookup(r["queue_offset"], units).physical_offset == r["physical_offset"]


@pytest.mark.parametrize("name", BATCHCQ_SETS)
def test_cat_cq_reads_batch_queues(name):
    q = max(readback(name)["batchConsumeQueues"], key=lambda q: len(q["units"]))
    out = run("cat-cq", store_path(name), q["topic"], q["queueId"], "--resolve", "-f", "json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [[r["physical_offset"], r["size"], r["tags_code"], r["store_timestamp"], r["queue_offset"],
             r["batch_size"], r["compacted_offset"]] for r in rows] == [_bcq_row(u)[:7] for u in q["units"]]
    assert {r["status"] for r in rows} == {"ok"}
    mid = q["units"][-1]
    out = run("cat-cq", store_path(name), q["topic"], q["queueId"],
              "--offset", mid["msgBaseOffset"] + mid["batchSize"] - 1, "-n", "1", "-f", "json")
    assert json.loads(out.output)[0]["physical_offset"] == mid["physOffset"]


def test_batch_unit_mismatch_is_reported(store_copy):
    root = store_copy("dev-batchcq-5x")
    path = root / "batchconsumequeue" / "BatchTopic" / "0" / "00000000000000000000"
    data = bytearray(path.read_bytes())
    data[36:38] = (3).to_bytes(2, "big")           # first unit: batchSize 5 -> 3
    path.write_bytes(bytes(data))
    out = run("cat-cq", root, "BatchTopic", "0", "--resolve", "-n", "1", "-f", "json")
    assert out.exit_code == 1
    assert json.loads(out.stdout)[0]["problems"] == ["batchSize 3 != 5 from the record"]


def test_truncated_batch_file_is_one_line_error(store_copy):
    root = store_copy("dev-batchcq-5x")
    path = root / "batchconsumequeue" / "BatchTopic" / "0" / "00000000000000000184"
    path.write_bytes(path.read_bytes()[:100])
    out = run("cat-cq", root, "BatchTopic", "0")
    assert out.exit_code != 0 and "Traceback" not in out.output
    assert f"{path}: offset 92: batch consume-queue file size 100 is not a multiple of 46" in out.stderr


# -- LMQ ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", LMQ_SETS)
def test_lmq_properties_and_offsets(name):
    rb = readback(name)["lmq"]
    store = Store.open(store_path(name))
    by_offset = {loc.offset: loc.entry for loc in store.commitlog.iter_entries(include_blank=False)}
    for rec in rb["multiDispatchRecords"]:
        msg = by_offset[rec["physicalOffset"]]
        props = msg.properties
        assert (msg.topic, msg.queue_id, msg.queue_offset) == (rec["topic"], rec["queueId"], rec["queueOffset"])
        assert props[C.PROPERTY_INNER_MULTI_DISPATCH] == rec["INNER_MULTI_DISPATCH"]
        assert props[C.PROPERTY_INNER_MULTI_QUEUE_OFFSET] == rec["INNER_MULTI_QUEUE_OFFSET"]
        names = rec["INNER_MULTI_DISPATCH"].split(",")
        offsets = rec["INNER_MULTI_QUEUE_OFFSET"].split(",")
        targets = multi_dispatch_targets(msg.topic, props)
        if "" in offsets:      # a non-LMQ name: empty field, and (Java split) no LMQ unit at all
            assert targets == [] and len(dispatch(msg)) == 1
        else:
            assert targets == list(zip(names, offsets))
            assert [(d.topic, d.queue_id, d.queue_offset) for d in dispatch(msg)[1:]] == \
                [(n, 0, int(o)) for n, o in zip(names, offsets)]
    assert any("" in r["INNER_MULTI_QUEUE_OFFSET"].split(",") for r in rb["multiDispatchRecords"])
    # getLmqQueueOffset after load = each LMQ consume queue's end
    ends = {q.topic: max((qo for qo, _ in q.iter_units()), default=-1) + 1
            for q in store.consume_queues() if q.topic.startswith(C.LMQ_PREFIX)}
    assert ends == rb["getLmqQueueOffset(after load)"]


@pytest.mark.parametrize("name", LMQ_SETS)
def test_cat_cq_resolves_lmq_units(name):
    store = Store.open(store_path(name))
    lmqs = [t for t in store.topics() if t.startswith(C.LMQ_PREFIX)]
    assert "%LMQ%房间3" in lmqs and "%LMQ%device%42" in lmqs
    for topic in lmqs:
        out = run("cat-cq", store_path(name), topic, "0", "--resolve", "-f", "json")
        assert out.exit_code == 0, out.output
        assert {r["status"] for r in json.loads(out.output)} == {"ok"}


def test_lmq_unit_in_the_wrong_queue_is_reported(store_copy):
    root = store_copy("dev-lmq-5x")
    src = root / "consumequeue" / "TopicA" / "0" / "00000000000000000000"
    dst = root / "consumequeue" / "%LMQ%room-1" / "0" / "00000000000000000000"
    dst.write_bytes(src.read_bytes()[:20] + dst.read_bytes()[20:])
    out = run("cat-cq", root, "%LMQ%room-1", "0", "--resolve", "-n", "1", "-f", "json")
    assert out.exit_code == 1
    assert "record topic is 'TopicA'" in json.loads(out.stdout)[0]["problems"]


@pytest.mark.parametrize("name", LMQ_SETS)
def test_query_key_on_lmq_names(name):
    store = Store.open(store_path(name))
    records = readback(name)["lmq"]["multiDispatchRecords"]
    rec = next(r for r in records if "" not in r["INNER_MULTI_QUEUE_OFFSET"].split(",")
               and "%LMQ%房间3" in r["INNER_MULTI_DISPATCH"])
    msg = store.commitlog.read_at(rec["physicalOffset"])
    found = lookup_key(store, "%LMQ%房间3", msg.uniq_key)
    assert found.via_queue and [o for o, _ in found.records] == [rec["physicalOffset"]]
    out = run("query-key", store_path(name), "%LMQ%房间3", msg.uniq_key, "-f", "json")
    assert out.exit_code == 0 and json.loads(out.stdout)[0]["physical_offset"] == rec["physicalOffset"]
    assert "not indexed" in out.stderr


# -- dispatch rules and codecs -----------------------------------------------------------------------
def _msg(**props) -> Message:
    raw = "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()
    return Message(topic="LmqParent", queue_id=3, queue_offset=9, physical_offset=100, properties_raw=raw)


def test_dispatch_rules():
    assert java_split("1,2,,", ",") == ["1", "2"] and java_split(",", ",") == [] and java_split("", ",") == []
    m = _msg(INNER_MULTI_DISPATCH="%LMQ%a,plain,x/y,%LMQ%b", INNER_MULTI_QUEUE_OFFSET="4,5,6,7")
    assert [(d.topic, d.queue_id, d.queue_offset) for d in dispatch(m)] == [
        ("LmqParent", 3, 9), ("%LMQ%a", 0, 4), ("plain", 3, 5), ("%LMQ%b", 0, 7)]
    stop = _msg(INNER_MULTI_DISPATCH="%LMQ%a,odd,%LMQ%b", INNER_MULTI_QUEUE_OFFSET="4,,7")
    assert [d.topic for d in dispatch(stop)] == ["LmqParent", "%LMQ%a"]
    prepared = Message(topic="T", sys_flag=int(C.TransactionType.PREPARED))
    assert dispatch(prepared) == []
    batch = _msg(INNER_NUM="4", INNER_BASE="20")
    (d,) = dispatch(batch, batch_cq=True)
    assert d.is_batch and (d.unit.msg_base_offset, d.unit.batch_size, d.unit.compacted_offset) == (20, 4, -1)
    (single,) = dispatch(_msg(), batch_cq=True)
    assert (single.unit.msg_base_offset, single.unit.batch_size) == (9, 1)
    with pytest.raises(FormatError, match="INNER_BASE"):
        dispatch(_msg(INNER_NUM="x", INNER_BASE="1"), batch_cq=True)


def test_layout_appends_as_the_queue_does():
    layout = QueueLayout()
    first = _msg(INNER_MULTI_DISPATCH="%LMQ%a", INNER_MULTI_QUEUE_OFFSET="5")
    later = Message(topic="LmqParent", queue_id=3, queue_offset=10, physical_offset=500,
                    properties_raw=b"INNER_MULTI_DISPATCH\x01%LMQ%a\x02INNER_MULTI_QUEUE_OFFSET\x017\x02")
    assert layout.add_record(first) == [9, 5]
    assert layout.add_record(later) == [10, 6]      # asks for 7, lands at the end (6)
    assert layout.add_record(first) == [None, None]  # a repeat


@given(st.builds(B.BatchCqUnit, st.integers(-2**63, 2**63 - 1), st.integers(-2**31, 2**31 - 1),
                 st.integers(-2**63, 2**63 - 1), st.integers(-2**63, 2**63 - 1), st.integers(-2**63, 2**63 - 1),
                 st.integers(-2**15, 2**15 - 1), st.integers(-2**31, 2**31 - 1), st.integers(-2**31, 2**31 - 1)))
def test_batch_unit_roundtrip(unit):
    raw = B.encode_unit(unit)
    assert len(raw) == 46 and B.decode_unit(raw) == unit and B.decode_units(raw * 2) == [unit, unit]


@given(st.lists(st.builds(BatchItem, st.binary(max_size=60), st.binary(max_size=40),
                          st.integers(-2**31, 2**31 - 1)), max_size=6))
def test_batch_body_roundtrip(items):
    raw = encode_batch(items)
    assert decode_batch(raw) == items and encode_batch(decode_batch(raw)) == raw
    if raw:
        with pytest.raises(FormatError):
            decode_batch(raw[:-1])


@given(bases=st.lists(st.integers(1, 9), min_size=1, max_size=8), probe=st.integers(0, 80))
def test_find_unit(bases, probe):
    units, at = [], 0
    for size in bases:
        units.append(B.BatchCqUnit(at * 10, 1, 0, 0, at, size))
        at += size
    i = B.find_unit(units, probe)
    covering = [j for j, u in enumerate(units) if u.covers(probe)]
    assert ([i] if i is not None else []) == covering


def test_dledger_sets_are_dispatched_too():
    assert set(DLEDGER_SETS) <= set(DISPATCH_SETS)


@pytest.mark.parametrize("name", DISPATCH_SETS)
def test_layout_files_are_the_brokers_files(name):
    """The queue files built from the dispatched units (fillers, zero tails) equal the broker's, byte for
    byte: consume queues, LMQ queues and batch consume queues, and no queue more or less."""
    store = Store.open(store_path(name))
    layout = layout_store(store)
    on_disk = {(q.topic, q.queue_id): q.queue for q in store.consume_queues()}
    on_disk.update({(q.topic, q.queue_id): q.queue for q in store.batch_consume_queues()})
    assert set(layout.queues) == set(on_disk)
    for key, placed in layout.queues.items():
        files = {f.start: f.path.read_bytes() for f in on_disk[key]}
        assert queue_file_bytes(placed, on_disk[key].file_size) == files, key
