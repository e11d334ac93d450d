"""Fault injection: SIGKILL the writer at every fault point of repair --apply, rebuild-cq and import.

After the kill, the next rmqtool write completes or drops the interrupted change (complete_pending);
the store must then be exactly the old one or exactly the new one (an import: none or all of its
messages).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal

import pytest

from conftest import run, store_path
from helpers_maintain import run_process, snapshot
from rmqtool.store.atomic import FAULT_ENV, complete_pending


def _kill_at_every_point(make_store, args, check, step: int = 1, env: dict | None = None) -> int:
    """Run ``args`` killed at fault point k = 1, 1+step, ... until a run completes; returns kills."""
    kills = 0
    for k in itertools.count(1, step):
        root = make_store()
        result = run_process(*args(root), env={**(env or {}), FAULT_ENV: str(k)})
        if result.returncode != -signal.SIGKILL:
            assert result.returncode in (0, 1), result.stderr
            check(root, result, completed=True)
            return kills
        kills += 1
        complete_pending(root)
        check(root, result, completed=False)


@pytest.mark.parametrize("name", ["dev-sample-crash-torn", "dev-sample-5x-crash"])
def test_repair_is_all_or_nothing(name, store_copy, tmp_path):
    old = snapshot(store_path(name))
    reference = store_copy(name, "store")
    assert run("repair", reference, "--apply", "--backup", tmp_path / "ref-bk").exit_code == 0
    new = snapshot(reference)
    counter = itertools.count()

    def make():
        dst = tmp_path / f"run{next(counter)}"
        shutil.copytree(store_path(name), dst)
        return dst

    def check(root, result, completed):
        assert snapshot(root) in (old, new)
        if completed:
            assert snapshot(root) == new

    scratch = tmp_path / "tmp"             # the system's temporary directory, as the runs see it
    scratch.mkdir()
    env = {"TMPDIR": str(scratch)}
    assert _kill_at_every_point(make, lambda r: ["repair", r, "--apply", "--backup", f"{r}.bk"], check,
                                env=env) >= 10
    # the killed runs' scratch (index files built outside the store) goes with the next run, once a minute old
    left = sorted(p.name for p in scratch.iterdir())
    assert left and all(n.startswith("rmqtool-repair-index-") for n in left)
    for p in scratch.iterdir():                 # by the file system's clock, as the sweep judges age
        os.utime(p, (p.stat().st_mtime - 120,) * 2)
    assert run_process("repair", make(), env=env).returncode == 1          # the plan builds its index files
    assert list(scratch.iterdir()) == []


def test_rebuild_cq_is_all_or_nothing(tmp_path):
    base = tmp_path / "base"
    shutil.copytree(store_path("dev-sample"), base)
    for q in (base / "consumequeue" / "TopicA").iterdir():
        for f in q.iterdir():
            f.write_bytes(bytes(f.stat().st_size))             # damaged queues, right sizes
    old = snapshot(base)
    new = snapshot(store_path("dev-sample"))
    counter = itertools.count()

    def make():
        dst = tmp_path / f"run{next(counter)}"
        shutil.copytree(base, dst)
        return dst

    def check(root, result, completed):
        assert snapshot(root) in (old, new)

    assert _kill_at_every_point(make, lambda r: ["rebuild-cq", r, "--backup", f"{r}.bk", "--apply"], check) >= 3


def test_import_is_one_transaction(tmp_path):
    rows = [json.loads(line) for line in run("cat-commitlog", store_path("dev-sample"), "-f", "jsonl",
                                             "--body-encoding", "base64", "-n", "60").stdout.splitlines()]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    messages = [r for r in rows if r["type"] == "message"]
    counter = itertools.count()

    def make():
        dst = tmp_path / f"run{next(counter)}"
        assert run("init", dst, "--commitlog-file-size", "65536", "--cq-file-size", "160", "--slots", "16",
                   "--max-entries", "64").exit_code == 0
        return dst

    def check(root, result, completed):
        stored = [json.loads(line) for line in run("cat-commitlog", root, "-f", "jsonl", "--body-encoding", "base64")
                  .stdout.splitlines()]
        assert len(stored) in (0, len(messages))                          # all or nothing
        assert [r["body"] for r in stored] == [r["body"] for r in messages[:len(stored)]]
        assert run("verify", root).exit_code == 0
        if completed:
            assert len(stored) == len(messages)

    assert _kill_at_every_point(make, lambda r: ["import", r, src, "--backup", f"{r}.bk", "--apply"],
                                check, step=2) >= 10
