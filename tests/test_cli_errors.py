"""Bad input: one line on stderr, a meaningful exit status, nothing on stdout, never a traceback."""

from __future__ import annotations

import os
import re

import click
import pytest
from rmqtool.cli import cli
from rmqtool.cli.exitcodes import ExitCode
from tests.conftest import FIXTURES, run


def assert_error(result, code: ExitCode, *parts: str, stdout: str = "") -> None:
    assert result.exit_code == code, (result.exit_code, result.stderr)
    assert result.stdout == stdout
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("rmqtool: error: ") and result.stderr.count("\n") == 1, result.stderr
    for part in parts:
        assert part in result.stderr


STORE_COMMANDS = [["info"], ["cat-commitlog"], ["cat-cq", "{}", "TopicA", "0"], ["cat-index"],
                  ["query-key", "{}", "TopicA", "k"], ["query-id", "{}", "C0A8000A00002A9F0000000000000000"],
                  ["checkpoint"]]


def _args(command: list[str], path) -> list[str]:
    return [a.format(path) for a in command] if "{}" in command else command + [str(path)]


@pytest.mark.parametrize("command", STORE_COMMANDS, ids=lambda c: c[0])
def test_missing_path(command, tmp_path):
    missing = tmp_path / "nope"
    assert_error(run(*_args(command, missing)), ExitCode.IO_ERROR, f"{missing}: no such file or directory")


@pytest.mark.parametrize("command", [c for c in STORE_COMMANDS if c[0] not in ("cat-commitlog", "checkpoint")],
                         ids=lambda c: c[0])
def test_empty_directory_is_not_a_store(command, tmp_path):
    assert_error(run(*_args(command, tmp_path)), ExitCode.IO_ERROR, "not a RocketMQ store")


def test_store_with_an_empty_commit_log(tmp_path):
    (tmp_path / "commitlog").mkdir()
    result = run("cat-commitlog", tmp_path)
    assert (result.exit_code, result.stdout, result.stderr) == (ExitCode.FINDINGS, "", "rmqtool: no records\n")


def test_file_that_is_not_a_store_file(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("these are not the bytes you are looking for\n" * 3)
    assert_error(run("cat-commitlog", junk), ExitCode.IO_ERROR, f"{junk}: not a store or a commit-log file")
    assert_error(run("cat-index", junk), ExitCode.BAD_INPUT, f"{junk}:")
    short = tmp_path / "checkpoint.old"          # named checkpoint, a short file reads as the broker maps it
    short.write_bytes(b"\x00" * 10)
    assert_error(run("checkpoint", short), ExitCode.BAD_INPUT, f"{short}: offset 0: truncated checkpoint")


def test_truncated_record_in_the_middle(tmp_path):
    """A commit-log file cut inside its third record: the first two are printed, then the error."""
    part = tmp_path / "00000000000000000000"
    part.write_bytes((FIXTURES / "dev-sample" / "store" / "commitlog" / part.name).read_bytes()[:600])
    result = run("cat-commitlog", part, "-f", "jsonl", "--fields", "physical_offset")
    assert_error(result, ExitCode.BAD_INPUT, f"{part}: offset 473: truncated record",
                 stdout='{"physical_offset":0}\n{"physical_offset":257}\n')


def test_damaged_record_in_the_middle_of_a_store(store_copy):
    store = store_copy("dev-sample")
    victim = store / "commitlog" / "00000000000000065536"
    data = bytearray(victim.read_bytes())
    data[4:8] = b"\x12\x34\x56\x78"                       # the magic code of the file's first record
    victim.write_bytes(bytes(data))
    result = run("cat-commitlog", store, "-f", "jsonl", "--fields", "physical_offset")
    assert result.stdout.count("\n") > 10                 # records of the first file came out first
    assert_error(result, ExitCode.BAD_INPUT, f"{victim}: offset 65536: bad magic code 0x12345678",
                 stdout=result.stdout)


def test_consume_queue_file_not_a_multiple_of_20(store_copy):
    store = store_copy("dev-sample")
    cq_file = store / "consumequeue" / "TopicA" / "1" / "00000000000000000000"
    with open(cq_file, "ab") as fh:
        fh.write(b"\x00" * 7)
    assert_error(run("cat-cq", store, "TopicA", "1"), ExitCode.BAD_INPUT,
                 f"{cq_file}: consume-queue file size 167 is not a multiple of 20")


def test_index_file_of_impossible_size(store_copy, tmp_path):
    lone = tmp_path / "20260101000000000"
    lone.write_bytes(b"\x00" * 50)                        # 40-byte header + 10: no slot/entry split fits
    assert_error(run("cat-index", lone), ExitCode.BAD_INPUT, f"{lone}: index file size 50 fits no geometry")
    store = store_copy("dev-sample")
    victim = sorted((store / "index").iterdir())[0]
    with open(victim, "r+b") as fh:
        fh.truncate(1000)
    for args in (["cat-index", store], ["query-key", store, "TopicA", "k"]):
        assert_error(run(*args), ExitCode.BAD_INPUT, f"{victim}: index file is 1000 bytes; its siblings' "
                     "geometry (16, 64) needs 1384")      # inferred from the fullest consistent sibling


@pytest.mark.parametrize("bad,what", [("C0A8000A00002A9F000000000000000G", "not hexadecimal"),
                                      ("C0A8000A00002A9F00000000000000", "must have 32 or 56 hex characters"),
                                      ("ZZZ", "must have 32 or 56 hex characters")])
def test_bad_ids_are_usage_errors(bad, what):
    """A malformed ID is a bad argument (exit 2), as every bad argument is."""
    store = FIXTURES / "dev-sample" / "store"
    for args in (("query-id", store, bad), ("query-id", store, "-i", f"C0A8000A00002A9F0000000000000E33,{bad}"),
                 ("decode-id", bad)):
        result = run(*args)
        assert result.exit_code == ExitCode.USAGE and what in result.stderr and "Invalid value for ID" in result.stderr


def test_no_hidden_option_is_suggested():
    """An unknown option is answered with the documented options near it, never a hidden old spelling."""
    for command in ("cat-commitlog", "query-id", "put", "export"):
        result = run(command, "x", "--bogus")
        assert result.exit_code == ExitCode.USAGE and "No such option '--bogus'" in result.stderr
        named = re.findall(r"'(--[\w-]+)'", result.stderr.split("No such option '--bogus'.")[1])
        shown = {o for p in cli.commands[command].params if isinstance(p, click.Option) and not p.hidden
                 for o in p.opts}
        assert set(named) <= shown, (command, named)
    assert "Did you mean '--body'?" in run("put", "x", "--bogus").stderr      # put's own --body is documented


@pytest.mark.parametrize("args,hint", [(("put", "{s}", "--topic", "T", "--queue-id", "-1", "--body", "x"),
                                        "--queue-id"),
                                       (("put", "{s}", "--topic", "T", "--queue-id", str(2**63 - 1), "--body", "x"),
                                        "--queue-id"),
                                       (("init", "{new}", "--commitlog-file-size", str(2**63 - 1)),
                                        "--commitlog-file-size"),
                                       (("init", "{new}", "--slots", "2000000000", "--max-entries", "2000000000"),
                                        "--slots/--max-entries"),
                                       (("init", "{new}", "--cq-file-size", "223"), "--cq-file-size"),
                                       (("rebuild-cq", "{s}", "--cq-file-size", "-20"), "--cq-file-size"),
                                       (("rebuild-index", "{s}", "--slots", "3"), "--max-entries"),
                                       (("repair", "{s}", "--max-entries", "3"), "--slots")])
def test_sizes_and_ids_beyond_the_brokers_ints_are_usage_errors(tmp_path, args, hint):
    """The broker's file sizes, queue ids and counts are Java ints: a value beyond one is refused before anything
    is written (exit 2, the option named)."""
    store = FIXTURES / "dev-sample" / "store"
    result = run(*[str(a).format(s=store, new=tmp_path / "new") for a in args])
    assert result.exit_code == ExitCode.USAGE and hint in result.stderr, result.stderr
    assert not (tmp_path / "new").exists()


def test_unknown_topic_and_queue():
    store = FIXTURES / "dev-sample" / "store"
    assert_error(run("cat-cq", store, "NoSuchTopic", "0"), ExitCode.IO_ERROR, "unknown topic 'NoSuchTopic'",
                 "TopicA")
    assert_error(run("cat-cq", store, "TopicA", "7"), ExitCode.IO_ERROR, "topic 'TopicA' has no queue 7",
                 "queues: 0, 1, 2, 3")


def test_missing_checkpoint(store_copy):
    store = store_copy("dev-sample")
    (store / "checkpoint").unlink()
    assert_error(run("checkpoint", store), ExitCode.IO_ERROR, "no checkpoint file")


def test_usage_errors_exit_2(tmp_path):
    store = FIXTURES / "dev-sample" / "store"
    for args in (["cat-commitlog", store, "--since", "not a time at all"], ["cat-cq", store, "TopicA", "x"],
                 ["cat-index", store, "--entries", "--slots"], ["cat-commitlog", store, "--body", "rot13"]):
        result = run(*args)
        assert (result.exit_code, result.stdout) == (ExitCode.USAGE, ""), args
        assert "Traceback" not in result.stderr


def test_traceback_option_shows_the_trace(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x01" * 64)
    with pytest.raises(Exception) as raised:
        run("--traceback", "cat-commitlog", junk)
    assert type(raised.value).__name__ == "StoreError"     # not a commit-log file (recognition.recognize)


@pytest.mark.parametrize("args", [["stats", "foo://bucket/store"],
                                  ["stats", "hdfs://127.0.0.1:1/store"],
                                  ["export", str(FIXTURES / "dev-sample" / "store"), "--to", "foo://bucket/out"]],
                         ids=["unknown-scheme", "hdfs-unreachable", "export-target"])
def test_unusable_uri(args):
    """A URI pyarrow.fs cannot open (unknown scheme; HDFS without libhdfs or without a name node)."""
    uri = next(a for a in args if "://" in a)
    assert_error(run(*args, "--engine", "local"), ExitCode.IO_ERROR, f"{uri}: cannot open: ")


# -- the exit-code cases of issue 20 (each exited 0 or 70 before) ----------------------------------------
SAMPLE_STORE = FIXTURES / "dev-sample" / "store"
COMMITLOG_FILE = SAMPLE_STORE / "commitlog" / "00000000000000000000"


@pytest.mark.parametrize("value", ["99999999999999999999999", "-99999999999999999999999"])
def test_a_time_out_of_range_is_a_usage_error(value):
    result = run("cat-commitlog", SAMPLE_STORE, "--until", value, "-n", "1")
    assert (result.exit_code, result.stdout) == (ExitCode.USAGE, "")
    assert "out of range for a time in epoch milliseconds" in result.stderr


@pytest.mark.parametrize("content", [b"hello\n", b"not a commit log\n" * 100], ids=["tiny", "text"])
def test_info_refuses_a_plain_file(tmp_path, content):
    plain = tmp_path / "notes.txt"
    plain.write_bytes(content)
    assert_error(run("info", plain), ExitCode.IO_ERROR, f"{plain}: not a store or a commit-log file")


def test_info_reads_one_commit_log_file():
    result = run("info", COMMITLOG_FILE, "-f", "jsonl")
    assert result.exit_code == 0 and '"messages":' in result.stdout


@pytest.mark.parametrize("command,what", [("cat-index", "not an index file"), ("checkpoint", "not a checkpoint file")])
def test_index_and_checkpoint_commands_refuse_a_commit_log_file(command, what):
    assert_error(run(command, COMMITLOG_FILE), ExitCode.BAD_INPUT, str(COMMITLOG_FILE), what)


def test_cat_cq_takes_a_queue_file_or_directory():
    by_name = run("cat-cq", SAMPLE_STORE, "TopicA", "0", "-f", "jsonl").stdout.splitlines()
    qdir = SAMPLE_STORE / "consumequeue" / "TopicA" / "0"
    files = sorted(qdir.iterdir())
    assert run("cat-cq", qdir, "-f", "jsonl").stdout.splitlines() == by_name
    per_file = [run("cat-cq", f, "-f", "jsonl").stdout.splitlines() for f in files]
    assert len(per_file) == 2 and all(per_file) and sum(per_file, []) == by_name       # each file its own units
    batch = FIXTURES / "dev-batchcq-5x" / "store" / "batchconsumequeue" / "BatchTopic" / "0"
    assert (run("cat-cq", batch, "-f", "jsonl").stdout
            == run("cat-cq", FIXTURES / "dev-batchcq-5x" / "store", "BatchTopic", "0", "-f", "jsonl").stdout)
    assert run("cat-cq", SAMPLE_STORE).exit_code == ExitCode.USAGE



@pytest.mark.parametrize("command", STORE_COMMANDS, ids=lambda c: c[0])
def test_an_os_error_without_a_path_names_the_command_path(command, store_copy, monkeypatch):
    """An OSError from any layer that names no file (a read on an open file, a map) still gives a line
    that names a path: the command's store."""
    import errno

    from rmqtool.store.store import Store

    def failing(cls, *args, **kw):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(Store, "open", classmethod(failing))
    store = store_copy("dev-sample")
    assert_error(run(*_args(command, store)), ExitCode.IO_ERROR, f"rmqtool: error: {store}: Input/output error")


def test_a_write_error_without_a_path_names_the_store_and_its_state(store_copy, monkeypatch):
    import errno

    from rmqtool.ops.write import StoreWriter
    from tests.helpers_maintain import snapshot

    def failing(self, msg):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(StoreWriter, "append", failing)
    store = store_copy("dev-sample")
    before = snapshot(store)
    assert_error(run("put", store, "--topic", "T", "--body", "b", "--apply"), ExitCode.IO_ERROR,
                 f"rmqtool: error: {store}: No space left on device; the store is unchanged")
    assert snapshot(store) == before


def test_one_exit_table():
    """The README, --help and the man pages show the one exit table (rmqtool.cli.exitcodes.EXIT_STATUS_HELP)."""
    from rmqtool.cli.exitcodes import EXIT_STATUS_HELP
    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text("utf-8")
    assert "".join(f"| {int(c)} | {t} |\n" for c, t in EXIT_STATUS_HELP.items()) in readme
    assert readme.count("| 70 |") == 1
    help_text = " ".join(run("--help").stdout.split())
    page = " ".join((ROOT / "man" / "rmqtool.1").read_text("utf-8").replace("\\-", "-").split())
    for code, text in EXIT_STATUS_HELP.items():
        assert f"{int(code)} {text}" in help_text
        assert text in page, text


class _FullTempDir:
    """The system's temporary directory out of data blocks (``what="blocks"``: a write into a file there
    fails, as the kernel fails it, naming no file) or of inodes once its directories are made (``"files"``:
    making a file or a link there fails, naming it); elsewhere every call goes through. ``hits`` counts the
    failed calls."""

    def __init__(self, monkeypatch, root, what: str):
        import errno
        import os

        self.hits, root = 0, os.path.realpath(root) + os.sep

        def under(path) -> bool:
            return os.path.realpath(path).startswith(root)

        def full(*names):
            self.hits += 1
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *names)

        def on_fd(real):
            def call(fd, *args):
                if under(f"/proc/self/fd/{fd}"):
                    raise full()
                return real(fd, *args)
            return call

        real_open, real_symlink = os.open, os.symlink

        def open_(path, flags, *args, **kw):
            if flags & os.O_CREAT and under(path) and not os.path.lexists(path):
                raise full(os.fspath(path))
            return real_open(path, flags, *args, **kw)

        def symlink(target, link, *args, **kw):
            if under(link):
                raise full(os.fspath(target), os.fspath(link))       # as the kernel's: both names
            return real_symlink(target, link, *args, **kw)

        if what == "blocks":
            for name in ("pwrite", "write"):
                monkeypatch.setattr(os, name, on_fd(getattr(os, name)))
        else:
            monkeypatch.setattr(os, "open", open_)
            monkeypatch.setattr(os, "symlink", symlink)


@pytest.mark.parametrize("args, name, what", [
    (["verify"], "dev-lmq-5x", "blocks"), (["verify"], "dev-lmq-5x", "files"),
    (["verify"], "dev-batchcq-5x", "blocks"), (["verify"], "dev-batchcq-5x", "files"),
    (["verify"], "dev-rocksdbcq-5x", "files"),
    (["put", "--topic", "T", "--body", "b"], "dev-sample", "blocks"), (["repair"], "dev-sample-crash", "blocks")])
def test_a_full_temporary_directory_is_named_not_the_store(args, name, what, store_copy, tmp_path, monkeypatch):
    """A command that builds files outside the store (verify's batch and LMQ queues, the RocksDB queue's
    private directory, put's and repair's planned index files) on a full temporary directory: exit 4, one
    line naming the file there it could not write, never the store (which it leaves as it was), and nothing
    left behind once the command is over (in-process: once what it raised is let go)."""
    import gc
    import tempfile

    from tests.helpers_maintain import snapshot

    if name == "dev-rocksdbcq-5x":
        pytest.importorskip("rocksdict")
    store = store_copy(name)
    if args[0] == "put":                       # no index file to append to: the plan builds a new one
        for f in (store / "index").iterdir():
            f.unlink()
    before = snapshot(store)
    temp = tmp_path / "systmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with monkeypatch.context() as m:
        full = _FullTempDir(m, temp, what)
        result = run(args[0], store, *args[1:])
    assert full.hits, "no call into the temporary directory failed"
    errors = [line for line in result.stderr.splitlines() if not line.startswith("rmqtool: warning: ")]
    assert result.exit_code == ExitCode.IO_ERROR and result.stdout == "" and len(errors) == 1, result.stderr
    assert re.fullmatch(f"rmqtool: error: {re.escape(str(temp))}/rmqtool-[^ ]+: No space left on device",
                        errors[0]), errors
    del result
    gc.collect()
    assert snapshot(store) == before and list(temp.iterdir()) == []


def test_a_remote_file_copied_into_a_full_temporary_directory_is_named(tmp_path, monkeypatch):
    """A store read through a URI (here file://) is copied file by file into the temporary directory: when
    that is full, the line names the copy it could not write, not a read of the remote file."""
    import tempfile

    temp = tmp_path / "systmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with monkeypatch.context() as m:
        full = _FullTempDir(m, temp, "blocks")
        result = run("stats", f"file://{FIXTURES / 'dev-sample' / 'store'}")
    assert full.hits
    assert result.exit_code == ExitCode.IO_ERROR and result.stdout == "", result.stderr
    assert re.fullmatch(f"rmqtool: error: {re.escape(str(temp))}/rmqtool-remote-[^ ]+/0+: No space left on "
                        "device\n", result.stderr), result.stderr


def test_import_from_stdin_on_a_full_temporary_directory_names_it(store_copy, tmp_path, monkeypatch):
    """import reads stdin twice, through a copy in the temporary directory: when that directory is full,
    the line names it (the copy has no name of its own), not the store, which is left as it was."""
    import errno
    import tempfile
    import threading

    from tests.helpers_maintain import snapshot

    rows = run("cat-commitlog", FIXTURES / "dev-sample" / "store", "-f", "jsonl", "-n", "20").stdout.encode()
    store = store_copy("dev-sample")
    before, temp = snapshot(store), tmp_path / "systmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    real = tempfile.TemporaryFile

    class Full:                                     # a write fails as on a full disk: naming no file
        def __init__(self, *args, **kw):
            self._file = real(*args, **kw)

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self._file, name)

    monkeypatch.setattr(tempfile, "TemporaryFile", Full)
    read, write = os.pipe()                         # stdin that cannot seek, as a shell pipe's
    feeder = threading.Thread(target=lambda: (os.write(write, rows), os.close(write)))
    feeder.start()
    with open(read, "rb") as stdin:
        result = run("import", store, "-", input=stdin)
    feeder.join()
    assert_error(result, ExitCode.IO_ERROR, f"rmqtool: error: {temp}: No space left on device (the copy of "
                 "stdin import reads twice)")
    assert snapshot(store) == before


@pytest.mark.parametrize("args", [["cat-commitlog", "{}", "-f", "jsonl"], ["stats", "{}"],
                                  ["cat-cq", "{}", "TopicA", "0"], ["grep", "{}", "-f", "csv"]], ids=lambda a: a[0])
def test_a_full_disk_under_standard_output_is_named(args):
    """Output redirected to a full disk (/dev/full: every write fails with ENOSPC): exit 4 and one line
    naming standard output, not the store the command read."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    store = FIXTURES / "dev-sample" / "store"
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "rmqtool", *_args(args, store)], stdout=full,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              timeout=120)
    assert (proc.returncode, proc.stderr) == (ExitCode.IO_ERROR,
                                              "rmqtool: error: standard output: No space left on device\n")


@pytest.mark.parametrize("args", [["export", "{}", "--to", "-"], ["rebuild-cq", "{}", "--out", "-"],
                                  ["generate", "-"]], ids=lambda a: a[0])
def test_a_dash_for_an_output_is_a_usage_error(args, tmp_path, monkeypatch):
    """'-' where a command writes files (export's --to, rebuild-cq's --out, a new store) is not taken for a
    file or directory named '-' in the working directory: a usage error, nothing written."""
    monkeypatch.chdir(tmp_path)
    result = run(*_args(args, FIXTURES / "dev-sample" / "store"))
    assert result.exit_code == ExitCode.USAGE and "'-' is not standard output here: give a path" in result.stderr
    assert list(tmp_path.iterdir()) == []
