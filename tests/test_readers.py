"""One rule for incomplete input, shared by every reader (rmqtool.store.readable, rmqtool.store.recognition):
a store the broker refuses to load is refused by every reader with the same line (exit 4); --read-anyway reads
what is readable, every reader the same records, and ends with the same warning naming what it skipped
(exit 3). A path that is neither a store nor a commit-log file is refused as such (exit 4), before the heavy
modules are imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, ROOT, readback, run

BASE = "dev-sample-5x"                       # 4 commit-log files of 65,536 bytes
CUT_AT = 40_000


def _expected(name: str, cut_file: int, cut_at: int) -> tuple[int, int, int]:
    """From the broker's readback of the intact set: (messages a reader reads once ``cut_file`` is cut to
    ``cut_at`` bytes, records torn by the cut, bytes skipped)."""
    rb = readback(name)
    files = rb["commitlogFiles"]
    start, size = files[cut_file]["fileFromOffset"], files[cut_file]["fileSize"]
    records = [(r["physicalOffset"], r["totalSize"], r["type"]) for r in rb["commitlogRecords"]]
    inside = [(o, n, t) for o, n, t in records if start <= o < start + size]
    whole = [(o, n, t) for o, n, t in inside if o + n <= start + cut_at]
    kept = sum(1 for o, n, t in records if t == "MESSAGE" and not (start <= o < start + size)) + \
        sum(1 for _, _, t in whole if t == "MESSAGE")
    end = max((o + n for o, n, _ in whole), default=start)
    torn = sum(1 for o, n, _ in inside if o < start + cut_at < o + n)
    return kept, torn, start + size - end


@pytest.fixture
def cut_store(store_copy):
    """dev-sample-5x with its second file (a middle one) cut to 40,000 of 65,536 bytes."""
    root = store_copy(BASE)
    victim = sorted((root / "commitlog").iterdir())[1]
    os.truncate(victim, CUT_AT)
    return root, victim


def _readers(store, tmp_path) -> dict[str, list]:
    msg_id = readback(BASE)["commitlogRecords"][0]["msgId"]
    return {"info": ["info", store, "-f", "json"],
            "cat-commitlog": ["cat-commitlog", store, "-f", "jsonl"],
            "stats": ["stats", store, "-f", "jsonl"],
            "grep": ["grep", store, "-f", "jsonl"],
            "export": ["export", store, "--to", tmp_path / "out.jsonl"],
            "export-dataset": ["export", store, "--to", tmp_path / "dataset"],
            "verify": ["verify", store, "-f", "jsonl"],
            "query-key": ["query-key", store, "TopicA", "键-19", "-f", "jsonl"],
            "query-id": ["query-id", store, msg_id, "-f", "jsonl"],
            "transactions": ["transactions", store, "--all", "-f", "jsonl"]}


def test_every_reader_refuses_a_store_the_broker_refuses(cut_store, tmp_path):
    root, victim = cut_store
    line = (f"rmqtool: error: {victim}: file is {CUT_AT} bytes, expected 65536: a broker refuses to load this "
            "store (rule commitlog_file_size, MappedFileQueue.load); --read-anyway reads what is readable\n")
    for name, args in _readers(root, tmp_path).items():
        result = run(*args)
        assert (result.exit_code, result.stdout, result.stderr) == (4, "", line), name
    assert sorted(os.listdir(tmp_path)) == [BASE]              # no export output, no staged part left


def test_read_anyway_reads_the_same_records_in_every_reader(cut_store, tmp_path):
    root, victim = cut_store
    messages, torn, skipped = _expected(BASE, 1, CUT_AT)
    assert torn == 1 and 0 < messages < len(readback(BASE)["commitlogRecords"])
    at = int(victim.name) + 65536 - skipped
    warning = (f"rmqtool: warning: partial{{}}: skipped {torn} record(s) and {skipped} bytes: {victim}: {skipped} "
               f"bytes from offset {at} (file is {CUT_AT} bytes, expected 65536)\n")
    readers = _readers(root, tmp_path)
    got = {}
    for name, args in readers.items():
        result = run(*args, "--read-anyway")
        assert result.exit_code == 3, (name, result.stderr)
        what = f" export in {args[3]}" if name.startswith("export") else ""
        assert result.stderr.endswith(warning.format(what)), (name, result.stderr)
        got[name] = result
    assert json.loads(got["info"].stdout)["messages"] == messages
    assert len(got["cat-commitlog"].stdout.splitlines()) == messages
    assert len(got["grep"].stdout.splitlines()) == messages
    assert json.loads(got["stats"].stdout)["messages"] == messages
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == messages
    assert f"exported {messages} records" in got["export-dataset"].stderr and "(partial" in got["export"].stderr
    assert any(json.loads(r)["kind"] == "wrong_file_size" for r in got["verify"].stdout.splitlines())
    assert len(got["query-key"].stdout.splitlines()) == len(got["query-id"].stdout.splitlines()) == 1


@pytest.mark.parametrize("name", ["dev-damage-midfile-magic-497", "dev-damage-midfile-magic-533"])
def test_read_anyway_past_a_damaged_record_counts_the_same_in_every_reader(name, tmp_path):
    """A damaged record in a store of full-size files: with --read-anyway every reader skips the rest of its
    file and reads the next ones (the records of the undamaged set outside that file, and those before the
    damage in it), with a warning naming it, exit 3."""
    damage = json.loads((FIXTURES / name / "damage.json").read_text())
    at = damage["damagedRecord"]["physicalOffset"]
    size = damage["geometry"]["mappedFileSizeCommitLog"]
    first = at - at % size
    base = [r for r in readback(damage["baseSet"])["commitlogRecords"] if r["type"] == "MESSAGE"]
    messages = sum(1 for r in base if not first <= r["physicalOffset"] < first + size or r["physicalOffset"] < at)
    assert messages < len(base) - 1                 # records after the damage in its file, and later files
    store = FIXTURES / name / "store"
    results = {"stats": run("stats", store, "-f", "jsonl", "--read-anyway"),
               "grep": run("grep", store, "-f", "jsonl", "--read-anyway"),
               "cat-commitlog": run("cat-commitlog", store, "-f", "jsonl", "--read-anyway"),
               "export": run("export", store, "--to", tmp_path / "o.jsonl", "--read-anyway"),
               "info": run("info", store, "-f", "json", "--read-anyway")}
    for reader, result in results.items():
        assert result.exit_code == 3 and f"offset {at}: " in result.stderr, (reader, result.stderr)
    assert json.loads(results["stats"].stdout)["messages"] == messages
    assert json.loads(results["info"].stdout)["messages"] == messages
    assert len(results["grep"].stdout.splitlines()) == len(results["cat-commitlog"].stdout.splitlines()) == messages
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == messages


def test_a_missing_file_and_a_file_off_the_grid(store_copy):
    """A gap (the third file removed) and a stray copy of a file named between two starts: refused; read
    anyway, the gap's bytes and the stray file's records and bytes are skipped, the other files read whole."""
    root = store_copy(BASE)
    files = sorted((root / "commitlog").iterdir())
    gone = files[2]
    per_file = [sum(1 for r in readback(BASE)["commitlogRecords"] if r["type"] == "MESSAGE"
                    and int(f.name) <= r["physicalOffset"] < int(f.name) + 65536) for f in files]
    gone.unlink()
    result = run("stats", root, "-f", "jsonl")
    assert result.exit_code == 4 and f"{files[3]}: starts at {int(files[3].name)}, expected {int(gone.name)} " \
                                      "(missing file)" in result.stderr
    result = run("stats", root, "-f", "jsonl", "--read-anyway")
    assert result.exit_code == 3 and json.loads(result.stdout)["messages"] == sum(per_file) - per_file[2]
    assert f"skipped 0 record(s) and 65536 bytes: {gone.name}: 65536 bytes from offset {int(gone.name)} " \
           "(missing file(s))" in result.stderr
    shutil.copy(gone.with_name(files[0].name), gone.with_name("00000000000000012345"))
    stray = gone.with_name("00000000000000012345")
    result = run("cat-commitlog", root, "-f", "jsonl", "--read-anyway")
    assert result.exit_code == 3 and len(result.stdout.splitlines()) == sum(per_file) - per_file[2]
    whole = sum(1 for r in readback(BASE)["commitlogRecords"] if r["physicalOffset"] < 65536 and r["type"] == "MESSAGE")
    assert f"{stray}: 65536 bytes from offset 12345 (a file off the grid of file names)" in result.stderr
    assert f"skipped {whole} record(s) and {65536 + 65536} bytes" in result.stderr


def test_data_source_failfast_refuses_and_permissive_reads_what_is_readable(cut_store, capfd):
    pytest.importorskip("pyspark.sql.datasource")
    from rmqtool.spark.datasource import RocketMQDataSource
    from rmqtool.store.readable import Refused

    root, victim = cut_store
    with pytest.raises(Refused, match="broker refuses to load this store"):
        RocketMQDataSource({"path": str(root)}).reader(None).partitions()
    reader = RocketMQDataSource({"path": str(root), "mode": "permissive"}).reader(None)
    rows = sum(b.num_rows for p in reader.partitions() for b in reader.read(p))
    messages, torn, skipped = _expected(BASE, 1, CUT_AT)
    assert rows == messages
    assert f"(mode permissive): partial: skipped {torn} record(s) and {skipped} bytes: {victim}" in capfd.readouterr().err


@pytest.mark.slow
def test_spark_jobs_refuse_and_read_anyway_as_the_local_engine(cut_store, tmp_path):
    """stats, grep and a dataset export with --engine spark: the same refusal and the same partial answer."""
    root, _ = cut_store
    messages, _, _ = _expected(BASE, 1, CUT_AT)
    for args in (["stats", root, "-f", "jsonl"], ["grep", root, "-f", "jsonl"]):
        assert run(*args, "--engine", "spark").exit_code == 4
    stats = run("stats", root, "-f", "jsonl", "--engine", "spark", "--read-anyway")
    assert stats.exit_code == 3 and json.loads(stats.stdout)["messages"] == messages
    grep = run("grep", root, "-f", "jsonl", "--engine", "spark", "--read-anyway")
    assert grep.exit_code == 3 and len(grep.stdout.splitlines()) == messages
    export = run("export", root, "--to", tmp_path / "ds", "--engine", "spark", "--read-anyway")
    assert export.exit_code == 3 and f"exported {messages} records" in export.stderr


# -- item 3: a path that is not a store or a commit-log file ----------------------------------------------
TEXT_FILES = {"passwd": b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n",
              "32 bytes": b"abcdefghijklmnopqrstuvwxyz012345"}


@pytest.mark.parametrize("content", TEXT_FILES.values(), ids=TEXT_FILES.keys())
@pytest.mark.parametrize("command", [["verify"], ["info"], ["cat-commitlog"], ["stats"], ["grep"],
                                     ["export", "--to", "{out}"], ["query-key", "{}", "T", "k"],
                                     ["query-id", "{}", "C0A8000A00002A9F0000000000000000"]], ids=lambda c: c[0])
def test_a_text_file_is_refused_by_every_reader(command, content, tmp_path):
    text = tmp_path / "notes"
    text.write_bytes(content)
    args = [a.format(text, out=tmp_path / "o.jsonl") for a in command]
    args = args if "{}" in command else args[:1] + [str(text)] + args[1:]
    result = run(*args)
    assert (result.exit_code, result.stdout) == (4, "")
    assert result.stderr.startswith(f"rmqtool: error: {text}: not a store or a commit-log file: its first record "
                                    "is no record (size ") and result.stderr.count("\n") == 1


def test_a_commit_log_file_whose_first_record_is_not_a_record(tmp_path):
    """Garbage over the first record of a real commit-log file: not a commit-log file (exit 4); the intact
    file, an all-zero file named by its offset (a pre-allocated one) and a DLedger data file are."""
    first = FIXTURES / BASE / "store" / "commitlog" / "00000000000000000000"
    bad = tmp_path / first.name
    bad.write_bytes(b"#!/bin/sh\nexit\n\n" + first.read_bytes()[16:])
    assert run("verify", bad).exit_code == 4
    zeros = tmp_path / "z" / "00000000000000065536"
    zeros.parent.mkdir()
    zeros.write_bytes(bytes(4096))
    ledger = next((FIXTURES / "dev-dledger" / "store").glob("dledger-*/data/00000000000000000000"))
    for good in (first, zeros, ledger):
        assert run("verify", good).exit_code in (0, 1), good
    named = tmp_path / "zeros.bin"
    named.write_bytes(bytes(4096))
    assert "zero bytes and no record" in run("cat-commitlog", named).stderr


def test_refused_before_the_heavy_modules_are_imported(tmp_path):
    """verify and stats of a text file: refused at the argument, before numpy, pyarrow or numba load."""
    text = tmp_path / "passwd"
    text.write_bytes(TEXT_FILES["passwd"])
    for command in ("verify", "stats"):
        code = ("import atexit, sys\n"
                "atexit.register(lambda: print(sorted(m for m in ('numpy', 'pyarrow', 'numba') if m in sys.modules),"
                " file=sys.stderr))\n"
                f"from rmqtool.cli import main\nmain([{command!r}, {str(text)!r}])\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 4 and done.stderr.splitlines()[-1] == "[]", done.stderr
