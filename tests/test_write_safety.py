"""Write commands that cannot hurt a store: only a store root is written, stdout never decides a write,
options mean one thing, bad import rows write nothing, backups are untrusted, outputs stay out of data
directories; verify reports what the broker refuses to load."""

from __future__ import annotations

import json

import pytest

from helpers_maintain import run, snapshot


def _findings(root):
    result = run("verify", root, "-f", "jsonl")
    return result, [json.loads(line) for line in result.stdout.splitlines()]


# -- point 5: verify reports what MappedFileQueue.load / IndexService.load would refuse or skip ---------
@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x"])
def test_verify_reports_staged_leftovers_and_stray_files(store_copy, name):
    root = store_copy(name)
    (root / "commitlog" / "00000000000000000000.rmqtool-new").write_bytes(b"x" * 100)
    queue = root / "consumequeue" / "TopicA" / "0"
    (queue / "00000000000000000000.rmqtool-new").write_bytes(b"")
    (queue / "notes.txt").write_bytes(b"hello")
    (root / "index" / "notes.txt").write_bytes(b"hello")
    result, rows = _findings(root)
    assert result.exit_code == 1
    stray = {r["path"]: r["severity"] for r in rows if r["kind"] == "stray_file"}
    assert stray == {str(root / "commitlog" / "00000000000000000000.rmqtool-new"): "error",
                     str(queue / "00000000000000000000.rmqtool-new"): "error",
                     str(queue / "notes.txt"): "error",
                     str(root / "index" / "notes.txt"): "warning"}   # IndexService.load skips it


def test_verify_directory_in_commitlog_depends_on_version(store_copy):
    for name, severity in (("dev-sample", "error"), ("dev-sample-5x", "warning")):
        root = store_copy(name)
        (root / "commitlog" / "bk").mkdir()
        _, rows = _findings(root)
        assert [(r["kind"], r["severity"]) for r in rows if r["path"].endswith("/commitlog/bk")] == \
            [("stray_file", severity)]


def test_verify_tolerates_what_the_broker_skips(store_copy):
    root = store_copy("dev-sample")
    (root / "consumequeue" / "TopicA" / "notes").mkdir()        # loadConsumeQueue skips non-int queue ids
    (root / "consumequeue" / "TopicA" / "notes" / "x").write_bytes(b"x")
    result, rows = _findings(root)
    assert result.exit_code == 0, rows
