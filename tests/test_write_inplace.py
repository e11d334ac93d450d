"""put / import write in place: the new bytes where they go, a journal of the pre-images of only the
ranges touched (a backup proportional to the change), all or nothing across a SIGKILL or a bad row;
init pre-allocates sparse files as the broker does; an interrupted change is announced by every command."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import signal
from pathlib import Path

from conftest import run, store_path
from helpers_maintain import run_process, snapshot
from rmqtool.store.atomic import FAULT_ENV, JOURNAL, PatchTransaction, complete_pending

SMALL = ["--commitlog-file-size", "4096", "--cq-file-size", "160", "--slots", "16", "--max-entries", "64"]


def _digest(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h = hashlib.sha256()
            with open(p, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 22), b""):
                    h.update(chunk)
            out[str(p.relative_to(root))] = h.hexdigest()
    return out


def test_put_into_big_files_backs_up_only_the_bytes_it_changes(tmp_path):
    root = tmp_path / "s"
    assert run("init", root, "--commitlog-file-size", str(256 << 20), "--slots", "1000",
               "--max-entries", "4000").exit_code == 0
    first = next((root / "commitlog").iterdir())
    assert first.stat().st_size == 256 << 20 and first.stat().st_blocks * 512 < 1 << 20     # sparse
    assert run("put", root, "--topic", "T", "--key", "k0", "--body", "first", "--apply").exit_code == 0
    before = _digest(root)
    result = run("put", root, "--topic", "T", "--key", "k1", "--body", "hello", "--backup", tmp_path / "bk", "--apply")
    assert result.exit_code == 0, result.stderr
    backup = sum(p.stat().st_size for p in (tmp_path / "bk").rglob("*") if p.is_file())
    assert backup < 64 << 10                         # the ranges touched, not the 256 MiB file
    manifest = json.loads((tmp_path / "bk" / "manifest.json").read_text())
    assert {e["path"] for e in manifest["entries"]} >= {"checkpoint", f"commitlog/{first.name}"}
    assert run("verify", root).exit_code == 0
    assert "hello" in run("query-key", root, "T", "k1", "-f", "jsonl", "--body-encoding", "text").stdout
    assert run("restore", tmp_path / "bk", root, "--apply").exit_code == 0
    assert _digest(root) == before


def test_a_sigkill_anywhere_in_put_leaves_the_old_or_the_new_store(tmp_path):
    base = tmp_path / "base"
    assert run("init", base, *SMALL).exit_code == 0
    for i in range(6):                               # an index file, queues and a BLANK roll to continue
        assert run("put", base, "--topic", f"T{i % 2}", "--key", f"k{i}", "--body", "x" * 900, "--apply").exit_code == 0
    old = snapshot(base)
    new_root = tmp_path / "ref"
    shutil.copytree(base, new_root)
    assert run("put", new_root, "--topic", "T0", "--key", "kk", "--body", "y" * 900,
               "--backup", tmp_path / "ref.bk", "--apply").exit_code == 0
    kills = 0
    for k in itertools.count(1):
        root = tmp_path / f"run{k}"
        shutil.copytree(base, root)
        result = run_process("put", root, "--topic", "T0", "--key", "kk", "--body", "y" * 900,
                             "--backup", tmp_path / f"run{k}.bk", "--apply", env={FAULT_ENV: str(k)})
        if result.returncode != -signal.SIGKILL:
            assert result.returncode == 0, result.stderr
            break
        kills += 1
        if (root / JOURNAL).exists():
            assert "an earlier change was interrupted" in run("info", root).stderr   # every command says so
        complete_pending(root)
        if snapshot(root) != old:                     # killed after the commit point: the whole put is there
            assert _bodies(root) == _bodies(new_root) and run("verify", root).exit_code == 0, k
    assert kills >= 5


def _bodies(root: Path) -> list[str]:
    return [json.loads(line)["body"] for line in run("cat-commitlog", root, "-f", "jsonl").stdout.splitlines()]


def test_a_bad_row_after_flushed_rows_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setattr(PatchTransaction, "FLUSH_BYTES", 512)    # rows written in place before the bad one
    root = tmp_path / "s"
    assert run("init", root, "--commitlog-file-size", "65536", *SMALL[2:]).exit_code == 0
    assert run("put", root, "--topic", "T", "--body", "before", "--apply").exit_code == 0
    before = snapshot(root)
    rows = [json.loads(line) for line in run("cat-commitlog", store_path("dev-sample"), "-f", "jsonl", "--body-encoding",
                                             "base64", "-n", "30").stdout.splitlines()]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows) + json.dumps({"body": "eA=="}) + "\n")
    result = run("import", root, src, "--backup", tmp_path / "bk", "--apply")
    assert result.exit_code == 3 and f"line {len(rows) + 1}" in result.stderr
    assert snapshot(root) == before
    assert not (root / JOURNAL).exists() and not (tmp_path / "bk").exists()


def test_an_interrupted_change_is_announced_and_repair_finishes_it(tmp_path):
    root = tmp_path / "s"
    assert run("init", root, *SMALL).exit_code == 0
    assert run("put", root, "--topic", "T", "--body", "one", "--apply").exit_code == 0
    before = snapshot(root)
    result = run_process("put", root, "--topic", "T", "--body", "two", "--apply", env={FAULT_ENV: "3"})
    assert result.returncode == -signal.SIGKILL and (root / JOURNAL).exists()
    for args in (["info", root], ["verify", root], ["repair", root]):
        assert "an earlier change was interrupted" in run(*args).stderr
    dry = run("repair", root, "-f", "jsonl")
    assert dry.exit_code == 1 and "finish_journal" in dry.stdout
    applied = run("repair", root, "--apply")
    assert applied.exit_code == 0 and "undid an interrupted earlier change" in applied.stderr
    assert snapshot(root) == before
