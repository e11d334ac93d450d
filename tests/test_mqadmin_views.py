"""mqadmin's views offline (query-id with several IDs and --track, offsets' last consumed time, topic-status,
query-key's queue columns, transactions) and progress reaching 100 % (issue 20, points 4 and 5)."""

from __future__ import annotations

import contextlib
import io
import json
import sys

from tests.conftest import readback, run, store_path

CONFIG = store_path("dev-config-5x")
SAMPLE = store_path("dev-sample")


def jsonl(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def record_at(store, topic: str, queue_id: int, queue_offset: int) -> dict:
    """The record a queue's unit points at, by cat-cq --message (itself checked against readback.json)."""
    (row,) = jsonl(run("cat-cq", store, topic, queue_id, "--offset", queue_offset, "-n", 1, "--message",
                       "-f", "jsonl"))
    return row


def test_query_key_default_columns_have_queue_id_and_offset():
    out = run("query-key", SAMPLE, "Order_Topic-1", "key-82", "-f", "plain").stdout.splitlines()
    assert out[0].split() == ["physical_offset", "store_timestamp", "topic", "queue_id", "queue_offset", "keys",
                              "msg_id", "body"]
    rec = next(r for r in readback("dev-sample")["commitlogRecords"] if r.get("physicalOffset") == 3948)
    assert out[2].split()[:6] == ["3948", "2026-11-20", "23:13:09.520", "Order_Topic-1", str(rec["queueId"]),
                                  str(rec["queueOffset"])]


def test_query_id_takes_several_ids():
    recs = [r for r in readback("dev-sample")["commitlogRecords"] if r["type"] != "BLANK"][3:6]
    a, b, c = (r["msgId"] for r in recs)
    both = jsonl(run("query-id", SAMPLE, f"{a},{b}", "-i", c, "-f", "jsonl"))
    assert [r["msg_id"] for r in both] == [a, b, c]
    assert [r["physical_offset"] for r in both] == [r["physicalOffset"] for r in recs]
    missing = run("query-id", SAMPLE, a, "-i", "FFFF000A00002A9F0000000000000001", "-f", "jsonl")
    assert missing.exit_code == 1 and [json.loads(x)["msg_id"] for x in missing.stdout.splitlines()] == [a]
    assert "FFFF000A00002A9F0000000000000001" in missing.stderr


def test_query_id_track_says_per_group_whether_consumed():
    uniq = "FD000000000000000000000000000002519430946E0972E0FF9C001E"
    rows = jsonl(run("query-id", CONFIG, uniq, "--track", "-f", "jsonl"))
    offsets = {(r["group"], r["topic"], r["queue_id"]): r["offset"]
               for r in jsonl(run("offsets", CONFIG, "-f", "jsonl"))}
    records = jsonl(run("query-id", CONFIG, uniq, "-f", "jsonl"))
    want = [(r["msg_id"], g, off, off > r["queue_offset"]) for r in records
            for (g, t, q), off in sorted(offsets.items()) if (t, q) == (r["topic"], r["queue_id"])]
    assert sorted((r["msg_id"], r["group"], r["offset"], r["consumed"]) for r in rows) == sorted(want)
    assert {r["consumed"] for r in rows} == {True, False}       # this fixture has both


def test_offsets_show_the_last_consumed_store_time():
    rows = jsonl(run("offsets", CONFIG, "--topic", "TopicA", "-f", "jsonl"))
    assert rows
    for r in rows:
        want = record_at(CONFIG, r["topic"], r["queue_id"], r["offset"] - 1)["store_timestamp"] if r["offset"] else None
        assert r["last_consumed_timestamp"] == want


def test_topic_status_per_queue():
    rows = jsonl(run("topic-status", CONFIG, "TopicA", "BatchTopic", "-f", "jsonl"))
    units = {}
    for topic in ("TopicA", "BatchTopic"):
        for q in range(4):
            got = run("cat-cq", CONFIG, topic, q, "-f", "jsonl")
            if got.exit_code == 0:
                units[(topic, q)] = [json.loads(x) for x in got.stdout.splitlines()]
    assert sorted((r["topic"], r["queue_id"]) for r in rows) == sorted(units)
    for r in rows:
        queue = units[(r["topic"], r["queue_id"])]
        last = queue[-1]
        assert r["min_offset"] == queue[0]["queue_offset"]
        assert r["max_offset"] == last["queue_offset"] + last.get("batch_size", 1)
        if "batch_size" not in last:
            assert r["last_updated_timestamp"] == record_at(CONFIG, r["topic"], r["queue_id"],
                                                            r["max_offset"] - 1)["store_timestamp"]
        else:
            assert r["last_updated_timestamp"] == last["store_timestamp"]


def test_transactions_on_the_fixtures_are_all_committed():
    """dev-sample's four transactional messages: each half has its op record and its commit."""
    rows = jsonl(run("transactions", SAMPLE, "--all", "-f", "jsonl"))
    recs = {r["physicalOffset"]: r for r in readback("dev-sample")["commitlogRecords"] if r["type"] != "BLANK"}
    halves = [o for o, r in recs.items() if r["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC"]
    assert [r["half_offset"] for r in rows] == sorted(halves) and len(halves) == 4
    for r in rows:
        assert r["state"] == "committed"
        assert recs[r["commit_offset"]]["uniqKey"] == recs[r["half_offset"]]["uniqKey"]
        assert recs[r["op_offset"]]["topic"] == "RMQ_SYS_TRANS_OP_HALF_TOPIC"
    assert run("transactions", SAMPLE).exit_code == 1           # nothing in doubt


def test_transactions_in_doubt_and_rolled_back(store_copy):
    """A store extended with rmqtool's own writer: one half left open, one closed by an op record alone."""
    store = store_copy("dev-sample")
    for args in (["--topic", "RMQ_SYS_TRANS_HALF_TOPIC", "--property", "REAL_TOPIC=TopicA", "--body", "open"],
                 ["--topic", "RMQ_SYS_TRANS_HALF_TOPIC", "--property", "REAL_TOPIC=TopicB", "--body", "undone"],
                 ["--topic", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "--tag", "d", "--body", "5"]):
        assert run("put", store, *args, "--backup", store.parent / f"bk{len(args)}{args[-1]}", "--apply").exit_code == 0
    rows = jsonl(run("transactions", store, "--all", "-f", "jsonl"))
    assert [(r["state"], r["queue_offset"], r["real_topic"]) for r in rows[4:]] == [
        ("in_doubt", 4, "TopicA"), ("rolled_back", 5, "TopicB")]
    (doubt,) = jsonl(run("transactions", store, "-f", "jsonl"))
    newest = max(r["store_timestamp"] for r in jsonl(run("cat-commitlog", store, "-f", "jsonl")))
    assert doubt["half_offset"] == rows[4]["half_offset"] and doubt["age_ms"] == newest - doubt["store_timestamp"]


def test_op_bodies_of_both_broker_versions():
    """4.9.7: one offset per op body ("12"); 5.x: "offset," per closed half, batched ("3,7,8,"); a part
    Long.parseLong refuses closes nothing."""
    from rmqtool.ops.mqadmin import op_half_offsets

    assert op_half_offsets(b"12") == [12] and op_half_offsets(b"3,") == [3]
    assert op_half_offsets(b"3,7,8,") == [3, 7, 8]
    assert op_half_offsets(b"x,5,,-1, 6,+9") == [5, 9] and op_half_offsets(None) == op_half_offsets(b"") == []


def test_transactions_closed_by_a_batched_5x_op_body(store_copy):
    """A 5.x broker's TransactionalOpBatchService closes several halves with one op record: two of three new
    halves closed by "4,6," are rolled back, the third stays in doubt."""
    store = store_copy("dev-sample-5x")
    for i, args in enumerate((["--topic", "RMQ_SYS_TRANS_HALF_TOPIC", "--property", "REAL_TOPIC=TopicA", "--body", "a"],
                              ["--topic", "RMQ_SYS_TRANS_HALF_TOPIC", "--property", "REAL_TOPIC=TopicB", "--body", "b"],
                              ["--topic", "RMQ_SYS_TRANS_HALF_TOPIC", "--property", "REAL_TOPIC=TopicA", "--body", "c"],
                              ["--topic", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "--tag", "d", "--body", "4,6,"])):
        assert run("put", store, *args, "--backup", store.parent / f"bk{i}", "--apply").exit_code == 0
    rows = jsonl(run("transactions", store, "--all", "-f", "jsonl"))
    assert [(r["state"], r["queue_offset"]) for r in rows[4:]] == [("rolled_back", 4), ("in_doubt", 5),
                                                                    ("rolled_back", 6)]
    assert rows[4]["op_offset"] == rows[6]["op_offset"]                   # one op record closed both
    assert [r["queue_offset"] for r in jsonl(run("transactions", store, "-f", "jsonl"))] == [5]


def test_a_re_put_half_is_closed_by_the_op_naming_the_original(store_copy, tmp_path):
    """checkPrepareQueueOffset: a half the check re-put (putImmunityMsgBackToHalfQueue) is closed by the op
    record naming its TRAN_PREPARED_QUEUE_OFFSET, and its commit names the original half. dev-sample's real
    half at queue offset 0 re-put as the broker would (same record, the two properties added, by import) is
    committed by the real op and commit; one re-put of an original left open stays in doubt; one whose
    original was rolled back is rolled back; one without CHECK_IMMUNITY_TIME_IN_SECONDS (the check never
    reads the property then) stays in doubt."""
    store = store_copy("dev-sample")
    before = jsonl(run("transactions", store, "--all", "-f", "jsonl"))
    original = before[0]
    (half,) = jsonl(run("cat-commitlog", store, "--offset", original["half_offset"], "-n", 1, "-f", "jsonl"))

    def re_put(prepared: int, immunity: bool = True) -> dict:
        props = {k: v for k, v in half["properties"].items() if k != "CHECK_IMMUNITY_TIME_IN_SECONDS"}
        props["TRAN_PREPARED_QUEUE_OFFSET"] = str(prepared)
        if immunity:
            props["CHECK_IMMUNITY_TIME_IN_SECONDS"] = "60"
        return {**half, "properties": props, "properties_raw": None}

    for i, args in enumerate((["--topic", "RMQ_SYS_TRANS_HALF_TOPIC", "--property", "REAL_TOPIC=TopicB",
                               "--property", "CHECK_IMMUNITY_TIME_IN_SECONDS=60", "--body", "open"],
                              ["--topic", "RMQ_SYS_TRANS_HALF_TOPIC", "--property", "REAL_TOPIC=TopicC",
                               "--property", "CHECK_IMMUNITY_TIME_IN_SECONDS=60", "--body", "undone"],
                              ["--topic", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "--tag", "d", "--body", "5"])):
        assert run("put", store, *args, "--backup", tmp_path / f"bk{i}", "--apply").exit_code == 0      # halves 4, 5
    lines = tmp_path / "re-put.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in (re_put(0), re_put(4), re_put(5), re_put(0, False))))
    assert run("import", store, lines, "--backup", tmp_path / "bk", "--apply").exit_code == 0            # halves 6-9
    rows = jsonl(run("transactions", store, "--all", "-f", "jsonl"))
    assert [{**r, "age_ms": 0} for r in rows[:4]] == [{**r, "age_ms": 0} for r in before]     # all committed
    assert [(r["state"], r["queue_offset"]) for r in rows[4:]] == [
        ("in_doubt", 4), ("rolled_back", 5), ("committed", 6), ("in_doubt", 7), ("rolled_back", 8), ("in_doubt", 9)]
    assert (rows[6]["op_offset"], rows[6]["commit_offset"]) == (original["op_offset"], original["commit_offset"])
    assert rows[8]["op_offset"] == rows[5]["op_offset"] and rows[8]["commit_offset"] is None
    assert rows[6]["uniq_key"] == original["uniq_key"]
    assert [r["queue_offset"] for r in jsonl(run("transactions", store, "-f", "jsonl"))] == [4, 7, 9]


# -- progress ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def _recording(seen: list):
    def bar(total, label, **_):
        told = []
        seen.append((label, total, told))
        yield told.append
    yield contextlib.contextmanager(bar)


def test_generate_and_query_id_scan_report_progress(tmp_path, monkeypatch):
    from rmqtool.cli import read

    seen: list = []
    with _recording(seen) as bar:
        monkeypatch.setattr(read, "progress_bar", bar)
        monkeypatch.setattr("rmqtool.cli.output.progress_bar", bar)
        assert run("generate", tmp_path / "g", "--size", "300K", "--file-size", "64K", "--no-index",
                   "--cq-file-size", "2000").exit_code == 0
        run("query-id", SAMPLE, "FD00000000000000000000000000000243AE5FFD2B2766D44D8E0FFF", "--scan")
    (label, total, told), (label2, total2, told2) = seen
    assert label == "generating" and total == 300 * 1024 and sum(told) >= total
    assert label2.startswith("scanning") and total2 > 0 and sum(told2) > 0


def test_the_progress_bar_ends_at_100_percent(monkeypatch):
    from rich.console import Console

    from rmqtool.cli import output

    buf = io.StringIO()
    monkeypatch.setattr(output, "stderr_console", lambda: Console(file=buf, force_terminal=True, width=100))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with output.progress_bar(2_000_000, "reading") as progress:
        progress(1_600_000)                   # 80 %: the bytes a scan counts can stop short of the files' size
    assert "2.0/2.0 MB" in buf.getvalue()
