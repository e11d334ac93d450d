"""Every write is bounded by its input (#37): a stored queue offset that is damage is placed as the broker's
ConsumeQueue.putMessagePositionInfo places it (rule reput_misplaced), never by filling the queue up to it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import FIXTURES, run
from helpers_maintain import run_process, snapshot
from rmqtool.store.bounds import Bound

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


@pytest.mark.parametrize("name", [name for name, _, _ in CASES])
def test_a_wrong_possible_offset_on_a_queues_last_unit_is_appended_as_the_broker_does(tmp_path, name):
    """The last unit of TopicA/3 stores its queue offset + 32 (still possible for its record): nothing confirms the
    gap (no record was skipped), so it goes at the queue's end, as ConsumeQueue.putMessagePositionInfo appends it
    ('[BUG]logic queue order maybe wrong'): the queues equal the undamaged store's, no blank unit is written."""
    rows = [json.loads(line) for line in run("cat-commitlog", FIXTURES / name / "store", "-f", "jsonl").stdout.splitlines()]
    last = [r for r in rows if r["type"] == "message" and r["topic"] == "TopicA" and r["queue_id"] == 3][-1]
    root = tmp_path / name
    shutil.copytree(FIXTURES / name / "store", root)
    first = last["physical_offset"] // 65536 * 65536
    log = root / "commitlog" / f"{first:020d}"
    data = bytearray(log.read_bytes())
    data[last["physical_offset"] - first + 27] ^= 0x20         # queue offset (bytes 20-27) + 32
    log.write_bytes(bytes(data))
    want = {k: v for k, v in snapshot(FIXTURES / name / "store").items() if k.startswith("consumequeue/")}
    for extra in ((), ("--as-broker",)):
        out = tmp_path / f"out{len(extra)}"
        result = run("rebuild-cq", root, "--out", out, "-f", "jsonl", *extra)
        assert result.exit_code == 0, result.stderr
        assert _by_queue(out) == want
        assert f"stores queue offset {last['queue_offset'] + 32}" in result.stdout
        assert f"offset {last['queue_offset']}" in result.stdout
    assert b"write_cq" not in _cli("rebuild-cq", root, "-f", "jsonl").stdout    # the store's queues are right


# -- every write bounded: damage with extreme values under every write command ---------------------------------
_EXTREME = st.sampled_from([2**63 - 1, -(2**63), -1, 2**31 - 1, -(2**31), 2**31 + 3, 2**32, 10**12])
_RECORD_FIELDS = {"totalsize": (0, 4), "magic": (4, 4), "bodycrc": (8, 4), "queueid": (12, 4), "flag": (16, 4),
                  "queueoffset": (20, 8), "physicaloffset": (28, 8), "sysflag": (36, 4), "borntimestamp": (40, 8),
                  "storetimestamp": (56, 8), "reconsumetimes": (72, 4), "preparedoffset": (76, 8), "bodylen": (84, 4)}
_ROW_FIELDS = ["queue_id", "queue_offset", "physical_offset", "store_timestamp", "born_timestamp", "sys_flag", "flag",
               "reconsume_times", "prepared_transaction_offset", "body_crc", "total_size"]
_COMMANDS = ["rebuild-cq --out", "rebuild-cq", "rebuild-index", "repair", "put", "import"]
BASE = "dev-sample-5x"


def _pack(value: int, width: int) -> bytes:
    return (value & ((1 << 8 * width) - 1)).to_bytes(width, "big")


def _usage(paths: list[Path]) -> tuple[int, int, int]:
    """(files, allocated bytes, apparent bytes) under ``paths``."""
    files = allocated = apparent = 0
    for root in paths:
        for p in (root.rglob("*") if root.exists() else ()):
            if p.is_file():
                s = p.stat()
                files, allocated, apparent = files + 1, allocated + s.st_blocks * 512, apparent + s.st_size
    return files, allocated, apparent


@pytest.fixture(scope="module")
def base_rows():
    lines = run("cat-commitlog", FIXTURES / BASE / "store", "-f", "jsonl").stdout.splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_write_outgrows_its_store(tmp_path_factory, base_rows, data):
    """A commit-log header field, an index header count or a consume-queue unit overwritten with an extreme value
    (or import rows carrying one), then one write command: it ends within the time bound, without a traceback,
    and either creates no more than the bound (store.bounds) of files and bytes beyond the store's own, or is
    refused beyond it (exit 4) having written nothing."""
    tmp = tmp_path_factory.mktemp("bounded")
    root = tmp / "store"
    shutil.copytree(FIXTURES / BASE / "store", root)
    value = data.draw(_EXTREME | st.integers(-(2**63), 2**63 - 1), "value")
    target = data.draw(st.sampled_from(["record", "index", "cq", "rows"]), "target")
    rows = [dict(r) for r in base_rows[:3]]
    if target == "record":
        rec = data.draw(st.sampled_from([r for r in base_rows if r["type"] == "message"]), "record")
        at, width = _RECORD_FIELDS[data.draw(st.sampled_from(sorted(_RECORD_FIELDS)), "field")]
        first = rec["physical_offset"] // 65536 * 65536
        log = root / "commitlog" / f"{first:020d}"
        with open(log, "r+b") as fh:
            fh.seek(rec["physical_offset"] - first + at)
            fh.write(_pack(value, width))
    elif target == "index":
        files = sorted((root / "index").iterdir())
        index = files[data.draw(st.integers(0, 5), "file") % len(files)]
        with open(index, "r+b") as fh:
            fh.seek(data.draw(st.sampled_from([32, 36]), "count"))      # hashSlotCount, indexCount
            fh.write(_pack(value, 4))
    elif target == "cq":
        unit = root / "consumequeue" / "TopicA" / "3" / "00000000000000000000"
        pos, width = data.draw(st.sampled_from([(0, 8), (8, 4), (12, 8)]), "unit field")
        with open(unit, "r+b") as fh:
            fh.seek(20 * data.draw(st.integers(0, 7), "unit") + pos)
            fh.write(_pack(value, width))
    else:
        for r in rows:
            r[data.draw(st.sampled_from(_ROW_FIELDS), "row field")] = value
    lines = tmp / "rows.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = data.draw(st.sampled_from(_COMMANDS), "command")
    out = tmp / "out"
    args = {"rebuild-cq --out": ["rebuild-cq", root, "--out", out],
            "rebuild-cq": ["rebuild-cq", root, "--apply"], "rebuild-index": ["rebuild-index", root, "--apply"],
            "repair": ["repair", root, "--apply", "--accept-loss"],
            "put": ["put", root, "--topic", "TopicA", "--queue-id", str(value), "--body", "x", "--apply"],
            "import": ["import", root, lines, "--apply"]}[command]
    before, stored = _usage([root]), snapshot(root)
    bound = Bound.of(root, len(rows), lines.stat().st_size)      # what the CLI's bound allows at least
    result = _cli(*args, "--backup", tmp / "bk") if command != "rebuild-cq --out" else _cli(*args)
    err = result.stderr.decode(errors="replace")
    assert "Traceback" not in err and result.returncode in (0, 1, 2, 3, 4), err
    files, allocated, apparent = _usage([root, out])
    if result.returncode == 4 and "beyond the bound" in err:       # refused: nothing written
        assert snapshot(root) == stored and _usage([out])[0] == 0, err
    else:                                                           # else within the bound
        assert files - before[0] <= bound.files and allocated - before[1] <= bound.data, (command, err)
    assert files <= 2 * before[0] + 50, (command, files, before)
    assert allocated <= 3 * before[1] + 2**24, (command, allocated, before)
    assert apparent <= 3 * before[2] + 2**28, (command, apparent, before)
    shutil.rmtree(tmp)


@pytest.mark.parametrize("args", [("repair", "{s}", "--apply"), ("rebuild-index", "{s}", "--slots", "32",
                                                                   "--max-entries", "128", "--apply"),
                                  ("rebuild-cq", "{s}", "--cq-file-size", "400", "--apply"), ("init", "{new}"),
                                  ("put", "{s}", "--topic", "TopicA", "--body", "x", "--apply"),
                                  ("import", "{s}", "{rows}", "--apply")])
def test_a_write_without_room_is_refused_before_it_writes(store_copy, tmp_path, monkeypatch, args):
    """A plan needing more bytes or inodes than the file system has free is refused (exit 4), nothing written."""
    import os

    rows = _rows_file(tmp_path)
    root = store_copy("dev-sample" if args[0] in ("put", "import") else "dev-sample-crash")
    before = snapshot(root)
    real = os.statvfs

    def full(path):
        fs = real(path)
        return os.statvfs_result((fs.f_bsize, fs.f_frsize, fs.f_blocks, 0, 0, fs.f_files, 0, 0, fs.f_flag,
                                  fs.f_namemax))

    monkeypatch.setattr(os, "statvfs", full)
    result = run(*[str(a).format(s=root, new=tmp_path / "new", rows=rows) for a in args])
    assert result.exit_code == 4 and "free: nothing written" in result.stderr, result.stderr
    assert snapshot(root) == before and not (tmp_path / "new").exists()
    assert not list(tmp_path.glob("*rmqtool-backup*")) and not list(root.parent.glob("*rmqtool-backup*"))


@pytest.mark.parametrize("limit", [1, 100])
def test_a_rebuild_into_a_new_out_that_fails_leaves_nothing(tmp_path, limit):
    """A write error during ``rebuild-cq --out NEW`` (a file-size limit, as a full disk: EFBIG from the kernel on
    the queue files' writes) is exit 4 in one line naming the output, and NEW is gone again; an --out that
    existed (empty) stays, empty."""
    import resource
    import signal

    made, kept = tmp_path / "new", tmp_path / "kept"
    kept.mkdir()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        results = [run("rebuild-cq", FIXTURES / "dev-sample" / "store", "--out", out) for out in (made, kept)]
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    for result, out in zip(results, (made, kept)):
        assert result.exit_code == 4 and result.stderr.count("\n") == 1, result.stderr
        assert "File too large" in result.stderr and str(out) in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"] and not any(kept.iterdir())


# -- the bound: a plan far larger than its store plus its input is refused (exit 4, nothing written) -----------
def _rows_file(tmp_path: Path) -> Path:
    rows = run("cat-commitlog", FIXTURES / "dev-sample" / "store", "-n", "3", "-f", "jsonl").stdout
    (tmp_path / "rows.jsonl").write_text(rows)
    return tmp_path / "rows.jsonl"


_WRITES = {"rebuild-cq": ("rebuild-cq", "{s}", "--cq-file-size", "160"),
           "rebuild-cq --out": ("rebuild-cq", "{s}", "--out", "{new}"),
           "rebuild-index": ("rebuild-index", "{s}", "--slots", "32", "--max-entries", "128"),
           "repair": ("repair", "{s}"), "put": ("put", "{s}", "--topic", "TopicA", "--body", "x"),
           "import": ("import", "{s}", "{rows}")}


@pytest.mark.parametrize("command", sorted(_WRITES))
def test_a_plan_beyond_its_bound_is_refused_unless_allowed(store_copy, tmp_path, monkeypatch, command):
    """With the bound made tiny (store.bounds' factor and slack 0), each write's plan is beyond it: the dry run
    shows the plan and its total and says it would be refused, the write is refused (exit 4) in one line naming
    the directory that drives it, nothing written; --allow-large writes it."""
    from rmqtool.store import bounds

    root = store_copy("dev-sample-crash" if command == "repair" else "dev-sample")
    if command.startswith("rebuild-cq"):
        shutil.rmtree(root / "consumequeue")
    before = snapshot(root)
    args = [str(a).format(s=root, new=tmp_path / "new", rows=_rows_file(tmp_path)) for a in _WRITES[command]]
    writes = ["--backup", tmp_path / "bk"] if "--out" not in args else []
    monkeypatch.setattr(bounds, "FACTOR", 0)
    monkeypatch.setattr(bounds, "SLACK_FILES", 0)
    monkeypatch.setattr(bounds, "SLACK_BYTES", 0)
    if "--out" not in args:
        plan = run(*args, "-f", "jsonl")
        assert plan.exit_code == 4 and "would be refused" in plan.stderr, plan.stderr
        total = [json.loads(line) for line in plan.stdout.splitlines()][-1]
        assert total["action"] == "total" and "files new" in total["detail"] and len(total["detail"]) < 70
    result = run(*args, *(["--apply"] if "--out" not in args else []), *writes)
    err = result.stderr.strip().splitlines()
    assert result.exit_code == 4 and "--allow-large writes it anyway: nothing written" in err[-1], result.stderr
    assert err[-1].startswith("rmqtool: error: ") and len([e for e in err if "error" in e]) == 1
    assert snapshot(root) == before and not (tmp_path / "bk").exists()
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())
    result = run(*args, *(["--apply"] if "--out" not in args else []), *writes, "--allow-large")
    assert result.exit_code in (0, 1) and "beyond the bound" not in result.stderr, result.stderr
    assert snapshot(root) != before or "--out" in args


def test_a_loop_in_an_index_chain_ends_every_walk(tmp_path):
    """The oldest entry of a slot's chain linked back to its newest: query-key (whose broker walk would loop for
    ever on a key of that slot that matches nothing), verify, cat-index and rebuild-index all end."""
    import struct

    from rmqtool.format.indexfile import ENTRY, decode_header, index_key_hash
    from rmqtool.store.store import Store

    root = tmp_path / "store"
    shutil.copytree(FIXTURES / "dev-sample" / "store", root)
    ref = Store.open(root).index_files()[0]
    g, buf = ref.geometry, bytearray(ref.path.read_bytes())
    count = decode_header(buf).index_count
    for slot in range(g.hash_slot_num):
        head = struct.unpack_from(">i", buf, g.slot_pos(slot))[0]
        chain = [head]
        while 0 < chain[-1] < count:
            chain.append(ENTRY.unpack_from(buf, g.entry_pos(chain[-1]))[3])
        if len(chain) > 2:
            break
    oldest = chain[-2]                        # its prev is 0: the chain's end
    struct.pack_into(">i", buf, g.entry_pos(oldest) + 16, head)
    ref.path.write_bytes(bytes(buf))
    key = next(f"k{i}" for i in range(10**6) if index_key_hash(f"TopicA#k{i}") % g.hash_slot_num == slot)
    result = _cli("query-key", root, "TopicA", key, "--raw")
    assert result.returncode == 1 and b"Traceback" not in result.stderr       # nothing found, and it ended
    for args in (("verify", root), ("cat-index", root, "--slots"), ("rebuild-index", root)):
        result = _cli(*args)
        assert result.returncode in (0, 1, 3) and b"Traceback" not in result.stderr, (args, result.stderr)


@pytest.mark.parametrize("case", ["config", "config-text", "put-queue-id", "import-queue-id", "import-negative"])
def test_a_given_or_stored_number_out_of_range_is_refused_before_anything_is_written(tmp_path, case):
    """Sizes in config/rmqtool.json (init's) drive file sizes: one that is not a Java int above 0 is refused (exit
    4); a queue id beyond a Java int is a usage error for put (exit 2), a bad row for import (exit 3)."""
    root = tmp_path / "store"
    assert run("init", root, "--commitlog-file-size", "65536", "--cq-file-size", "160", "--slots", "16",
               "--max-entries", "64").exit_code == 0
    sizes = root / "config" / "rmqtool.json"
    if case.startswith("config"):
        sizes.write_text(json.dumps({**json.loads(sizes.read_text()),
                                     "mappedFileSizeConsumeQueue": 10**15 if case == "config" else "big"}))
    before = snapshot(root)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"topic": "T", "body": "eA==", "queue_id": 2**63 - 1 if case == "import-queue-id"
                                else -1}) + "\n")
    args = {"put-queue-id": ("put", root, "--topic", "T", "--body", "x", "--queue-id", 2**63 - 1, "--apply")}.get(
        case, ("import", root, rows, "--apply") if case.startswith("import") else
        ("put", root, "--topic", "T", "--body", "x", "--apply"))
    result = run(*args, "--backup", tmp_path / "bk")
    assert result.exit_code == {"put-queue-id": 2, "import-queue-id": 3, "import-negative": 3}.get(case, 4), \
        result.stderr
    assert "Traceback" not in result.stderr and (case == "put-queue-id" or len(result.stderr.splitlines()) == 1)
    assert snapshot(root) == before
