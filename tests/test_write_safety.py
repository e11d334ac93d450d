"""Write commands that cannot hurt a store: only a store root is written, stdout never decides a write,
options mean one thing, bad import rows write nothing, backups are untrusted, outputs stay out of data
directories; verify reports what the broker refuses to load."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import run, store_path
from helpers_maintain import run_process, snapshot


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
    stray = {r["path"]: r["severity"] for r in rows if r["kind"] in ("stray_file", "skipped_file")}
    assert stray == {str(root / "commitlog" / "00000000000000000000.rmqtool-new"): "error",
                     str(queue / "00000000000000000000.rmqtool-new"): "error",
                     str(queue / "notes.txt"): "error",
                     str(root / "index" / "notes.txt"): "warning"}   # IndexService.load skips it


def test_verify_directory_in_commitlog_depends_on_version(store_copy):
    for name, kind, severity in (("dev-sample", "stray_file", "error"), ("dev-sample-5x", "skipped_file", "warning")):
        root = store_copy(name)
        (root / "commitlog" / "bk").mkdir()
        _, rows = _findings(root)
        assert [(r["kind"], r["severity"]) for r in rows if r["path"].endswith("/commitlog/bk")] == [(kind, severity)]


def test_verify_tolerates_what_the_broker_skips(store_copy):
    root = store_copy("dev-sample")
    (root / "consumequeue" / "TopicA" / "notes").mkdir()        # loadConsumeQueue skips non-int queue ids
    (root / "consumequeue" / "TopicA" / "notes" / "x").write_bytes(b"x")
    result, rows = _findings(root)
    assert result.exit_code == 0, rows


# -- point 1: only a store root is written ---------------------------------------------------------------
def _not_stores(root):
    """Paths inside a store that are not its root, and a directory that is no store."""
    queue = next((root / "consumequeue" / "TopicA").iterdir())
    notes = root.parent / "notes.txt"
    notes.write_text("my notes\n")
    plain = root.parent / "plain"
    plain.mkdir()
    return [root / "checkpoint", next(queue.iterdir()), next((root / "index").iterdir()), notes, plain,
            root / "commitlog", root / "consumequeue", queue]


@pytest.mark.parametrize("command", [["repair", "--apply"], ["repair"], ["rebuild-cq", "--apply"], ["rebuild-cq"],
                                     ["rebuild-index", "--apply"], ["rebuild-index"],
                                     ["put", "--topic", "T", "--body", "x", "--apply"], ["import", "{rows}", "--apply"],
                                     ["restore", "{backup}", "--apply"]])
def test_write_commands_refuse_anything_but_a_store_root(store_copy, tmp_path, command):
    root = store_copy("dev-sample-crash-torn")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(run("cat-commitlog", root, "-n", "2", "-f", "jsonl").stdout)
    backup = tmp_path / "bk"
    other = shutil.copytree(store_path("dev-sample-crash-torn"), tmp_path / "other")
    assert run("repair", other, "--apply", "--backup", backup).exit_code == 0
    for target in _not_stores(root):
        before, tree = snapshot(tmp_path), _tree(tmp_path)
        args = [a.format(rows=rows, backup=backup) for a in command]
        args = args[:2] + [target] + args[2:] if command[0] == "restore" else [args[0], target, *args[1:]]
        result = run(*args)
        assert result.exit_code == 4, (target, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and str(target) in lines[0] and "not a store root" in lines[0], (target, lines)
        assert snapshot(tmp_path) == before and _tree(tmp_path) == tree, target     # nothing created or changed


def _tree(base):
    return sorted(str(p) for p in base.rglob("*"))


def test_init_refuses_a_file_and_a_data_directory(store_copy):
    root = store_copy("dev-sample")
    before = snapshot(root)
    for target in (root / "checkpoint", root / "commitlog" / "new", root / "index" / "x"):
        result = run("init", target, "--commitlog-file-size", "65536")
        assert result.exit_code == 4, result.output
        assert len(result.stderr.strip().splitlines()) == 1 and str(target) in result.stderr
    assert snapshot(root) == before and not (root / "commitlog" / "new").exists()


# -- point 2: a closed stdout never decides a write, nor a status ----------------------------------------
def test_repair_into_a_closed_pipe_still_repairs(store_copy, tmp_path):
    root = store_copy("dev-sample-crash-torn")
    result = run_process("repair", root, "--apply", "-f", "jsonl", "--backup", tmp_path / "bk", closed_stdout=True)
    assert result.returncode == 0, result.stderr                     # done, and the store verifies clean
    assert (tmp_path / "bk" / "manifest.json").is_file()
    assert run("verify", root).exit_code == 0
    assert b"Traceback" not in result.stderr and b"undo: rmqtool restore" in result.stderr


@pytest.mark.parametrize("args,status", [(["verify", "{bad}", "-f", "jsonl"], 1),
                                         (["verify", "{bad}", "-f", "plain"], 1),
                                         (["repair", "{torn}", "-f", "jsonl"], 1),
                                         (["rebuild-index", "{torn}", "--dry-run"], 1),
                                         (["verify", "{clean}"], 0)])
def test_exit_status_does_not_depend_on_the_reader(store_copy, args, status):
    bad = store_copy("dev-sample")
    (bad / "commitlog" / "00000000000000000000.rmqtool-new").write_bytes(b"x")      # an error finding
    args = [a.format(torn=store_path("dev-sample-crash-torn"), clean=store_path("dev-sample"), bad=bad)
            for a in args]
    for _ in range(2):
        result = run_process(*args, closed_stdout=True)
        assert result.returncode == status, result.stderr
        assert b"Traceback" not in result.stderr


def test_repair_reports_after_the_change(store_copy, tmp_path, monkeypatch):
    """The actions of repair --apply are printed once they are done: stdout cannot stop them."""
    import rmqtool.cli.maintain as maintain
    from rmqtool.ops import repair as ops_repair

    calls = []
    apply_plan, write_rows = ops_repair.apply_plan, maintain.write_rows
    monkeypatch.setattr(ops_repair, "apply_plan", lambda *a, **k: calls.append("apply") or apply_plan(*a, **k))
    monkeypatch.setattr(maintain, "write_rows", lambda *a, **k: calls.append("report") or write_rows(*a, **k))
    assert run("repair", store_copy("dev-sample-crash-torn"), "--apply", "--backup", tmp_path / "bk").exit_code == 0
    assert calls == ["apply", "report"]


# -- point 7: --force means only "the lock is held"; repeated options are any-of or refused --------------
def test_rebuild_cq_topics_are_any_of(store_copy, tmp_path):
    root = store_copy("dev-sample")
    out = tmp_path / "cq"
    result = run("rebuild-cq", root, "--topic", "TopicA", "--topic", "TopicB", "--out", out, "-f", "jsonl")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["TopicA", "TopicB"]
    for topic in ("TopicA", "TopicB"):
        for q in (out / topic).iterdir():
            for f in q.iterdir():
                assert f.read_bytes() == (root / "consumequeue" / topic / q.name / f.name).read_bytes()


def test_force_does_not_allow_a_topic_without_records(store_copy):
    root = store_copy("dev-sample")
    before = snapshot(root)
    result = run("rebuild-cq", root, "--topic", "NoSuchTopic", "--force", "--apply")
    assert result.exit_code == 1 and "NoSuchTopic" in result.stderr
    assert snapshot(root) == before
    result = run("rebuild-cq", root, "--topic", "NoSuchTopic", "--topic", "TopicA", "--allow-no-records", "--apply")
    assert result.exit_code == 0, result.output
    assert (root / "consumequeue" / "NoSuchTopic").is_dir()


def test_offsets_topics_and_groups_are_any_of():
    store = store_path("dev-config-5x")
    every = [json.loads(x) for x in run("offsets", store, "-f", "jsonl").stdout.splitlines()]
    topics = sorted({r["topic"] for r in every})[:2]
    groups = sorted({r["group"] for r in every})[:2]
    assert len(topics) == 2 and len(groups) == 2
    rows = [json.loads(x) for x in run("offsets", store, "-t", topics[0], "-t", topics[1], "-f", "jsonl")
            .stdout.splitlines()]
    assert rows == [r for r in every if r["topic"] in topics]
    rows = [json.loads(x) for x in run("offsets", store, "-g", groups[0], "-g", groups[1], "-f", "jsonl")
            .stdout.splitlines()]
    assert rows == [r for r in every if r["group"] in groups]


@pytest.mark.parametrize("args", [["verify", "{s}", "--jobs", "1", "--jobs", "2"],
                                  ["cat-commitlog", "{s}", "-n", "1", "-n", "5"],
                                  ["repair", "{s}", "-f", "jsonl", "--format", "csv"],
                                  ["put", "{s}", "--topic", "A", "--topic", "B", "--body", "x", "--dry-run"]])
def test_a_single_value_option_given_twice_is_refused(args):
    result = run(*[a.format(s=store_path("dev-sample")) for a in args])
    assert result.exit_code == 2 and "given more than once" in result.stderr, result.output


# -- point 8: import validates every row before writing; put and import honour -f ------------------------
@pytest.mark.parametrize("bad", [{"body": "not base64!!", "body_encoding": "base64"},
                                 {"body": "x", "body_encoding": "rot13"},
                                 {"queue_id": -1}, {"queue_id": 1.5}, {"queue_id": True},
                                 {"topic": ""}, "[1, 2]", "42"])
def test_import_refuses_a_bad_row_and_writes_nothing(store_copy, tmp_path, bad):
    root = store_copy("dev-sample")
    good = {"topic": "T", "body": "aGk=", "body_encoding": "base64", "queue_id": 0}
    lines = [json.dumps(good), json.dumps(good),
             bad if isinstance(bad, str) else json.dumps({**good, **bad}), json.dumps(good)]
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(lines) + "\n")
    before = snapshot(root)
    result = run("import", root, src, "--backup", tmp_path / "bk", "--apply")
    assert result.exit_code == 3, result.output
    assert "line 3" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert snapshot(root) == before and not (tmp_path / "bk").exists()


def test_put_and_import_honour_format(store_copy, tmp_path):
    root = store_copy("dev-sample")
    result = run("put", root, "--topic", "T", "--body", "x", "-f", "jsonl", "--backup", tmp_path / "b1", "--apply")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    assert row["topic"] == "T" and row["queue_id"] == 0 and row["msg_id"]
    stored = [json.loads(x) for x in run("cat-commitlog", root, "-f", "jsonl").stdout.splitlines()]
    assert stored[-1]["msg_id"] == row["msg_id"] and stored[-1]["physical_offset"] == row["physical_offset"]
    src = tmp_path / "rows.jsonl"
    src.write_text(run("cat-commitlog", root, "-n", "2", "-f", "jsonl").stdout)
    result = run("import", root, src, "-f", "csv", "--backup", tmp_path / "b2", "--apply")
    assert result.exit_code == 0 and result.stdout.splitlines() == ["imported", "2"], result.output


# -- point 11: backups are untrusted; outputs never land in a store's data directories --------------------
def _crafted_backup(tmp_path, store, path):
    import hashlib

    bk = tmp_path / "crafted"
    (bk / "x").parent.mkdir(parents=True, exist_ok=True)
    data = b"evil"
    (bk / "payload").write_bytes(data)
    entry_file = bk / path if not path.startswith("/") else None
    if entry_file is not None:
        try:
            entry_file.resolve().parent.mkdir(parents=True, exist_ok=True)
            entry_file.resolve().write_bytes(data)
        except OSError:
            pass
    manifest = {"store": str(store), "label": "repair", "created": "x",
                "entries": [{"path": path, "kind": "file", "sha256": hashlib.sha256(data).hexdigest()}]}
    (bk / "manifest.json").write_text(json.dumps(manifest))
    return bk


@pytest.mark.parametrize("path", ["../../x", "../outside", "/tmp/rmqtool-evil-abs", "commitlog/../../y",
                                  "linked/x"])
def test_restore_confines_manifest_paths(store_copy, tmp_path, path):
    root = store_copy("dev-sample")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "linked").symlink_to(outside)             # a symlink in the store leading out of it
    bk = _crafted_backup(tmp_path, root, path)
    before, around = snapshot(root), sorted(p for p in tmp_path.rglob("*"))
    for args in (["restore", bk, root], ["restore", bk, root, "--apply"]):
        result = run(*args)
        assert result.exit_code == 4, (path, result.output)
        assert len(result.stderr.strip().splitlines()) == 1
    assert snapshot(root) == before and sorted(p for p in tmp_path.rglob("*")) == around
    assert not any(outside.iterdir())


def test_restore_refuses_a_symlink_inside_a_backed_up_directory(store_copy, tmp_path):
    root = store_copy("dev-sample-crash-torn")
    bk = tmp_path / "bk"
    assert run("rebuild-index", root, "--backup", bk, "--apply").exit_code == 0
    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    (bk / "index" / "leak").symlink_to(secret)
    before = snapshot(root)
    result = run("restore", bk, root, "--apply")
    assert result.exit_code == 4 and "symbolic link" in result.stderr, result.output
    assert snapshot(root) == before


@pytest.mark.parametrize("args", [["repair", "{s}", "--apply", "--backup", "{s}/commitlog/bk"],
                                  ["rebuild-index", "{s}", "--backup", "{s}/index/bk", "--apply"],
                                  ["rebuild-cq", "{s}", "--out", "{s}/commitlog/cq"],
                                  ["rebuild-cq", "{s}", "--out", "{s}/consumequeue"],
                                  ["put", "{s}", "--topic", "T", "--body", "x", "--backup", "{s}/consumequeue/T/bk",
                                   "--apply"],
                                  ["export", "{s}", "--to", "{s}/commitlog/x.parquet"],
                                  ["cat-commitlog", "{s}", "--body-file", "{s}/index/bodies"],
                                  ["generate", "{s}/commitlog/gen", "--size", "64K"]])
def test_outputs_never_land_in_data_directories(store_copy, args):
    root = store_copy("dev-sample-crash-torn")
    before = snapshot(root)
    dirs = sorted(p for p in root.rglob("*") if p.is_dir())
    result = run(*[a.format(s=root) for a in args])
    assert result.exit_code == 4, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "inside" in result.stderr
    assert snapshot(root) == before and sorted(p for p in root.rglob("*") if p.is_dir()) == dirs


# -- a failed backup leaves no partial backup directory -----------------------------------------------
@pytest.mark.parametrize("command", ["repair", "put"])
def test_a_failed_backup_write_leaves_no_backup_directory(store_copy, tmp_path, monkeypatch, command):
    import errno

    from rmqtool.store import atomic

    root = store_copy("dev-sample-crash-torn" if command == "repair" else "dev-sample")
    before = snapshot(root)
    backup = tmp_path / "bk"
    if command == "repair":          # the second file linked (or copied) into the backup
        real, calls = atomic.link_or_copy, []

        def failing(src, dst):
            calls.append(dst)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, "No space left on device", str(dst))
            real(src, dst)
        monkeypatch.setattr(atomic, "link_or_copy", failing)
        args = ["repair", root, "--apply"]
    else:                            # the manifest that ends an in-place change's backup
        def failing(self):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.backup / "manifest.json"))
        monkeypatch.setattr(atomic.PatchTransaction, "_stage_manifest", failing)
        args = ["put", root, "--topic", "T", "--body", "b", "--apply"]
    result = run(*args, "--backup", backup)
    assert result.exit_code == 4 and f"{backup}/" in result.stderr, result.stderr
    assert "No space left on device; the store is unchanged" in result.stderr
    assert not backup.exists() and snapshot(root) == before
