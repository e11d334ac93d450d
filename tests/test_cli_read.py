"""The read and query commands against the real-broker fixtures and their ground truth."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import hashlib
import io
import ipaddress
import json
import mmap
import os
import subprocess
import sys
import time

import pytest

from rmqtool.format.indexfile import DEFAULT_GEOMETRY, ENTRY, IndexHeader, encode_header
from rmqtool.format.java import index_key_hash
from rmqtool.ops.query import lookup_key
from rmqtool.format.rows import RECORD_FIELDS
from rmqtool.store.store import Store
from tests.conftest import ALL_SETS, CLEAN_SETS, CRASH_SETS, FIXTURES, ROOT, index_queries, manifest, readback, run

# The readback of a clean set describes store/; of a crash set, recovered-store/.
READ_SETS = [(name, "store" if name in CLEAN_SETS else "recovered-store") for name in ALL_SETS]
READ_IDS = [f"{n}/{w}" for n, w in READ_SETS]


def jsonl(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def path_of(name: str, which: str) -> str:
    return str(FIXTURES / name / which)


def host(h: dict) -> str:
    ip = ipaddress.ip_address(h["ip"])
    return f"[{ip}]:{h['port']}" if ip.version == 6 else f"{ip}:{h['port']}"


def expected_row(r: dict) -> dict:
    """A readback record under the documented JSON field names."""
    if r["type"] == "BLANK":
        return {"type": "blank", "physical_offset": r["physicalOffset"], "total_size": r["totalSize"],
                "magic_code": r["magicCode"]}
    props = r["properties"]
    out = {
        "type": "message", "physical_offset": r["physicalOffset"], "total_size": r["totalSize"],
        "magic_code": r["magicCode"], "body_crc": r["bodyCRC"], "queue_id": r["queueId"], "flag": r["flag"],
        "queue_offset": r["queueOffset"], "sys_flag": r["sysFlag"], "born_timestamp": r["bornTimestamp"],
        "born_host": host(r["bornHost"]), "store_timestamp": r["storeTimestamp"],
        "store_host": host(r["storeHost"]), "reconsume_times": r["reconsumeTimes"],
        "prepared_transaction_offset": r["preparedTransactionOffset"], "topic": r["topic"],
        "properties": props, "tags": props.get("TAGS"), "keys": [k for k in (r["keys"] or "").split(" ") if k],
        "uniq_key": r["uniqKey"], "msg_id": r["msgId"], "body_length": r["bodyLength"],
        "body_encoding": "base64",
    }
    if "tagsCode" in r:
        out["tags_code"] = r["tagsCode"]
    return out


def _torn_offset(name: str) -> int | None:
    tear = FIXTURES / name / "tear.json"
    return json.loads(tear.read_text())["tornRecordPhysicalOffset"] if tear.exists() else None


# -- cat-commitlog ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name,which", READ_SETS, ids=READ_IDS)
def test_cat_commitlog_agrees_with_readback(name, which):
    result = run("cat-commitlog", path_of(name, which), "--format", "jsonl", "--body-encoding", "base64",
                 "--include-blank")
    torn = _torn_offset(name)
    if torn is None or which == "recovered-store":   # the torn bytes a recovered store keeps end its data
        assert (result.exit_code, result.stderr) == (0, "")
    else:   # the killed broker's store: every record before the tear, then an error
        assert result.exit_code == 3
        assert result.stderr.startswith("rmqtool: error: ") and f": offset {torn}: " in result.stderr
    rows = jsonl(result)
    records = readback(name)["commitlogRecords"]
    assert [r["physical_offset"] for r in rows] == [r["physicalOffset"] for r in records]
    for row, rec in zip(rows, records):
        assert list(row) == RECORD_FIELDS
        want = expected_row(rec)
        assert {k: row[k] for k in want} == want
        if rec["type"] == "MESSAGE":
            body = base64.b64decode(row["body"])
            assert hashlib.sha256(body).hexdigest() == rec["bodySha256"]
            if "bodyBase64" in rec:
                assert row["body"] == rec["bodyBase64"]


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x"])
def test_cat_commitlog_decompress_and_crc(name):
    rows = jsonl(run("cat-commitlog", path_of(name, "store"), "-f", "jsonl", "--decompress", "--check-crc"))
    by_offset = {r["physicalOffset"]: r for r in readback(name)["commitlogRecords"]}
    compressed = [r for r in rows if "decompressedBodySha256" in by_offset[r["physical_offset"]]]
    assert compressed
    for row in compressed:
        rec = by_offset[row["physical_offset"]]
        body = base64.b64decode(row["body"])
        assert hashlib.sha256(body).hexdigest() == rec["decompressedBodySha256"]
        assert row["body_length"] == rec["decompressedBodyLength"]
    assert all(r["crc_ok"] is True for r in rows)


def test_cat_commitlog_torn_store_prints_records_then_fails():
    """The crash-torn store as the killed broker left it: every record before the tear, then an error."""
    tear = json.loads((FIXTURES / "dev-sample-crash-torn" / "tear.json").read_text())
    result = run("cat-commitlog", path_of("dev-sample-crash-torn", "store"), "-f", "jsonl")
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1
    assert f"offset {tear['tornRecordPhysicalOffset']}:" in result.stderr
    assert tear["file"] in result.stderr
    offsets = [r["physical_offset"] for r in jsonl(result)]
    expected = [r["physicalOffset"] for r in readback("dev-sample-crash-torn")["commitlogRecords"]
                if r["type"] == "MESSAGE"]
    assert offsets == [o for o in expected if o < tear["tornRecordPhysicalOffset"]]


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_cat_commitlog_filters(name):
    store = path_of(name, "store")
    records = [r for r in readback(name)["commitlogRecords"] if r["type"] == "MESSAGE"]
    times = sorted(r["storeTimestamp"] for r in records)
    since, until = times[len(times) // 4], times[len(times) // 2]
    since_iso = dt.datetime.fromtimestamp(since / 1000, dt.timezone.utc).isoformat()
    key = next(k for r in records for k in (r["keys"] or "").split(" ") if k)
    cases = [
        (["--topic", "TopicA"], lambda r: r["topic"] == "TopicA"),
        (["--topic", "TopicB", "--queue-id", "1"], lambda r: r["topic"] == "TopicB" and r["queueId"] == 1),
        (["--tag", "TxTag"], lambda r: r["properties"].get("TAGS") == "TxTag"),
        (["--key", key], lambda r: key in (r["keys"] or "").split(" ")),
        (["--since", since_iso, "--until", str(until)], lambda r: since <= r["storeTimestamp"] <= until),
    ]
    for args, keep in cases:
        result = run("cat-commitlog", store, "-f", "jsonl", "--body-encoding", "none", *args)
        expected = [r["physicalOffset"] for r in records if keep(r)]
        assert expected, args
        assert [r["physical_offset"] for r in jsonl(result)] == expected, args
        assert result.exit_code == 0
    none = run("cat-commitlog", store, "-f", "jsonl", "--topic", "NoSuchTopic")
    assert (none.exit_code, none.stdout) == (1, "")
    assert none.stderr == "rmqtool: no records\n"


def test_cat_commitlog_offset_and_count():
    store = path_of("dev-sample", "store")
    offsets = [r["physicalOffset"] for r in readback("dev-sample")["commitlogRecords"] if r["type"] == "MESSAGE"]
    result = run("cat-commitlog", store, "--offset", offsets[5], "--count", 3, "-f", "jsonl")
    assert [r["physical_offset"] for r in jsonl(result)] == offsets[5:8]
    bad = offsets[5] + 1
    result = run("cat-commitlog", store, "--offset", bad, "-f", "jsonl")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (f"rmqtool: error: {store}/commitlog/00000000000000000000: offset {bad}: not a "
                             f"record boundary (nearest before: {offsets[5]}, after: {offsets[6]})\n")


def test_cat_commitlog_single_file_uses_its_name_as_start():
    name = "00000000000000065536"
    path = FIXTURES / "dev-sample" / "store" / "commitlog" / name
    rows = jsonl(run("cat-commitlog", path, "-f", "jsonl", "--include-blank", "--body-encoding", "none"))
    expected = [r["physicalOffset"] for r in readback("dev-sample")["commitlogRecords"]
                if 65536 <= r["physicalOffset"] < 131072]
    assert [r["physical_offset"] for r in rows] == expected


# -- output formats ---------------------------------------------------------------------------------
def test_output_formats_carry_the_same_records():
    store = path_of("dev-sample", "store")
    base = ["cat-commitlog", store, "-n", "6", "--body-encoding", "base64"]
    lines = jsonl(run(*base, "-f", "jsonl"))
    assert json.loads(run(*base, "-f", "json").stdout) == lines
    table = list(csv.DictReader(io.StringIO(run(*base, "-f", "csv").stdout)))
    assert list(table[0]) == RECORD_FIELDS
    assert [int(r["physical_offset"]) for r in table] == [r["physical_offset"] for r in lines]
    assert [json.loads(r["properties"]) for r in table] == [r["properties"] for r in lines]
    plain = run(*base, "-f", "plain", "--tablefmt", "github").stdout.splitlines()
    assert plain[0].startswith("| physical_offset") and len(plain) == 2 + 6
    stamp = dt.datetime.fromtimestamp(lines[0]["store_timestamp"] / 1000, dt.timezone.utc)
    assert stamp.strftime("%Y-%m-%d %H:%M:%S") in plain[2]          # dates for people
    assert isinstance(lines[0]["store_timestamp"], int)             # epoch ms for scripts
    rich = run(*base, "-f", "table", "--fields", "physical_offset,topic").stdout
    assert "physical_offset" in rich and lines[0]["topic"] in rich


def test_default_format_is_jsonl_when_not_a_terminal():
    result = run("cat-commitlog", path_of("dev-sample", "store"), "-n", "2")
    assert [r["body_encoding"] for r in jsonl(result)] == ["base64", "base64"]


def test_fields_option():
    rows = jsonl(run("cat-commitlog", path_of("dev-sample", "store"), "-n", 2, "-f", "jsonl",
                     "--fields", "msg_id,topic"))
    assert [list(r) for r in rows] == [["msg_id", "topic"]] * 2
    bad = run("cat-commitlog", path_of("dev-sample", "store"), "--fields", "nope")
    assert bad.exit_code == 2 and "unknown field(s) nope" in bad.stderr


def test_head_closes_the_pipe_quietly():
    """`cat-commitlog | head -1`: the first line arrives, the writer exits 0 without BrokenPipe noise."""
    proc = subprocess.Popen([sys.executable, "-m", "rmqtool", "cat-commitlog", path_of("dev-sample", "store"),
                             "-f", "jsonl"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()              # like head -1 exiting; the rest (about 300 KB) cannot be written
    _, err = proc.communicate(timeout=60)
    assert json.loads(first)["physical_offset"] == 0
    assert (proc.returncode, err) == (0, b"")


# -- cat-cq -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,which", READ_SETS, ids=READ_IDS)
def test_cat_cq_agrees_with_readback(name, which):
    store = path_of(name, which)
    queues = readback(name)["consumeQueues"]
    assert queues
    for q in queues:
        units = next(v for k, v in q.items() if k.startswith("units"))
        result = run("cat-cq", store, q["topic"], q["queueId"], "-f", "jsonl", "--resolve")
        if not q["files"]:      # a queue the broker only created in memory (SCHEDULE_TOPIC_XXXX levels)
            assert (result.exit_code, result.stdout, units) == (4, "", [])
            continue
        assert result.exit_code == (0 if units else 1), result.stderr
        rows = jsonl(result)
        assert [[r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"]] for r in rows] == units
        assert {(r["topic"], r["queue_id"]) for r in rows} <= {(q["topic"], q["queueId"])}
        assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]


def test_cat_cq_from_and_count():
    q = next(q for q in readback("dev-sample")["consumeQueues"] if q["topic"] == "TopicB" and q["queueId"] == 1)
    units = next(v for k, v in q.items() if k.startswith("units"))
    rows = jsonl(run("cat-cq", path_of("dev-sample", "store"), "TopicB", "1", "--offset", "9", "-n", "4"))
    assert [r["queue_offset"] for r in rows] == [u[0] for u in units[9:13]]


def test_cat_cq_resolve_flags_a_mismatch(store_copy):
    store = store_copy("dev-sample")
    cq_file = store / "consumequeue" / "TopicA" / "0" / "00000000000000000000"
    data = bytearray(cq_file.read_bytes())
    data[8:12] = (1234).to_bytes(4, "big")          # unit 0: wrong size
    cq_file.write_bytes(bytes(data))
    result = run("cat-cq", store, "TopicA", "0", "--resolve", "-f", "jsonl")
    assert result.exit_code == 1
    first = jsonl(result)[0]
    assert first["status"] == "mismatch" and first["problems"][0].startswith("size 1234 != record size")
    assert "1 unit(s) disagree" in result.stderr


# -- cat-index / checkpoint / info ------------------------------------------------------------------
def _index_expected(name: str) -> list[dict]:
    return [{"index_file": f["file"], "begin_timestamp": f["beginTimestamp"], "end_timestamp": f["endTimestamp"],
             "begin_phy_offset": f["beginPhyOffset"], "end_phy_offset": f["endPhyOffset"],
             "hash_slot_count": int(f["hashSlotCount"]), "index_count": f["indexCount"]}
            for f in readback(name)["indexFiles"]]


@pytest.mark.parametrize("name,which", READ_SETS, ids=READ_IDS)
def test_cat_index_agrees_with_readback(name, which):
    store = path_of(name, which)
    rows = jsonl(run("cat-index", store, "-f", "jsonl"))
    expected = _index_expected(name)
    assert [{k: r[k] for k in expected[0]} for r in rows] == expected
    geometry = {(16, 64)} if name in ("dev-sample", "dev-sample-5x") else {(23, 100)}
    assert {(r["hash_slot_num"], r["index_num"]) for r in rows} == geometry
    entries = jsonl(run("cat-index", store, "--entries", "-f", "jsonl"))
    assert len(entries) == sum(r["entry_count"] for r in rows)
    slots = jsonl(run("cat-index", store, "--slots", "-f", "jsonl"))
    assert sum(s["chain_length"] for s in slots) == len(entries)    # every entry on exactly one chain
    for ref in rows[:1]:
        one = jsonl(run("cat-index", f"{store}/index/{ref['index_file']}", "-f", "jsonl"))
        assert one == [ref]


@pytest.mark.parametrize("name,which", READ_SETS, ids=READ_IDS)
def test_checkpoint_agrees_with_readback(name, which):
    cp = readback(name)["checkpointAfterShutdown"]
    row = json.loads(run("checkpoint", path_of(name, which), "-f", "json").stdout)
    assert row["physic_msg_timestamp"] == cp["physicMsgTimestamp"]
    assert row["logics_msg_timestamp"] == cp["logicsMsgTimestamp"]
    assert row["index_msg_timestamp"] == cp["indexMsgTimestamp"]
    assert row["min_timestamp"] == cp["minTimestamp"]
    assert row["min_timestamp_index"] == cp["minTimestampIndex"]
    assert row["confirm_phy_offset"] == cp.get("confirmPhyOffset", 0)


@pytest.mark.parametrize("name,which", READ_SETS, ids=READ_IDS)
def test_info_agrees_with_readback(name, which):
    rb = readback(name)
    result = run("info", path_of(name, which), "-f", "json")
    info = json.loads(result.stdout)
    assert [(f["file"], f["start_offset"], f["size"]) for f in info["commitlog_files"]] == \
        [(f["file"], f["fileFromOffset"], f["fileSize"]) for f in rb["commitlogFiles"]]
    assert (info["min_physical_offset"], info["max_physical_offset"]) == (rb["minPhyOffset"], rb["maxPhyOffset"])
    kinds = [r["type"] for r in rb["commitlogRecords"]]
    assert (info["messages"], info["blanks"]) == (kinds.count("MESSAGE"), kinds.count("BLANK"))
    assert [(q["topic"], q["queue_id"], q["min_queue_offset"], q["max_queue_offset"]) for q in info["consume_queues"]] \
        == sorted((q["topic"], q["queueId"], q["minOffsetInQueue"], q["maxOffsetInQueue"]) for q in rb["consumeQueues"]
                  if q["files"])
    expected = _index_expected(name)
    assert [{k: f[k] for k in expected[0]} for f in info["index_files"]] == expected
    assert info["checkpoint"]["index_msg_timestamp"] == rb["checkpointAfterShutdown"]["indexMsgTimestamp"]
    v2 = kinds and sum(r.get("magicCode") == "0xdaa320ab" for r in rb["commitlogRecords"])
    assert info["v2_records"] == v2
    assert any("V2 records" in h for h in info["version_hints"]) == bool(v2)
    assert (info["abort"], info["lock"]) == (False, "free")
    # the torn bytes a recovered store keeps end its data, as for cat-commitlog, stats and verify: no problem
    assert (result.exit_code, info["problems"], result.stderr) == (0, [], "")


@pytest.mark.parametrize("name", CRASH_SETS)
def test_info_on_a_crashed_store(name):
    """store/ as the killed broker left it: abort present, checkpoint before recovery."""
    result = run("info", path_of(name, "store"), "-f", "json")
    info = json.loads(result.stdout)
    before = readback(name)["beforeRecovery"]
    assert info["abort"] is before["abortFileExisted"] is True
    assert info["checkpoint"]["logics_msg_timestamp"] == before["checkpointBeforeRecovery"]["logicsMsgTimestamp"]
    torn = name.endswith("-torn")
    assert result.exit_code == (1 if torn else 0)
    assert bool(info["problems"]) == torn


def test_info_table_sections():
    out = run("info", path_of("dev-sample-5x", "store"), "-f", "plain").stdout
    for title in ("commit-log files", "consume queues", "index files", "checkpoint", "version hints"):
        assert f"\n{title}\n" in out
    assert "RocketMQ 5.1 or later" in out


# -- query-key --------------------------------------------------------------------------------------
def _carries(rec: dict | None, topic: str, key: str) -> bool:
    return rec is not None and rec["topic"] == topic and (
        key in (rec["keys"] or "").split(" ") or rec["uniqKey"] == key)


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_query_key_cli_agrees_with_broker_lookups(name):
    store = path_of(name, "store")
    by_offset = {r["physicalOffset"]: r for r in readback(name)["commitlogRecords"]}
    for q in index_queries(readback(name)):
        raw = run("query-key", store, q["topic"], q["key"], "--raw", "-f", "jsonl")
        assert sorted(r["physical_offset"] for r in jsonl(raw)) == q["phyOffsets"]
        assert {(r["topic"], r["key"]) for r in jsonl(raw)} == {(q["topic"], q["key"])}
        found = run("query-key", store, q["topic"], q["key"], "-f", "jsonl", "--body-encoding", "none")
        expected = sorted({o for o in q["phyOffsets"] if _carries(by_offset.get(o), q["topic"], q["key"])})
        assert sorted(r["physical_offset"] for r in jsonl(found)) == expected
        assert found.exit_code == (0 if expected else 1)


@pytest.mark.parametrize("name", CRASH_SETS)
def test_query_key_lookups_on_recovered_stores(name):
    st = Store.open(FIXTURES / name / "recovered-store")
    by_offset = {r["physicalOffset"]: r for r in readback(name)["commitlogRecords"]}
    for q in index_queries(readback(name)):
        found = lookup_key(st, q["topic"], q["key"])
        assert sorted(h.physical_offset for h in found.hits) == q["phyOffsets"]
        assert sorted(o for o, _ in found.records) == \
            sorted({o for o in q["phyOffsets"] if _carries(by_offset.get(o), q["topic"], q["key"])})


def test_query_key_time_window_and_max():
    store = path_of("dev-sample", "store")
    q = max(index_queries(readback("dev-sample")), key=lambda q: len(q["phyOffsets"]))
    assert len(q["phyOffsets"]) >= 2
    one = jsonl(run("query-key", store, q["topic"], q["key"], "--raw", "--count", "1"))
    assert len(one) == 1 and one[0]["physical_offset"] in q["phyOffsets"]
    ts = {r["physicalOffset"]: r["storeTimestamp"] for r in readback("dev-sample")["commitlogRecords"]
          if r["type"] == "MESSAGE"}
    newest = max(ts[o] for o in q["phyOffsets"])
    late = jsonl(run("query-key", store, q["topic"], q["key"], "--raw", "--since", newest + 1000))
    assert late == []


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_query_key_window_is_on_the_store_time(name):
    """IndexFile.selectPhyOffset compares an entry's time to the second (header begin + timeDiff * 1000):
    the window applies to the record's own store time, so [t, t] finds a record stored at t, and a window
    ending 1 ms before it (or starting 1 ms after) does not."""
    st = Store.open(path_of(name, "store"))
    by_offset = {r["physicalOffset"]: r for r in readback(name)["commitlogRecords"]}
    checked = 0
    for q in index_queries(readback(name)):
        for o in sorted({o for o in q["phyOffsets"] if _carries(by_offset.get(o), q["topic"], q["key"])}):
            t = by_offset[o]["storeTimestamp"]
            assert o in [off for off, _ in lookup_key(st, q["topic"], q["key"], begin=t, end=t).records]
            assert o not in [off for off, _ in lookup_key(st, q["topic"], q["key"], end=t - 1).records]
            assert o not in [off for off, _ in lookup_key(st, q["topic"], q["key"], begin=t + 1).records]
            checked += 1
    assert checked > 100
    q = index_queries(readback(name))[0]
    t = by_offset[min(q["phyOffsets"])]["storeTimestamp"]
    found = jsonl(run("query-key", path_of(name, "store"), q["topic"], q["key"], "--since", t, "--until", t,
                      "-f", "jsonl", "--body-encoding", "none"))
    assert min(q["phyOffsets"]) in [r["physical_offset"] for r in found]


def test_query_key_drops_hash_collisions():
    """Java's String.hashCode is unchanged when (c1, c2) becomes (c1 + 1, c2 - 31): 'key-82' ~ 'lFy-82'."""
    store = path_of("dev-sample", "store")
    q = next(q for q in index_queries(readback("dev-sample")) if q["key"] == "key-82")
    assert index_key_hash(f"{q['topic']}#lFy-82") == index_key_hash(q["indexKey"])
    raw = run("query-key", store, q["topic"], "lFy-82", "--raw")
    assert sorted(r["physical_offset"] for r in jsonl(raw)) == q["phyOffsets"]
    found = run("query-key", store, q["topic"], "lFy-82")
    assert (found.exit_code, found.stdout) == (1, "")
    assert f"{len(q['phyOffsets'])} index hit(s) dropped" in found.stderr


def test_query_key_nothing_found():
    result = run("query-key", path_of("dev-sample", "store"), "NoSuchTopic", "k")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == ("rmqtool: no record of topic 'NoSuchTopic' with key 'k' "
                             "(the store has no consume queue for topic 'NoSuchTopic')\n")


# -- query-id / decode-id ---------------------------------------------------------------------------
def _manifest_ids(name: str) -> list[tuple[str, str | None, int]]:
    """(offsetMsgId, UNIQ_KEY or None, physical offset) of every acknowledged message."""
    out = []
    torn_seq = None
    tear = FIXTURES / name / "tear.json"
    if tear.exists():
        torn_seq = json.loads(tear.read_text())["tornPutSeq"]
    for put in manifest(name)["puts"]:
        if put["seq"] == torn_seq:
            continue
        ids = put["result"]["msgId"].split(",")
        if "items" in put["input"]:
            uniq = [item["properties"].get("UNIQ_KEY") for item in put["input"]["items"]]
        else:
            props = dict(p.split("\x01", 1) for p in put["input"]["propertiesString"].split("\x02") if "\x01" in p)
            uniq = [props.get("UNIQ_KEY")]
        for msg_id, key in zip(ids, uniq, strict=True):
            out.append((msg_id, key, int(msg_id[-16:], 16)))
    return out


@pytest.mark.parametrize("name,which", READ_SETS, ids=READ_IDS)
def test_query_id_finds_every_manifest_message(name, which):
    store = path_of(name, which)
    ids = _manifest_ids(name)
    assert ids
    for msg_id, uniq_key, offset in ids:
        result = run("query-id", store, msg_id, "-f", "jsonl", "--body-encoding", "none")
        assert [(r["physical_offset"], r["msg_id"]) for r in jsonl(result)] == [(offset, msg_id)], msg_id
        if uniq_key is None:
            continue
        # a clean store's index has every UNIQ_KEY; recovery rebuilds the index only in part
        scan = ["--scan"] if name in CRASH_SETS else []
        rows = jsonl(run("query-id", store, uniq_key, "-f", "jsonl", "--body-encoding", "none", *scan))
        assert offset in [r["physical_offset"] for r in rows], uniq_key
        assert {r["uniq_key"] for r in rows} == {uniq_key}


def test_query_id_host_mismatch_is_reported():
    rec = next(r for r in readback("dev-sample")["commitlogRecords"] if r["type"] == "MESSAGE"
               and not r["storeHost"]["ipv6"])
    other = "0A000001" + rec["msgId"][8:]                # same port and offset, another host
    result = run("query-id", path_of("dev-sample", "store"), other, "-f", "jsonl", "--kind", "msg-id")
    assert [r["physical_offset"] for r in jsonl(result)] == [rec["physicalOffset"]]
    assert "was stored by 192.168.0.10:10911, not by 10.0.0.1:10911" in result.stderr


def test_query_id_nothing_found():
    result = run("query-id", path_of("dev-sample", "store"), "C0A8000A00002A9F00000000000000FF")
    assert (result.exit_code, result.stdout) == (1, "")
    assert "--scan reads the whole commit log" in result.stderr


def test_decode_id():
    put = manifest("dev-sample")["puts"][0]
    msg_id = put["result"]["msgId"]
    row = json.loads(run("decode-id", msg_id, "-f", "json").stdout)
    assert row["store_host"] == host(put["input"]["storeHost"])
    assert row["physical_offset"] == put["result"]["wroteOffset"]
    props = dict(p.split("\x01", 1) for p in put["input"]["propertiesString"].split("\x02") if "\x01" in p)
    born = put["input"]["bornTimestamp"]
    row = json.loads(run("decode-id", props["UNIQ_KEY"], "--born", born, "-f", "json").stdout)
    # the id is made on send: after the producer's born time, before the broker stores the message
    assert born <= row["created_timestamp"] <= put["result"]["storeTimestamp"]


# -- look-ups stay light and fast -------------------------------------------------------------------
@pytest.mark.parametrize("args", [["query-key", "TopicA", "k"], ["query-id", "C0A8000A00002A9F0000000000000000"]])
def test_lookups_import_neither_pyarrow_nor_pyspark(args):
    code = ("import sys\nfrom rmqtool.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'pyspark', 'pandas'))\n"
            "print('HEAVY', heavy, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, args[0], path_of("dev-sample", "store"), *args[1:]],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in proc.stderr, proc.stderr


def test_lookup_on_a_default_size_index_file_is_fast(store_copy):
    """A 420,000,040-byte (sparse) index file: only the header, one slot and a chain are read."""
    store = store_copy("dev-sample")
    for p in (store / "index").iterdir():
        p.unlink()
    recs = [r for r in readback("dev-sample")["commitlogRecords"] if r.get("keys")][:3]
    g = DEFAULT_GEOMETRY
    path = store / "index" / "20261120231309479"
    with open(path, "wb") as fh:
        fh.truncate(g.file_size)
        slots: dict[int, int] = {}
        for number, rec in enumerate(recs, 1):
            key_hash = index_key_hash(f"{rec['topic']}#{rec['keys'].split(' ')[0]}")
            slot = key_hash % g.hash_slot_num
            fh.seek(g.entry_pos(number))
            fh.write(ENTRY.pack(key_hash, rec["physicalOffset"], 0, slots.get(slot, 0)))
            slots[slot] = number
            fh.seek(g.slot_pos(slot))
            fh.write(number.to_bytes(4, "big"))
        fh.seek(0)
        fh.write(encode_header(IndexHeader(recs[0]["storeTimestamp"], recs[-1]["storeTimestamp"],
                                           recs[0]["physicalOffset"], recs[-1]["physicalOffset"],
                                           len(slots), len(recs) + 1)))
    assert os.path.getsize(path) == 420_000_040
    rec = recs[1]
    args = ("query-key", store, rec["topic"], rec["keys"].split(" ")[0], "-f", "jsonl")
    run(*args)                                   # imports and first calls out of the measure
    started = time.process_time()                # CPU time: another process's load does not stretch it
    result = run(*args)
    lookup = time.process_time() - started
    assert [r["physical_offset"] for r in jsonl(result)] == [rec["physicalOffset"]]
    started = time.process_time()                # what touching every page of the file costs, for scale
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        whole = sum(mm[at] for at in range(0, len(mm), mmap.PAGESIZE))
        mm.close()
    touched = time.process_time() - started
    assert whole == 0 and lookup < touched / 10, (lookup, touched)


def test_info_reports_a_held_lock(store_copy):
    """A running broker holds a lock on byte 0 of <store>/lock; info says so."""
    store = store_copy("dev-sample")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(store / 'lock')!r}, os.O_RDWR)\n"
                               "fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0)\nprint('held', flush=True)\ntime.sleep(60)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert json.loads(run("info", store, "-f", "json").stdout)["lock"] == "locked"
    finally:
        holder.kill()
        holder.wait()
    assert json.loads(run("info", store, "-f", "json").stdout)["lock"] == "free"
