"""export when a write fails, when it is killed, and when its stderr goes away: a write error names the output
(not the store, not the hidden temporary name) in one line, exit 4, and leaves nothing (an existing output
unchanged); a killed export's leftovers go at the next export to the same name, never a running one's; a
closed stderr changes neither the output nor the exit status."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import resource
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run, store_path
from rmqtool.ops import export, scan
from rmqtool.store import joined

STORE = store_path("dev-sample-5x")          # four commit-log files: four parts
DAMAGED = store_path("dev-damage-midfile-magic-497")
# (--to, extra arguments): one file, JSON lines, CSV and Parquet, in this process and from workers (the small
# path, and the bulk path for Parquet), a dataset directory, Hive-partitioned
SHAPES = [("out.jsonl", ["--jobs", "1"]), ("out.jsonl", ["--jobs", "2"]), ("out.csv", ["--jobs", "2"]),
          ("out.parquet", ["--jobs", "1"]), ("out.parquet", ["--jobs", "2"]), ("out.parquet", ["--jobs", "1", "bulk"]),
          ("ds", ["-f", "jsonl", "--jobs", "1"]), ("ds", ["--jobs", "2"]), ("ds", ["--partition-by", "topic"])]


def _export(tmp_path, to, extra, *more):
    return run("export", STORE, "--to", tmp_path / to, *[a for a in extra if a != "bulk"], *more)


def _tree(path) -> dict:
    """Every file under ``path`` (relative name -> bytes)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _refused(result, to, existed: bool) -> None:
    assert result.exit_code == 4, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"rmqtool: error: {to}: "), result.stderr
    assert ("the existing output is unchanged" if existed else "nothing written") in result.stderr, result.stderr


@contextlib.contextmanager
def _file_size_limit(limit: int):
    """RLIMIT_FSIZE: a write past ``limit`` bytes of any file fails with EFBIG, in this process and the workers
    it forks (pyarrow's writer, copy_file_range and all); SIGXFSZ ignored, as by a shell's ulimit -f."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.parametrize("to, extra", SHAPES)
def test_a_write_error_names_the_output_and_leaves_nothing(to, extra, tmp_path, monkeypatch):
    """Seeded: the writes of a file fail past a byte count drawn from the seed, below the size of the largest
    file of the output (EFBIG from the kernel, in whichever process writes it); the first run starts afresh,
    the others replace an existing output (--force)."""
    if "bulk" in extra:
        monkeypatch.setattr(scan, "FEW_BYTES", -1)
    clean = tmp_path / "clean"
    clean.mkdir()
    assert _export(clean, to, extra).exit_code == 0
    size = max(len(b) for b in _tree(clean).values())        # the limit is per file
    for seed in range(3):
        limit = random.Random(seed).randrange(1, size)
        existed = seed > 0
        with _file_size_limit(limit):
            result = _export(tmp_path, to, extra, *["--force"] * existed)
        _refused(result, tmp_path / to, existed)
        assert sorted(os.listdir(tmp_path)) == sorted(["clean", to][:1 + existed]), (seed, limit)
        if not existed:                                 # the output to leave untouched from now on
            assert _export(tmp_path, to, extra).exit_code == 0
            before = _tree(tmp_path / to) if (tmp_path / to).is_dir() else (tmp_path / to).read_bytes()
        after = _tree(tmp_path / to) if (tmp_path / to).is_dir() else (tmp_path / to).read_bytes()
        assert after == before, (seed, limit)


WRITERS = [(*shape, "writer") for shape in SHAPES[1:3] + SHAPES[4:6] + SHAPES[7:8]]
# parts joined: Parquet's, and a filtered text export's (the text of every record is written in place)
JOINS = [(*shape, "join") for shape in SHAPES[4:5]] + \
    [(to, ["--jobs", "2", "--topic", "TopicA"], "join") for to in ("out.jsonl", "out.csv")]


@pytest.mark.parametrize("to, extra, where", WRITERS + JOINS)
def test_a_full_disk_says_so_naming_the_output(to, extra, where, tmp_path, monkeypatch):
    """ENOSPC from the k-th write of a batch on (in the workers, which inherit the patch, and here) or from the k-th
    copy of a part into the output (the join, here), for k = 1..3: "No space left on device", naming the
    output, nothing left."""
    if "bulk" in extra:
        monkeypatch.setattr(scan, "FEW_BYTES", -1)
    real_writer, real_copy = export._writer, joined.copy_range
    for k in (1, 2, 3):
        calls = [0]

        def full(fn):
            def call(*args, **kwargs):
                calls[0] += 1
                if calls[0] >= k:               # the disk stays full
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return fn(*args, **kwargs)
            return call

        if where == "writer":
            monkeypatch.setattr(export, "_writer", lambda *a: full(real_writer(*a)))
        else:
            monkeypatch.setattr(joined, "copy_range", full(real_copy))
        result = _export(tmp_path, to, extra)
        _refused(result, tmp_path / to, False)
        assert "No space left on device" in result.stderr, k
        assert os.listdir(tmp_path) == [], k


@pytest.mark.parametrize("extra", [[], ["--topic", "TopicA"]])
def test_a_killed_exports_leftovers_go_at_the_next_export(extra, tmp_path):
    """A real SIGKILL while the workers write, into the output in place (every record) or their parts (a
    filter): no worker writes on, and the next export to the name removes what it left (one warning line)
    and writes the same bytes as a clean run."""
    out = tmp_path / "out.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT), RMQTOOL_NO_PROGRESS="1")
    proc = subprocess.Popen([sys.executable, "-m", "rmqtool", "export", str(STORE), "--to", str(out), "--jobs", "2",
                             *extra], env=env, stderr=subprocess.DEVNULL)
    written = ".parts-" if extra else ".out.jsonl.tmp-"        # (the lock's name ends in "-lock")
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if any(written in name and not name.endswith("-lock") for name in os.listdir(tmp_path)):
            proc.kill()
            break
        time.sleep(0.001)
    assert proc.wait() == -signal.SIGKILL, "the export ended before it wrote"
    left = sorted(os.listdir(tmp_path))
    assert not out.exists() and any(n.startswith(".out.jsonl.tmp-") and written in n for n in left), left
    sizes = [(p.name, p.stat().st_size) for p in sorted(tmp_path.rglob("*"))]
    time.sleep(0.3)
    assert [(p.name, p.stat().st_size) for p in sorted(tmp_path.rglob("*"))] == sizes
    result = run("export", STORE, "--to", out, "--jobs", "2", *extra)
    assert result.exit_code == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if "warning" in line]
    leftovers = [n for n in left if n != ".out.jsonl.tmp-lock"]
    assert warning == [f"rmqtool: warning: {out}: removed what an interrupted run left beside it: "
                       f"{', '.join(leftovers)}"]
    assert sorted(os.listdir(tmp_path)) == ["out.jsonl"]
    assert run("export", STORE, "--to", tmp_path / "clean.jsonl", "--jobs", "1", *extra).exit_code == 0
    assert out.read_bytes() == (tmp_path / "clean.jsonl").read_bytes()


@pytest.mark.parametrize("to", ["out.parquet", "ds"])
def test_a_running_exports_files_are_left_alone(to, tmp_path):
    """While another process holds the name's lock, an export to it is refused (exit 4) and touches nothing;
    once that process is gone (its lock free), its leftovers are removed: a file, a parts directory, a
    dataset's staging directory."""
    leftovers = [f".{to}.tmp-999999", f".{to}.tmp-999999.parts-x1"]
    for name in leftovers:
        (tmp_path / name).mkdir() if "parts" in name or to == "ds" else (tmp_path / name).write_bytes(b"PAR1")
    (tmp_path / leftovers[1] / "part-00000").write_bytes(b"x")
    lock = os.open(tmp_path / f".{to}.tmp-lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = run("export", STORE, "--to", tmp_path / to)
        assert result.exit_code == 4, result.stderr
        assert result.stderr == (f"rmqtool: error: {tmp_path / to}: another process is writing this output (it holds "
                                 f".{to}.tmp-lock); wait for it to end, or write elsewhere\n")
        assert sorted(os.listdir(tmp_path)) == sorted(leftovers + [f".{to}.tmp-lock"])
    finally:
        os.close(lock)
    result = run("export", STORE, "--to", tmp_path / to)
    assert result.exit_code == 0, result.stderr
    assert f"removed what an interrupted run left beside it: {', '.join(leftovers)}" in result.stderr
    assert os.listdir(tmp_path) == [to]


def test_a_closed_stderr_changes_neither_the_output_nor_the_exit_status(tmp_path):
    """stdout and stderr read by no one (``2>&1 | true``), or stderr closed (``2>&-``): the partial export's
    output whole and its exit status 3, as with a terminal."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "rmqtool", "export", str(DAMAGED), "--read-anyway", "--to"]
    expected = run("export", DAMAGED, "--read-anyway", "--to", tmp_path / "tty.jsonl")
    assert expected.exit_code == 3 and "warning" in expected.stderr
    reader, writer = os.pipe()
    os.close(reader)                                   # the reader went away before a line was written
    try:
        gone = subprocess.run(command + [str(tmp_path / "pipe.jsonl")], env=env, stdout=writer, stderr=writer)
    finally:
        os.close(writer)
    closed = subprocess.run(command + [str(tmp_path / "closed.jsonl")], env=env, stdout=subprocess.DEVNULL,
                            preexec_fn=lambda: os.close(2))
    assert (gone.returncode, closed.returncode) == (3, 3)
    assert (tmp_path / "pipe.jsonl").read_bytes() == (tmp_path / "closed.jsonl").read_bytes() == \
        (tmp_path / "tty.jsonl").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["closed.jsonl", "pipe.jsonl", "tty.jsonl"]


def test_an_output_that_is_not_a_regular_file_is_refused(tmp_path):
    """A FIFO (or a device) at --to, even with --force: the file renamed into place would replace it."""
    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    result = run("export", STORE, "--to", fifo, "--force")
    assert result.exit_code == 4 and result.stderr == (f"rmqtool: error: {fifo}: output is not a regular file "
                                                       "(export writes a new file and renames it into place)\n")
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["out.jsonl"]


def test_a_dataset_directory_gets_its_missing_parents_and_a_file_does_not(tmp_path):
    """A dataset directory is made with its parents (the README's demo exports into build/demo/ after removing
    it; a URI's parents are made too); a one-file output in a directory that is not there is refused, naming it."""
    done = run("export", STORE, "--to", tmp_path / "a" / "b" / "ds")
    assert done.exit_code == 0 and sorted(os.listdir(tmp_path / "a" / "b")) == ["ds"]
    missing = tmp_path / "c" / "out.jsonl"
    refused = run("export", STORE, "--to", missing)
    assert (refused.exit_code, refused.stderr) == (4, f"rmqtool: error: {missing}: No such file or directory; "
                                                      "nothing written\n")
    assert sorted(os.listdir(tmp_path)) == ["a"]
