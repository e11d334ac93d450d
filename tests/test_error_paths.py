"""Every error names its path: each class of damage, on a copy of a bundled store named as a user names it
(a relative path), gives a line that names the damaged file under that name, or the directory whose files
set the size that is refused."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from tests.conftest import run

CQ = "consumequeue/TopicA/0/00000000000000000000"


def cut(size):
    return lambda p: os.truncate(p, size)


def overwrite(data: bytes):
    def damage(p):
        with open(p, "r+b") as fh:
            fh.write(data)
    return damage


def every_queue_file(size):
    """Every consume-queue file cut to ``size``, and TopicB's queues gone (a write recreates them)."""
    def damage(store):
        for f in store.glob("consumequeue/*/*/*"):
            os.truncate(f, size)
        shutil.rmtree(store / "consumequeue" / "TopicB")
    return damage


# (fixture, damaged path in the store ("" = the store), damage, command (S: the store), the path the line names)
CASES = [
    ("dev-sample", CQ, cut(223), ["cat-cq", f"S/{CQ}"], f"S/{CQ}"),
    ("dev-sample", CQ, cut(223), ["cat-cq", "S", "TopicA", "0"], "S/consumequeue/TopicA/0/"),
    ("dev-sample", CQ, cut(223), ["repair", "S"], CQ),
    ("dev-sample", CQ, cut(223), ["verify", "S", "-f", "plain"], CQ),
    ("dev-sample", "", every_queue_file(223), ["repair", "S"], "S/consumequeue: file size 223"),
    ("dev-sample", "", every_queue_file(223), ["rebuild-cq", "S"], "S/consumequeue: file size 223"),
    ("dev-sample", "", every_queue_file(223), ["put", "S", "--topic", "TopicB", "--body", "b"], "S/consumequeue"),
    ("dev-sample", "commitlog/00000000000000065536", cut(40000), ["info", "S"], None),
    ("dev-sample", "commitlog/00000000000000065536", cut(40000), ["stats", "S"], None),
    ("dev-sample", "commitlog/00000000000000065536", cut(40000), ["export", "S", "--to", "out.jsonl"], None),
    ("dev-sample", "commitlog/00000000000000065536", cut(40000), ["grep", "S", "--topic", "TopicA"], None),
    ("dev-sample", "commitlog/00000000000000065536", cut(40000), ["repair", "S"], None),
    ("dev-sample", "commitlog/00000000000000000000", overwrite(b"\1\2\3\4\5\6\7\x08"), ["cat-commitlog", "S"], None),
    ("dev-sample", "commitlog/00000000000000000000", overwrite(b"\1\2\3\4\5\6\7\x08"), ["stats", "S"], None),
    ("dev-sample", "index/20261120231309479", cut(1000), ["cat-index", "S"], None),
    ("dev-sample", "index/20261120231309479", cut(1000), ["query-key", "S", "TopicA", "k"], None),
    ("dev-timer-5x", "timerwheel", cut(1001), ["timer", "S"], None),
    ("dev-timer-5x", "config/timercheck", cut(5), ["timer", "S"], None),
    ("dev-timer-5x", "config/timercheck", cut(5), ["repair", "S"], None),
]


@pytest.mark.parametrize("fixture,damaged,damage,command,named", CASES,
                         ids=[f"{c[0]}:{c[1] or 'queues'}:{c[3][0]}" for c in CASES])
def test_the_line_names_the_path(fixture, damaged, damage, command, named, store_copy, tmp_path, monkeypatch):
    store = store_copy(fixture)
    damage(store / damaged if damaged else store)
    monkeypatch.chdir(store.parent)
    os.rename(store, "S")
    result = run(*command)
    assert "Traceback" not in result.stderr and result.exit_code in (1, 3, 4), (result.exit_code, result.stderr)
    named = re.compile(rf"(^|[ :]){re.escape(named or f'S/{damaged}')}")     # as given: not inside another path
    assert any(named.search(line) for line in (result.stderr + result.stdout).splitlines()), \
        result.stderr + result.stdout[-2000:]


def test_a_backup_manifest_that_is_not_json_is_named(store_copy, tmp_path, monkeypatch):
    store = store_copy("dev-sample")
    monkeypatch.chdir(store.parent)
    assert run("put", "store", "--topic", "TopicA", "--body", "b", "--apply", "--backup", "bk").exit_code == 0
    (store.parent / "bk" / "manifest.json").write_text("{not json")
    result = run("restore", "bk", "store")
    assert result.exit_code == 4 and result.stderr.startswith("rmqtool: error: bk/manifest.json: ")



def test_a_short_checkpoint_reads_as_the_broker_maps_it_whichever_path_names_it(store_copy, monkeypatch):
    """A 7-byte checkpoint, named by its store or by its own path: the same fields (the broker's zeros past its
    end) and the same warning naming the file, exit 0."""
    store = store_copy("dev-sample")
    os.truncate(store / "checkpoint", 7)
    monkeypatch.chdir(store.parent)
    os.rename(store, "S")
    by_store, by_file = run("checkpoint", "S"), run("checkpoint", "S/checkpoint")
    assert by_store.exit_code == by_file.exit_code == 0 and by_store.stdout == by_file.stdout
    assert by_file.stderr == by_store.stderr and by_file.stderr.startswith("rmqtool: warning: S/checkpoint: ")
