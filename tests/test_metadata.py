"""Broker metadata (config/*.json) against what the real 5.3.3 managers load back: topic and group tables,
data versions, consumer offsets with lag, delay-level offsets; the .bak fallback of ConfigManager.load."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqtool.errors import FormatError
from rmqtool.format.fastjson import parse_fastjson
from rmqtool.ops.metadata import config_rows, delay_rows, group_rows, offset_rows, snake, topic_rows, totals
from rmqtool.store.metadata import load, topic_table
from rmqtool.store.store import Store
from tests.conftest import CONFIG_SETS, FIXTURES, readback, run, store_path

SCHEDULE_OFFSETS = "scheduleMessageService.offsetTable(level -> offset, after load)"


def jsonl(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(params=CONFIG_SETS)
def name(request):
    return request.param


def test_topic_table(name):
    store = Store.open(store_path(name))
    table = topic_table(store)
    want = readback(name)["metadata"]["topicConfigTable"]
    assert sorted(table) == sorted(want)
    for topic, tc in table.items():
        w = want[topic]
        assert (tc.topic_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_filter_type,
                tc.topic_sys_flag, tc.order, tc.attributes) == (
            w["topicName"], w["readQueueNums"], w["writeQueueNums"], w["perm"], w["topicFilterType"],
            w["topicSysFlag"], w["order"], w["attributes"])
        assert tc.queue_type == w["attributes"].get("queue.type", "SimpleCQ")
    rows = {r["topic"]: r for r in topic_rows(load(store, "topics.json"), store)}
    assert rows["BatchTopic"]["queue_type"] == "BatchCQ" and rows["BatchTopic"]["queues_on_disk"] == 2
    assert rows["TopicA"]["perm"] == "RW-" and rows["TBW102"]["perm"] == "RWX"


def test_no_topic_table_without_topics_json():
    assert topic_table(Store.open(store_path("dev-sample"))) is None


def test_subscription_groups(name):
    loaded = load(Store.open(store_path(name)), "subscriptionGroup.json")
    want = readback(name)["metadata"]["subscriptionGroupTable"]
    rows = {r["group"]: r for r in group_rows(loaded)}
    assert sorted(rows) == sorted(want)
    for group, w in want.items():
        assert {k: v for k, v in rows[group].items() if k not in ("group", "forbidden")} == {
            snake(k): v for k, v in w.items() if k != "groupName"}
        assert rows[group]["forbidden"] == loaded.value.forbidden.get(group, {})


def test_data_versions(name):
    store = Store.open(store_path(name))
    md = readback(name)["metadata"]
    for file, key in (("topics.json", "topicConfigManager.dataVersion"),
                      ("subscriptionGroup.json", "subscriptionGroupManager.dataVersion"),
                      ("consumerOffset.json", "consumerOffsetManager.dataVersion"),
                      ("delayOffset.json", "scheduleMessageService.dataVersion")):
        assert load(store, file).value.data_version.to_json() == md[key], file
    assert [r["file"] for r in config_rows(store)] == ["topics.json", "subscriptionGroup.json",
                                                       "consumerOffset.json", "delayOffset.json"]


def expected_offsets(name: str) -> list[tuple]:
    return sorted((o["group"], o["topic"], o["queueId"], o["committedOffset"], o["cqMaxOffset"], o["lag"])
                  for o in readback(name)["metadata"]["consumerOffsets"])


def test_consumer_offsets_with_lag(name):
    store = Store.open(store_path(name))
    rows = list(offset_rows(load(store, "consumerOffset.json"), store))
    assert [(r["group"], r["topic"], r["queue_id"], r["offset"], r["max_offset"], r["lag"]) for r in rows] == \
        expected_offsets(name)
    assert all(o["queryOffset"] == o["committedOffset"] for o in readback(name)["metadata"]["consumerOffsets"])


def test_offsets_command_filters_and_totals(name):
    want = expected_offsets(name)
    result = run("offsets", store_path(name), "--group", "GroupB", "--topic", "TopicA", "-f", "jsonl")
    assert result.exit_code == 0
    assert [tuple(r.values())[:6] for r in jsonl(result)] == [w for w in want if w[:2] == ("GroupB", "TopicA")]
    by_group = {r["group"]: r for r in jsonl(run("offsets", store_path(name), "--by", "group", "-f", "jsonl"))}
    for group in {w[0] for w in want}:
        mine = [w for w in want if w[0] == group]
        assert by_group[group]["lag"] == sum(w[5] for w in mine if w[5] is not None)
        assert by_group[group]["queues"] == len(mine)
    assert run("offsets", store_path(name), "--group", "GroupIdle").exit_code == 1
    assert list(totals(iter([]), ("group",))) == []


def test_delay_level_offsets(name):
    store = Store.open(store_path(name))
    md = readback(name)["metadata"]
    rows = list(delay_rows(load(store, "delayOffset.json"), store))
    assert {str(r["level"]): r["offset"] for r in rows} == md[SCHEDULE_OFFSETS]
    assert all(r["delay_ms"] == md["scheduleMessageService.delayLevelTable(level -> ms)"][str(r["level"])]
               for r in rows)
    cq = {(q["topic"], q["queueId"]): q["maxOffsetInQueue"] for q in readback(name)["consumeQueues"]}
    assert all(r["max_offset"] == cq[("SCHEDULE_TOPIC_XXXX", r["queue_id"])] for r in rows)
    assert jsonl(run("delay-offsets", store_path(name), "-f", "jsonl")) == rows


def test_4x_delay_offsets_without_data_version():
    rows = jsonl(run("delay-offsets", store_path("dev-sample"), "-f", "jsonl"))
    cq = {q["queueId"]: q["maxOffsetInQueue"] for q in readback("dev-sample")["consumeQueues"]
          if q["topic"] == "SCHEDULE_TOPIC_XXXX"}
    assert [(r["level"], r["offset"], r["max_offset"]) for r in rows] == [(1, 2, cq[0]), (2, 2, cq[1])]
    assert next(config_rows(Store.open(store_path("dev-sample"))))["data_version_counter"] is None
    result = run("delay-offsets", store_path("dev-sample-5x"))
    assert result.exit_code == 4 and "no config/delayOffset.json" in result.stderr


def test_cli_tables(name):
    for command in ("topics", "groups", "offsets", "delay-offsets", "config"):
        result = run(command, store_path(name), "-f", "plain")
        assert result.exit_code == 0 and result.stdout.count("\n") > 2, command


# -- ConfigManager.load's .bak fallback -------------------------------------------------------------
@pytest.fixture
def copy(tmp_path, name):
    dst = tmp_path / "store"
    shutil.copytree(store_path(name), dst)
    return dst


def test_broken_file_falls_back_to_bak(copy, name):
    path = copy / "config" / "consumerOffset.json"
    path.write_text(path.read_text()[:200])
    result = run("offsets", copy, "-f", "jsonl")
    assert result.exit_code == 0
    assert sorted(tuple(r.values())[:6] for r in jsonl(result)) == expected_offsets(name)
    assert result.stderr.startswith("rmqtool: read consumerOffset.json.bak as the broker would: ")
    assert f"{path}: offset " in result.stderr
    loaded = load(Store.open(copy), "consumerOffset.json")
    assert loaded.path.name == "consumerOffset.json.bak" and loaded.fallback


@pytest.mark.parametrize("how", ["missing", "empty"])
def test_missing_or_empty_file_reads_bak(copy, how):
    path = copy / "config" / "topics.json"
    path.unlink() if how == "missing" else path.write_text("")
    loaded = load(Store.open(copy), "topics.json")
    assert loaded.path.name == "topics.json.bak" and how in loaded.fallback
    assert [r["read_from"] for r in config_rows(Store.open(copy))][0] == "topics.json.bak"


def test_both_broken_is_one_line_error(copy):
    path = copy / "config" / "consumerOffset.json"
    path.write_text('{"offsetTable":{"T@G":{0:1,')
    (copy / "config" / "consumerOffset.json.bak").write_bytes(b'{"offsetTable": nope}')
    result = run("offsets", copy)
    assert result.exit_code == 3 and result.stdout == ""
    assert result.stderr == (f"rmqtool: error: {path}.bak: offset 16: not fastjson: Expecting value; "
                             "consumerOffset.json: not fastjson: Expecting property name enclosed in double "
                             "quotes\n")


def test_broken_file_without_bak_is_an_error(copy):
    path = copy / "config" / "delayOffset.json"
    path.write_text('{"offsetTable":[1,2]}')
    (copy / "config" / "delayOffset.json.bak").unlink()
    result = run("delay-offsets", copy)
    assert result.exit_code == 3
    assert result.stderr == f"rmqtool: error: {path}: offsetTable is not an object\n"


def test_no_offsets_file_at_all(copy):
    for p in (copy / "config").glob("consumerOffset.json*"):
        p.unlink()
    result = run("offsets", copy)
    assert result.exit_code == 4 and "no config/consumerOffset.json" in result.stderr


def test_fastjson_errors_give_the_offset_in_the_original_text():
    text = '{"a":{0:1,12:2},"b":x}'
    with pytest.raises(FormatError) as err:
        parse_fastjson(text)
    assert err.value.offset == text.index("x")
    text = '{"名":{0:1},"b":x}'
    with pytest.raises(FormatError) as err:
        parse_fastjson(text)
    assert err.value.offset == len(text[:text.index("x")].encode())


@given(st.dictionaries(st.text(max_size=8), st.dictionaries(st.integers(-5, 10**6), st.integers(-2**63, 2**63 - 1),
                                                            max_size=4), max_size=4))
def test_fastjson_integer_keys_parse_like_quoted_ones(table):
    quoted = json.dumps({"offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in table.items()}},
                        ensure_ascii=False)
    bare = "{\"offsetTable\":{" + ",".join(
        json.dumps(k, ensure_ascii=False) + ":{" + ",".join(f"{q}:{o}" for q, o in v.items()) + "\n\t\t}"
        for k, v in table.items()) + "\n\t}}"
    assert parse_fastjson(bare) == json.loads(quoted)


# -- lmqConsumerOffset.json (enableLmq) -------------------------------------------------------------
@pytest.fixture
def lmq_store(tmp_path):
    """dev-lmq-5x with the config/lmqConsumerOffset.json (+ .bak) of fixtures/dev-lmq-5x-offsets."""
    dst = tmp_path / "store"
    shutil.copytree(store_path("dev-lmq-5x"), dst)
    shutil.copytree(FIXTURES / "dev-lmq-5x-offsets" / "config", dst / "config")
    return dst


def test_lmq_consumer_offsets(lmq_store):
    """LmqConsumerOffsetManager: every group in lmqConsumerOffset.json, %LMQ% groups in lmqOffsetTable
    (topic@group -> offset, queue 0); lag against the LMQ queue's max offset (getLmqQueueOffset)."""
    lmq_max = readback("dev-lmq-5x")["lmq"]["getLmqQueueOffset(after load)"]
    result = run("offsets", lmq_store, "-f", "jsonl")
    assert (result.exit_code, result.stderr) == (0, "")
    rows = {(r["group"], r["topic"], r["queue_id"]): (r["offset"], r["max_offset"], r["lag"]) for r in jsonl(result)}
    for queue, offset in (("%LMQ%device%42", 50), ("%LMQ%room-1", 42), ("%LMQ%房间3", 40)):
        assert rows[(queue, queue, 0)] == (offset, lmq_max[queue], lmq_max[queue] - offset)
    high = next(q["maxOffsetInQueue"] for q in readback("dev-lmq-5x")["consumeQueues"]
                if (q["topic"], q["queueId"]) == ("LmqParent", 1))
    assert rows[("GroupL", "LmqParent", 1)] == (44, high, high - 44)
    assert rows[("GroupL", "%RETRY%GroupL", 0)] == (0, None, None)
    assert len(rows) == 3 + 2 + 1 + 4
    only = jsonl(run("offsets", lmq_store, "--group", "%LMQ%room-1", "-f", "jsonl"))
    assert [(r["topic"], r["lag"]) for r in only] == [("%LMQ%room-1", 0)]
    assert [r["read_from"] for r in config_rows(Store.open(lmq_store))] == ["lmqConsumerOffset.json"]


def test_lmq_consumer_offsets_bak(lmq_store):
    (lmq_store / "config" / "lmqConsumerOffset.json").unlink()
    result = run("offsets", lmq_store, "--by", "group", "-f", "jsonl")
    assert result.exit_code == 0
    assert result.stderr == ("rmqtool: read lmqConsumerOffset.json.bak as the broker would: "
                             "lmqConsumerOffset.json is missing\n")
    assert {r["group"] for r in jsonl(result)} == {"GroupL", "%LMQ%device%42", "%LMQ%room-1", "%LMQ%房间3"}


# -- crash sets: queue maxima as the broker's recovery leaves them ----------------------------------
@pytest.mark.parametrize("name", ["dev-sample-crash-torn", "dev-sample-5x-crash-torn", "dev-sample-5x-crash"])
def test_offsets_after_a_crash_cap_at_the_recovered_end(tmp_path, name):
    """With abort present, recovery cuts the commit log at the torn record and truncateDirtyLogicFiles drops
    the consume-queue units at or after it: max_offset is the recovered queue's (recovery-readback.json)."""
    dst = tmp_path / "store"
    shutil.copytree(store_path(name), dst)
    want = {(q["topic"], q["queueId"]): q["maxOffsetInQueue"] for q in readback(name)["consumeQueues"]
            if (dst / "consumequeue" / q["topic"]).is_dir()}
    table: dict = {}
    for t, q in want:
        table.setdefault(f"{t}@G", {})[q] = 0
    (dst / "config").mkdir()
    (dst / "config" / "consumerOffset.json").write_text(json.dumps({"offsetTable": table}))
    result = run("offsets", dst, "-f", "jsonl")
    assert result.exit_code == 0
    assert {(r["topic"], r["queue_id"]): r["max_offset"] for r in jsonl(result)} == want
    end = readback(name)["maxPhyOffset"]
    assert result.stderr == ("rmqtool: warning: abort file present (the broker did not shut down cleanly): max "
                             "offsets are what its recovery keeps, consume-queue units at or after commit-log "
                             f"offset {end} left out\n")
    # delay-offsets reads SCHEDULE_TOPIC_XXXX queues the same way: a copy of TopicB's queue 0 stands in for level 1
    shutil.copytree(dst / "consumequeue" / "TopicB" / "0", dst / "consumequeue" / "SCHEDULE_TOPIC_XXXX" / "0")
    (dst / "config" / "delayOffset.json").write_text(json.dumps({"offsetTable": {1: 0}}))
    rows = jsonl(run("delay-offsets", dst, "-f", "jsonl"))
    assert [(r["queue_id"], r["max_offset"]) for r in rows] == [(0, want[("TopicB", 0)])]


@pytest.mark.parametrize("name", ["dev-sample-crash-torn", "dev-sample-5x-crash-torn", "dev-sample-5x-crash"])
def test_topic_status_after_a_crash_caps_at_the_recovered_end(name):
    """The same rule as offsets (crash_recovered_end): topic-status gives the recovered queues' maxima and
    says so; the last message's store time is that of the recovered queue's last unit."""
    want = {(q["topic"], q["queueId"]): q["maxOffsetInQueue"] for q in readback(name)["consumeQueues"]
            if (store_path(name) / "consumequeue" / q["topic"]).is_dir()}
    result = run("topic-status", store_path(name), *sorted({t for t, _ in want}), "-f", "jsonl")
    rows = jsonl(result)
    assert {(r["topic"], r["queue_id"]): r["max_offset"] for r in rows} == want
    assert result.stderr.startswith("rmqtool: warning: abort file present (the broker did not shut down cleanly)")
    assert f"offset {readback(name)['maxPhyOffset']} left out" in result.stderr
    stamps = {x["physicalOffset"]: x.get("storeTimestamp") for x in readback(name)["commitlogRecords"]}
    for q in readback(name)["consumeQueues"]:
        units = q["units[queueOffset,commitLogOffset,size,tagsCode]"]
        row = next((r for r in rows if (r["topic"], r["queue_id"]) == (q["topic"], q["queueId"])), None)
        if row is not None and units:
            assert row["last_updated_timestamp"] == stamps[units[-1][1]]


def test_lmq_consumer_offsets_in_query_id_track(lmq_store):
    """query-id --track reads the same offsets (LmqConsumerOffsetManager's file when the broker wrote it)."""
    rec = next(r for r in readback("dev-lmq-5x")["commitlogRecords"]
               if r.get("topic") == "LmqParent" and r["queueId"] == 1)
    rows = jsonl(run("query-id", lmq_store, rec["msgId"], "--track", "-f", "jsonl"))
    assert [(r["group"], r["offset"], r["consumed"]) for r in rows] == [("GroupL", 44, True)]
