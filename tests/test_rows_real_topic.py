"""Delay-level and timer messages show their REAL_TOPIC / REAL_QID in every row view (record rows, the
columnar decoder, jsonl, tables), checked against the real broker's readback."""

from __future__ import annotations

import json

import pytest

from rmqtool.columnar import iter_record_batches
from rmqtool.format.rows import entry_row
from rmqtool.store.store import Store
from tests.conftest import CONFIG_SETS, TIMER_SETS, readback, run, store_path


def expected(name: str) -> dict[int, tuple]:
    return {r["physicalOffset"]: (r["properties"].get("REAL_TOPIC"),
                                  int(r["properties"]["REAL_QID"]) if "REAL_QID" in r["properties"] else None)
            for r in readback(name)["commitlogRecords"] if r["type"] != "BLANK"}


@pytest.mark.parametrize("name", CONFIG_SETS + TIMER_SETS)
def test_record_rows_and_columns_carry_real_topic_and_queue(name):
    want = expected(name)
    assert sum(1 for t, _ in want.values() if t) >= 12
    rows = {loc.offset: entry_row(loc.entry, loc.offset)
            for loc in Store.open(store_path(name)).commitlog.iter_entries(include_blank=False)}
    assert {o: (r["real_topic"], r["real_queue_id"]) for o, r in rows.items()} == want
    columns = {}
    for batch in iter_record_batches(store_path(name)):
        for row in batch.select(["type", "physical_offset", "real_topic", "real_queue_id"]).to_pylist():
            if row["type"] == "message":
                columns[row["physical_offset"]] = (row["real_topic"], row["real_queue_id"])
    assert columns == want


@pytest.mark.parametrize("name", CONFIG_SETS)
def test_redelivered_delay_messages_in_the_cli(name):
    want = {o: v for o, v in expected(name).items() if v[0]}
    scan = run("cat-commitlog", store_path(name), "-f", "jsonl")
    rows = [json.loads(line) for line in scan.stdout.splitlines()]
    assert {r["physical_offset"]: (r["real_topic"], r["real_queue_id"]) for r in rows if r["real_topic"]} == want
    table = run("cat-commitlog", store_path(name), "--topic", "SCHEDULE_TOPIC_XXXX", "-f", "csv", "--fields", "physical_offset,topic,real_topic,real_queue_id")
    lines = table.stdout.splitlines()
    assert lines[0] == "physical_offset,topic,real_topic,real_queue_id"
    assert {int(line.split(",")[0]): (line.split(",")[2], int(line.split(",")[3])) for line in lines[1:]} == \
        {o: v for o, v in want.items() if o in {r["physical_offset"] for r in rows
                                                 if r["topic"] == "SCHEDULE_TOPIC_XXXX"}}
