"""The local engine's worker processes: verify's and info's per-file steps, and the walks of rebuild-cq,
rebuild-index and repair, in several processes give the same findings, summary, files and plan as one
process; errors and progress come back from the workers."""

from __future__ import annotations

import dataclasses
import fcntl
import multiprocessing
import os
import platform
import shutil
import signal
import tempfile
import time
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ALL_SETS, CRASH_SETS, DLEDGER_CRASH_SETS, FEATURE_SETS, made_at, run, store_path
from rmqtool.errors import FormatError, RmqError
from rmqtool.ops.inspect import store_info
from rmqtool.ops.verify import verify_store
from rmqtool.ops.workers import available_memory, default_jobs, process_imap, process_map
from rmqtool.store.atomic import BUILD
from rmqtool.store.store import Store


def _square_in_child(item, progress, *, parent):
    for _ in range(item * 5000):          # many small reports while the parent polls the sum
        progress(1)
    if item == 3:
        raise FormatError("third item is bad", path=f"file-{item}", offset=7)
    return item * item, os.getpid() != parent


def _die(item, progress, *, parent):
    if os.getpid() != parent:
        os._exit(3)
    time.sleep(1)


def test_process_map_runs_in_children_keeps_order_and_counts_progress():
    """Two jobs: one worker process and this one; every item's result in order, progress from both."""
    seen = []
    out = process_map(partial(_square_in_child, parent=os.getpid()), [5, 1, 4, 2], 2, seen.append)
    assert [value for value, _ in out] == [25, 1, 16, 4]
    assert any(in_child for _, in_child in out) and not all(in_child for _, in_child in out)
    assert sum(seen) == 12 * 5000


def _numbers(item, progress):
    import numpy as np

    progress(item)
    return np.arange(item), os.getpid()


def test_process_imap_yields_in_order_from_workers_and_stops_them_when_closed():
    """Results in item order, computed in worker processes and mapped from shared memory (arrays intact);
    a caller that stops early leaves no worker running."""
    seen = []
    it = process_imap(_numbers, [5, 200_000, 3, 7, 9], 2, seen.append)
    values, pid = next(it)
    assert values.tolist() == list(range(5)) and pid != os.getpid()
    values, _ = next(it)
    assert int(values.sum()) == 200_000 * 199_999 // 2
    assert [v.tolist() for v, _ in [next(it)]] == [[0, 1, 2]]
    it.close()
    assert not multiprocessing.active_children()
    assert [len(v) for v, _ in process_imap(_numbers, [4, 2], 2)] == [4, 2] and sum(seen) >= 5


def test_process_imap_removes_what_a_killed_one_left_in_shared_memory(tmp_path, monkeypatch):
    """Its results' directory (in /dev/shm) is locked while it lives: the next run removes one left unlocked
    and unchanged for a minute (a killed run's), never a locked one (a live run's) nor one made just now."""
    from rmqtool.ops import workers

    monkeypatch.setattr(workers, "SHARED_MEMORY", str(tmp_path))
    dead, live, young = (tmp_path / f"rmqtool-parcels-{n}" for n in ("dead", "live", "young"))
    for d in (dead, live, young):
        d.mkdir()
        (d / "tmpx").write_bytes(b"x")
    for d in (dead, live):                      # by the file system's clock, as the sweep judges age
        os.utime(d, (d.stat().st_mtime - 120,) * 2)
    held = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert [len(v) for v, _ in process_imap(_numbers, [4, 2], 2)] == [4, 2]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["rmqtool-parcels-live", "rmqtool-parcels-young"]
    finally:
        os.close(held)


_CHURN = """
import resource
import numpy as np
from rmqtool.ops.workers import process_map

def churn(n, progress):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(n):
        a = np.ones(75_000 + 1_000 * i)          # 600 KB and up, each larger than the last
        del a
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

print(max(process_map(churn, [50, 50], 2)))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_workers_reuse_the_memory_they_free():
    """A worker (and the process that forked it, in a fresh interpreter as a command is) takes its temporary
    arrays from memory it freed before, not from new mappings each time: 50 arrays of 600-650 KB fault in
    about one array's pages (~160), not 50 arrays' (~7,800 with glibc's initial threshold)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _CHURN], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert int(out.stdout) < 1_500, out.stdout


def _done_at(item, progress):
    time.sleep(item)
    return time.monotonic()


@pytest.mark.parametrize("ahead", [0, 1])
def test_process_imap_hands_out_items_ahead(ahead):
    """With ``ahead``, the worker done before the one whose result is due goes on with the next item
    (done before the slow first one); without, it waits until the first result is taken."""
    first, second, third = process_imap(_done_at, [1.0, 0.0, 0.0], 2, ahead=ahead)
    assert (third < first) == bool(ahead) and second < first


def test_a_worker_error_is_the_same_one_line_error():
    with pytest.raises(FormatError) as exc:
        process_map(partial(_square_in_child, parent=os.getpid()), [1, 3, 2], 2)
    assert str(exc.value) == "file-3: offset 7: third item is bad"


def test_a_worker_that_dies_is_an_error_not_a_hang():
    with pytest.raises(RmqError, match="worker process died"):
        process_map(partial(_die, parent=os.getpid()), [1, 2], 2)


def _sleep(item, progress):
    time.sleep(60)


def test_an_interrupt_stops_the_workers():
    """Ctrl-C while files are being checked: the workers stop too, nothing is left running."""
    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            process_map(_sleep, [1, 2, 3], 2)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - started < 10
    assert not multiprocessing.active_children()


def test_default_jobs():
    assert default_jobs(10 << 20, 8) == 1                       # small store: this process
    assert default_jobs(1 << 40, 1) == 1                        # one file: nothing to share
    assert default_jobs(1 << 40, 64) == max(1, min(len(os.sched_getaffinity(0)), available_memory() >> 30))


def test_default_jobs_leave_room_in_memory(monkeypatch):
    import rmqtool.ops.workers as workers

    monkeypatch.setattr(workers, "available_memory", lambda: 3 << 30)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)), raising=False)
    assert default_jobs(1 << 40, 64) == 3
    monkeypatch.setattr(workers, "available_memory", lambda: 100 << 20)
    assert default_jobs(1 << 40, 64) == 1


@pytest.mark.parametrize("deep", [False, True])
def test_workers_give_the_same_findings_on_a_damaged_multi_file_store(damaged, deep):
    want = list(verify_store(damaged, deep=deep, jobs=1))
    assert {"bad_magic", "cq_file_size", "index_entry_no_record", "cq_missing_unit"} <= {f.kind for f in want}
    progress = []
    assert list(verify_store(damaged, deep=deep, jobs=3, progress=progress.append)) == want
    assert sum(progress) > 5 * 65536 - 65536          # the walked bytes of six files, a bad one cut short


@pytest.mark.parametrize("name", ALL_SETS + FEATURE_SETS + DLEDGER_CRASH_SETS)
def test_workers_give_the_same_findings_on_every_fixture(name, now):
    path = store_path(name)
    now(made_at(path))
    assert list(verify_store(path, deep=True, jobs=2)) == list(verify_store(path, deep=True, jobs=1))


def test_cli_jobs(damaged):
    one, two = run("verify", damaged, "-f", "jsonl", "--jobs", "1"), run("verify", damaged, "-f", "jsonl", "-j", "2")
    assert (two.exit_code, two.stdout) == (one.exit_code, one.stdout) and one.exit_code == 1
    assert run("verify", damaged, "--jobs", "0").exit_code == 2


@pytest.mark.parametrize("name", ALL_SETS + FEATURE_SETS + DLEDGER_CRASH_SETS + ["generated", "damaged"])
def test_info_in_workers_is_the_same_summary(name, request):
    path = request.getfixturevalue(name) if name in ("generated", "damaged") else store_path(name)
    one = store_info(Store.open(path), jobs=1)
    assert store_info(Store.open(path), jobs=2) == one
    if name == "damaged":            # the walk stops at the third file's bad record; later files not counted
        assert "bad magic" in one["problems"][0]
        assert one["max_physical_offset"] < 3 * 65536
    if name == "generated":
        assert one["max_physical_offset"] > 5 * 65536 and not one["problems"]


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


_WALK_SETS = ALL_SETS + FEATURE_SETS + DLEDGER_CRASH_SETS + ["dev-damage-oldfile-crc-497",
                                                              "dev-damage-midfile-magic-533", "generated", "damaged"]


@pytest.mark.parametrize("as_broker", [False, True])
@pytest.mark.parametrize("name", _WALK_SETS)
def test_rebuilds_in_workers_write_the_same_bytes(name, as_broker, request, tmp_path):
    """rebuild-cq and rebuild-index walk the files in worker processes (facts.scan_files) and write
    exactly the files one process writes."""
    src = request.getfixturevalue(name) if name in ("generated", "damaged") else store_path(name)
    extra = ["--as-broker"] * as_broker
    outputs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"cq-{jobs}"
        cq = run("rebuild-cq", src, "--out", out, "-f", "jsonl", "--jobs", jobs, *extra)
        store = tmp_path / f"store-{jobs}"
        shutil.copytree(src, store)
        index = run("rebuild-index", store, "-f", "jsonl", "--jobs", jobs, "--force", "--apply", *extra)
        outputs.append((cq.exit_code, cq.stdout.replace(str(out), "OUT"), _tree(out) if out.exists() else {},
                        index.exit_code, index.stdout.replace(str(store), "STORE"), _tree(store / "index")))
    assert outputs[0] == outputs[1]
    assert outputs[0][0] == 0 and outputs[0][3] == 0 and (outputs[0][2] or outputs[0][1])


@pytest.mark.parametrize("name", CRASH_SETS + ["dev-damage-oldfile-crc-497", "dev-damage-midfile-crc-533", "damaged"])
def test_repair_walk_in_workers_is_the_same_plan(name, request):
    src = request.getfixturevalue(name) if name == "damaged" else store_path(name)
    for salvage in ([], ["--salvage"]):
        one, two = (run("repair", src, "-f", "jsonl", "--limit", "0", "--jobs", jobs, *salvage) for jobs in "12")
        assert (two.exit_code, two.stdout) == (one.exit_code, one.stdout)


def _placed_runs(monkeypatch) -> list[tuple[bool, int, int, int]]:
    """(accepted, first unit's byte place, last unit's end, file size) of each queue run a worker wrote,
    as this process takes it (CqFileWriter.placed)."""
    from rmqtool.store.queue_writer import CqFileWriter

    runs, placed = [], CqFileWriter.placed

    def spy(self, queue_offset, count, first_end, last_end):
        ok = placed(self, queue_offset, count, first_end, last_end)
        runs.append((ok, queue_offset * 20, (queue_offset + count) * 20, self.file_size))
        return ok
    monkeypatch.setattr(CqFileWriter, "placed", spy)
    return runs


def test_rebuild_cq_workers_write_their_queue_runs(generated, tmp_path, monkeypatch):
    """With --jobs 2 the workers write each queue's run of their file at its queue offsets (runs across
    two consume-queue files among them); the files are the ones one process writes."""
    from rmqtool.ops.rebuild import rebuild_consume_queues

    runs = _placed_runs(monkeypatch)
    one = rebuild_consume_queues(Store.open(generated), out=tmp_path / "one", jobs=1)
    assert runs == []
    two = rebuild_consume_queues(Store.open(generated), out=tmp_path / "two", jobs=2)
    assert _tree(tmp_path / "two") == _tree(tmp_path / "one")
    assert (two.queues, two.files, two.units) == (one.queues, one.files, one.units)
    assert runs and all(ok for ok, *_ in runs)
    assert any(at // size != (end - 1) // size for _, at, end, size in runs)
    root = tmp_path / "store"                      # one topic, built in place beside consumequeue/
    shutil.copytree(generated, root)
    (root / "consumequeue" / "Topic-01").rename(tmp_path / "old")
    runs.clear()
    rebuild_consume_queues(Store.open(root), topics=["Topic-01"], jobs=2)
    assert runs and all(ok for ok, *_ in runs)
    assert _tree(root / "consumequeue" / "Topic-01") == _tree(tmp_path / "one" / "Topic-01")


def test_a_rebuild_cq_worker_keeps_its_queue_files_open(tmp_path):
    """A worker writes each file's run of a queue through the descriptor it kept from the last file's run
    (OpenQueueFiles): the bytes are those of a run written with its own opens, across two consume-queue
    files; past the table's limit a file is opened and closed for each run."""
    import numpy as np

    from rmqtool.store.queue_writer import UNIT_DTYPE, OpenQueueFiles, write_run

    units = np.zeros(6, UNIT_DTYPE)
    units["phy"], units["size"], units["tags"] = np.arange(6) * 100, 100, 7
    kept, size = OpenQueueFiles(), 4 * 20                      # 4 units a consume-queue file
    assert kept.limit > 2
    held, apart = tmp_path / "held" / "T" / "0", tmp_path / "apart" / "T" / "0"
    try:
        write_run(held, size, 0, units[:3], kept)                  # one commit-log file's run
        write_run(held, size, 3, units[3:], kept)                  # the next one's, into both files
        assert sorted(kept) == [str(held / f"{0:020d}"), str(held / f"{80:020d}")]
        write_run(apart, size, 0, units[:3])
        write_run(apart, size, 3, units[3:])
        assert (held / f"{0:020d}").read_bytes() == units[:4].tobytes()
        assert (held / f"{80:020d}").read_bytes() == units[4:].tobytes() + bytes(40)
        assert _tree(held) == _tree(apart)
        kept.limit = 2
        write_run(tmp_path / "more", size, 0, units[:1], kept)
        assert len(kept) == 2 and (tmp_path / "more" / f"{0:020d}").read_bytes()[:20] == units[:1].tobytes()
    finally:
        for fd in kept.values():
            os.close(fd)


def _repeating(generated, root: Path) -> int:
    """A copy of ``generated`` at ``root`` with a seventh file holding one record alone that repeats an older
    queue offset of its queue; returns that unit's byte place in the queue."""
    from rmqtool.format.commitlog import decode_entry, encode_message

    shutil.copytree(generated, root)
    first = (root / "commitlog" / f"{0:020d}").read_bytes()
    pos, msg = 0, None
    while msg is None or msg.queue_offset < 3:
        msg = decode_entry(first, pos)
        pos += len(encode_message(msg))
    start = 6 * 65536
    raw = encode_message(dataclasses.replace(msg, physical_offset=start))
    (root / "commitlog" / f"{start:020d}").write_bytes(raw + bytes(65536 - len(raw)))
    return msg.queue_offset * 20


def test_rebuild_cq_run_a_worker_misplaced_is_rebuilt_by_one_process(generated, tmp_path, monkeypatch):
    """A record repeating an older queue offset of its queue, alone in a later file: its worker writes it
    at that offset, where one process drops it as a repeat; the rebuild starts again with the queues
    written here, and the store gets the bytes one process writes (built in place, swapped in)."""
    from rmqtool.ops.rebuild import rebuild_consume_queues

    root = tmp_path / "store"
    at = _repeating(generated, root)
    rebuild_consume_queues(Store.open(root), out=tmp_path / "one", jobs=1)
    runs = _placed_runs(monkeypatch)
    rebuild_consume_queues(Store.open(root), jobs=2)
    assert [place for ok, place, *_ in runs if not ok] == [at]
    assert _tree(root / "consumequeue") == _tree(tmp_path / "one")
    assert not (root / ("consumequeue" + BUILD)).exists()


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["flip", "zero", "delete", "cut", "extra", "queue"]),
                          st.integers(0, 1 << 20)), max_size=4))
def test_rebuild_cq_plan_workers_compare_their_queue_runs(generated, damage):
    """A plan (dry run) with --jobs 2: the workers compare their queue runs with the store's files where they
    walk them (runs across two queue files among them) and this process takes what they found in order;
    the plan tells exactly the changes, size and counts of the plan one process makes, on queues damaged
    every way, and writes nothing."""
    from helpers_maintain import snapshot
    from rmqtool.ops.rebuild import rebuild_consume_queues

    with tempfile.TemporaryDirectory() as work:
        root = Path(work) / "store"
        shutil.copytree(generated, root)
        files = sorted(p for p in (root / "consumequeue").rglob("0*") if p.is_file())
        for op, n in damage:
            f = files[n % len(files)]
            if not f.exists():
                continue
            data = bytearray(f.read_bytes())
            if op == "flip":
                data[n % len(data)] ^= 1 << n % 8
            elif op == "zero":
                data[n % len(data):] = bytes(len(data) - n % len(data))
            elif op == "cut":
                del data[n % len(data):]
            elif op == "extra":
                f.with_name(f"{int(f.name) + 20 * 50 * 8:020d}").write_bytes(bytes(data))
            if op == "delete":
                f.unlink()
            elif op == "queue":
                shutil.rmtree(f.parent)
            else:
                f.write_bytes(bytes(data))
        before = snapshot(root)
        one = rebuild_consume_queues(Store.open(root), dry_run=True, jobs=1)
        with pytest.MonkeyPatch.context() as m:
            runs = _placed_runs(m)
            two = rebuild_consume_queues(Store.open(root), dry_run=True, jobs=2)
        assert runs and all(ok for ok, *_ in runs)
        assert any(at // size != (end - 1) // size for _, at, end, size in runs)
        assert dataclasses.asdict(two) == dataclasses.asdict(one)
        assert snapshot(root) == before


def test_rebuild_cq_plan_a_worker_misplaced_is_compared_by_one_process(generated, tmp_path, monkeypatch):
    """The plan of the store whose later file repeats an older queue offset (above): a worker's run is
    refused, the plan starts again in one process and tells what one process tells."""
    from rmqtool.ops.rebuild import rebuild_consume_queues

    root = tmp_path / "store"
    at = _repeating(generated, root)
    one = rebuild_consume_queues(Store.open(root), dry_run=True, jobs=1)
    runs = _placed_runs(monkeypatch)
    two = rebuild_consume_queues(Store.open(root), dry_run=True, jobs=2)
    assert [place for ok, place, *_ in runs if not ok] == [at]
    assert dataclasses.asdict(two) == dataclasses.asdict(one) and one.misplaced


def _killed_rebuild(root: Path, delay: float) -> bool:
    """``rebuild-cq --jobs 2`` of ``root`` in a forked child SIGKILLed after ``delay`` s; whether it was."""
    pid = os.fork()
    if pid == 0:                               # the child: never returns into pytest
        code = 99
        try:
            signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
            signal.setitimer(signal.ITIMER_REAL, delay)
            code = run("rebuild-cq", root, "--jobs", "2", "--backup", root.parent / "bk", "--apply").exit_code
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 0
    return os.WIFSIGNALED(status)


@pytest.mark.slow
def test_rebuild_cq_killed_while_workers_write_leaves_the_store_or_the_rebuild(generated, tmp_path):
    """SIGKILL at random instants of a rebuild whose workers write queue files: after the interrupted
    change is finished or dropped, the consume queues are the old ones or the rebuilt ones, nothing
    staged is left behind, and no worker of the killed rebuild writes on (they die with it)."""
    import random

    from helpers_maintain import snapshot
    from rmqtool.store import atomic

    def base(case: Path) -> Path:
        root = case / "store"
        shutil.copytree(generated, root)
        for f in sorted(p for p in (root / "consumequeue").rglob("0*") if p.is_file())[::3]:
            f.write_bytes(bytes(f.stat().st_size))
        return root

    ref = base(tmp_path / "ref")
    before = snapshot(ref / "consumequeue")
    run("rebuild-cq", base(tmp_path / "warm"), "--jobs", "2", "--apply")          # imports done before forking
    start = time.monotonic()
    assert not _killed_rebuild(ref, 60)
    duration, after = time.monotonic() - start, snapshot(ref / "consumequeue")
    assert after != before
    rng, kills = random.Random(19), 0
    for n in range(60):
        if kills == 10:
            break
        root = base(tmp_path / f"k{n}")
        if not _killed_rebuild(root, rng.uniform(0.02, duration * 0.8)):
            shutil.rmtree(root.parent)
            continue
        kills += 1
        atomic.complete_pending(root)
        assert snapshot(root / "consumequeue") in (before, after), n
        assert not [p for p in root.rglob("*") if p.name.endswith((atomic.BUILD, atomic.STAGED, atomic.JOURNAL))]
        left = snapshot(root.parent)
        time.sleep(0.3)
        assert snapshot(root.parent) == left, n
    assert kills == 10


@pytest.mark.parametrize("name", ["generated", "damaged"])
def test_stats_and_grep_in_workers_print_what_one_process_prints(name, request):
    """stats and grep spread the files over worker processes (``--jobs``) and print the same rows, the same
    damage warnings and the same exit status as one process; grep's ``-n`` stops the workers early."""
    src = request.getfixturevalue(name)
    commands = [("stats", src, "--by", "topic", "-f", "jsonl"), ("stats", src, "--by", "queue", "-f", "csv"),
                ("grep", src, "--tag", "TagA", "-f", "jsonl"), ("grep", src, "-f", "csv"),
                ("grep", src, "-f", "plain", "-n", "7")]
    for command in commands:
        one, three = (run(*command, "--jobs", jobs) for jobs in "13")
        assert (three.exit_code, three.stdout, three.stderr) == (one.exit_code, one.stdout, one.stderr), command
        assert one.exit_code == (3 if name == "damaged" and "-n" not in command else 0), (command, one.stderr)
        assert len(one.stdout.splitlines()) > 2, command


def test_stats_and_grep_spread_a_large_store_by_default(generated, monkeypatch):
    """Above workers.PARALLEL_MIN_BYTES of commit log stats and grep use workers without --jobs (here the
    threshold lowered under the generated store: the files' scans run in other processes)."""
    from rmqtool.ops import workers

    pids = []
    real = workers.process_map

    def spy(fn, items, jobs, progress=None):
        pids.append(jobs)
        return real(fn, items, jobs, progress)
    monkeypatch.setattr(workers, "process_map", spy)
    monkeypatch.setattr(workers, "PARALLEL_MIN_BYTES", 1 << 16)
    cores = len(os.sched_getaffinity(0))
    one = run("stats", generated, "--by", "topic", "-f", "jsonl", "--jobs", "1")
    default = run("stats", generated, "--by", "topic", "-f", "jsonl")
    assert default.stdout == one.stdout and pids == [1, workers.default_jobs(6 * 65536, 6)]
    assert pids[1] == min(cores, 6, available_memory() >> 30) and (cores < 2 or pids[1] > 1)


def test_one_file_export_takes_a_default_worker_per_file_but_filtered_text(generated, monkeypatch, tmp_path):
    """Without --jobs, export to one Parquet file, or to JSON lines or CSV of every record (written in place),
    takes a worker per commit-log file (cores allowing); a filtered text export one per two files: the copy
    of its last part after its worker ends is serial."""
    from rmqtool.ops import scan, workers

    asked = []
    real = workers.default_jobs
    monkeypatch.setattr(scan, "FEW_BYTES", 0)             # the columnar path, not the small store's
    monkeypatch.setattr(workers, "default_jobs", lambda size, files: asked.append(files) or real(size, files))
    monkeypatch.setattr(workers, "PARALLEL_MIN_BYTES", 1 << 16)
    for name, extra in [("out.parquet", []), ("out.jsonl", []), ("out.csv", []),
                        ("topic.parquet", ["--topic", "Topic-01"]), ("topic.jsonl", ["--topic", "Topic-01"]),
                        ("topic.csv", ["--topic", "Topic-01"])]:
        assert run("export", generated, "--to", tmp_path / name, *extra).exit_code == 0
    assert asked == [6, 6, 6, 6, 3, 3]


@pytest.mark.parametrize("name", ["generated", "damaged"])
def test_dataset_export_in_workers_writes_the_same_parts(name, request, tmp_path):
    """export to a dataset directory writes its parts (one per commit-log file) in worker processes
    (``--jobs``): the same files, bytes, counts and exit status as one process, a damaged file's error
    (or with --read-anyway its warning) included."""
    src = request.getfixturevalue(name)
    for extra in (["-f", "parquet"], ["-f", "jsonl", "--read-anyway"], ["--partition-by", "topic"]):
        outputs = []
        for jobs in "13":
            out = tmp_path / f"{name}-{extra[1]}-{jobs}"
            r = run("export", src, "--to", out, *extra, "--jobs", jobs)
            outputs.append((r.exit_code, r.stderr.replace(str(out), "OUT").split(" in ")[0],
                            [line for line in r.stderr.splitlines() if line.startswith("rmqtool: ")],
                            _tree(out) if out.exists() else {}))
        assert outputs[0] == outputs[1], extra
        if name == "generated":
            assert outputs[0][0] == 0 and len(outputs[0][3]) >= 6, extra
        else:           # the third file's bad magic code: a refused export, or the parts before it
            assert outputs[0][0] == 3 and "bad magic code" in outputs[0][2][-1], (extra, outputs[0])
            assert bool(outputs[0][3]) == ("--read-anyway" in extra), extra


@pytest.mark.parametrize("name, extra", [("generated", ["-f", "parquet"]),
                                         ("generated", ["-f", "csv", "--check-crc", "--topic", "Topic-01"]),
                                         ("generated", ["-f", "parquet", "--topic", "no-such-topic"]),
                                         ("generated", ["-f", "jsonl"]),
                                         ("generated", ["-f", "csv", "--check-crc", "--body-encoding", "text"]),
                                         ("damaged", ["-f", "jsonl", "--read-anyway"]),
                                         ("damaged", ["-f", "csv", "--read-anyway", "--body-encoding", "hex"]),
                                         ("damaged", ["-f", "csv"]),
                                         ("damaged", ["-f", "parquet"])])
def test_one_file_export_in_workers_writes_the_same_bytes(name, extra, request, tmp_path):
    """export to one file with --jobs: each commit-log file written by a worker, apart and joined in order
    (Parquet: its row groups copied, the footer rebuilt; a filtered text export) or in place (the lines of
    every record), gives the bytes of one process, the same counts, warnings and exit status; a worker's error
    is the one-process error, and no output or part file is left."""
    import pyarrow.parquet as pq

    src = request.getfixturevalue(name)
    outputs = []
    for jobs in "13":
        out = tmp_path / f"{jobs}.{extra[1]}"
        r = run("export", src, "--to", out, *extra, "--jobs", jobs)
        outputs.append((r.exit_code, r.stderr.replace(str(out), "OUT").split(" in ")[0],
                        [line.replace(str(out), "OUT") for line in r.stderr.splitlines() if line.startswith("rmqtool: ")],
                        out.read_bytes() if out.exists() else None))
    assert outputs[0] == outputs[1]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    if name == "generated":
        assert outputs[0][0] == 0 and outputs[0][3]
        if extra[1] == "parquet" and len(extra) == 2:       # a row group per commit-log file
            assert pq.ParquetFile(out).metadata.num_row_groups == len(os.listdir(Path(src) / "commitlog"))
    elif "--read-anyway" in extra:        # the third file's bad magic code: skipped with a warning
        assert outputs[0][0] == 3 and "bad magic code" in outputs[0][2][-1] and outputs[0][3], outputs[0][:3]
    else:                                 # refused: nothing written
        assert outputs[0][0] == 3 and "bad magic code" in outputs[0][2][-1] and outputs[0][3] is None, outputs[0][:3]


def _append_until_killed(path: str, progress) -> None:
    """Appends to ``path`` for 20 seconds (an orphan does not outlive a failed test for long)."""
    end = time.monotonic() + 20
    while time.monotonic() < end:
        with open(path, "a") as fh:
            fh.write("x")
        time.sleep(0.005)


def test_process_map_workers_die_with_this_process(tmp_path):
    """A SIGKILLed process's ``process_map`` workers die with it: none goes on writing (an export writes its
    output from them)."""
    paths = [str(tmp_path / name) for name in "ab"]        # a: the worker's item, b: this process's
    pid = os.fork()
    if pid == 0:                                # the child: never returns into pytest
        try:
            process_map(_append_until_killed, paths, 2)
        finally:
            os._exit(1)
    deadline = time.monotonic() + 60
    # both writing: each file holds a byte (one that exists may be made but not yet written)
    while not all(os.path.exists(p) and os.path.getsize(p) > 0 for p in paths) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    time.sleep(0.1)
    sizes = [os.path.getsize(p) for p in paths]
    time.sleep(0.3)
    assert [os.path.getsize(p) for p in paths] == sizes and min(sizes) > 0


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_text_of_every_record_is_written_in_place(fmt, generated, monkeypatch, tmp_path):
    """JSON lines or CSV of every record with --jobs: each part's lines written at their place in the output,
    nothing copied after the workers; a store whose first file gives no record (its first record damaged,
    read anyway) has the CSV header written by the next part: the bytes of --jobs 1."""
    import struct

    from rmqtool.store import joined

    def no_copy(*args):
        raise AssertionError("a part was copied")
    monkeypatch.setattr(joined, "copy_range", no_copy)
    src = tmp_path / "store"
    shutil.copytree(generated, src)
    first = sorted((src / "commitlog").iterdir())[0]
    data = bytearray(first.read_bytes())
    struct.pack_into(">i", data, 4, 0x12345678)              # the first record's magic code
    first.write_bytes(bytes(data))
    outputs = []
    for jobs in "13":
        out = tmp_path / f"{jobs}.{fmt}"
        r = run("export", src, "--to", out, "-f", fmt, "--read-anyway", "--jobs", jobs)
        outputs.append((r.exit_code, r.stderr.replace(str(out), "OUT").split(" in ")[0], out.read_bytes()))
    assert outputs[0] == outputs[1]
    assert outputs[0][0] == 3 and outputs[0][2].count(b"\n") > 100
    if fmt == "csv":
        assert outputs[0][2].startswith(b'"type","physical_offset",') and outputs[0][2].count(b'"type"') == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.csv" if fmt == "csv" else "1.jsonl",
                                                          "3.csv" if fmt == "csv" else "3.jsonl", "store"]


def test_a_part_whose_lines_change_length_stops_the_export(generated, monkeypatch, tmp_path):
    """A part whose lines come out of another length than counted (its commit-log file changed in between)
    stops an export written in place: one line naming the file, no output left."""
    from rmqtool.ops import export

    real = export._measure
    monkeypatch.setattr(export, "_measure", lambda *args, **kw: real(*args, **kw) + 1)
    out = tmp_path / "out.jsonl"
    r = run("export", generated, "--to", out, "--jobs", "3")
    assert r.exit_code != 0 and "changed while it was exported" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


@settings(max_examples=60, deadline=None)
@given(head=st.binary(max_size=40), body=st.binary(max_size=300), out_head=st.binary(max_size=30),
       piece=st.integers(1, 64), kernel=st.booleans())
def test_a_joined_part_is_copied_from_its_end_back_and_cut_as_it_goes(head, body, out_head, piece, kernel):
    """store.joined.copy_range appends a part's bytes from an offset on, exactly, whether the kernel copies
    (copy_file_range) or not, in pieces from the end back; each piece is cut from the part as soon as it is
    copied, so the part never holds more than the bytes still to copy."""
    from rmqtool.store import joined

    sizes = []                  # the part's size as each piece is copied
    real_copy = joined._copy_piece

    def copy(src, out, at, to, count, path):
        sizes.append(os.fstat(src.fileno()).st_size)
        return real_copy(src, out, at, to, count, path)

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(joined, "PIECE", piece)
        mp.setattr(joined, "_copy_piece", copy)
        if not kernel:
            mp.delattr(os, "copy_file_range")
        part, target = Path(tmp, "part"), Path(tmp, "out")
        part.write_bytes(head + body)
        target.write_bytes(out_head)
        with open(target, "r+b") as out:
            out.seek(0, os.SEEK_END)
            joined.copy_range(part, out, len(head), len(body))
            assert out.tell() == len(out_head) + len(body)
        assert target.read_bytes() == out_head + body
        assert part.stat().st_size == len(head)                         # all of it cut
    ends, end = [], len(body)
    while end:
        ends.append(len(head) + end)
        end = (end - 1) // piece * piece
    assert sizes == ends


@settings(max_examples=60, deadline=None)
@given(before=st.binary(max_size=5000), chunks=st.lists(st.binary(max_size=70_000), max_size=8),
       bounded=st.booleans(), native=st.booleans())
def test_a_file_written_with_its_blocks_allocated_ahead(before, chunks, bounded, native):
    """store.joined.Allocating writes every byte where it goes whether the file system allocates blocks
    ahead or not; a writer bounded by ``end`` (a part written in place) asks for no block past it, and one
    that writes the file's end leaves none allocated past the end when it closes."""
    from rmqtool.store import joined

    asked, real = [], joined._fallocate_ahead

    def allocate(fd, offset, length):
        asked.append((offset, length))
        return native and real(fd, offset, length)

    data = b"".join(chunks)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        can = _can_allocate(Path(tmp, "probe"))              # whether this file system allocates ahead
        mp.setattr(joined, "PIECE", 1 << 20)
        mp.setattr(joined, "_fallocate_ahead", allocate)
        path = Path(tmp, "out")
        path.write_bytes(before + bytes(len(data)) + b"after" if bounded else before)
        with open(path, "r+b") as raw:
            raw.seek(len(before))
            out = joined.Allocating(raw, len(before) + len(data) if bounded else None)
            for i, chunk in enumerate(chunks):
                assert out.write(memoryview(chunk) if i % 2 else chunk) == len(chunk)
            assert out.tell() == len(before) + len(data)
            out.close()
        assert path.read_bytes() == before + data + (b"after" if bounded else b"")
        if bounded:
            assert all(offset + length <= len(before) + len(data) for offset, length in asked), asked
        elif native and asked and can:
            assert path.stat().st_blocks * 512 < (1 << 19), "blocks allocated past the end were left"


def _can_allocate(path: Path) -> bool:
    from rmqtool.store import joined

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        return joined._fallocate_ahead(fd, 0, 4096)
    finally:
        os.close(fd)
