"""restore, undo hints, one backup per write invocation, and the one dry-run convention of writes."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.conftest import CRASH_SETS, run
from tests.helpers_maintain import run_process, snapshot


def tree(root) -> dict[str, bytes | None]:
    """Every file's bytes and every directory (None) under root."""
    return {**{str(p.relative_to(root)): None for p in root.rglob("*") if p.is_dir()}, **snapshot(root)}


def undo_command(stderr: str) -> list[str]:
    line = stderr.strip().splitlines()[-1]
    assert "undo: rmqtool restore " in line, stderr
    return shlex.split(line.split("undo: rmqtool ", 1)[1])


@pytest.mark.parametrize("name", CRASH_SETS)
def test_restore_after_repair_gives_the_identical_tree(name, store_copy):
    root = store_copy(name)
    before = tree(root)
    result = run("repair", root, "--apply")
    assert result.exit_code == 0 and tree(root) != before
    undo = undo_command(result.stderr)
    backup = undo[1]
    plan = run("restore", backup, root, "-f", "jsonl")             # a dry run first: the plan, no change
    assert plan.exit_code == 1 and plan.stdout and tree(root) != before
    assert {json.loads(line)["action"] for line in plan.stdout.splitlines()} <= {"restore_file", "restore_dir",
                                                                                "delete", "total"}
    result = run(*undo)
    assert result.exit_code == 0, result.stderr
    assert tree(root) == before
    assert run("restore", backup, root).exit_code == 0               # nothing left to do
    # the restore is undone the same way
    assert run(*undo_command(result.stderr)).exit_code == 0
    assert run("verify", root).exit_code == 0


def test_restore_defaults_to_the_store_of_the_manifest_and_refuses_a_changed_backup(store_copy, tmp_path):
    root = store_copy("dev-sample-crash")
    before = tree(root)
    assert run("repair", root, "--apply", "--backup", tmp_path / "bk").exit_code == 0
    assert run("restore", tmp_path / "bk", "--apply").exit_code == 0 and tree(root) == before
    entry = next(e for e in json.loads((tmp_path / "bk" / "manifest.json").read_text())["entries"]
                 if e["kind"] == "file")
    (tmp_path / "bk" / entry["path"]).write_bytes(b"tampered")
    result = run("restore", tmp_path / "bk", root, "--apply")
    assert result.exit_code == 4 and "changed since the backup" in result.stderr and tree(root) == before


def test_restore_respects_a_held_lock(store_copy, tmp_path):
    import fcntl
    root = store_copy("dev-sample-crash")
    assert run("repair", root, "--apply", "--backup", tmp_path / "bk").exit_code == 0
    after = tree(root)
    with open(root / "lock", "r+b") as fh:
        fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = run_process("restore", tmp_path / "bk", root, "--apply")
        assert result.returncode == 4 and tree(root) == after
    assert run_process("restore", tmp_path / "bk", root, "--apply").returncode == 0


def _init(root):
    assert run("init", root, "--commitlog-file-size", "65536", "--cq-file-size", "160", "--slots", "16",
               "--max-entries", "64").exit_code == 0


def test_one_backup_per_put_and_per_import(tmp_path):
    root = tmp_path / "store"
    _init(root)
    result = run("put", root, "--topic", "T", "--key", "a", "--key", "b c", "--tag", "x", "--body", "one", "--apply")
    assert result.exit_code == 0
    assert len(list(tmp_path.glob("store.rmqtool-backup-*"))) == 1
    rows = [{"type": "message", "topic": "T", "body": "aGk=", "body_encoding": "base64"}] * 120
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run("import", root, tmp_path / "in.jsonl", "--apply")
    assert result.exit_code == 0 and json.loads(result.stdout) == {"imported": 120}
    assert len(list(tmp_path.glob("store.rmqtool-backup-*"))) == 2
    stored = [json.loads(line) for line in run("cat-commitlog", root, "-f", "jsonl").stdout.splitlines()]
    assert len(stored) == 121 and stored[0]["keys"] == ["a", "b", "c"] and stored[0]["tags"] == "x"
    assert run(*undo_command(result.stderr)).exit_code == 0
    assert len(run("cat-commitlog", root, "-f", "jsonl").stdout.splitlines()) == 1


@pytest.mark.parametrize("args", [
    ["repair", "{crash}"], ["repair", "{crash}", "--dry-run"], ["rebuild-cq", "{torn}", "--dry-run"],
    ["rebuild-cq", "{torn}"], ["rebuild-index", "{clean}", "--slots", "32", "--max-entries", "128"],
    ["rebuild-index", "{clean}", "--slots", "32", "--max-entries", "128", "--dry-run"],
    ["put", "{clean}", "--topic", "T", "--body", "x"],
    ["put", "{clean}", "--topic", "T", "--body", "x", "--dry-run"],
])
def test_dry_runs_print_one_plan_format_and_exit_1_with_something_to_do(args, store_copy):
    crash, clean, torn = store_copy("dev-sample-crash"), store_copy("dev-sample"), store_copy("dev-sample-crash-torn")
    before = tree(crash), tree(clean), tree(torn)
    result = run(*[a.format(crash=crash, clean=clean, torn=torn) for a in args], "-f", "jsonl")
    assert result.exit_code == 1, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows and all(list(r) == ["action", "path", "detail"] for r in rows)
    assert (tree(crash), tree(clean), tree(torn)) == before


def test_dry_run_with_nothing_to_do_exits_0(store_copy):
    root = store_copy("dev-sample")
    assert run("repair", root, "--dry-run").exit_code == 0


def test_write_commands_document_the_convention():
    from tests.conftest import ROOT
    readme = (ROOT / "README.md").read_text("utf-8")
    assert "rmqtool restore" in readme and "0 when there is nothing to do, 1 when there is" in readme
    for page in ("repair", "rebuild-cq", "rebuild-index", "put", "import", "restore"):
        text = (ROOT / "man" / f"rmqtool-{page}.1").read_text("utf-8")
        assert "nothing to do" in text, page



@pytest.mark.parametrize("args", [
    ["rebuild-cq", "--cq-file-size", "400"], ["rebuild-cq", "--topic", "TopicB", "--cq-file-size", "400"],
    ["rebuild-index", "--slots", "32", "--max-entries", "128"],
    ["put", "--topic", "TopicA", "--tag", "T", "--key", "k", "--body", "hello"],
])
def test_every_write_says_how_to_undo_it(args, store_copy, tmp_path):
    root = store_copy("dev-sample")
    before = tree(root)
    result = run(args[0], root, *args[1:], "--apply")
    assert result.exit_code == 0, result.stderr
    assert tree(root) != before
    undo = run(*undo_command(result.stderr))
    assert undo.exit_code == 0, undo.stderr
    assert tree(root) == before


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x", "dev-lmq-5x", "dev-dledger", "dev-trace-5x"])
def test_a_rebuild_of_a_healthy_index_changes_nothing(store_copy, name):
    """The broker names an index file by the time it created it: a rebuilt file equal to it keeps that name,
    so a broker-written index needs no rebuild, with or without --apply. dev-trace-5x: one file was created
    after its successor's first store time (20261206035643535, the next one begins at ...529)."""
    root = store_copy(name)
    before = tree(root)
    for args in ((), ("--apply",)):
        result = run("rebuild-index", root, *args, "-f", "jsonl")
        assert (result.exit_code, result.stdout) == (0, ""), result.stderr
        assert "nothing to change" in result.stderr and tree(root) == before
    slots = run("rebuild-index", root, "--slots", "32", "--max-entries", "128", "--apply")    # every file differs
    assert slots.exit_code == 0 and tree(root) != before
    again = run("rebuild-index", root, "-f", "jsonl")
    assert (again.exit_code, again.stdout) == (0, "") and "nothing to change" in again.stderr


@pytest.mark.parametrize("name", ["dev-sample-5x", "dev-lmq-5x"])
def test_a_rebuild_of_healthy_queues_changes_nothing(store_copy, name):
    """rebuild-cq on broker-written queues builds the same files: the dry run has nothing to do (exit 0),
    --apply swaps nothing in and leaves no backup. An LMQ unit sits at its queue's end whatever offset its
    record asks for (the broker appends it there): a misplaced_unit row saying so, not an action."""
    root = store_copy(name)
    before = tree(root)
    plan = run("rebuild-cq", root, "-f", "jsonl")
    rows = [json.loads(line) for line in plan.stdout.splitlines()]
    assert (plan.exit_code, plan.stderr) == (0, "nothing to change\n")
    assert {r["action"] for r in rows} == ({"misplaced_unit", "total"} if "lmq" in name else set())
    result = run("rebuild-cq", root, "--apply", "-f", "jsonl")
    assert (result.exit_code, result.stdout) == (0, plan.stdout) and "nothing to change" in result.stderr
    assert tree(root) == before and not list(root.parent.glob("*rmqtool-backup*"))
