"""The 5.x timer store against the real broker's readback: timer-log units, wheel slots, pending messages,
timercheck, timermetrics; codec round trips; other geometries; damaged input."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqtool.format.timer import (BLANK_MAGIC_CODE, MIN_BLANK_LEN, SLOT_SIZE, UNIT_SIZE, TimerBlank,
                                  TimerCheckpoint, TimerMetric, TimerMetrics, TimerSlot, TimerUnit,
                                  decode_slot, decode_timercheck, decode_timerlog_entry, encode_slot,
                                  encode_timer_metrics, encode_timercheck, encode_timerlog_entry,
                                  parse_timer_metrics)
from rmqtool.format.fastjson import DataVersion
from rmqtool.format.java import java_string_hash
from rmqtool.ops.metadata import config_rows
from rmqtool.ops.timer import PENDING_FIELDS, open_timer_store, pending_rows
from rmqtool.store import timer as store_timer
from rmqtool.store.store import Store
from rmqtool.store.timer import TimerStore
from tests.conftest import TIMER_SETS, made_at, readback, run, store_path

SLOTS_KEY = "timerwheelSlots(non-empty, TimerWheel.getRawSlot/getSlot)"
i32 = st.integers(-2**31, 2**31 - 1)
i64 = st.integers(-2**63, 2**63 - 1)


@pytest.fixture(params=TIMER_SETS)
def name(request):
    return request.param


def test_every_timerlog_unit_and_blank(name):
    ts = TimerStore.open(store_path(name))
    got = list(ts.iter_timerlog())
    want = readback(name)["timer"]["timerlogUnits"]
    assert [off for off, _ in got] == [u["offset"] for u in want]
    for (off, entry), u in zip(got, want):
        if u["type"] == "BLANK":
            assert isinstance(entry, TimerBlank) and entry.size == u["size"]
            assert f"0x{BLANK_MAGIC_CODE & 0xFFFFFFFF:08x}" == u["magic"]
            continue
        assert (entry.size, entry.prev_pos, entry.magic, entry.curr_write_time_ms, entry.delayed_time,
                entry.delayed_time_ms, entry.offset_py, entry.size_py, entry.real_topic_hash, entry.reserved) == (
            u["size"], u["prevPos"], u["magic"], u["currWriteTimeMs"], u["delayedTime(relative)"],
            u["delayedTimeMs"], u["offsetPy"], u["sizePy"], u["hashCodeOfRealTopic"], u["reserved"])
        assert entry.is_roll == ("ROLL" in u["magicFlags"]) and entry.is_delete == ("DELETE" in u["magicFlags"])


def test_timerlog_files_reencode_exactly(name):
    ts = TimerStore.open(store_path(name))
    assert [(f.path.name, f.start, f.length) for f in ts.timerlog] == [
        (f["file"], f["fileFromOffset"], f["fileSize"]) for f in readback(name)["timer"]["timerlogFiles"]]
    entries = dict(ts.iter_timerlog())
    for f in ts.timerlog:
        data = f.path.read_bytes()
        encoded = b"".join(encode_timerlog_entry(e) for off, e in entries.items()
                           if f.start <= off < f.start + f.length)
        assert data[:len(encoded)] == encoded and not any(data[len(encoded):])


def test_every_non_empty_slot_read_without_reading_the_wheel_whole(name, monkeypatch):
    reads = []
    real_pread = os.pread
    monkeypatch.setattr(store_timer.os, "pread", lambda fd, n, off: reads.append(n) or real_pread(fd, n, off))
    ts = TimerStore.open(store_path(name))
    want = readback(name)["timer"][SLOTS_KEY]
    assert ts.slot_count * SLOT_SIZE == readback(name)["timer"]["timerwheel"]["fileSize"]
    got = list(ts.iter_slots())
    assert [(i, i * SLOT_SIZE, s.time_ms(ts.precision_ms), s.first_pos, s.last_pos, s.num, s.magic)
            for i, s in got] == [(w["slotIndex"], w["byteOffset"], w["timeMs"], w["firstPos"], w["lastPos"],
                                 w["num"], w["magic"]) for w in want]
    assert all(w["getSlot(timeMs).matches"] for w in want)
    assert all(ts.slot_at(w["timeMs"]) == s for w, (_, s) in zip(want, got))
    assert sum(reads) < ts.slot_count * SLOT_SIZE // 4


def test_slots_are_found_without_seek_data(name, monkeypatch):
    want = list(TimerStore.open(store_path(name)).iter_slots())
    monkeypatch.delattr(store_timer.os, "SEEK_DATA", raising=False)
    assert list(TimerStore.open(store_path(name)).iter_slots()) == want


def test_pending_messages_as_the_dequeue_walks_them(name):
    store = Store.open(store_path(name))
    problems: list[str] = []
    rows = list(pending_rows(store, open_timer_store(store), problems))
    want = readback(name)["timer"]["pendingMessages"]
    assert problems == []
    assert [(r["timerlog_offset"], r["magic"], r["physical_offset"], r["size"], r["slot_timestamp"],
             r["real_topic"], r["real_queue_id"], r["uniq_key"], r["deliver_timestamp"], r["roll_times"],
             r["state"]) for r in rows] == [
        (w["timerlogOffset"], w["magic"], w["offsetPy"], w["sizePy"], w["slotTimeMs"], w["realTopic"],
         int(w["realQueueId"]), w["uniqKey"], int(w["TIMER_OUT_MS"]), int(w["TIMER_ROLL_TIMES"] or 0), w["state"])
        for w in want]
    # the unit's topic hash is the real topic's String.hashCode
    units = {off: u for off, u in TimerStore.open(store_path(name)).iter_timerlog()}
    assert all(units[r["timerlog_offset"]].real_topic_hash == java_string_hash(r["real_topic"]) for r in rows)


def test_timercheck_and_timermetrics(name):
    ts = TimerStore.open(store_path(name))
    rb = readback(name)["timer"]
    cp = ts.checkpoint()
    want = rb["timercheck"]
    assert cp[:7] == (want["lastReadTimeMs"], want["lastTimerLogFlushPos"], want["lastTimerQueueOffset"],
                      want["masterTimerQueueOffset"], want["dataVersion.stateVersion"], want["dataVersion.timestamp"],
                      want["dataVersion.counter"])
    raw = (store_path(name) / "config" / "timercheck").read_bytes()
    assert encode_timercheck(decode_timercheck(raw)) == raw
    loaded = ts.metrics()
    assert loaded.fallback is None
    assert {t: {"count": m.count, "timeStamp": m.time_stamp} for t, m in loaded.value.timing_count.items()} == \
        rb["timermetrics.timingCount"]
    assert loaded.value.data_version.to_json() == json.loads(rb["timermetrics.dataVersion"])
    text = (store_path(name) / "config" / "timermetrics").read_text()
    assert encode_timer_metrics(parse_timer_metrics(text)) == text
    row = next(config_rows(Store.open(store_path(name))))
    assert (row["file"], row["entries"], row["data_version_counter"]) == (
        "timermetrics", len(rb["timermetrics.timingCount"]), loaded.value.data_version.counter)


def test_timer_command_views(name):
    path = store_path(name)
    rb = readback(name)["timer"]
    pending = run("timer", path, "-f", "jsonl", "--now", made_at(path))
    assert pending.exit_code == 0, pending.stderr
    rows = [json.loads(line) for line in pending.stdout.splitlines()]
    assert [list(r) for r in rows[:1]] == [PENDING_FIELDS]
    assert [r["state"] for r in rows] == [w["state"] for w in rb["pendingMessages"]]
    units = [json.loads(line) for line in run("timer", path, "--units", "-f", "jsonl").stdout.splitlines()]
    assert [(u["timerlog_offset"], u["type"]) for u in units] == [(w["offset"], w["type"].lower())
                                                                 for w in rb["timerlogUnits"]]
    slots = [json.loads(line) for line in run("timer", path, "--slots", "-f", "jsonl").stdout.splitlines()]
    assert [(s["slot"], s["slot_timestamp"], s["in_place"]) for s in slots] == [
        (w["slotIndex"], w["timeMs"], True) for w in rb[SLOTS_KEY]]
    check = json.loads(run("timer", path, "--check", "-f", "jsonl").stdout)
    assert check["last_read_time_ms"] == rb["timercheck"]["lastReadTimeMs"]
    metrics = run("timer", path, "--metrics", "-f", "csv").stdout.splitlines()
    assert metrics[0] == "topic,count,time_stamp" and len(metrics) == 1 + len(rb["timermetrics.timingCount"])
    assert run("timer", store_path("dev-sample"), "--slots").exit_code == 4


def _copy(tmp_path, name):
    dst = tmp_path / "store"
    shutil.copytree(store_path(name), dst, ignore=shutil.ignore_patterns("timerwheel"))
    return dst


def test_truncated_timerlog_is_one_line_error_with_its_offset(tmp_path, name):
    dst = _copy(tmp_path, name)
    last = sorted((dst / "timerlog").iterdir())[-1]
    units = [u for u in readback(name)["timer"]["timerlogUnits"] if u["type"] == "UNIT"]
    cut = units[-1]["offset"]
    last.write_bytes(last.read_bytes()[:cut - int(last.name) + 30])
    result = run("timer", dst, "--units", "-f", "jsonl")
    assert result.exit_code == 3
    assert result.stderr == (f"rmqtool: error: {last}: offset {cut}: truncated timer-log unit: "
                             f"needs {UNIT_SIZE} bytes, 30 available\n")
    assert len(result.stdout.splitlines()) == len(readback(name)["timer"]["timerlogUnits"]) - 1


def test_other_geometry_and_precision(tmp_path):
    """A wheel of 10 slots at 100 ms, timer-log files of 3 units: slots, precision and chains still hold."""
    root = tmp_path / "store"
    (root / "timerlog").mkdir(parents=True)
    (root / "consumequeue").mkdir()
    base, prec, n = 1_800_000_000_000, 100, 10
    units = [TimerUnit(UNIT_SIZE, -1, 1, base, 300, 0, 100, 7, 0),
             TimerUnit(UNIT_SIZE, 0, 3, base, 300, 100, 100, 7, 0),
             TimerUnit(UNIT_SIZE, -1, 5, base, 1200, 200, 100, 7, 0)]
    file_size = 3 * UNIT_SIZE + 20
    first = b"".join(encode_timerlog_entry(u) for u in units[:2]) + encode_timerlog_entry(
        TimerBlank(file_size - 2 * UNIT_SIZE, bytes(file_size - 2 * UNIT_SIZE - MIN_BLANK_LEN)))
    (root / "timerlog" / f"{0:020d}").write_bytes(first)
    second = encode_timerlog_entry(units[2]) + bytes(file_size - UNIT_SIZE)
    (root / "timerlog" / f"{file_size:020d}").write_bytes(second)
    wheel = bytearray(n * SLOT_SIZE)
    t1, t2 = (base + 300) // prec, (base + 1200) // prec
    for t, slot in ((t1, TimerSlot(t1, 0, UNIT_SIZE, 2, 0)), (t2, TimerSlot(t2, file_size, file_size, 1, 0))):
        wheel[t % n * SLOT_SIZE:(t % n + 1) * SLOT_SIZE] = encode_slot(slot)
    (root / "timerwheel").write_bytes(bytes(wheel))
    ts = TimerStore.open(root)
    assert ts.slot_count == n and ts.precision_ms == prec
    assert [i for i, _ in ts.iter_slots()] == sorted({t1 % n, t2 % n})
    assert [off for off, _ in ts.iter_timerlog()] == [0, UNIT_SIZE, 2 * UNIT_SIZE, file_size]
    problems: list[str] = []
    rows = list(pending_rows(Store.open(root), ts, problems, from_ms=base))
    assert [(r["slot_timestamp"], r["timerlog_offset"], r["state"]) for r in rows] == [
        (base + 300, UNIT_SIZE, "message-missing"), (base + 300, 0, "message-missing"),
        (base + 1200, file_size, "message-missing")]
    assert TimerStore.open(root, precision_ms=1000).slot_at(base + 1200) is None


# -- codec round trips ------------------------------------------------------------------------------
@given(st.builds(TimerUnit, st.just(UNIT_SIZE), i64, st.integers(0, 15), i64, i32, i64, i32, i32, i64))
def test_unit_round_trip(unit):
    raw = encode_timerlog_entry(unit)
    assert len(raw) == UNIT_SIZE and decode_timerlog_entry(raw) == unit
    assert encode_timerlog_entry(decode_timerlog_entry(raw)) == raw


@given(st.binary(max_size=80))
def test_blank_round_trip(padding):
    blank = TimerBlank(MIN_BLANK_LEN + len(padding), padding)
    raw = encode_timerlog_entry(blank)
    assert decode_timerlog_entry(raw) == blank and encode_timerlog_entry(decode_timerlog_entry(raw)) == raw


@given(st.builds(TimerSlot, i64, i64, i64, i32, i32))
def test_slot_round_trip(slot):
    raw = encode_slot(slot)
    assert len(raw) == SLOT_SIZE and decode_slot(raw) == slot


@given(st.builds(TimerCheckpoint, i64, i64, i64, i64, i64, i64, i64, st.binary(max_size=64)))
def test_timercheck_round_trip(cp):
    assert decode_timercheck(encode_timercheck(cp)) == cp


@given(st.dictionaries(st.text(min_size=1), st.builds(TimerMetric, i64, i64), max_size=5), i64, i64, i64)
def test_timermetrics_round_trip(counts, a, b, c):
    metrics = TimerMetrics(DataVersion(a, b, c), counts)
    text = encode_timer_metrics(metrics)
    assert parse_timer_metrics(text) == metrics and encode_timer_metrics(parse_timer_metrics(text)) == text


@pytest.mark.parametrize("raw, what", [(bytes(20), "truncated"), (b"\0\0\0\x34" + bytes(8) + b"\0\0\0\x10" + bytes(36),
                                                                   "not a timer-log unit")])
def test_bad_units_are_format_errors(raw, what):
    from rmqtool.errors import FormatError
    with pytest.raises(FormatError, match=what):
        decode_timerlog_entry(raw)


def test_broken_slot_chain_is_a_finding_with_its_offset(tmp_path, name):
    dst = _copy(tmp_path, name)
    shutil.copy(store_path(name) / "timerwheel", dst / "timerwheel")   # a dense copy: no holes to skip
    first = sorted((dst / "timerlog").iterdir())[0]
    pending = readback(name)["timer"]["pendingMessages"]
    victim = next(w["timerlogOffset"] for w in pending if w["timerlogOffset"] < first.stat().st_size)
    data = bytearray(first.read_bytes())
    data[victim:victim + 4] = (999).to_bytes(4, "big")
    first.write_bytes(bytes(data))
    result = run("timer", dst, "-f", "jsonl")
    assert result.exit_code == 1
    assert len(result.stdout.splitlines()) == len(pending) - 1
    assert f"{first}: offset {victim}: not a timer-log unit: size 999" in result.stderr
    assert result.stderr.startswith("rmqtool: problem: slot ")


def test_timer_command_imports_neither_pyarrow_nor_pyspark(name):
    import subprocess
    import sys

    from tests.conftest import ROOT
    code = ("import sys\nfrom rmqtool.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'pyspark', 'pandas'))\n"
            "print('HEAVY', heavy, file=sys.stderr)\n")
    for args in (["timer"], ["offsets"], ["topics"]):
        proc = subprocess.run([sys.executable, "-c", code, *args, str(store_path(name))], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert "HEAVY []" in proc.stderr, proc.stderr


def test_wheel_of_a_size_that_is_not_whole_slots(tmp_path, name):
    dst = _copy(tmp_path, name)
    (dst / "timerwheel").write_bytes(bytes(SLOT_SIZE * 3 + 5))
    result = run("timer", dst, "--slots")
    assert result.exit_code == 3
    assert result.stderr == (f"rmqtool: error: {dst / 'timerwheel'}: offset {SLOT_SIZE * 3}: timer wheel of "
                             f"{SLOT_SIZE * 3 + 5} bytes is not a whole number of 32-byte slots\n")


def test_rolled_recall_is_a_delete_marker(tmp_path):
    """Magic 7 (DEFAULT|ROLL|DELETE): 5.x TimerMessageStore.dequeue sends it to the normal stack, so it adds
    nothing to the slot's delete list, and TimerDequeuePutMessageService re-puts it as a rolled recall: it is
    a delete marker, never pending, and the message it names is not cancelled in this slot."""
    name = TIMER_SETS[0]
    dst = _copy(tmp_path, name)
    (dst / "timerwheel").symlink_to(store_path(name) / "timerwheel")
    want = readback(name)["timer"]["pendingMessages"]
    marker = next(i for i, w in enumerate(want) if w["magic"] == 5)
    victim = next(i for i, w in enumerate(want) if w["state"] == "cancelled-by-delete"
                  and w["slotTimeMs"] == want[marker]["slotTimeMs"])
    offset = want[marker]["timerlogOffset"]
    log = next(f for f in sorted((dst / "timerlog").iterdir(), reverse=True) if int(f.name) <= offset)
    data = bytearray(log.read_bytes())
    data[offset - int(log.name) + 12:offset - int(log.name) + 16] = (7).to_bytes(4, "big")
    log.write_bytes(bytes(data))
    rows = [json.loads(line) for line in run("timer", dst, "-f", "jsonl").stdout.splitlines()]
    states = [w["state"] for w in want]
    states[victim] = "pending"
    assert [r["state"] for r in rows] == states
    assert (rows[marker]["magic"], rows[marker]["state"]) == (7, "delete-marker")


# -- verify: what a 5.x broker's timer load, recovery and dequeue make of a damaged timer store ---------
def _patch(root, name: str, at: int, fmt: str, value: int) -> None:
    import struct
    path = root / name
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, at, value)
    path.write_bytes(bytes(data))


def _truncate(root, name: str, size: int) -> None:
    os.truncate(root / name, size)


TL0, TL1 = "timerlog/00000000000000000000", "timerlog/00000000000000001300"
TIMER_DAMAGE = [
    # a pending slot's chain (unit 1560 -> 832) broken: the dequeue follows prevPos unchecked (TimerMessageStore.dequeue)
    ("prev_pos_misaligned", lambda r: _patch(r, TL1, 260 + 4, ">q", 1561), ("error", "timer_bad_chain", TL1, 1560)),
    ("prev_pos_forward", lambda r: _patch(r, TL1, 260 + 4, ">q", 1612), ("error", "timer_bad_chain", TL1, 1560)),
    ("prev_pos_other_slot", lambda r: _patch(r, TL1, 260 + 4, ">q", 884), ("error", "timer_bad_chain", TL1, 1560)),
    # a unit the recovery walk rejects: the timer log is truncated there (TimerMessageStore.recoverAndRevise)
    ("bad_magic_last_file", lambda r: _patch(r, TL1, 104 + 12, ">i", 0x10), ("warning", "timer_bad_unit", TL1, 1404)),
    ("bad_size_first_file", lambda r: _patch(r, TL0, 832, ">i", 51), ("warning", "timer_bad_unit", TL0, 832)),
    # what the load refuses (TimerLog.load -> MappedFileQueue.load, TimerWheel.<init>)
    ("short_timerlog_file", lambda r: _truncate(r, TL0, 1040), ("error", "timer_file_size", TL0, None)),
    ("short_wheel", lambda r: _truncate(r, "timerwheel", 32 * 1000), ("error", "timer_wheel_size", "timerwheel", None)),
]


@pytest.mark.parametrize("damage,want", [(d, w) for _, d, w in TIMER_DAMAGE], ids=[k for k, _, _ in TIMER_DAMAGE])
def test_verify_reports_timer_damage_as_the_broker_meets_it(damage, want, store_copy, now):
    """Seen 3 (a broken timer-log chain passed verify --deep): each damage is one finding at the level the
    broker model's timer rules give it, with its file and timer-log offset (a broker started as the set was made)."""
    from rmqtool.ops.verify import verify_store
    root = store_copy("dev-timer-5x")
    damage(root)
    now(made_at(store_path("dev-timer-5x")))
    found = [(f.severity, f.kind, os.path.relpath(f.path, root), f.offset)
             for f in verify_store(root, deep=True) if f.kind.startswith("timer_")]
    assert found == [want]
    now(None)
    assert run("verify", root, "--deep", "--now", made_at(store_path("dev-timer-5x"))).exit_code == \
        (1 if want[0] == "error" else 0)


def test_timer_recovery_cut_counts_what_the_broker_deletes(store_copy, now):
    """A bad unit in file 0: the broker truncates there and deletes file 1300 (7 + 10 units lost)."""
    from rmqtool.ops.verify import verify_store
    root = store_copy("dev-timer-5x")
    now(made_at(store_path("dev-timer-5x")))
    _patch(root, TL0, 832 + 12, ">i", 0x20)
    (f,) = [f for f in verify_store(root) if f.kind == "timer_bad_unit"]
    assert "deletes 1 later file(s): 17 unit(s) after it are lost" in f.message


def test_timer_slot_lastpos_is_relinked_by_the_recovery(store_copy, now):
    """A slot whose lastPos is wrong while its units lie in the recovery window: TimerWheel.reviseSlot sets it
    again on start (a warning); its chain from the re-linked unit is whole."""
    from rmqtool.ops.verify import verify_store
    root = store_copy("dev-timer-5x")
    now(made_at(store_path("dev-timer-5x")))
    ts = TimerStore.open(root)
    index, slot = next((i, s) for i, s in ts.iter_slots() if s.last_pos == 1560)
    _patch(root, "timerwheel", index * SLOT_SIZE + 16, ">q", 884)
    found = [(f.severity, f.kind, f.offset, f.expected, f.actual) for f in verify_store(root) if f.kind.startswith("timer_")]
    assert found == [("warning", "timer_slot_revised", index * SLOT_SIZE, 1560, 884)]


@pytest.mark.parametrize("hours", [0, 20, 80])
def test_read_time_moved_after_seven_days(hours, store_copy, now):
    """broker_model "timer_read_time": a broker started 7 days + ``hours`` after lastReadTimeMs reads from
    formatTimeMs(now) - (7 x 86400 - 60) slots (TimerMessageStore.recover): the messages of the slots before that
    time are never delivered, an error that names the start time; the chains of the later slots only are checked.
    verify and timer say so at that --now, and nothing at a start as the set was made."""
    from rmqtool.ops.timer import timer_findings
    root = store_copy("dev-timer-5x")
    ts = TimerStore.open(root)
    last = ts.checkpoint().last_read_time_ms
    late = last + 7 * 86_400_000 + hours * 3_600_000 + 999
    start = late // 1000 * 1000 - (7 * 86400 - 60) * 1000
    slots = [s for i, s in ts.iter_slots() if s.ticks % ts.slot_count == i and last <= s.time_ms(1000) < start]
    now(late)
    found = [(f.severity, f.kind, f.expected, f.actual, f.message) for f in timer_findings(Store.open(root))]
    now(None)
    assert bool(slots) == (hours > 0)           # the fixture's first pending slots are due ~20 h after it
    made = run("verify", root, "--now", made_at(store_path("dev-timer-5x")), "-f", "jsonl")
    assert (made.exit_code, made.stdout) == (0, "")
    assert run("timer", root, "--now", made_at(store_path("dev-timer-5x"))).exit_code == 0
    result = run("verify", root, "--now", late, "-f", "jsonl")
    listed = run("timer", root, "--now", late, "-f", "jsonl")
    if not slots:
        assert found == []
        assert (result.exit_code, result.stdout, listed.exit_code) == (0, "", 0)
        return
    when = dt.datetime.fromtimestamp(late / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    assert found == [("error", "timer_read_moved", start, last,
                      f"lastReadTimeMs {last} is more than 7 days before the start: a 5.3.3 broker started at {when} "
                      f"UTC (--now) reads from {start} on (TimerMessageStore.recover), so the "
                      f"{sum(s.num for s in slots)} message(s) of the {len(slots)} slot(s) before it are never "
                      "delivered")]
    assert result.exit_code == 1
    assert [(r["severity"], r["kind"], r["expected"], r["actual"], r["message"])
            for r in map(json.loads, result.stdout.splitlines())] == found
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    never = [r for r in rows if r["slot_timestamp"] < start and r["state"].startswith("pending")]
    assert len(never) == sum(s.num for s in slots)         # the wheel's count: puts less recalls
    assert listed.exit_code == 1
    assert f"problem: {len(never)} pending message(s) listed before {start} are never delivered" in listed.stderr
    assert f"started at {when} UTC (--now)" in listed.stderr
