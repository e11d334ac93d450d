"""Compaction topics (dev-compaction-5x) against what RocketMQ 5.3.3's own classes read back: every
compaction-log record, sparse-queue unit, look-up and the consumer view; the codecs byte-exact."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from hypothesis import given, strategies as st

from rmqtool.format.batchcq import encode_unit
from rmqtool.format.commitlog import Blank, Message, encode_entry
from rmqtool.format.compaction import (END_POSITION, decode_position_checkpoint, decode_sparse_units,
                                       encode_position_checkpoint)
from rmqtool.store.store import Store
from tests.conftest import manifest, readback, run, store_path
from tests.helpers_readback import assert_record_matches

SET = "dev-compaction-5x"


def _field(d: dict, prefix: str):
    return next(v for k, v in d.items() if k.startswith(prefix))


def _queues():
    return readback(SET)["compaction"]["compactionLogs"]


def _queue(exp: dict):
    return Store.open(store_path(SET)).compaction.queue(exp["topic"], exp["queueId"])


@pytest.mark.parametrize("qi", [0, 1])
def test_every_log_record(qi):
    exp = _queues()[qi]
    q = _queue(exp)
    want = _field(exp, "logRecords")
    got = list(q.records())
    walked = [r for r in want if r["type"] in ("MESSAGE", "BLANK")]
    assert [loc.offset for loc in got] == [r["compactionLogOffset"] for r in walked]
    for loc, r in zip(got, walked):
        if r["type"] == "BLANK":
            assert isinstance(loc.entry, Blank) and loc.entry.total_size == r["totalSize"]
            continue
        assert_record_matches(loc.offset, loc.entry, {**r, "physicalOffset": r["compactionLogOffset"]})
        assert loc.entry.physical_offset == r["commitLogOffsetField"]
        assert encode_entry(loc.entry) == bytes(loc.file.read()[loc.offset - loc.file.start:][:loc.entry.total_size])
    # the zero-filled end of the last rewritten file: no record, no BLANK, the walk goes on
    zeros = [r["compactionLogOffset"] for r in want if r["type"].startswith("END(zeros")]
    assert zeros and all(not any(o <= loc.offset < o + 1 for loc in got) for o in zeros)
    assert q.log.written_end() == exp["logMaxOffset"] == exp["cqMaxPhyOffsetInLog"]


@pytest.mark.parametrize("qi", [0, 1])
def test_every_sparse_unit_byte_exact(qi):
    exp = _queues()[qi]
    q = _queue(exp)
    raw = _field(exp, "cqUnits")
    files = {f.path.name: (f, units, ended) for f, units, ended in q.files}
    assert sorted(files) == sorted(f["file"] for f in exp["cqFiles"])
    for fexp in exp["cqFiles"]:
        f, units, ended = files[fexp["file"]]
        mine = [r for r in raw if r["file"] == fexp["file"]]
        kinds = [r["kind"] for r in mine]
        assert ended == any(k.startswith("END_POSITION") for k in kinds)
        assert [encode_unit(u).hex() for u in units] == [r["hex"] for r in mine if r["kind"] == "unit"]
        assert len(units) * 46 == fexp["wrotePosition"]     # recover() stops in front of END_POSITION
        if ended:
            assert encode_unit(END_POSITION).hex() == next(r["hex"] for r in mine if r["kind"] != "unit")
    assert q.min_offset == exp["cqMinOffsetInQueue"] and q.max_offset == exp["cqMaxOffsetInQueue"]


@pytest.mark.parametrize("qi", [0, 1])
def test_every_lookup(qi):
    exp = _queues()[qi]
    q = _queue(exp)
    for queue_offset, found, batch, phy, size, tags in _field(exp, "cqLookup"):
        u = q.lookup(queue_offset)
        assert (u.msg_base_offset, u.batch_size, u.physical_offset, u.size, u.tags_code) == (found, batch, phy, size, tags)
    assert q.lookup(exp["cqMaxOffsetInQueue"]) is None


@pytest.mark.parametrize("qi", [0, 1])
def test_consumer_view(qi):
    exp = _queues()[qi]
    q = _queue(exp)
    got = [(qo, unit.physical_offset, rec.properties.get("KEYS"), rec.uniq_key, hashlib.sha256(rec.body).hexdigest())
           for qo, unit, rec in q.consumer_view(q.min_offset)]
    assert got == [tuple(v) for v in _field(exp, "consumerView")]
    assert all(isinstance(rec, Message) and rec.queue_offset == qo for qo, _, rec in q.consumer_view())


def test_position_checkpoint_round_trip():
    cp = readback(SET)["compaction"]["filesBeforeLoad"]
    text = _field(cp, "position-checkpoint(raw")
    offsets = decode_position_checkpoint(text)
    assert offsets == {tuple(k.rsplit("_", 1)[:1]) + (int(k.rsplit("_", 1)[1]),): v
                       for k, v in readback(SET)["compaction"]["positionMgr.queueOffsetMap(after load)"].items()}
    assert encode_position_checkpoint(offsets) == text
    assert Store.open(store_path(SET)).compaction.position_checkpoint() == offsets


@given(st.dictionaries(st.tuples(st.from_regex(r"[A-Za-z%_-][A-Za-z0-9%_-]{0,12}", fullmatch=True),
                                 st.integers(0, 2**31 - 1)), st.integers(0, 2**62)))
def test_position_checkpoint_encoding_round_trips(offsets):
    assert decode_position_checkpoint(encode_position_checkpoint(offsets)) == offsets


def test_sparse_units_stop_at_end_position_or_zeros():
    q = _queue(_queues()[0])
    f, units, ended = q.files[0]
    buf = bytes(f.read())
    assert decode_sparse_units(buf) == (units, ended)
    assert decode_sparse_units(buf[:46 * len(units)] + bytes(46)) == (units, False)


def test_compaction_log_walked_as_a_commit_log():
    st = Store.open(store_path(SET) / "compaction" / "compactionLog" / "CompactTopic" / "1")
    want = [r["compactionLogOffset"] for r in _field(_queues()[1], "logRecords") if r["type"] == "MESSAGE"]
    assert [loc.offset for loc in st.commitlog.iter_entries(include_blank=False)] == want


# -- commands ------------------------------------------------------------------------------------------
STORE = store_path(SET)


def _jsonl(res) -> list[dict]:
    import json
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_verify_clean():
    res = run("verify", STORE, "--check-crc", "-f", "jsonl")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("qi", [0, 1])
def test_cat_cq_message_is_the_consumer_view(qi):
    """What a consumer reading from the min offset receives, as CompactionStore.getMessage returns it."""
    exp = _queues()[qi]
    res = run("cat-cq", STORE, exp["topic"], exp["queueId"], "--message", "-f", "jsonl", "--body-encoding", "base64",
              "--compaction")
    assert res.exit_code == 0, res.output
    import base64
    got = [[r["queue_offset"], r["physical_offset"], r["properties"].get("KEYS"), r["uniq_key"],
            hashlib.sha256(base64.b64decode(r["body"])).hexdigest()] for r in _jsonl(res)]
    assert got == _field(exp, "consumerView")
    assert "compaction topic" in res.stderr


@pytest.mark.parametrize("qi", [0, 1])
def test_cat_cq_from_a_removed_offset_starts_at_the_next_retained(qi):
    exp = _queues()[qi]
    for queue_offset, found, *_ in _field(exp, "cqLookup")[::5]:
        res = run("cat-cq", STORE, exp["topic"], exp["queueId"], "--offset", queue_offset, "-n", 1, "--resolve",
                  "-f", "jsonl", "--compaction")
        (row,) = _jsonl(res)
        assert (row["queue_offset"], row["status"]) == (found, "ok")


def test_cat_cq_units_are_the_sparse_queue():
    exp = _queues()[0]
    rows = _jsonl(run("cat-cq", STORE, exp["topic"], exp["queueId"], "-f", "jsonl", "--compaction"))
    units = [u for u in _field(exp, "cqUnits") if u["kind"] == "unit"]
    assert [(r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"], r["store_timestamp"],
             r["compacted_offset"]) for r in rows] == \
        [(u["msgBaseOffset(queueOffset)"], u["physOffset(compaction log)"], u["size"], u["tagsCode"], u["storeTime"],
          u["compactedOffset"]) for u in units]


def test_cat_commitlog_walks_a_compaction_log():
    exp = _queues()[0]
    path = STORE / "compaction" / "compactionLog" / exp["topic"] / str(exp["queueId"])
    rows = _jsonl(run("cat-commitlog", path, "-f", "jsonl", "--include-blank"))
    want = [r for r in _field(exp, "logRecords") if r["type"] in ("MESSAGE", "BLANK")]
    assert [(r["physical_offset"], r["type"].upper()) for r in rows] == [(r["compactionLogOffset"], r["type"]) for r in want]


def test_info_says_what_compaction_removed():
    res = run("info", STORE, "-f", "json")
    import json
    rows = json.loads(res.stdout)["compaction_queues"]
    for row, exp in zip(rows, _queues()):
        keyed = [r for r in readback(SET)["commitlogRecords"]
                 if r.get("topic") == exp["topic"] and r.get("queueId") == exp["queueId"] and r.get("keys")]
        assert (row["min_offset"], row["max_offset"], row["compacted_to"]) == \
            (exp["cqMinOffsetInQueue"], exp["cqMaxOffsetInQueue"], exp["positionMgrOffset"])
        assert row["records"] == len(_field(exp, "consumerView"))
        assert row["removed"] == len(keyed) - row["records"]


def _damaged(store_copy, change) -> set[str]:
    from rmqtool.ops.verify import verify_store

    root = store_copy(SET)
    change(root)
    return {f.kind for f in verify_store(str(root), jobs=1)}


def _flip_a_body_byte(root):
    p = root / "compaction/compactionLog/CompactTopic/0/00000000000000000000"
    b = bytearray(p.read_bytes())
    b[290] ^= 1              # a body byte of the first record
    p.write_bytes(b)


def _move_the_checkpoint(root):
    for name in ("position-checkpoint", "position-checkpoint.bak"):
        p = root / "compaction" / name
        p.write_text(p.read_text().replace('"CompactTopic_0":49', '"CompactTopic_0":58'))


def _shift_a_unit(root):
    p = root / "compaction/compactionCq/CompactTopic/1/00000000000000004048"
    b = bytearray(p.read_bytes())
    b[11] ^= 4               # the first unit's size
    p.write_bytes(b)


def _move_a_physical_offset_field(root):
    p = root / "compaction/compactionLog/CompactTopic/1/00000000000000004048"
    b = bytearray(p.read_bytes())
    b[28 + 7] ^= 8           # the PHYSICALOFFSET field of the file's first record (no CRC covers it)
    p.write_bytes(b)


def _garble_the_checkpoint(root):
    checkpoint = root / "compaction" / "position-checkpoint"
    for path in (checkpoint, checkpoint.with_name(checkpoint.name + ".bak")):
        path.write_bytes(path.read_bytes() + b"\xe1\x01garbage")


def _cut_a_log_record(root):
    p = root / "compaction/compactionLog/CompactTopic/0/00000000000000000000"
    b = bytearray(p.read_bytes())
    b[4] ^= 0xFF             # the first record's magic code: the log does not read
    p.write_bytes(b)


def test_verify_finds_a_changed_record(store_copy):
    assert "compaction_log_differs" in _damaged(store_copy, _flip_a_body_byte)


def test_verify_finds_a_checkpoint_beyond_the_compaction(store_copy):
    assert "compaction_not_newest" in _damaged(store_copy, _move_the_checkpoint)


def test_verify_finds_a_unit_off_its_record(store_copy):
    assert "compaction_cq_mismatch" in _damaged(store_copy, _shift_a_unit)


def test_verify_finds_a_physical_offset_field_off_its_position(store_copy):
    assert _damaged(store_copy, _move_a_physical_offset_field) == {"compaction_log_record"}


@pytest.mark.parametrize("change, few", [(None, True), (_flip_a_body_byte, True), (_move_the_checkpoint, True),
                                         (_shift_a_unit, True), (_move_a_physical_offset_field, True),
                                         (_garble_the_checkpoint, True), (_cut_a_log_record, False)])
def test_both_paths_give_the_same_output(store_copy, monkeypatch, change, few):
    """A few records are read one at a time, more on the columnar scan: verify (with and without CRCs) and info
    print the same bytes and exit the same way either way, on the store and on damaged copies. The small path
    reads each of them but the log that does not decode (it leaves that to the columnar scan)."""
    from rmqtool.errors import RmqError
    from rmqtool.ops import compaction

    root = store_copy(SET)
    if change:
        change(root)
    if not few:                             # the small path hands the store over to the columnar scan
        with pytest.raises(RmqError):
            compaction._few_facts(Store.open(root), Store.open(root).compaction.queues(), True)
    commands = [["verify", root, "-f", "json"], ["verify", "--check-crc", root, "-f", "jsonl"],
                ["info", root, "-f", "json"]]
    outputs = {}
    for path in ("few", "scan"):
        with monkeypatch.context() as m:
            if path == "scan":
                m.setattr(compaction, "FEW_RECORDS", 0)
            elif few:                       # the small path must not hand over to the scan
                m.setattr(compaction, "_scanned_facts", lambda *a: pytest.fail("the columnar scan ran"))
            outputs[path] = [(r.exit_code, r.stdout, r.stderr) for r in (run(*c) for c in commands)]
    assert outputs["few"] == outputs["scan"]
    assert [code for code, _, _ in outputs["scan"][:2]] == [int(change not in (None, _garble_the_checkpoint))] * 2


@pytest.mark.parametrize("change", [_flip_a_body_byte, _move_the_checkpoint, _shift_a_unit,
                                    _move_a_physical_offset_field, _cut_a_log_record])
def test_repair_names_each_error_it_leaves(store_copy, change):
    """repair plans no change of a compaction log, queue or checkpoint: its dry run names each error verify
    finds there as not repaired (exit 1), never "nothing to do" (exit 0) beside verify's exit 1 and its advice
    to run repair."""
    root = store_copy(SET)
    change(root)
    errors = [json.loads(line) for line in run("verify", root, "-f", "jsonl").stdout.splitlines()]
    errors = [f for f in errors if f["severity"] == "error"]
    repair = run("repair", root, "-f", "jsonl")
    assert (repair.exit_code, repair.stdout) == ((1, "") if errors else (0, "")), repair.stderr
    for f in errors:
        assert f"rmqtool: not repaired: {os.path.relpath(f['path'], root)}: {f['message']} [repair does not " \
            "rewrite compaction logs" in repair.stderr
    assert ("nothing to do" in repair.stderr) == (not errors)


def test_compaction_checks_run_on_the_columnar_scan(monkeypatch):
    """Beyond a few records, none is decoded one at a time: the compaction logs and the commit log are walked
    by the scan kernel (a BLANK ending a log file is the only entry the walk decodes by itself)."""
    from rmqtool.columnar import batches
    from rmqtool.ops import compaction
    from rmqtool.ops.compaction import compaction_findings
    from rmqtool.store import commitlog

    monkeypatch.setattr(compaction, "FEW_RECORDS", 0)
    calls = []
    for module in (batches, commitlog):
        real = module.decode_entry
        monkeypatch.setattr(module, "decode_entry", lambda *a, _real=real, **k: calls.append(a[1]) or _real(*a, **k))
    store = Store.open(STORE)
    assert list(compaction_findings(store)) == []
    blanks = sum(1 for q in _queues() for r in _field(q, "logRecords") if r["type"] == "BLANK")
    assert len(calls) == blanks         # the commit log: only the records the topic's units name, gathered


def test_records_at_decodes_only_the_records_named():
    """The commit-log records of the compaction topic's units, gathered and scanned by the kernel, are the
    whole-log scan's rows for those offsets, field for field."""
    import numpy as np
    import pyarrow as pa
    from rmqtool.columnar import iter_record_batches
    from rmqtool.ops.compaction import records_at
    cl = Store.open(STORE).commitlog
    every = pa.Table.from_batches(list(iter_record_batches(cl)))
    every = every.filter(pa.compute.equal(every.column("type"), "message"))
    picked = np.array(sorted(r["physicalOffset"] for r in readback(SET)["commitlogRecords"]
                             if r.get("topic") == "CompactTopic"), np.int64)
    got = pa.Table.from_batches(list(records_at(cl, picked)))
    assert got.column("physical_offset").to_pylist() == picked.tolist()
    want = every.take(pa.array(np.searchsorted(every.column("physical_offset").to_numpy(), picked)))
    assert got.to_pylist() == want.to_pylist()


def test_stats_by_topic_says_what_compaction_kept_and_removed():
    rows = {r["topic"]: r for r in _jsonl(run("stats", STORE, "--by", "topic", "-f", "jsonl"))}
    records = [r for r in readback(SET)["commitlogRecords"] if r.get("topic") == "CompactTopic"]
    kept = sum(len(_field(q, "consumerView")) for q in _queues())
    assert rows["CompactTopic"]["compaction_kept"] == kept
    assert rows["CompactTopic"]["compaction_removed"] == sum(1 for r in records if r.get("keys")) - kept
    assert rows["TopicA"]["compaction_kept"] is None


def _with_topic_table(store_copy):
    """A copy with the topic table the broker was given (manifest: generator.topicAttributes)."""
    import json
    root = store_copy(SET)
    table = {t: {"topicName": t, "readQueueNums": 2, "writeQueueNums": 2, "attributes": attrs}
             for t, attrs in manifest(SET)["generator"]["topicAttributes"].items()}
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": table}))
    return root


@pytest.mark.parametrize("fmt", ["plain", "csv", "json"])
def test_topics_mark_the_compacted_topics(store_copy, fmt):
    import csv
    import io
    import json
    out = run("topics", _with_topic_table(store_copy), "-f", fmt).stdout
    if fmt == "json":
        rows = json.loads(out)
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out)))
    else:
        head, _, *lines = out.splitlines()
        rows = [dict(zip(head.split(), line.split())) for line in lines]
    got = {r["topic"]: (r["cleanup_policy"], int(r["compaction_queues"])) for r in rows}
    compacted = {q["topic"] for q in _queues()}
    assert got == {t: ("COMPACTION", 2) if t in compacted else ("DELETE", 0)
                   for t in manifest(SET)["generator"]["topicAttributes"]}
    assert compacted == {"CompactTopic"}


# -- export of a compaction topic from the store root ---------------------------------------------------
def _view_rows(rows: list[dict]) -> list[tuple]:
    import base64
    return [(r["topic"], r["queue_id"], r["queue_offset"], r["physical_offset"], " ".join(r["keys"]), r["uniq_key"],
             hashlib.sha256(base64.b64decode(r["body"])).hexdigest()) for r in rows]


def _consumer_views(queue_ids=(0, 1)) -> list[tuple]:
    return [(q["topic"], q["queueId"], *v) for q in _queues() if q["queueId"] in queue_ids
            for v in _field(q, "consumerView")]


def test_export_of_a_compaction_topic_is_its_consumer_view(tmp_path):
    res = run("export", STORE, "--topic", "CompactTopic", "--to", tmp_path / "view.jsonl")
    assert res.exit_code == 0, res.output
    assert _view_rows(_jsonl_file(tmp_path / "view.jsonl")) == _consumer_views()
    assert "exported 33 records (33 messages)" in res.stderr
    res = run("export", STORE, "--topic", "CompactTopic", "--queue-id", "1", "--to", tmp_path / "q1.jsonl")
    assert _view_rows(_jsonl_file(tmp_path / "q1.jsonl")) == _consumer_views((1,))


def test_export_names_the_compaction_log_files_and_mixes_topics(tmp_path):
    import pyarrow.parquet as pq
    res = run("export", STORE, "--topic", "CompactTopic", "--topic", "TopicA", "--to", tmp_path / "both.parquet")
    assert res.exit_code == 0, res.output
    table = pq.read_table(tmp_path / "both.parquet").to_pylist()
    topic_a = [r for r in readback(SET)["commitlogRecords"] if r.get("topic") == "TopicA"]
    assert [r["physical_offset"] for r in table if r["topic"] == "TopicA"] == [r["physicalOffset"] for r in topic_a]
    view = [r for r in table if r["topic"] == "CompactTopic"]
    assert [(r["queue_id"], r["queue_offset"], r["physical_offset"]) for r in view] == \
        [(t[1], t[2], t[3]) for t in _consumer_views()]
    assert all("/compaction/compactionLog/CompactTopic/" in r["commitlog_file"] for r in view)


def test_export_commitlog_records_of_a_compaction_topic(tmp_path):
    res = run("export", STORE, "--topic", "CompactTopic", "--commitlog-records", "--to", tmp_path / "raw.jsonl")
    assert res.exit_code == 0, res.output
    want = [r for r in readback(SET)["commitlogRecords"] if r.get("topic") == "CompactTopic"]
    assert [(r["physical_offset"], r["queue_offset"]) for r in _jsonl_file(tmp_path / "raw.jsonl")] == \
        [(r["physicalOffset"], r["queueOffset"]) for r in want] and len(want) == 125


def test_dataset_export_of_a_compaction_topic(tmp_path):
    import pyarrow.dataset as ds
    res = run("export", STORE, "--topic", "CompactTopic", "--to", tmp_path / "set")
    assert res.exit_code == 0, res.output
    rows = sorted(ds.dataset(tmp_path / "set", format="parquet").to_table().to_pylist(),
                  key=lambda r: (r["queue_id"], r["queue_offset"]))
    assert [(r["queue_id"], r["queue_offset"], r["physical_offset"]) for r in rows] == \
        [(t[1], t[2], t[3]) for t in _consumer_views()]
    mixed = run("export", STORE, "--topic", "CompactTopic", "--topic", "TopicA", "--to", tmp_path / "mixed")
    assert mixed.exit_code == 2 and "--commitlog-records" in mixed.stderr and not (tmp_path / "mixed").exists()


def _jsonl_file(path) -> list[dict]:
    import json
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_unreadable_position_checkpoint_is_what_the_broker_ignores(store_copy):
    """CompactionPositionMgr is a ConfigManager whose constructor drops load()'s result: a position-checkpoint
    that does not decode (bytes appended, not UTF-8) and has no usable .bak leaves the broker with no position,
    so it compacts again: a warning naming the file, never an internal error."""
    root = store_copy("dev-compaction-5x")
    _garble_the_checkpoint(root)
    result = run("verify", root, "-f", "jsonl")
    assert result.exit_code == 0, result.output
    found = [json.loads(line) for line in result.stdout.splitlines() if "compaction_checkpoint" in line]
    assert [(r["severity"], r["kind"]) for r in found] == [("warning", "compaction_checkpoint_unread")]
    assert found[0]["path"].endswith("position-checkpoint.bak")


def test_every_reader_takes_an_unreadable_checkpoint_as_the_broker_does(store_copy):
    """The position checkpoint and its .bak do not decode: the broker ignores the load and starts with no
    position. verify warns (exit 0); info and cat-cq --compaction read the store on, with no position and the
    same warning, not a failure; stats keeps its compaction columns."""
    root = store_copy(SET)
    _garble_the_checkpoint(root)
    verify = run("verify", root, "-f", "json")
    assert verify.exit_code == 0
    [warning] = [f for f in json.loads(verify.stdout) if f["kind"] == "compaction_checkpoint_unread"]
    info = run("info", root, "-f", "json")
    assert info.exit_code == 0, info.stderr
    summary = json.loads(info.stdout)
    assert [q["compacted_to"] for q in summary["compaction_queues"]] == [None] * len(summary["compaction_queues"])
    assert summary["warnings"] == [f"{warning['path']}: {warning['message'].split(' (what')[0]}"]
    assert f"rmqtool: warning: {summary['warnings'][0]}" in info.stderr
    assert summary["problems"] == []
    cat = run("cat-cq", root, "CompactTopic", "0", "--compaction", "-n", "1")
    assert cat.exit_code == 0 and "compacted up to none" in cat.stderr
    stats = run("stats", root, "--by", "topic", "-f", "jsonl")
    assert stats.exit_code == 0
    assert {r["topic"]: r["compaction_kept"] for r in map(json.loads, stats.stdout.splitlines())}["CompactTopic"] > 0
