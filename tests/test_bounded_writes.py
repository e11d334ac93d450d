"""Every write is bounded by its input (#37): a stored queue offset that is damage is placed as the broker's
ConsumeQueue.putMessagePositionInfo places it (rule reput_misplaced), never by filling the queue up to it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, run
from helpers_maintain import run_process, snapshot

# (fixture, the record TopicA/3 queue offset 3, the record TopicA/3 queue offset 0)
CASES = [("dev-sample", 39996, 4938), ("dev-sample-5x", 31484, 2573)]
TIMEOUT = 60          # seconds: each command reads a few hundred kB


def _flipped(tmp_path: Path, name: str, record: int) -> Path:
    """A copy of ``name``'s store with bit 7 of byte 24 of the record at ``record`` flipped: its stored queue
    offset (bytes 20-27) gains 2^31."""
    root = tmp_path / name
    shutil.copytree(FIXTURES / name / "store", root)
    log = root / "commitlog" / "00000000000000000000"
    data = bytearray(log.read_bytes())
    data[record + 24] ^= 0x80
    log.write_bytes(bytes(data))
    return root


def _files(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file())


def _cli(*args):
    """The CLI in a child process, killed (the test fails) after TIMEOUT: a write that does not stop."""
    return run_process(*args, timeout=TIMEOUT)


def _by_queue(out: Path) -> dict[str, bytes]:
    """--out's <topic>/<queueId>/<file> named as under consumequeue/."""
    return {f"consumequeue/{k}": v for k, v in snapshot(out).items()}


@pytest.mark.parametrize("name,record,_", CASES)
def test_a_flipped_queue_offset_is_rebuilt_as_the_broker_dispatches_it(tmp_path, name, record, _):
    root = _flipped(tmp_path, name, record)
    want = {k: v for k, v in snapshot(FIXTURES / name / "store").items() if k.startswith("consumequeue/")}
    assert run("verify", root, "-f", "jsonl").exit_code == 1          # cq_queue_offset_mismatch
    for extra in ((), ("--as-broker",)):
        out = tmp_path / f"out{len(extra)}"
        result = _cli("rebuild-cq", root, "--out", out, "-f", "jsonl", *extra)
        assert result.returncode == 0, result.stderr
        assert _by_queue(out) == want and _files(out) == len(want)
        assert f"the record at {record} stores queue offset {2**31 + 3}" in result.stdout.decode()
    plan = _cli("rebuild-cq", root, "-f", "jsonl")                 # the store's queues are right already
    assert plan.returncode == 1 and b"misplaced_unit" in plan.stdout and b"write_cq" not in plan.stdout
    shutil.rmtree(root / "consumequeue")
    size = len(want["consumequeue/TopicA/3/00000000000000000000"])       # the broker's file size, as a user gives it
    result = _cli("rebuild-cq", root, "--apply", "--backup", tmp_path / "bk", "--cq-file-size", size)
    assert result.returncode == 0, result.stderr
    assert {k: v for k, v in snapshot(root).items() if k.startswith("consumequeue/")} == want


@pytest.mark.parametrize("name,record,_", CASES)
def test_repair_answers_the_mismatch_and_leaves_missing_queues_to_the_dispatch(tmp_path, name, record, _):
    root = _flipped(tmp_path, name, record)
    result = run("repair", root)
    assert result.exit_code == 1 and "not repaired" in result.stderr and "queue offset" in result.stderr
    assert "nothing to do" not in result.stderr
    shutil.rmtree(root / "consumequeue")
    before = _files(root)
    result = _cli("repair", root, "--apply", "--backup", tmp_path / "bk")
    assert result.returncode == 0, result.stderr
    assert b"left to the broker's dispatch" in result.stderr and _files(root) <= before + 1


@pytest.mark.parametrize("name,_,record", CASES)
def test_a_flipped_first_queue_offset_loses_units_only_as_the_broker(tmp_path, name, _, record):
    """First in its queue, the outlier makes the broker start the queue at 2^31 and skip the rest: the default
    rebuild builds the undamaged queue and says so, --as-broker builds the broker's one file, repair names it."""
    root = _flipped(tmp_path, name, record)
    want = {k: v for k, v in snapshot(FIXTURES / name / "store").items() if k.startswith("consumequeue/")}
    result = _cli("rebuild-cq", root, "--out", tmp_path / "out", "-f", "jsonl")
    assert result.returncode == 0 and _by_queue(tmp_path / "out") == want
    assert b"skips every later unit of it as repeated" in result.stdout
    result = _cli("rebuild-cq", root, "--out", tmp_path / "broker", "--as-broker", "-f", "jsonl")
    assert result.returncode == 0
    far = 2**31 * 20 // (size := len(want["consumequeue/TopicA/3/00000000000000000000"])) * size
    assert sorted(p.name for p in (tmp_path / "broker" / "TopicA" / "3").iterdir()) == [f"{far:020d}"]
    assert _files(tmp_path / "broker") == len(want) - sum(k.startswith("consumequeue/TopicA/3/") for k in want) + 1
    shutil.rmtree(root / "consumequeue")
    result = run("repair", root)
    assert result.exit_code == 1 and "consumequeue/TopicA/3" in result.stderr and "skips" in result.stderr
