"""put and import write the bytes given, as a producer sends them and the store's broker stores them (store
host, UNIQ_KEY, CLUSTER, property order); query-id finds a UNIQ_KEY under every topic the store knows; a
queue file given to cat-cq is that file (#34 items 4-6)."""

from __future__ import annotations

import base64
import json
import os

import pytest

from conftest import readback, run, store_path
from rmqtool.format.java import java_string_hash
from rmqtool.format.msgid import decode_uniq_key, encode_uniq_key, month_start_ms
from rmqtool.store.store import Store

PINNED = "2026-11-28T10:00:00Z"          # day 28: the month-start difference passes 2^31 ms
PINNED_MS = 1_795_860_000_000


def _write(*args):
    """Every in-place write of this module (put, import) goes through here: it writes (--apply)."""
    return run(*args, "--apply")


def _rows(store, *args) -> list[dict]:
    res = run("cat-commitlog", store, "-f", "jsonl", *args)
    assert res.exit_code == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def _records(name: str) -> list[dict]:
    return [r for r in _rows(store_path(name)) if r["type"] == "message"]


# -- query-id: every topic the store knows -----------------------------------------------------------
def test_query_id_finds_a_batchcq_topics_uniq_key():
    records = [r for r in _records("dev-batchcq-5x") if r["topic"].startswith("BatchTopic")]
    assert {r["topic"] for r in records} == {"BatchTopic", "BatchTopic2"}
    for r in records:
        res = run("query-id", store_path("dev-batchcq-5x"), r["uniq_key"], "-f", "jsonl")
        assert res.exit_code == 0, res.stderr
        assert [row["physical_offset"] for row in map(json.loads, res.stdout.splitlines())] == [r["physical_offset"]]


def test_query_id_miss_names_the_topics_searched():
    pytest.importorskip("rocksdict")
    store = store_path("dev-rocksdbcq-5x")
    (tmp,) = [r for r in _records("dev-rocksdbcq-5x") if r["topic"] == "TopicTmp"][:1]   # a deleted topic
    res = run("query-id", store, tmp["uniq_key"])
    assert res.exit_code == 1
    assert "under 2 topic(s) (TopicA, TopicB)" in res.stderr and "--scan" in res.stderr
    for extra in (["--topic", "TopicTmp"], ["--scan"]):
        found = run("query-id", store, tmp["uniq_key"], "-f", "jsonl", *extra)
        assert json.loads(found.stdout)["physical_offset"] == tmp["physical_offset"], extra


# -- UNIQ_KEY: MessageClientIDSetter ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x"])
def test_uniq_key_encoder_gives_back_every_real_key(name):
    """Decoded and encoded again, each UNIQ_KEY a real client made is the same text (the time taken from
    the record's born time and the month start its difference counts from)."""
    for r in readback(name)["commitlogRecords"]:
        key = r.get("uniqKey")
        if not key:
            continue
        u = decode_uniq_key(key)
        created = u.timestamp(r["bornTimestamp"])
        ip = bytes.fromhex(key[:-24])
        assert encode_uniq_key(ip, u.pid, u.class_loader_hash, created, created - u.time_diff, u.counter) == key


# -- put ---------------------------------------------------------------------------------------------
@pytest.fixture
def sample_5x(store_copy):
    return store_copy("dev-sample-5x")


def test_put_takes_store_host_and_cluster_from_the_store(sample_5x):
    stored = readback("dev-sample-5x")["commitlogRecords"][-1]
    host = f"{stored['storeHost']['ip']}:{stored['storeHost']['port']}"
    assert host != "127.0.0.1:10911"
    res = _write("put", sample_5x, "--topic", "TopicA", "--body", "x", "-f", "jsonl")
    assert res.exit_code == 0, res.stderr
    row = _rows(sample_5x)[-1]
    assert (row["store_host"], row["born_host"]) == (host, f"{stored['storeHost']['ip']}:0")
    assert row["properties"]["CLUSTER"] == stored["properties"]["CLUSTER"]
    assert row["msg_id"] == json.loads(res.stdout)["msg_id"] and row["msg_id"].startswith("C0A8000A00002A9F")
    assert run("verify", sample_5x).exit_code == 0
    res = _write("put", sample_5x, "--topic", "TopicA", "--body", "y", "--store-host", "10.1.2.3:10912",
                 "--born-host", "[fd00::7]:4242")
    assert res.exit_code == 0, res.stderr
    row = _rows(sample_5x)[-1]
    assert (row["store_host"], row["born_host"]) == ("10.1.2.3:10912", "[fd00::7]:4242")
    assert len(row["uniq_key"]) == 56 and decode_uniq_key(row["uniq_key"]).ip == "fd00::7"


@pytest.mark.parametrize("host", ["10.20.30.40:10922", "[fd00:1234::10]:10911"])
def test_put_into_a_store_of_another_host_takes_its_host(tmp_path, host):
    store = tmp_path / "s"
    assert run("init", store, "--commitlog-file-size", "65536", "--cq-file-size", "160", "--slots", "16",
               "--max-entries", "64").exit_code == 0
    (tmp_path / "r.jsonl").write_text(json.dumps({"topic": "A", "body": "eA==", "store_host": host}) + "\n")
    assert _write("import", store, tmp_path / "r.jsonl").exit_code == 0
    assert _write("put", store, "--topic", "B", "--body", "y").exit_code == 0
    row = _rows(store)[-1]
    ip = host.rpartition(":")[0].strip("[]")
    assert (row["store_host"], decode_uniq_key(row["uniq_key"]).ip) == (host, ip)
    assert run("query-id", store, row["uniq_key"]).exit_code == 0
    assert run("query-id", store, row["msg_id"], "--kind", "msg-id").exit_code == 0


def test_put_takes_cluster_from_a_record_the_broker_sent(store_copy):
    """dev-dledger's newest record is a batch's inner message (the client's properties, no CLUSTER)."""
    store = store_copy("dev-dledger")
    assert "CLUSTER" not in _rows(store)[-1]["properties"]
    assert _write("put", store, "--topic", "TopicA", "--body", "x").exit_code == 0
    assert _rows(store)[-1]["properties"]["CLUSTER"] == "DefaultCluster"


def test_put_uniq_key_is_found_by_query_id_and_decoded(sample_5x):
    res = _write("--now", PINNED, "put", sample_5x, "--topic", "TopicB", "--body", "x", "-f", "jsonl")
    assert res.exit_code == 0, res.stderr
    put = json.loads(res.stdout)
    found = run("query-id", sample_5x, put["uniq_key"], "--kind", "uniq-key", "-f", "jsonl")
    assert found.exit_code == 0, found.stderr
    assert json.loads(found.stdout)["physical_offset"] == put["physical_offset"]
    decoded = json.loads(run("--now", "2026-11-28T10:05:00Z", "decode-id", put["uniq_key"], "-f", "json").stdout)
    assert decoded["created_timestamp"] == PINNED_MS
    assert (decoded["client_ip"], decoded["pid"], decoded["class_loader_hash"]) == \
        ("192.168.0.10", os.getpid() & 0xFFFF, java_string_hash("rmqtool"))
    assert decoded["time_diff"] == PINNED_MS - month_start_ms(PINNED_MS) > 2**31


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x", "dev-trace-5x"])
def test_put_lays_properties_out_as_the_broker_did(name):
    """Given a real record's topic, tags, keys, user properties and UNIQ_KEY (and WAIT, which the trace set's
    client sent), the properties put builds are the stored bytes (the client's and the broker's HashMap order,
    MSG_REGION and TRACE_ON, CLUSTER, the trailing separator). dev-sample-5x's driver skipped the 5.3.3 send
    path's buildMsgContext, so its records lack the two properties a 5.3.3 broker adds: compared without them."""
    from dataclasses import replace

    from rmqtool.ops.write import broker_stamp, sent_message

    stamp = broker_stamp(Store.open(store_path(name)))
    assert (stamp.region, stamp.trace_on) == ((None, None) if name == "dev-sample" else ("DefaultRegion", "true"))
    if name == "dev-sample-5x":
        stamp = replace(stamp, region=None, trace_on=None)
    n = 0
    broker = {"CLUSTER", "TAGS", "KEYS", "MSG_REGION", "TRACE_ON"}
    user_names = {"up0", "up1", "up2"} | ({"WAIT"} if name == "dev-trace-5x" else set())
    for r in _records(name):
        props = r["properties"]
        if r["sys_flag"] or "UNIQ_KEY" not in props or not set(props) - broker - {"UNIQ_KEY"} <= user_names:
            continue
        user = [(k.encode(), v.encode()) for k, v in props.items() if k not in broker]
        msg = sent_message(r["topic"].encode(), b"", stamp, tags=(props.get("TAGS") or "").encode() or None,
                           keys=[k.encode() for k in props.get("KEYS", "").split(" ") if k], properties=user)
        assert base64.b64encode(msg.properties_raw).decode() == r["properties_raw"], r["physical_offset"]
        n += 1
    assert n > 50


def test_put_writes_msg_region_and_trace_on_as_the_broker_did_for_its_neighbours(store_copy, tmp_path):
    """On a copy of dev-trace-5x (every record through the 5.3.3 send path), put given a record's client side
    writes that record's property bytes; --region / --trace-off set the two, and the next put takes them from
    the newest record; a row to import without stored property bytes gets them too."""
    store = store_copy("dev-trace-5x")
    r = next(r for r in _records("dev-trace-5x") if r["topic"] == "TopicA" and "KEYS" in r["properties"]
             and "up1" in r["properties"])
    props = r["properties"]
    args = ["--topic", "TopicA", "--body", "x", "--tag", props["TAGS"], "--key", props["KEYS"]]
    args += [a for k in ("UNIQ_KEY", "WAIT", "up0", "up1") for a in ("--property", f"{k}={props[k]}")]
    assert _write("put", store, *args).exit_code == 0
    assert _rows(store)[-1]["properties_raw"] == r["properties_raw"]
    assert _write("put", store, "--topic", "TopicB", "--body", "y", "--region", "cn-east", "--trace-off").exit_code == 0
    assert _write("put", store, "--topic", "TopicB", "--body", "z").exit_code == 0
    for row in _rows(store)[-2:]:
        assert (row["properties"]["MSG_REGION"], row["properties"]["TRACE_ON"]) == ("cn-east", "false")
    (tmp_path / "r.jsonl").write_text(json.dumps({"topic": "TopicA", "body": "eA==", "properties": {"a": "1"}}) + "\n")
    assert _write("import", store, tmp_path / "r.jsonl", "--region", "R2").exit_code == 0
    raw = base64.b64decode(_rows(store)[-1]["properties_raw"])
    assert raw == b"MSG_REGION\x01R2\x02a\x011\x02TRACE_ON\x01false\x02"
    assert run("verify", store).exit_code == 0


def test_put_into_a_4x_store_adds_no_msg_region_unless_asked(store_copy):
    """A stock 4.9.7 broker registers no SendMessageHook, so buildMsgContext adds nothing (dev-sample's records)."""
    store = store_copy("dev-sample")
    assert _write("put", store, "--topic", "TopicA", "--body", "x").exit_code == 0
    assert not {"MSG_REGION", "TRACE_ON"} & set(_rows(store)[-1]["properties"])
    assert _write("put", store, "--topic", "TopicA", "--body", "x", "--trace-on").exit_code == 0
    assert (_rows(store)[-1]["properties"]["MSG_REGION"], _rows(store)[-1]["properties"]["TRACE_ON"]) == \
        ("DefaultRegion", "true")


def test_put_writes_bytes_that_are_not_utf8_and_they_come_back(sample_5x, tmp_path):
    # click hands argv bytes that are not UTF-8 over surrogate-escaped, as Python decodes them
    res = _write("put", sample_5x, "--topic", "Top\udcfeic", "--tag", "t\udcfe", "--key", "k\udcff",
                 "--property", "p=v\udce9", "--body", "b\udc80")
    assert res.exit_code == 0, res.stderr
    hexed = _write("put", sample_5x, "--hex", "--topic", b"Top\xfeic".hex(), "--tag", b"t\xfe".hex(),
                   "--key", b"k\xff".hex(), "--property", b"p".hex() + "=" + b"v\xe9".hex(), "--body", b"b\x80".hex())
    assert hexed.exit_code == 0, hexed.stderr
    rows = _rows(sample_5x)[-2:]
    for row in rows:
        raw = base64.b64decode(row["properties_raw"])
        assert base64.b64decode(row["topic_raw"]) == b"Top\xfeic" and row["topic"] == "Top\ufffdic"
        assert b"TAGS\x01t\xfe\x02" in raw and b"KEYS\x01k\xff\x02" in raw and b"p\x01v\xe9\x02" in raw
        assert base64.b64decode(row["body"]) == b"b\x80"
    assert [r["topic_raw"] for r in _rows(sample_5x, "-n", "1000")[-2:]] == [r["topic_raw"] for r in rows]
    assert run("verify", sample_5x).exit_code == 0
    # import writes the rows' stored bytes
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    target = tmp_path / "t"
    assert run("init", target, "--commitlog-file-size", "65536", "--cq-file-size", "160", "--slots", "16",
               "--max-entries", "64").exit_code == 0
    assert _write("import", target, tmp_path / "rows.jsonl").exit_code == 0
    again = _rows(target)
    assert [(r["topic_raw"], r["properties_raw"], r["body"]) for r in again] == \
        [(r["topic_raw"], r["properties_raw"], r["body"]) for r in rows]


@pytest.mark.parametrize("args", [
    ["--hex", "--topic", "zz", "--body", "00"],
    ["--topic", "T", "--body", "x", "--property", "a\x01b=c"],
    ["--topic", "T\ud800", "--body", "x"],                      # not a byte Python could have escaped
    ["--topic", "T", "--body", "x", "--property", "a\udcfe=1", "--property", "a\udcff=2"],   # one name to Java
    ["--topic", "T", "--body", "x", "--store-host", "nohost"],
    ["--topic", "a/b", "--body", "x"],
    ["--hex", "--topic", "", "--body", "00"],
])
def test_put_refuses_what_it_cannot_write_as_given(sample_5x, args):
    res = _write("put", sample_5x, *args)
    assert res.exit_code == 2, res.output


def test_import_takes_the_store_host_from_the_store(sample_5x, tmp_path):
    (tmp_path / "r.jsonl").write_text(json.dumps({"topic": "TopicA", "body": "eA==", "queue_id": 1}) + "\n")
    assert _write("import", sample_5x, tmp_path / "r.jsonl").exit_code == 0
    assert _rows(sample_5x)[-1]["store_host"] == "192.168.0.10:10911"
    assert _write("import", sample_5x, tmp_path / "r.jsonl", "--store-host", "10.9.9.9:1").exit_code == 0
    assert _rows(sample_5x)[-1]["store_host"] == "10.9.9.9:1"


# -- cat-cq: a file argument means that file --------------------------------------------------------
def test_cat_cq_of_a_compaction_topics_queue_file_prints_its_units():
    rb = next(q for q in readback("dev-compaction-5x")["consumeQueues"]
              if (q["topic"], q["queueId"]) == ("CompactTopic", 0))
    units = rb["units[queueOffset,commitLogOffset,size,tagsCode]"]
    qdir = store_path("dev-compaction-5x") / "consumequeue" / "CompactTopic" / "0"
    first = sorted(qdir.iterdir())[0]
    res = run("cat-cq", first, "-f", "jsonl")
    assert res.exit_code == 0, res.stderr
    got = [[r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"]]
           for r in map(json.loads, res.stdout.splitlines())]
    assert got == units[:first.stat().st_size // 20]
    whole = run("cat-cq", store_path("dev-compaction-5x"), "CompactTopic", 0, "-f", "jsonl")
    assert [[r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"]]
            for r in map(json.loads, whole.stdout.splitlines())] == units
    assert "--compaction" in whole.stderr
    sparse = run("cat-cq", store_path("dev-compaction-5x"), "CompactTopic", 0, "-f", "jsonl", "--compaction")
    assert json.loads(sparse.stdout.splitlines()[0])["batch_size"] == 1
    assert run("cat-cq", store_path("dev-compaction-5x"), "TopicA", 0, "--compaction").exit_code == 2


def test_cat_cq_of_a_compaction_queue_file_prints_its_units():
    (log,) = [q for q in readback("dev-compaction-5x")["compaction"]["compactionLogs"]
              if (q["topic"], q["queueId"]) == ("CompactTopic", 0)]
    units = next(v for k, v in log.items() if k.startswith("cqUnits"))
    qdir = store_path("dev-compaction-5x") / "compaction" / "compactionCq" / "CompactTopic" / "0"
    for f in log["cqFiles"]:
        res = run("cat-cq", qdir / f["file"], "-f", "jsonl")
        assert res.exit_code == 0, res.stderr
        assert [(r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"])
                for r in map(json.loads, res.stdout.splitlines())] == \
            [(u["msgBaseOffset(queueOffset)"], u["physOffset(compaction log)"], u["size"], u["tagsCode"])
             for u in units if u["file"] == f["file"] and u["kind"] == "unit"]


def test_decode_id_of_a_difference_longer_than_the_previous_month():
    """Now at 1 March 00:00 UTC and a difference of 28 days + 1 ms: February does not hold it; January does
    (an internal error before)."""
    january = 31_536_000_000                                   # 1971-01-01T00:00:00Z
    key = encode_uniq_key(bytes([10, 0, 0, 1]), 1, 2, january + 28 * 86_400_000 + 1, january, 3)
    res = run("--now", "1971-03-01T00:00:00Z", "decode-id", key, "-f", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["created_timestamp"] == january + 28 * 86_400_000 + 1
