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
    found = [json.loads(r) for r in run("verify", root, "-f", "jsonl", "--read-anyway").stdout.splitlines()]
    assert [(f["kind"], f["offset"]) for f in found] == [("missing_file", int(files[3].name)),
                                                        ("skipped_part", int(gone.name))]
    assert found[1]["counts"]["units"] == sum(1 for u in _units(BASE) if int(gone.name) <= u[3] < int(files[3].name))
    shutil.copy(gone.with_name(files[0].name), gone.with_name("00000000000000012345"))
    stray = gone.with_name("00000000000000012345")
    result = run("cat-commitlog", root, "-f", "jsonl", "--read-anyway")
    assert result.exit_code == 3 and len(result.stdout.splitlines()) == sum(per_file) - per_file[2]
    whole = sum(1 for r in readback(BASE)["commitlogRecords"] if r["physicalOffset"] < 65536 and r["type"] == "MESSAGE")
    assert f"{stray}: 65536 bytes from offset 12345 (a file off the grid of file names)" in result.stderr
    found = [json.loads(r) for r in run("verify", root, "-f", "jsonl", "--read-anyway").stdout.splitlines()]
    assert [(f["kind"], f["path"]) for f in found][:2] == [("missing_file", str(stray)), ("missing_file", str(files[3]))]
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


# -- every other reader of commit-log records: the same refusal, the same partial answer ---------------
# (set, commit-log file cut, bytes kept): built once per module, read only
CUTS = {"dev-sample": (1, CUT_AT), "dev-sample-5x": (1, CUT_AT), "dev-config-5x": (0, 30_000),
        "dev-timer-5x": (0, CUT_AT), "dev-batchcq-5x": (0, CUT_AT), "dev-lmq-5x": (0, CUT_AT),
        "dev-rocksdbcq-5x": (0, CUT_AT)}


@pytest.fixture(scope="module")
def cuts(tmp_path_factory):
    """Per set: (root, victim, [lo, hi): the physical offsets readers leave unread, the intact store)."""
    out = {}
    for name, (which, keep) in CUTS.items():
        root = tmp_path_factory.mktemp(name) / "store"
        shutil.copytree(FIXTURES / name / "store", root)
        victim = sorted((root / "commitlog").iterdir())[which]
        os.truncate(victim, keep)
        _, _, skipped = _expected(name, which, keep)
        start, size = int(victim.name), readback(name)["commitlogFiles"][which]["fileSize"]
        out[name] = root, victim, (start + size - skipped, start + size), FIXTURES / name / "store"
    return out


def _units(name: str, queue=None) -> list[tuple[str, int, int, int]]:
    """(topic, queue id, queue offset, physical offset) of the set's consume-queue units (the readback's)."""
    return [(q["topic"], q["queueId"], u[0], u[1]) for q in readback(name)["consumeQueues"]
            if queue in (None, (q["topic"], q["queueId"])) for u in q["units[queueOffset,commitLogOffset,size,tagsCode]"]]


def _rows(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def _refused_then_partial(args: list, victim, keep: int, size: int = 65536):
    """``args`` without --read-anyway: the one refusal line of every reader (exit 4, no output); with it:
    exit 3, ending with the warning naming the cut. Returns the partial run."""
    line = (f"rmqtool: error: {victim}: file is {keep} bytes, expected {size}: a broker refuses to load this "
            "store (rule commitlog_file_size, MappedFileQueue.load); --read-anyway reads what is readable\n")
    refused = run(*args)
    assert (refused.exit_code, refused.stdout, refused.stderr) == (4, "", line), args
    partial = run(*args, "--read-anyway")
    assert partial.exit_code == 3 and partial.stderr.splitlines()[-1].startswith(
        "rmqtool: warning: partial: skipped ") and f"{victim}: " in partial.stderr.splitlines()[-1], partial.stderr
    return partial


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x"])
def test_cat_cq_reads_what_export_reads(name, cuts, tmp_path):
    """cat-cq --message, --resolve and its plain listing (which checks the trailing units against the commit
    log): refused; read anyway, --message prints the records export --read-anyway exports for that queue,
    --resolve marks unread exactly the units whose record lies in the part not read."""
    root, victim, (lo, hi), _ = cuts[name]
    exported = run("export", root, "--to", tmp_path / "all.jsonl", "--read-anyway")
    assert exported.exit_code == 3
    records = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    in_cut = [u for u in _units(name) if lo <= u[3] < hi]
    topic, qid = max({u[:2] for u in in_cut}, key=lambda q: sum(u[:2] == q for u in in_cut))
    listed = _refused_then_partial(["cat-cq", root, topic, qid, "-f", "jsonl"], victim, CUTS[name][1])
    assert len(_rows(listed)) == len(_units(name, (topic, qid)))
    messages = _refused_then_partial(["cat-cq", root, topic, qid, "--message", "-f", "jsonl"], victim, CUTS[name][1])
    assert [r["physical_offset"] for r in _rows(messages)] == \
        [r["physical_offset"] for r in records if (r["topic"], r["queue_id"]) == (topic, qid)]
    resolved = _refused_then_partial(["cat-cq", root, topic, qid, "--resolve", "-f", "jsonl"], victim, CUTS[name][1])
    status = {r["queue_offset"]: r["status"] for r in _rows(resolved)}
    assert status == {u[2]: "unread" if lo <= u[3] < hi else "ok" for u in _units(name, (topic, qid))}
    assert "disagree" not in resolved.stderr


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x"])
def test_query_id_scan_reads_past_the_cut(name, cuts):
    """query-id --scan (a UNIQ_KEY no index lookup finds: --topic names none of its topics): refused; read
    anyway, a record after the cut is found, one in the part not read is not (both partial: exit 3)."""
    root, victim, (lo, hi), _ = cuts[name]
    records = [r for r in readback(name)["commitlogRecords"] if r["type"] == "MESSAGE" and r["uniqKey"]]
    after = next(r for r in records if r["physicalOffset"] >= hi)
    lost = next(r for r in records if lo <= r["physicalOffset"] < hi)
    args = ["query-id", root, "--kind", "uniq-key", "--topic", "NoSuchTopic", "--scan", "-f", "jsonl"]
    found = _refused_then_partial(args + [after["uniqKey"]], victim, CUTS[name][1])
    assert [r["physical_offset"] for r in _rows(found)] == \
        [r["physicalOffset"] for r in records if r["uniqKey"] == after["uniqKey"]]
    missed = _refused_then_partial(args + [lost["uniqKey"]], victim, CUTS[name][1])
    assert all(r["physical_offset"] < lo or r["physical_offset"] >= hi for r in _rows(missed))


def test_query_id_scan_reads_past_a_damaged_record():
    """--read-anyway takes query-id --scan past a damaged record (the rest of its file skipped), as it takes
    query-key --scan; without it the damage is the error."""
    name = "dev-damage-midfile-magic-497"
    damage = json.loads((FIXTURES / name / "damage.json").read_text())
    size = damage["geometry"]["mappedFileSizeCommitLog"]
    at = damage["damagedRecord"]["physicalOffset"]
    later = next(r for r in readback(damage["baseSet"])["commitlogRecords"]
                 if r["type"] == "MESSAGE" and r["uniqKey"] and r["physicalOffset"] >= at - at % size + size)
    args = ["query-id", FIXTURES / name / "store", later["uniqKey"], "--kind", "uniq-key", "--topic", "NoSuchTopic",
            "--scan", "-f", "jsonl"]
    assert run(*args).exit_code == 3 and "rmqtool: error: " in run(*args).stderr
    found = run(*args, "--read-anyway")
    assert found.exit_code == 3 and f"offset {at}: " in found.stderr and "the rest of that file was skipped" in found.stderr
    assert later["physicalOffset"] in [r["physical_offset"] for r in _rows(found)]


def test_offsets_topic_status_and_delay_offsets(cuts):
    """The mqadmin views read records (times) and report what the broker's load leaves: refused; read
    anyway, the intact store's rows, a time empty exactly where its record lies in the part not read."""
    name = "dev-config-5x"
    root, victim, (lo, hi), intact = cuts[name]
    phy = {(t, q, o): p for t, q, o, p in _units(name)}
    emptied = 0
    for command, at in (("offsets", lambda r: (r["topic"], r["queue_id"], r["offset"] - 1)),
                        ("topic-status", lambda r: (r["topic"], r["queue_id"], r["max_offset"] - 1)),
                        ("delay-offsets", None)):
        got = _rows(_refused_then_partial([command, root, "-f", "jsonl"], victim, CUTS[name][1]))
        want = _rows(run(command, intact, "-f", "jsonl"))
        if at is not None:
            time = "last_consumed_timestamp" if command == "offsets" else "last_updated_timestamp"
            cut_off = [lo <= phy.get(at(r), -1) < hi for r in want]
            emptied += sum(cut_off)
            want = [{**r, time: None} if off else r for r, off in zip(want, cut_off)]
        assert got == want, command
    assert emptied
    del_ = _rows(_refused_then_partial(["delay-offsets", cuts["dev-sample"][0], "-f", "jsonl"], cuts["dev-sample"][1],
                                       CUT_AT))
    assert del_ == _rows(run("delay-offsets", cuts["dev-sample"][3], "-f", "jsonl"))


def test_timer_resolves_what_is_readable(cuts):
    """timer's pending list resolves each unit's record: refused; read anyway, a unit whose record lies in
    the part not read is message-missing, every other row as on the intact store (but a message whose recall
    was cut off: no longer cancelled). --units and --slots read the timer store alone: as intact."""
    root, victim, (lo, hi), intact = cuts["dev-timer-5x"]
    args = ["--now", "2026-11-23T07:00:00Z", "-f", "jsonl"]
    got = _rows(_refused_then_partial(["timer", root, *args], victim, CUT_AT))
    want = _rows(run("timer", intact, *args))
    assert len(got) == len(want) and any(lo <= w["physical_offset"] < hi for w in want)
    for g, w in zip(got, want):
        if lo <= w["physical_offset"] < hi:
            assert g["state"] == "message-missing" and g["real_topic"] is None
        elif w["state"] != "cancelled-by-delete":
            assert g == w
    for view in ("--units", "--slots"):
        assert run("timer", root, view, *args).stdout == run("timer", intact, view, *args).stdout


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x"])
def test_verify_reads_the_short_file_and_names_the_cut(name, cuts):
    """verify --read-anyway walks the short file's whole records like every reader: what it finds on the
    intact store (nothing), the file's size, and one skipped_part finding counting the records on disk there
    and the units pointing into the part not read; no error per unit or index entry, no missing file."""
    root, victim, (lo, hi), intact = cuts[name]
    assert run("verify", intact, "-f", "jsonl").stdout == ""
    result = _refused_then_partial(["verify", root, "-f", "jsonl"], victim, CUTS[name][1])
    rows = _rows(result)
    assert [(r["kind"], r["path"], r["offset"]) for r in rows] == [("wrong_file_size", str(victim), int(victim.name)),
                                                                  ("skipped_part", str(victim), lo)]
    _, torn, skipped = _expected(name, *CUTS[name])
    counts = rows[1]["counts"]
    assert (counts["records"], counts["bytes"]) == (torn, skipped) == (1, hi - lo)
    assert counts["units"] == sum(1 for u in _units(name) if lo <= u[3] < hi) > 0 and counts["index_entries"] > 0


def _queue_phys(name: str) -> list[int]:
    """The commit-log offsets of every unit of every queue kind in the set's readback: consume queues (LMQ
    ones included), batch consume queues, the RocksDB consume queue."""
    rb = readback(name)
    units = "units[queueOffset,commitLogOffset,size,tagsCode]"
    return [u[1] for q in rb.get("consumeQueues", ()) for u in q[units]] + \
        [u["physOffset"] for q in rb.get("batchConsumeQueues", ()) for u in q["units"]] + \
        [u[1] for q in rb.get("rocksdbConsumeQueue", {}).get("queues", ()) for u in q[f"{units} (RocksDBConsumeQueue.get)"]]


@pytest.mark.parametrize("name", ["dev-batchcq-5x", "dev-lmq-5x", "dev-rocksdbcq-5x"])
def test_verify_checks_batch_lmq_and_rocksdb_queues_past_the_cut(name, cuts):
    """The queues verify compares with the dispatch of the records read (batch, LMQ, RocksDB) follow the
    classic queue's rule: a unit pointing into the part not read is counted in skipped_part, not checked, and
    the units after it are checked where the broker put them: no mismatch for a store that had none."""
    root, victim, (lo, hi), intact = cuts[name]
    assert run("verify", intact, "-f", "jsonl").stdout == ""
    rows = _rows(_refused_then_partial(["verify", root, "-f", "jsonl"], victim, CUT_AT))
    assert [(r["kind"], r["path"]) for r in rows] == [("wrong_file_size", str(victim)), ("skipped_part", str(victim))]
    assert rows[1]["counts"]["units"] == sum(lo <= p < hi for p in _queue_phys(name)) > 0
    assert any(p >= hi for p in _queue_phys(name))                 # units after the cut were checked


def test_verify_still_finds_a_wrong_unit_past_the_cut(cuts, tmp_path):
    """The rule excuses only the units pointing into the part not read: a batch unit after the cut whose size
    is wrong is a cq_unit_mismatch at its place."""
    root = tmp_path / "store"
    shutil.copytree(cuts["dev-batchcq-5x"][0], root)
    lo, hi = cuts["dev-batchcq-5x"][2]
    queue = root / "batchconsumequeue" / "BatchTopic" / "1"
    path, at = next((f, i) for f in sorted(queue.iterdir()) for i in range(0, f.stat().st_size, 46)
                    if int.from_bytes(f.read_bytes()[i:i + 8], "big") >= hi)
    data = bytearray(path.read_bytes())
    data[at + 11] ^= 1                                             # the unit's size field
    path.write_bytes(data)
    rows = _rows(run("verify", root, "--read-anyway", "-f", "jsonl"))
    assert [(r["kind"], r["path"], r["offset"]) for r in rows if r["kind"] == "cq_unit_mismatch"] == \
        [("cq_unit_mismatch", str(path), at)]


def test_rebuild_cq_read_anyway_places_the_units_the_readable_part_names(cuts, tmp_path):
    """rebuild-cq --read-anyway after a cut: every unit whose record was read at its stored queue offset (a
    queue's last one too: the part not read can hold the records before it), a blank unit where the record
    lies in the part not read, no misplaced_unit row; exit 3 with the warning naming the bytes skipped."""
    from rmqtool.store.filequeue import FileQueue
    from rmqtool.store.store import ConsumeQueue

    name = "dev-sample-5x"
    root, victim, (lo, hi), _ = cuts[name]
    out = tmp_path / "cq"
    done = run("rebuild-cq", root, "--out", out, "--read-anyway", "-f", "jsonl")
    assert done.exit_code == 3 and "misplaced_unit" not in done.stdout
    assert done.stderr.splitlines()[-1] == (f"rmqtool: warning: partial: skipped 1 record(s) and {hi - lo} bytes: "
                                            f"{victim}: {hi - lo} bytes from offset {lo} (file is {CUT_AT} bytes, "
                                            "expected 65536)")
    rb = readback(name)["consumeQueues"]
    for q in rb:
        cq = ConsumeQueue(q["topic"], q["queueId"], FileQueue.from_dir(out / q["topic"] / str(q["queueId"])))
        got = {qo: None if u.is_filler else tuple(u[:3]) for qo, u in cq.iter_units()}
        assert got == {qo: None if lo <= phy < hi else (phy, size, tags)
                       for qo, phy, size, tags in q["units[queueOffset,commitLogOffset,size,tagsCode]"]}, q["topic"]


def test_repairs_placeholder_is_no_message_to_any_reader(store_copy, tmp_path):
    """A store repair salvaged (a damaged record replaced by a placeholder, type salvaged_record): every
    reader counts the messages of the undamaged set but the damaged one; the record listings (cat-commitlog,
    export) show the placeholder as a salvaged_record row, and export says records and messages apart."""
    name = "dev-damage-midfile-magic-497"
    g = json.loads((FIXTURES / name / "damage.json").read_text())
    root = store_copy(name)
    repaired = run("repair", root, "--apply", "--backup", tmp_path / "bk", "--cq-file-size",
                   g["geometry"]["mappedFileSizeConsumeQueue"], "--slots", g["geometry"]["maxHashSlotNum"],
                   "--max-entries", g["geometry"]["maxIndexNum"])
    assert repaired.exit_code == 0, repaired.stderr
    messages = sum(1 for r in readback(g["baseSet"])["commitlogRecords"] if r["type"] == "MESSAGE") - 1
    info = json.loads(run("info", root, "-f", "json").stdout)
    stats = json.loads(run("stats", root, "-f", "jsonl").stdout)
    assert info["messages"] == stats["messages"] == len(run("grep", root, "-f", "jsonl").stdout.splitlines()) == messages
    assert info["min_store_timestamp"] == stats["min_store_timestamp"] > 0
    assert sum(r["messages"] for r in _rows(run("stats", root, "--by", "topic", "-f", "jsonl"))) == messages
    listed = [r["type"] for r in _rows(run("cat-commitlog", root, "-f", "jsonl"))]
    exported = run("export", root, "--to", tmp_path / "o.jsonl")
    rows = [json.loads(line)["type"] for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert listed == rows and rows.count("salvaged_record") == 1 and len(rows) == messages + 1
    assert f"exported {messages + 1} records ({messages} messages)" in exported.stderr


@pytest.mark.parametrize("few", [True, False])
def test_a_hole_in_a_middle_file_reads_the_same_in_every_reader(store_copy, monkeypatch, tmp_path, few):
    """The second of four files zeroed after its fifth record: each file is read to its own end of data, so
    every reader reads the records before the hole and every later file's (the broker serves those past a
    hole its recovery does not reach: CommitLog.recoverNormally begins at the third file from the end), exit 0,
    the record-at-a-time path and the columnar scan alike; verify names the hole (data_after_end)."""
    from rmqtool.ops import scan

    if not few:
        monkeypatch.setattr(scan, "FEW_BYTES", 0)
    root = store_copy(BASE)
    victim = sorted((root / "commitlog").iterdir())[1]
    start = int(victim.name)
    records = sorted((r["physicalOffset"], r["type"]) for r in readback(BASE)["commitlogRecords"])
    inside = [o for o, _ in records if start <= o < start + 65536]
    cut = inside[5] - start
    data = victim.read_bytes()
    victim.write_bytes(data[:cut] + bytes(len(data) - cut))
    messages = sum(1 for o, t in records if t == "MESSAGE" and not start + cut <= o < start + 65536)
    assert sum(1 for o, t in records if t == "MESSAGE" and o >= start + 65536) > 0      # later files hold records
    results = {"stats": run("stats", root, "-f", "jsonl", "--jobs", "1"),
               "info": run("info", root, "-f", "json"),
               "cat-commitlog": run("cat-commitlog", root, "-f", "jsonl"),
               "grep": run("grep", root, "-f", "jsonl"),
               "export": run("export", root, "--to", tmp_path / "one.jsonl"),
               "export-jobs": run("export", root, "--to", tmp_path / "three.jsonl", "--jobs", "3")}
    assert {k: r.exit_code for k, r in results.items()} == dict.fromkeys(results, 0)
    assert json.loads(results["stats"].stdout)["messages"] == messages
    assert json.loads(results["info"].stdout)["messages"] == messages
    assert len(results["cat-commitlog"].stdout.splitlines()) == len(results["grep"].stdout.splitlines()) == messages
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "three.jsonl").read_bytes()
    assert len((tmp_path / "one.jsonl").read_text().splitlines()) == messages
    kinds = [json.loads(line)["kind"] for line in run("verify", root, "-f", "jsonl").stdout.splitlines()]
    assert "data_after_end" in kinds
