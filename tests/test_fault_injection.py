"""Seeded fault injection for every write command (repair --apply, rebuild-cq, rebuild-index, put, import).

1. Random damage (bit flips, truncations, zeroed ranges, stray and short files, oversized length fields)
   of copies of every fixture set; every write command on each: it completes (exit 0 or 1) or leaves the
   store byte-identical (exit 3 or 4); no traceback, no staging file, nothing written outside the store
   but the backup; after repair, every record that lies before the damage (which the broker's recovery
   keeps) is still there.
2. SIGKILL at random points (fault points of the journal and random instants) of each write command, run
   in a forked child: the next command rolls the change forward or back, and no acknowledged message is
   lost.
3. ENOSPC and EIO at each write, fsync, rename and unlink the store layer makes: exit 4, one line naming
   the path and the state the store is in; the store is as before with nothing staged, or as after (a
   change applied whose flush failed), and after the next command as after.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import random
import shutil
import signal
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import ALL_SETS, DLEDGER_CRASH_SETS, FEATURE_SETS, run, store_path
from helpers_maintain import snapshot
from rmqtool.store import atomic

pytestmark = pytest.mark.slow

SEED = 17
SETS = sorted(set(ALL_SETS + FEATURE_SETS + DLEDGER_CRASH_SETS + ["dev-compaction-5x", "dev-rocksdbcq-5x"]))
DAMAGES = 320                       # 20 per fixture set
KILLS = 50                          # per write command
DOCUMENTED = {0, 1, 3, 4}           # done, done with findings left, bad input, refused or failed
LEFTOVERS = (atomic.STAGED, atomic.OLD, atomic.BUILD, atomic.JOURNAL)
COMMANDS = ("repair", "rebuild-cq", "rebuild-index", "put", "import")
# put's UNIQ_KEY, fixed: a new one each run (the time, the process's counter) falls in the index's hash
# slot 0 one run in 16 (dev-sample has 16 slots), whose write then joins the header's, and the calls the
# I/O-fault test counts would change from run to run (this one's slot is 3)
UNIQ_KEY = "FD00000000000000000000000000000243AE5FFD2B2766D44CD40001"


def _args(command: str, root: Path, rows: Path, backup: str = "bk") -> list:
    bk = root.parent / backup
    return {"repair": ["repair", root, "--apply"],
            "rebuild-cq": ["rebuild-cq", root],
            "rebuild-index": ["rebuild-index", root],
            "put": ["put", root, "--topic", "FaultTopic", "--body", "fault", "--property", f"UNIQ_KEY={UNIQ_KEY}"],
            "import": ["import", root, rows]}[command] + ["--backup", bk] + (["--apply"] if command != "repair" else [])


def _copy(src: Path, case: Path) -> Path:
    root = case / "store"
    shutil.copytree(src, root)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def _leftovers(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.name.endswith(LEFTOVERS)]


def _unstaged(snap: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in snap.items() if not any(part.endswith(LEFTOVERS) for part in k.split("/"))}


def _rows(root: Path) -> list[dict]:
    result = run("cat-commitlog", root, "-f", "jsonl", "--body", "base64")
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch):
    """Process kills and damage, not power loss: the page cache survives a SIGKILL, so fsync only costs
    time here (the I/O-fault test counts and fails the calls instead)."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.fixture(autouse=True)
def _own_temp_dir(tmp_path, monkeypatch):
    """The system's temporary directory of each test its own: what one command builds there, and what a killed
    one leaves there (removed by a later command of the same kind, once a minute old), are not another test's
    calls to count or kill."""
    path = tmp_path / "systmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    monkeypatch.setenv("TMPDIR", str(path))


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory) -> Path:
    """Three messages to import (as cat-commitlog writes them)."""
    path = tmp_path_factory.mktemp("rows") / "in.jsonl"
    path.write_text(run("cat-commitlog", store_path("dev-sample"), "-f", "jsonl", "--body", "base64",
                        "-n", "3").stdout)
    return path


@lru_cache(maxsize=None)
def _kept(name: str) -> tuple[tuple[int, ...], bytes]:
    """(end position of every record repair keeps on the undamaged set, the data files' bytes up to the
    last of them). Positions count in the data files (commitlog/, or DLedger's data/) by their names."""
    case = Path(tempfile.mkdtemp(prefix="rmqtool-fi-"))
    try:
        root = _copy(store_path(name), case)
        assert run("repair", root, "--apply", "--backup", case / "bk").exit_code in (0, 1)
        ends = tuple(sorted(r["physical_offset"] + r["total_size"] for r in _rows(root) if r["type"] == "message"))
        return ends, _data_bytes(root, ends[-1] if ends else 0)
    finally:
        shutil.rmtree(case)


def _data_bytes(root: Path, end: int) -> bytes:
    """The data files' bytes [0, end) (zeros where a file is missing)."""
    out = bytearray(end)
    for f in _data_files(root):
        start = int(f.name)
        if start < end:
            chunk = f.read_bytes()[:end - start]
            out[start:start + len(chunk)] = chunk
    return bytes(out)


# -- 1. random damage ------------------------------------------------------------------------------------
def _data_files(root: Path) -> list[Path]:
    ledger = sorted(root.glob("dledger-*/data"))
    return sorted(p for p in (ledger[0] if ledger else root / "commitlog").iterdir() if p.name.isdigit())


def _damage(rng: random.Random, root: Path) -> tuple[str, int | None]:
    """Damage ``root`` in place; returns (description, absolute data position of the first damaged byte
    of the commit log, or None when the commit log is untouched)."""
    data = _data_files(root)
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and p.name != "lock"]
    kind = rng.choice(["flip", "truncate", "zero", "stray", "short", "length"])
    target = rng.choice(data) if data and rng.random() < 0.5 else rng.choice(files)
    size = target.stat().st_size
    at = rng.randrange(size) if size else 0
    buf = bytearray(target.read_bytes())
    pos = int(target.name) + at if target in data else None
    if kind == "flip" and size:
        buf[at] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        buf = buf[:at]
    elif kind == "zero" and size:
        end = min(size, at + rng.choice([1, 4, 20, 512, 4096]))
        buf[at:end] = bytes(end - at)
    elif kind == "length" and data:
        target = rng.choice(data)
        buf = bytearray(target.read_bytes())
        at = _record_start(buf, rng) + (48 if target.parent.name == "data" and target.parent.parent.name.startswith(
            "dledger-") else 0)
        buf[at:at + 4] = rng.choice([0x7FFFFFF0, len(buf) + 1, 1 << 30, 0xFFFFFFFF]).to_bytes(4, "big")
        pos = int(target.name) + at
    elif kind in ("stray", "short"):
        dirs = [root / "commitlog", root / "index"] + sorted(p for p in root.glob("consumequeue/*/*") if p.is_dir())
        d = rng.choice([p for p in dirs if p.is_dir()])
        if kind == "stray":
            name = rng.choice(["00000000000000000000.rmqtool-new", "notes.txt", "x.rmqtool-build", "0"])
        else:
            last = max((p for p in d.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), default=None)
            name = f"{int(last.name) + last.stat().st_size:020d}" if last else f"{0:020d}"   # the next file
        (d / name).write_bytes(bytes(rng.randrange(1, 200)))
        return f"{kind} {d.relative_to(root)}/{name}", (int(name) if d in (root / "commitlog",) and name.isdigit()
                                                        and len(name) == 20 else None)
    target.write_bytes(bytes(buf))
    return f"{kind} {target.relative_to(root)} at {at}", pos


def _record_start(buf: bytearray, rng: random.Random) -> int:
    """The position of a random record in a commit-log file (walking the size fields from 0)."""
    starts, pos = [], 0
    while pos + 8 <= len(buf):
        size = int.from_bytes(buf[pos:pos + 4], "big")
        if size <= 0 or pos + size > len(buf):
            break
        starts.append(pos)
        pos += size
    return rng.choice(starts) if starts else 0


def _check_run(command: str, root: Path, before: dict, result, case: Path, what: str) -> None:
    out = result.stdout + result.stderr
    assert result.exit_code in DOCUMENTED, (what, command, result.exit_code, out)
    assert "Traceback" not in out and "internal error" not in out, (what, command, out)
    assert not _leftovers(root), (what, command, _leftovers(root))
    assert sorted(p.name for p in case.iterdir()) in (["store"], ["bk", "store"], ["bk", "store", "tmp"],
                                                      ["store", "tmp"]), (what, command, list(case.iterdir()))
    assert not any((case / "tmp").iterdir()), (what, command, "temporary files left")
    if result.exit_code in (3, 4):          # byte-identical (a staged leftover the damage planted aside: each
        assert _unstaged(snapshot(root)) == _unstaged(before), (what, command, out)   # write drops those first)


def test_random_damage(tmp_path, rows_file, monkeypatch):
    rng = random.Random(SEED)
    outcomes: dict[tuple[str, int], int] = {}
    for n in range(DAMAGES):
        name = SETS[n % len(SETS)]
        base = tmp_path / f"d{n}"
        src = _copy(store_path(name), base)
        what, pos = _damage(rng, src)
        what = f"{name}: {what}"
        before = snapshot(src)
        for command in COMMANDS:
            case = tmp_path / f"d{n}-{command}"
            root = _copy(src, case)
            (case / "tmp").mkdir()
            monkeypatch.setattr(tempfile, "tempdir", str(case / "tmp"))
            result = run(*_args(command, root, rows_file))
            monkeypatch.setattr(tempfile, "tempdir", None)
            _check_run(command, root, before, result, case, what)
            outcomes[command, result.exit_code] = outcomes.get((command, result.exit_code), 0) + 1
            if command == "repair" and result.exit_code in (0, 1):   # records before the damage stay
                ends, data = _kept(name)
                cut = max((e for e in ends if pos is None or e <= pos), default=0)
                assert _data_bytes(root, cut) == data[:cut], (what, "repair lost records before", cut)
            shutil.rmtree(case)
        shutil.rmtree(base)
    completed = sum(v for (c, code), v in outcomes.items() if code in (0, 1))
    assert completed > DAMAGES, outcomes          # most commands complete on most damage


# -- 2. SIGKILL at random points ------------------------------------------------------------------------
def _run_child(args: list, kill_at: int | None = None, delay: float | None = None) -> int | None:
    """The CLI in a forked child, SIGKILLed at fault point ``kill_at`` or after ``delay`` seconds; the exit
    status, or None when the child was killed. Returns the number of fault points passed with neither."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                           # the child: never returns into pytest
        code = 99
        try:
            os.close(read)
            os.environ[atomic.FAULT_ENV] = str(kill_at or 1 << 40)
            atomic._fault_count = 0
            if delay is not None:
                signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
                signal.setitimer(signal.ITIMER_REAL, delay)
            code = run(*args).exit_code
            os.write(write, str(atomic._fault_count).encode())
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    passed = os.read(read, 64)
    os.close(read)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return None
    _run_child.points = int(passed or 0)
    return os.WEXITSTATUS(status)


def _kill_base(command: str, case: Path) -> Path:
    """The store each command is killed on: one it has something to do to."""
    if command == "repair":
        return _copy(store_path("dev-sample-crash-torn"), case)
    root = _copy(store_path("dev-sample"), case)
    if command == "rebuild-cq":
        for f in (root / "consumequeue" / "TopicA").glob("*/*"):
            f.write_bytes(bytes(f.stat().st_size))
    if command == "rebuild-index":
        for f in (root / "index").iterdir():
            f.write_bytes(bytes(f.stat().st_size))
    return root


@pytest.mark.parametrize("command", COMMANDS)
def test_sigkill_at_random_points(command, tmp_path, rows_file):
    rng = random.Random(f"{SEED}-{command}")
    ref = _kill_base(command, tmp_path / "ref")
    before = snapshot(ref)
    original = _rows(ref)
    run(*_args(command, _kill_base(command, tmp_path / "warm"), rows_file))    # imports done before forking
    start = time.monotonic()
    assert _run_child(_args(command, ref, rows_file)) == 0
    duration, points = time.monotonic() - start, _run_child.points
    after, new_rows = snapshot(ref), _rows(ref)
    added = new_rows[len(original):]
    assert new_rows[:len(original)] == original and before != after
    kills = 0
    for n in range(KILLS * 3):
        if kills >= KILLS:
            break
        case = tmp_path / f"k{n}"
        root = _kill_base(command, case)
        if n % 2 == 0 and points:
            status = _run_child(_args(command, root, rows_file), kill_at=rng.randint(1, points))
        else:
            status = _run_child(_args(command, root, rows_file), delay=rng.uniform(0.001, duration * 0.8))
        if status is not None:                   # finished before the kill
            assert status == 0
            shutil.rmtree(case)
            continue
        kills += 1
        if kills % 5:       # what every write command does first: finish or drop the interrupted change
            atomic.complete_pending(root)
        else:               # the next command itself (the killed one's backup holds its undo data)
            result = run(*_args(command, root, rows_file, "bk2"))
            assert result.exit_code == 0, (n, result.stderr)
        assert not _leftovers(root), (n, _leftovers(root))
        if command in ("put", "import"):
            rows = _rows(root)
            assert rows[:len(original)] == original, n                    # nothing acknowledged lost
            extra = [(r["topic"], r["body"]) for r in rows[len(original):]]
            each = [(r["topic"], r["body"]) for r in added]
            assert extra in ([], each, each + each) and (extra or kills % 5), n   # all or nothing
        else:
            assert snapshot(root) in ((before, after) if kills % 5 else (after,)), n
        shutil.rmtree(case)
    assert kills >= KILLS, kills


# -- 3. ENOSPC and EIO in-process ------------------------------------------------------------------------
def _numba_cache(path) -> bool:
    """numba's cache files (written when compiled code is first used): not the store layer's calls."""
    return not isinstance(path, int) and (".nbi" in str(path) or ".nbc" in str(path))


class _Faults:
    """Count (or fail) the calls the store layer makes: file writes, fsync, rename, unlink."""

    KINDS = ("write", "fsync", "rename", "unlink")

    def __init__(self, monkeypatch, fail: tuple[str, int, int] | None = None):
        self.calls = dict.fromkeys(self.KINDS, 0)
        self.fail = fail
        real_open = builtins.open
        faults = self

        class Writer:
            def __init__(self, fh, path):
                self._fh, self._path = fh, path

            def write(self, data):
                faults.hit("write", self._path)
                return self._fh.write(data)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self._fh.__exit__(*exc)

            def __getattr__(self, name):
                return getattr(self._fh, name)

        def fake_open(file, mode="r", *args, **kw):
            fh = real_open(file, mode, *args, **kw)
            return Writer(fh, file) if any(c in mode for c in "wa+") and not isinstance(file, int) \
                and not _numba_cache(file) else fh

        def wrap(kind, real):
            def call(*args, **kw):
                if not (args and _numba_cache(args[0])):
                    faults.hit(kind, args[0] if args else None)
                return real(*args, **kw)
            return call

        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(os, "fsync", wrap("fsync", lambda fd: None))
        for name in ("replace", "rename"):
            monkeypatch.setattr(os, name, wrap("rename", getattr(os, name)))
        for name in ("unlink", "remove", "rmdir"):
            monkeypatch.setattr(os, name, wrap("unlink", getattr(os, name)))

    def hit(self, kind: str, path) -> None:
        self.calls[kind] += 1
        if self.fail and self.fail[0] == kind and self.fail[1] == self.calls[kind]:
            code = self.fail[2]
            raise OSError(code, os.strerror(code), None if isinstance(path, int) else str(path))


def _view(command: str, root: Path, original: list[dict]):
    """What a change did: the store's files (repair, rebuilds; staged files left out) or the messages
    after the original ones (put, import: their times differ from run to run)."""
    if command in ("put", "import"):
        rows = _rows(root)
        assert rows[:len(original)] == original                     # nothing acknowledged lost
        return [(r["topic"], r["body"]) for r in rows[len(original):]]
    return _unstaged(snapshot(root))


# the states an I/O error line names (rmqtool.store.atomic.store_state), and what the store holds then
STATES = {"the store is unchanged": "before", "the change is applied": "after",
          "the change is half-made": None, "the change is committed but not finished": None}


@pytest.mark.parametrize("command", COMMANDS)
def test_enospc_and_eio_at_each_call(command, tmp_path, rows_file, monkeypatch):
    ref = _kill_base(command, tmp_path / "ref")
    original = _rows(ref)
    views = {"before": _view(command, ref, original)}
    with monkeypatch.context() as m:
        counter = _Faults(m)
        assert run(*_args(command, ref, rows_file)).exit_code == 0
    views["after"] = after = _view(command, ref, original)
    again = after + after if command in ("put", "import") else after
    assert all(counter.calls.values()), counter.calls          # every kind of call is tried
    cases = [(kind, i, code) for kind, count in counter.calls.items() for i in range(1, count + 1)
             for code in ((errno.ENOSPC, errno.EIO) if i in (1, count) else (errno.EIO if i % 2 else errno.ENOSPC,))]
    for n, (kind, i, code) in enumerate(cases):
        case = tmp_path / f"io{n}"
        root = _kill_base(command, case)
        (case / "tmp").mkdir()
        with monkeypatch.context() as m:
            m.setattr(tempfile, "tempdir", str(case / "tmp"))     # what a failed case left is not the next one's
            _Faults(m, (kind, i, code))
            result = run(*_args(command, root, rows_file))
        what = (kind, i, errno.errorcode[code], result.stderr)
        lines = [x for x in result.stderr.splitlines() if x.startswith("rmqtool: error:")]
        assert result.exit_code == 4 and len(lines) == 1 and os.strerror(code) in lines[0], what
        assert str(case) in lines[0], what          # a file of the case's store or of its scratch (case/tmp)
        state = [s for s in STATES if s in lines[0]]
        assert len(state) == 1, what                               # says what state the store is in
        if STATES[state[0]]:                                       # as before, or as after, with nothing staged
            assert _view(command, root, original) == views[STATES[state[0]]], what
            assert not _leftovers(root) or " removes " in lines[0], what     # or it says what removes them
            if STATES[state[0]] == "before":
                assert not (case / "bk").exists(), what                # no partial backup either
        else:
            assert (root / atomic.JOURNAL).exists(), what            # the next command finishes or undoes it
        result = run(*_args(command, root, rows_file, "bk2"))      # the next command: as after
        assert result.exit_code == 0, what + (result.stderr,)
        assert not _leftovers(root) and _view(command, root, original) in (after, again), what
        shutil.rmtree(case)
