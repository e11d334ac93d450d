"""5.x static topics (#38 item 3): config/topicQueueMapping.json read as TopicQueueMappingManager loads it, and each
physical unit's logical queue and logical offset (LogicQueueMappingItem.computeStaticQueueOffsetLoosely) in
cat-cq, topic-status, offsets and query-id, against the readback of the real 5.3.3 classes; verify's rule
static_topic_mapping."""

from __future__ import annotations

import json

import pytest

from conftest import readback, run, store_path
from rmqtool.format.statictopic import decode_topic_queue_mapping
from rmqtool.store.config import read_config

STATIC_SETS = ["dev-static-5x"]
UNITS = "units[physicalQueueOffset,logicalQueueOffset,commitLogOffset,size]"


def _jsonl(*args) -> list[dict]:
    res = run(*args, "-f", "jsonl")
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.stdout.splitlines()]


def _hosted(name: str):
    """(topic, hosted logical queue) of each logical queue led from this broker (its units are in this store)."""
    for t in readback(name)["static"]["staticTopics"]:
        for q in t["hostedQueues"]:
            if q["leaderBroker"] == t["mappingDetail(loaded)"]["bname"]:
                yield t["topic"], q


@pytest.mark.parametrize("name", STATIC_SETS)
def test_the_mapping_file_decodes_as_the_broker_loads_it(name):
    """Unquoted integer keys and every field of every item, generations in file order, as the reloaded
    TopicQueueMappingManager holds them."""
    loaded = decode_topic_queue_mapping(read_config(store_path(name) / "config" / "topicQueueMapping.json"))
    want = readback(name)["static"]
    assert loaded.data_version.to_json() == want["dataVersion"]
    assert sorted(loaded.entries) == sorted(t["topic"] for t in want["staticTopics"])
    for t in want["staticTopics"]:
        d, w = loaded.entries[t["topic"]], t["mappingDetail(loaded)"]
        assert (d.topic, d.total_queues, d.bname, d.epoch, d.dirty, d.scope) == \
            (w["topic"], w["totalQueues"], w["bname"], w["epoch"], w["dirty"], w["scope"])
        assert {str(k): [i._asdict() for i in items] for k, items in d.hosted_queues.items()} == {
            k: [dict(gen=i["gen"], queue_id=i["queueId"], bname=i["bname"], logic_offset=i["logicOffset"],
                     start_offset=i["startOffset"], end_offset=i["endOffset"], time_of_start=i["timeOfStart"],
                     time_of_end=i["timeOfEnd"]) for i in items] for k, items in w["hostedQueues"].items()}


@pytest.mark.parametrize("name", STATIC_SETS)
def test_every_hosted_unit_has_the_readbacks_logical_queue_and_offset(name):
    """cat-cq of each physical queue: per unit the logical queue and logical offset the broker's send path
    answered (items of generation 1 after the remap start at their logicOffset); topic-status's logical
    range covers exactly those units."""
    status = {(r["topic"], r["queue_id"]): r for r in _jsonl("topic-status", store_path(name))}
    n = 0
    for topic, q in _hosted(name):
        rows = _jsonl("cat-cq", store_path(name), topic, q["physicalQueueId"])
        assert [[r["queue_offset"], r["logical_queue_offset"], r["physical_offset"], r["size"]]
                for r in rows] == q[UNITS]
        assert {r["logical_queue_id"] for r in rows} == {q["logicalQueueId"]}
        s = status[(topic, q["physicalQueueId"])]
        assert (s["logical_queue_id"], s["logical_min_offset"], s["logical_max_offset"]) == \
            (q["logicalQueueId"], q[UNITS][0][1], q[UNITS][-1][1] + 1)
        n += len(rows)
    assert n > 0
    assert all("logical_queue_id" not in r for (t, _), r in status.items() if t not in {t for t, _ in _hosted(name)})


@pytest.mark.parametrize("name", STATIC_SETS)
def test_query_id_shows_the_logical_queue_of_a_static_record(name):
    msg_ids = {r["physicalOffset"]: r["msgId"] for r in readback(name)["commitlogRecords"] if "msgId" in r}
    for _, q in _hosted(name):
        phy_offset, logical, phy, _ = q[UNITS][-1]
        (row,) = _jsonl("query-id", store_path(name), msg_ids[phy], "--kind", "msg-id")
        assert (row["queue_offset"], row["logical_queue_id"], row["logical_queue_offset"]) == \
            (phy_offset, q["logicalQueueId"], logical)
    plain = run("query-id", store_path(name), msg_ids[q[UNITS][-1][2]], "-f", "plain")
    assert "logical_queue_offset" in plain.stdout


def test_offsets_of_a_static_topic_are_shown_logically(store_copy):
    """ConsumerManageProcessor stores a static topic's offsets physically; queryConsumerOffset answers them
    through computeStaticQueueOffsetStrictly (generation 1 items start at 10000)."""
    store = store_copy("dev-static-5x")
    path = store / "config" / "consumerOffset.json"
    path.write_text(path.read_text().replace('"offsetTable":{}',
                                             '"offsetTable":{"StaticTopic@G":{0:5,3:2},"TopicA@G":{1:3}}'))
    rows = {(r["topic"], r["queue_id"]): r for r in _jsonl("offsets", store)}
    assert (rows[("StaticTopic", 3)]["logical_queue_id"], rows[("StaticTopic", 3)]["logical_offset"],
            rows[("StaticTopic", 3)]["logical_max_offset"]) == (0, 10002, 10004)
    assert (rows[("StaticTopic", 0)]["logical_queue_id"], rows[("StaticTopic", 0)]["logical_offset"]) == (1, 5)
    assert "logical_offset" not in rows[("TopicA", 1)]
    assert "logical" not in run("offsets", store, "--topic", "TopicA", "-f", "plain").stdout


def test_verify_reports_a_mapping_that_does_not_match_the_queues(store_copy):
    """The real set verifies clean; the .bak the broker loads when the file does not decode (a remap's first
    step, logic offsets -1) and two logical queues on one physical queue are warnings; a physical queue with
    messages that no item names is an error."""
    store = store_copy("dev-static-5x")
    assert run("verify", store).exit_code == 0
    mapping = store / "config" / "topicQueueMapping.json"
    text = mapping.read_text()
    mapping.write_text(text[:text.index("hostedQueues") + 16])        # cut inside the unquoted keys: the .bak
    res = run("verify", store, "-f", "jsonl")
    kinds = [json.loads(line)["kind"] for line in res.stdout.splitlines()]
    assert res.exit_code == 0 and kinds.count("static_mapping_mismatch") == 3, res.output
    assert "config_fallback" in kinds
    assert {r["logical_queue_offset"] for r in _jsonl("cat-cq", store, "StaticTopic", 3)} == {-1}
    i = text.index('"StaticTopic"')
    j = text.index('"queueId":3', i)                         # logical 0's broker-a item names queue 2 instead
    mapping.write_text(text[:j] + '"queueId":2' + text[j + len('"queueId":3'):])
    res = run("verify", store, "-f", "jsonl")
    found = [json.loads(line) for line in res.stdout.splitlines()]
    assert res.exit_code == 1
    (err,) = [f for f in found if f["severity"] == "error"]
    assert (err["kind"], err["actual"]) == ("static_queue_unmapped", 3) and err["path"].endswith("StaticTopic/3")
    assert [f["actual"] for f in found if f["kind"] == "static_mapping_mismatch"] == [2]
    assert "4.9.7: safe to start; 5.3.3: not safe to start" in run("verify", store, "-f", "plain").output


def test_a_store_without_static_topics_shows_no_logical_columns():
    assert "logical" not in run("topic-status", store_path("dev-config-5x"), "TopicA", "-f", "plain").stdout
    assert "logical" not in run("cat-cq", store_path("dev-config-5x"), "TopicA", 0, "-f", "jsonl").stdout
