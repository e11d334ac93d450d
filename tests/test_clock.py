"""One clock (rmqtool.clock): every result that depends on the current time takes it from --now, and names it.

No test here reads the system clock for an expected value: each pins the time it asks about, so the suite gives
the same results on any day (it is run under faketime too, see the README's "One clock")."""

from __future__ import annotations

import calendar
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqtool.format.msgid import anchor_month_diff
from tests.conftest import ROOT, made_at, run, store_path

DAY = 86_400_000
# The real-broker sets beside the project (tests skip when absent).
REAL = Path(os.environ.get("RMQTOOL_REAL_FIXTURES", ROOT.parent / "shared" / "fixtures-real"))
REAL_SETS = sorted(p.name for p in REAL.iterdir() if (p / "store").is_dir()) if REAL.is_dir() else []


def _rows(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def _ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return calendar.timegm((year, month, day, hour, minute, 0)) * 1000


@pytest.mark.skipif(not REAL_SETS, reason="no ../shared/fixtures-real")
@pytest.mark.parametrize("name", REAL_SETS)
def test_a_start_as_the_set_was_made_gets_the_verdict_it_got_then(name):
    """verify --now T, T a minute after the set's newest record: no finding used the clock, and a set the real
    broker started on and read back whole (every set but the damaged ones) passes: clean, or with the warnings of
    what a crash recovery does. The same start 400 days
    later finds the same, but for a timer store, whose start then skips every slot it had still to deliver."""
    store = REAL / name / "store"
    made = made_at(store)
    then = run("verify", store, "--check-crc", "-f", "jsonl", "--now", made)
    later = run("verify", store, "--check-crc", "-f", "jsonl", "--now", made + 400 * DAY)
    found, found_later = _rows(then), _rows(later)
    assert not [f for f in found if "--now" in f["message"] or f["kind"] == "timer_read_moved"]
    if not name.startswith("dev-damage-"):     # the broker started on it (after a crash: recovered it)
        assert then.exit_code == 0 and not [f for f in found if f["severity"] == "error"], then.stdout
        assert found == [] or (REAL / name / "recovery-readback.json").exists()
    if not (store / "timerwheel").exists():
        assert (later.exit_code, found_later) == (then.exit_code, found)
        return
    moved = [f for f in found_later if f["kind"] == "timer_read_moved"]
    assert [f for f in found_later if f not in moved] == found and later.exit_code == 1
    assert [(f["severity"], f["actual"]) for f in moved] == [("error", _rows(run("timer", store, "--check", "-f",
                                                                                  "jsonl"))[0]["last_read_time_ms"])]
    assert "UTC (--now) reads from" in moved[0]["message"]


def test_the_timer_start_is_judged_at_now_by_every_command(store_copy):
    """verify, repair and timer of one timer store at a start as it was made (clean, nothing to do, exit 0) and a
    start 30 days later (timer_read_moved: an error; repair cannot fix it and says why; timer exits 1)."""
    root = store_copy("dev-timer-5x")
    made = made_at(store_path("dev-timer-5x"))
    for late in (False, True):
        now = made + 30 * DAY * late
        verify = run("verify", root, "--now", now, "-f", "jsonl")
        repair = run("repair", root, "--now", now)
        timer = run("timer", root, "--now", now, "-f", "jsonl")
        assert (verify.exit_code, repair.exit_code, timer.exit_code) == (late, late, late)
        assert [f["kind"] for f in _rows(verify)] == ["timer_read_moved"] * late
        assert ("not repaired: timerwheel: " in repair.stderr and "[no offline fix" in repair.stderr) == late
        assert ("are never delivered: a 5.3.3 broker started at" in timer.stderr) == late
        assert len(_rows(timer)) == len(_rows(run("timer", store_path("dev-timer-5x"), "--now", made, "-f", "jsonl")))


def test_now_goes_before_or_after_the_command_and_comes_first_among_its_options():
    """--now before the command's name or after it, before or after --since: relative times count from it."""
    store = store_path("dev-sample")
    rows = _rows(run("cat-commitlog", store, "-f", "jsonl"))
    times = sorted(r["store_timestamp"] for r in rows)
    mid = times[len(times) // 2]
    want = [r["physical_offset"] for r in rows if r["store_timestamp"] >= mid]
    now = mid + 2 * 3_600_000
    for args in (("cat-commitlog", store, "--since", "-2h", "--now", now),
                 ("cat-commitlog", store, "--now", now, "--since", "-2h"),
                 ("--now", now, "cat-commitlog", store, "--since", "-2h"),
                 ("--now", now, "cat-commitlog", store, "--since", "2 hours ago")):
        result = run(*args, "-f", "jsonl")
        assert result.exit_code == 0, result.stderr
        assert [r["physical_offset"] for r in _rows(result)] == want, args
    assert run("cat-commitlog", store, "--since", "-2h", "--now", mid + 2 * 3_600_000 + 1, "-f", "jsonl").stdout \
        != run("cat-commitlog", store, "--since", "-2h", "--now", now, "-f", "jsonl").stdout    # one ms later


def test_every_command_takes_now():
    from rmqtool.cli import cli

    assert [n for n, c in cli.commands.items() if not any(p.opts == ["--now"] for p in c.params)] == []


def test_each_invocation_starts_on_the_system_clock():
    """A --now pins the clock for its command only (in-process runs share the module)."""
    from rmqtool import clock

    assert run("decode-id", "C0A8000A00002A9F0000000000000E33", "--now", "0").exit_code == 0
    assert clock.now_ms() == 0
    run("decode-id", "C0A8000A00002A9F0000000000000E33")
    assert clock.now_ms() > _ms(2026, 1, 1)


@pytest.mark.parametrize("args", [("verify", "STORE", "--now", "not a time"),
                                  ("decode-id", "C0A8000A00002A9F0000000000000E33", "--now", str(2**63 - 1)),
                                  ("decode-id", "C0A8000A00002A9F0000000000000E33", "--now", "-1"),
                                  ("decode-id", "C0A8000A00002A9F0000000000000E33", "--born", "10000-01-01")])
def test_a_now_or_born_that_is_no_time_to_anchor_on_is_a_usage_error(args):
    """One line naming the option, exit 2 (a month start around it must be a date: 1970 to November 9999)."""
    result = run(*(store_path("dev-sample") if a == "STORE" else a for a in args))
    assert result.exit_code == 2 and f"Invalid value for '{args[-2]}'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_last_month_a_now_may_anchor_on():
    assert _rows(run("decode-id", "C0A8000A00002A9F0000000000000E33", "--now", _ms(9999, 12, 1) - 1,
                     "-f", "jsonl"))[0]["created_timestamp"] == _ms(9999, 11, 1)


@pytest.mark.parametrize("now,want", [
    (_ms(2026, 11, 26, 12), _ms(2026, 11, 1)),        # the man page's example
    (_ms(2026, 12, 1), _ms(2026, 12, 1)),             # a month's first millisecond: that month
    (_ms(2026, 12, 1) - 1, _ms(2026, 11, 1)),         # its last: the month before
    (_ms(2027, 12, 31, 23, 59), _ms(2027, 12, 1)),
])
def test_decode_id_anchors_a_uniq_key_on_the_month_of_now(now, want):
    """C0A8...0E33 has time diff 0: its creation time is the start of now's UTC month."""
    result = run("decode-id", "C0A8000A00002A9F0000000000000E33", "--now", now, "-f", "jsonl")
    assert _rows(result)[0]["created_timestamp"] == want


@given(diff=st.integers(0, 31 * DAY), now=st.integers(_ms(1971, 1, 1), _ms(2200, 1, 1)))
def test_the_month_anchor_is_the_latest_month_start_not_after_now(diff, now):
    """MessageClientIDSetter.getNearlyTimeFromID: of the month starts M around now, the latest with M + diff <= now."""
    got = anchor_month_diff(diff, now_ms=now)
    month = got - diff
    assert got <= now and month in _month_starts(now)
    assert all(m + diff > now for m in _month_starts(now) if m > month)


def _month_starts(ms: int) -> list[int]:
    import datetime as dt
    d = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    out = []
    for delta in (-2, -1, 0, 1):
        y, m = divmod(d.year * 12 + d.month - 1 + delta, 12)
        out.append(_ms(y, m + 1, 1))
    return out


def test_the_month_anchor_needs_a_time():
    with pytest.raises(ValueError):
        anchor_month_diff(0)


def test_put_stamps_records_with_now(tmp_path):
    """A record put without times is born and stored at --now (and its index file named after it)."""
    root = tmp_path / "s"
    assert run("init", root).exit_code == 0
    now = _ms(2027, 2, 28, 23, 59) + 59_999
    assert run("put", root, "--topic", "T", "--key", "k", "--body", "x", "--now", now, "--apply").exit_code == 0
    (row,) = _rows(run("cat-commitlog", root, "-f", "jsonl"))
    assert (row["born_timestamp"], row["store_timestamp"]) == (now, now)
    assert _rows(run("checkpoint", root, "-f", "jsonl"))[0]["physic_msg_timestamp"] == now
