"""info on the 5.x feature stores: the topic table, batch consume queues and the DLedger log, against
what the real broker read back."""

from __future__ import annotations

import json

import pytest

from conftest import DLEDGER_SETS, readback, run, store_path


def _info(name: str) -> dict:
    result = run("info", store_path(name), "-f", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_topic_table_as_the_broker_loads_it():
    table = readback("dev-config-5x")["metadata"]["topicConfigTable"]
    rows = {r["topic"]: r for r in _info("dev-config-5x")["topic_config"]}
    assert set(rows) == set(table)
    for name, conf in table.items():
        assert (rows[name]["read_queue_nums"], rows[name]["write_queue_nums"]) == \
            (conf["readQueueNums"], conf["writeQueueNums"]), name
    assert rows["BatchTopic"]["queue_type"] == "BatchCQ" and rows["BatchTopic"]["queues_on_disk"] == 2


def test_batch_consume_queues():
    want = {(q["topic"], q["queueId"]): (q["minOffsetInQueue"], q["maxOffsetInQueue"])
            for q in readback("dev-batchcq-5x")["batchConsumeQueues"]}
    got = {(q["topic"], q["queue_id"]): (q["min_queue_offset"], q["max_queue_offset"])
           for q in _info("dev-batchcq-5x")["batch_consume_queues"]}
    assert got == want


@pytest.mark.parametrize("name", DLEDGER_SETS)
def test_dledger_log(name):
    store = readback(name)["dledgerStore"]
    d = _info(name)["dledger"]
    assert (d["begin_index"], d["end_index"], d["end_term"], d["committed_index"]) == \
        (store["ledgerBeginIndex"], store["ledgerEndIndex"], store["ledgerEndTerm"], store["committedIndex"])
    assert _info("dev-sample")["dledger"] is None


def test_stats_by_topic_carries_the_topic_table():
    table = readback("dev-config-5x")["metadata"]["topicConfigTable"]
    result = run("stats", store_path("dev-config-5x"), "--by", "topic", "-f", "jsonl")
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows and all(r["write_queue_nums"] == table[r["topic"]]["writeQueueNums"] for r in rows)
    assert {r["topic"]: r["queue_type"] for r in rows}["BatchTopic"] == "BatchCQ"


def test_a_broken_topic_table_is_a_problem_not_a_failure(store_copy):
    root = store_copy("dev-config-5x")
    for name in ("topics.json", "topics.json.bak"):
        (root / "config" / name).write_text("{broken")
    result = run("info", root, "-f", "json")
    assert result.exit_code == 1
    info = json.loads(result.stdout)
    assert info["topic_config"] == [] and info["messages"] > 0
    assert any("topics.json" in p for p in info["problems"])


@pytest.fixture
def multi_path(tmp_path, monkeypatch):
    """dev-sample-5x with its commit log over two directories, placed as 5.x MultiPathMappedFileQueue
    .tryCreateMappedFile places them (file i in the i-th of the sorted directories, modulo 2)."""
    import shutil

    monkeypatch.setenv("RMQTOOL_STORE_PATH_COMMITLOG", "")      # the option sets it for worker processes
    root, disk2 = tmp_path / "a" / "store", tmp_path / "b" / "commitlog"
    shutil.copytree(store_path("dev-sample-5x"), root)
    disk2.mkdir(parents=True)
    for i, f in enumerate(sorted((root / "commitlog").iterdir())):
        if i % 2:
            f.rename(disk2 / f.name)
    return root, disk2


def test_multi_path_commit_log(multi_path, monkeypatch):
    root, disk2 = multi_path
    rb = readback("dev-sample-5x")
    messages = sum(r["type"] == "MESSAGE" for r in rb["commitlogRecords"])
    for args in (["info", f"{root};{disk2}"], ["info", f"{root / 'commitlog'};{disk2}"],
                 ["--store-path-commitlog", f"{root};{disk2}", "info", root]):
        result = run(*args, "-f", "json")
        assert result.exit_code == 0, result.output
        info = json.loads(result.stdout)
        assert (info["messages"], info["commitlog_file_size"], info["max_physical_offset"], info["problems"]) == \
            (messages, 65536, rb["maxPhyOffset"], [])
        assert info["store"] == str(root) and len(info["consume_queues"]) == len(rb["consumeQueues"])
    monkeypatch.setenv("RMQTOOL_STORE_PATH_COMMITLOG", "")
    refused = run("info", root, "-f", "json")                          # one directory: every other file
    assert refused.exit_code == 4 and "(missing file)" in refused.stderr and "DIR;DIR" in refused.stderr
    alone = json.loads(run("info", root, "-f", "json", "--read-anyway").stdout)
    assert alone["commitlog_file_size"] == 65536 and alone["messages"] < messages
    assert run("verify", f"{root};{disk2}").exit_code == 0
    refused = run("put", f"{root};{disk2}", "--topic", "TopicA", "--body", "x", "--apply")
    assert refused.exit_code != 0 and "several directories is read-only" in refused.stderr


@pytest.mark.parametrize("name", ["dev-batchcq-5x", "dev-config-5x"])
def test_inner_batches_count_as_the_broker_counts(name, tmp_path):
    """An inner batch is one record holding INNER_NUM messages: the broker's batch queues advance by it
    (readback maxOffsetInQueue), and stats, export and info count messages the same way."""
    rb = readback(name)
    records = [r for r in rb["commitlogRecords"] if r["type"] == "MESSAGE"]
    batch_max = {}
    for q in rb["batchConsumeQueues"]:
        batch_max[q["topic"]] = batch_max.get(q["topic"], 0) + q["maxOffsetInQueue"]
    per_topic = {}
    for r in records:
        per_topic[r["topic"]] = per_topic.get(r["topic"], 0) + 1
    total = sum(per_topic.values()) - sum(per_topic[t] for t in batch_max) + sum(batch_max.values())
    assert total > len(records)
    stats = {r["topic"]: r["messages"] for r in
             (json.loads(line) for line in run("stats", store_path(name), "--by", "topic", "-f", "jsonl")
              .stdout.splitlines())}
    assert stats == {**per_topic, **batch_max}
    assert _info(name)["messages"] == total
    exported = run("export", store_path(name), "--to", tmp_path / "x.jsonl")
    assert exported.exit_code == 0
    assert f"exported {len(records)} records ({total} messages)" in exported.output
    hits = [json.loads(line) for line in run("grep", store_path(name), *(a for t in batch_max for a in ("--topic", t)),
                                             "-f", "jsonl").stdout.splitlines()]
    assert len(hits) == sum(per_topic[t] for t in batch_max)              # a row per record, as export's
    grepped = {}
    for h in hits:
        grepped[h["topic"]] = grepped.get(h["topic"], 0) + h["messages"]
    assert grepped == batch_max                                           # its messages as the broker counts them
