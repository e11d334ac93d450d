"""Recovery rules as the broker has them: an end-of-file BLANK ends its file whatever its TOTALSIZE says;
DLedger index files that are short, empty or missing are rebuilt from the data; a change that cannot
finish names the path that stopped it and is finished by the next repair."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from conftest import run, store_path
from helpers_maintain import snapshot

DLEDGER_SETS = ["dev-dledger", "dev-dledger-crash", "dev-dledger-5x", "dev-dledger-5x-crash"]


def _rows(root) -> list[dict]:
    return [json.loads(line) for line in run("cat-commitlog", root, "-f", "jsonl", "--include-blank")
            .stdout.splitlines()]


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x"])
def test_an_oversized_end_of_file_blank_costs_no_data(store_copy, name):
    """4.9.7 ignores a BLANK's TOTALSIZE, 5.3.x stops its recovery at one beyond the rest of the file and
    deletes every later file (broker_model "blank_size"): repair rewrites the size, deletes nothing."""
    root = store_copy(name)
    if name.endswith("5x"):             # without consume queues 5.x's normal recovery reads from file 0
        shutil.rmtree(root / "consumequeue")
    before, files = _rows(root), sorted((root / "commitlog").iterdir())
    blank = next(r for r in before if r["type"] == "blank")
    path = root / "commitlog" / "00000000000000000000"
    good = path.read_bytes()
    data = bytearray(good)
    struct.pack_into(">i", data, blank["physical_offset"], blank["total_size"] + 5000)
    path.write_bytes(bytes(data))
    kept = {k: v for k, v in snapshot(root).items() if k.startswith(("commitlog/", "consumequeue/"))}
    plan = run("repair", root, "-f", "jsonl")
    actions = [json.loads(line)["action"] for line in plan.stdout.splitlines()]
    assert actions.count("fix_blank_size") == 1, actions
    assert not {"truncate_commitlog", "delete_file", "delete_cq", "rewrite_cq"} & set(actions), actions
    assert run("repair", root, "--apply", "--backup", f"{root}.bk").exit_code in (0, 1)
    after = {k: v for k, v in snapshot(root).items() if k.startswith(("commitlog/", "consumequeue/"))}
    assert after == {**kept, "commitlog/00000000000000000000": good}       # the size fixed, nothing else
    assert _rows(root) == before and sorted((root / "commitlog").iterdir()) == files


@pytest.mark.parametrize("over", [True, False], ids=["over", "under"])
@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x"])
def test_a_mismatched_end_of_file_blank_is_judged_per_broker_version(store_copy, name, over):
    """broker_model "blank_size" (CommitLog.checkMessageAndReturnSize): 4.9.7 ends the file at a BLANK whatever
    its TOTALSIZE; 5.3.3 rejects a TOTALSIZE beyond the rest of the file before it reads the magic, a smaller one
    passes and the BLANK ends the file. Both start: verify warns (exit 0) about a smaller one; an oversized one
    makes a 5.3.3 start (without consume queues it reads from file 0) cut the later files and their messages,
    an error (exit 1) that its broker_start finding counts."""
    root = store_copy(name)
    shutil.rmtree(root / "consumequeue")
    rows = _rows(root)
    blank = next(r for r in rows if r["type"] == "blank")
    at, rest = blank["physical_offset"], blank["total_size"]
    path = root / "commitlog" / "00000000000000000000"
    data = bytearray(path.read_bytes())
    struct.pack_into(">i", data, at, rest + 1 if over else rest - 1)
    path.write_bytes(bytes(data))
    result = run("verify", root, "-f", "jsonl")
    assert result.exit_code == over, result.output
    found = [json.loads(line) for line in result.stdout.splitlines()]
    assert {f["severity"] for f in found if f["kind"] != "broker_start"} == {"warning"}
    assert [(f["kind"], f["expected"], f["actual"]) for f in found if f["offset"] == at] == \
        [("blank_size_mismatch", rest, rest + 1 if over else rest - 1)] + \
        [("broker_start", "5.3.3", None)] * over
    later = [r for r in rows if r["type"] == "message" and r["physical_offset"] >= len(data)]
    files = len(list((root / "commitlog").iterdir())) - 1
    said = [f for f in found if f["kind"] == "broker_start"]
    assert [f["message"].split(":")[0] for f in said] == \
        [f"a 5.3.3 broker will truncate the commit log at {at} and delete {files} file(s)"] * over
    assert [f["counts"]["files_deleted"] for f in said] == [files] * over
    assert all(0 < f["counts"]["messages_lost"] <= len(later) and f["severity"] == "error" for f in said)


@pytest.mark.parametrize("damage", ["short", "empty", "missing"])
@pytest.mark.parametrize("name", DLEDGER_SETS)
def test_dledger_index_files_are_rebuilt_from_the_data(name, damage, store_copy, tmp_path):
    reference = store_copy(name)
    assert run("repair", reference, "--apply", "--backup", tmp_path / "ref.bk").exit_code in (0, 1)
    root = tmp_path / "damaged"
    shutil.copytree(store_path(name), root)
    first = sorted(next(root.glob("dledger-*")).joinpath("index").iterdir())[0]     # not the last file
    if damage == "missing":
        first.unlink()
    else:
        os.truncate(first, 1000 if damage == "short" else 0)
    plan = run("repair", root)
    assert plan.exit_code == 1 and "error" not in plan.stderr, plan.stderr
    applied = run("repair", root, "--apply", "--backup", tmp_path / "bk")
    assert applied.exit_code in (0, 1) and "error" not in applied.stderr, applied.stderr
    got, want = snapshot(root), snapshot(reference)
    index = [k for k in want if "/index/" in k and k.startswith("dledger-")]
    assert index and {k: got.get(k) for k in index} == {k: want[k] for k in index}


def test_a_directory_that_cannot_be_removed_is_named_and_the_next_repair_finishes(store_copy, monkeypatch):
    root = store_copy("dev-sample")
    real_rmdir = os.rmdir

    def refuse(path, *args, **kwargs):
        if ".rmqtool-old" in str(path) or kwargs.get("dir_fd") is not None and str(path) == "index.rmqtool-old":
            raise PermissionError(13, "Permission denied")
        return real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", refuse)
    result = run("rebuild-index", root, "--backup", f"{root}.bk")
    assert result.exit_code == 4
    assert "index.rmqtool-old" in result.stderr and "Permission denied" in result.stderr
    assert "error: 0:" not in result.stderr
    monkeypatch.setattr(os, "rmdir", real_rmdir)
    dry = run("repair", root, "-f", "jsonl")
    assert dry.exit_code == 1 and "finish_journal" in dry.stdout
    assert run("repair", root, "--apply", "--backup", f"{root}.bk2").exit_code == 0
    assert not (root / "index.rmqtool-old").exists() and not (root / ".rmqtool-journal.json").exists()


def test_a_crash_repair_of_a_store_of_unknown_version_says_which_rules_it_follows(store_copy):
    unknown, known = store_copy("dev-sample-crash"), store_copy("dev-sample-5x-crash")
    assert "do not tell a 4.x from a 5.x broker" in run("repair", unknown).stderr
    assert "do not tell" not in run("repair", known).stderr
