"""Operator experience: streamed tables, escaped control characters, the record view, one option
vocabulary with hidden aliases, repeatable filters, filters on export and stats."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import re
import subprocess
import sys

import click
import pytest

from tests.conftest import ROOT, readback, run, store_path

SAMPLE = store_path("dev-sample")
NASTY = "\x1b[31mred\x1b]0;x\x07\r\nline2\x9b"


def messages(name: str = "dev-sample") -> list[dict]:
    return [r for r in readback(name)["commitlogRecords"] if r["type"] != "BLANK"]


# -- 1. tables stream -------------------------------------------------------------------------------
def _generated(tmp_path_factory, size: str, file_size: str):
    root = tmp_path_factory.mktemp("gen") / "store"
    subprocess.run([sys.executable, "-m", "rmqtool", "generate", str(root), "--size", size, "--file-size", file_size,
                    "--no-index", "--cq-file-size", "6000"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return root


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    return _generated(tmp_path_factory, "48M", "8M")


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    # past cat-commitlog's record-at-a-time threshold (1 MiB) and the kernel's plain-Python share (2,000
    # records): the start-up the large store's run pays
    return _generated(tmp_path_factory, "2M", "4M")


def _cpu_seconds(args: list[str]) -> float:
    """User + system CPU seconds of one rmqtool run (output discarded)."""
    proc = subprocess.Popen([sys.executable, "-m", "rmqtool", *args], stdout=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return usage.ru_utime + usage.ru_stime


@pytest.mark.slow
@pytest.mark.parametrize("command,fmt", [("cat-commitlog", "plain"), ("cat-commitlog", "table"),
                                         ("cat-commitlog", "record"), ("grep", "plain")])
def test_first_row_prints_before_the_scan_ends(big_store, small_store, command, fmt):
    """Rows stream: the first ones come out before half of the command's work beyond its start-up (the
    same command on a store of a few thousand records; a command that prints after its scan is at the whole).
    Measured in the child's CPU time (from /proc at the first rows, from wait4 at its end), which another
    process's load does not stretch as it does wall time. Start-up varies by ~0.3 CPU-s from run to run
    (imports, loading compiled code): the median of three, and half of the rest as the bound, not a third."""
    start_up = sorted(_cpu_seconds([command, str(small_store), "-f", fmt]) for _ in range(3))[1]
    proc = subprocess.Popen([sys.executable, "-m", "rmqtool", command, str(big_store), "-f", fmt],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    seen = b""
    while b"2026" not in seen and b"physical_offset" not in seen.split(b"\n", 2)[-1]:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        seen += line
        if fmt != "record" and seen.count(b"\n") >= 4:
            break
    with open(f"/proc/{proc.pid}/stat") as fh:
        ticks = fh.read().rsplit(")", 1)[1].split()
    first = (int(ticks[11]) + int(ticks[12])) / os.sysconf("SC_CLK_TCK")     # utime + stime
    rest = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    total = usage.ru_utime + usage.ru_stime
    assert proc.returncode == 0, proc.stderr.read()
    assert rest.count(b"\n") > 40000
    assert first - start_up < (total - start_up) / 2, (start_up, first, total)


def test_a_damaged_store_prints_its_good_records_before_the_error():
    torn = store_path("dev-sample-crash-torn")
    result = run("cat-commitlog", torn, "-f", "plain", "--fields", "physical_offset")
    assert result.exit_code == 3 and "offset 279071" in result.stderr
    printed = [int(line) for line in result.stdout.splitlines()[2:]]
    good = [r["physicalOffset"] for r in messages("dev-sample-crash-torn") if r["physicalOffset"] < 279071]
    assert printed == good


# -- 2. message bytes never control the terminal ----------------------------------------------------
@pytest.fixture
def nasty_store(tmp_path):
    root = tmp_path / "store"
    assert run("init", root, "--commitlog-file-size", "65536", "--cq-file-size", "200", "--slots", "16",
               "--max-entries", "64").exit_code == 0
    result = run("put", root, "--topic", "T", "--tag", "t\x1b[1m", "--key", "k\x07x", "--property", "P=\x1b]0;t\x07",
                 "--body", NASTY, "--apply")
    assert result.exit_code == 0, result.output
    return root


@pytest.mark.parametrize("fmt", ["table", "plain", "record"])
def test_control_characters_are_escaped_for_people(nasty_store, fmt):
    out = run("cat-commitlog", nasty_store, "-f", fmt, "--fields", "topic,tags,keys,properties,body").stdout
    assert not any(ch in out for ch in "\x1b\x07\r\x9b"), repr(out)
    assert "\\x1b[31mred\\x1b]0;x\\x07\\r\\nline2\\x9b" in out
    assert "t\\x1b[1m" in out and "k\\u0007x" in out            # keys print as a JSON list
    if fmt == "record":                                             # whole, not cut to a column
        assert '"P": "\\u001b]0;t\\u0007"' in out


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv"])
def test_machine_formats_stay_exact(nasty_store, fmt):
    out = run("cat-commitlog", nasty_store, "-f", fmt, "--body-encoding", "text").stdout_bytes.decode()
    if fmt == "csv":
        import csv
        import io
        row = next(csv.DictReader(io.StringIO(out, newline="")))
    else:
        row = json.loads(out) if fmt == "jsonl" else json.loads(out)[0]
    assert row["body"] == NASTY and row["tags"] == "t\x1b[1m"



def test_tsv_escapes_tab_newline_and_backslash_instead_of_quoting(tmp_path):
    """TSV cells hold no tab or newline: they and the backslash come as \\t \\n \\r \\\\ (the TSV of PostgreSQL's text
    COPY), never in CSV quotes; reading them back gives the exact body."""
    root = tmp_path / "store"
    body = 'a\tb\nc\r\\d "q",e'
    assert run("init", root, "--commitlog-file-size", "65536", "--cq-file-size", "200", "--slots", "16",
               "--max-entries", "64").exit_code == 0
    assert run("put", root, "--topic", "T", "--tag", "t\tx", "--body", body, "--apply").exit_code == 0
    out = run("cat-commitlog", root, "-f", "tsv", "--body-encoding", "text", "--fields", "topic,tags,body").stdout
    head, row = out.splitlines()
    assert out.count("\n") == 2 and head == "topic\ttags\tbody"
    cells = row.split("\t")
    assert cells == ["T", "t\\tx", 'a\\tb\\nc\\r\\\\d "q",e']
    unescape = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}
    assert re.sub(r"\\(.)", lambda m: unescape[m.group(1)], cells[2]) == body


# -- 3. readable by default -------------------------------------------------------------------------
def test_record_view_prints_one_field_per_line():
    r = next(r for r in messages() if r["physicalOffset"] == 3635)
    out = run("cat-commitlog", SAMPLE, "--offset", "3635", "-n", "1", "-f", "record").stdout
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert fields["msg_id"].strip() == r["msgId"] and fields["topic"].strip() == r["topic"]
    assert fields["uniq_key"].strip() == r["uniqKey"]
    assert fields["body"].strip() == base64.b64decode(r["bodyBase64"]).decode() if "bodyBase64" in r else True


def test_ids_offsets_and_timestamps_never_fold_on_a_narrow_terminal():
    r = messages()[0]
    result = run("query-id", SAMPLE, r["msgId"], "-f", "table", env={"COLUMNS": "80"})
    assert r["msgId"] in result.stdout
    stamp = dt.datetime.fromtimestamp(r["storeTimestamp"] / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    assert stamp in result.stdout


def test_body_file_writes_each_body(tmp_path):
    wanted = [r for r in messages() if r["topic"] == "TopicA"]
    assert run("cat-commitlog", SAMPLE, "--topic", "TopicA", "-f", "jsonl", "--body-file", tmp_path).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{r['msgId']}.bin" for r in wanted)
    for r in wanted:
        assert hashlib.sha256((tmp_path / f"{r['msgId']}.bin").read_bytes()).hexdigest() == r["bodySha256"]


# -- 5. sizes, non-UTF-8 text, charsets, csv --------------------------------------------------------
@pytest.mark.parametrize("via", ["cat-commitlog", "export"])
def test_text_body_that_is_not_utf8_stays_exact_in_jsonl(via, tmp_path):
    if via == "export":
        assert run("export", SAMPLE, "--to", tmp_path / "a.jsonl", "--body-encoding", "text").exit_code == 0
        text = (tmp_path / "a.jsonl").read_text("utf-8")
    else:
        text = run("cat-commitlog", SAMPLE, "--body-encoding", "text", "-f", "jsonl").stdout
    rows = [json.loads(line) for line in text.splitlines()]
    by_offset = {r["physicalOffset"]: r for r in messages()}
    assert {r["body_encoding"] for r in rows} == {"text", "base64"}
    for row in rows:
        assert "\ufffd" not in (row["body"] or "")
        body = row["body"].encode() if row["body_encoding"] == "text" else base64.b64decode(row["body"])
        assert hashlib.sha256(body).hexdigest() == by_offset[row["physical_offset"]]["bodySha256"]


def test_charset_decodes_gbk_bodies(tmp_path):
    root = tmp_path / "store"
    run("init", root, "--commitlog-file-size", "65536", "--cq-file-size", "200", "--slots", "16",
        "--max-entries", "64")
    body = tmp_path / "b"
    body.write_bytes("订单".encode("gbk"))
    assert run("put", root, "--topic", "T", "--body-file", body, "--apply").exit_code == 0
    assert "订单" in run("cat-commitlog", root, "-f", "plain", "--charset", "gbk").stdout
    assert "not UTF-8" in run("cat-commitlog", root, "-f", "plain").stdout


def test_sizes_for_people_and_no_python_reprs_in_csv():
    assert "65.5 kB" in run("info", SAMPLE, "-f", "plain").stdout
    out = run("info", SAMPLE, "-f", "csv").stdout
    assert "False" not in out and "True" not in out


# -- 6. one vocabulary, old spellings hidden ---------------------------------------------------------
@pytest.mark.parametrize("new,old", [
    (["query-key", SAMPLE, "Order_Topic-1", "key-82", "--count", "5", "--since", "0"],
     ["query-key", SAMPLE, "Order_Topic-1", "key-82", "--max", "5", "--begin", "0"]),
    (["cat-cq", SAMPLE, "TopicA", "0", "--offset", "2"], ["cat-cq", SAMPLE, "TopicA", "0", "--from", "2"]),
    (["cat-commitlog", SAMPLE, "-n", "3", "--body-encoding", "hex"],
     ["cat-commitlog", SAMPLE, "-n", "3", "--body", "hex"]),
])
def test_old_spellings_are_hidden_aliases(new, old):
    a, b = run(*new, "-f", "jsonl"), run(*old, "-f", "jsonl")
    assert a.exit_code == b.exit_code == 0 and a.stdout == b.stdout
    assert f"The option '{old[-2]}' is deprecated. Use {new[-2]}." in b.stderr and "deprecated" not in a.stderr
    shown = set(re.findall(r"(?<![\w-])--[\w-]+", run(new[0], "--help").stdout))
    assert new[-2] in shown and old[-2] not in shown


def test_since_takes_local_and_relative_times():
    first = min(r["storeTimestamp"] for r in messages())
    local = dt.datetime.fromtimestamp(first / 1000 + 1).strftime("%Y-%m-%d %H:%M:%S")
    rows = run("cat-commitlog", SAMPLE, "--since", local, "-f", "jsonl").stdout.splitlines()
    want = [r for r in messages() if r["storeTimestamp"] >= (first // 1000 + 1) * 1000]
    assert len(rows) == len(want)
    assert run("cat-commitlog", SAMPLE, "--since", "-2h").exit_code == 1      # the fixture is older
    assert run("cat-commitlog", SAMPLE, "--until", "yesterday", "-n", "1").exit_code == 0


# -- 7. repeatable filters combine ------------------------------------------------------------------
def test_grep_counts_like_cat_commitlog():
    a = run("grep", SAMPLE, "--topic", "TopicA", "-n", "3", "-f", "jsonl").stdout.splitlines()
    b = run("cat-commitlog", SAMPLE, "--topic", "TopicA", "--count", "3", "-f", "jsonl").stdout.splitlines()
    assert len(a) == 3 and [json.loads(x)["physical_offset"] for x in a] == \
        [json.loads(x)["physical_offset"] for x in b]


@pytest.mark.parametrize("command", ["cat-commitlog", "grep"])
def test_repeated_filters_are_alternatives(command):
    rows = [json.loads(line) for line in run(command, SAMPLE, "--topic", "TopicA", "--topic", "TopicB",
                                             "--tag", "Tag3", "-f", "jsonl").stdout.splitlines()]
    want = [r["physicalOffset"] for r in messages()
            if r["topic"] in ("TopicA", "TopicB") and r["properties"].get("TAGS") == "Tag3"]
    assert [r["physical_offset"] for r in rows] == want and {r["topic"] for r in rows} == {"TopicA", "TopicB"}


# -- 8. export and stats take the filters; exports hold messages only -------------------------------
def test_export_filters_and_blank_free_integers(tmp_path):
    pd = pytest.importorskip("pandas")
    out = tmp_path / "a.parquet"
    assert run("export", SAMPLE, "--to", out, "--topic", "TopicA", "--key", "key-37").exit_code == 0
    df = pd.read_parquet(out)
    want = [r["physicalOffset"] for r in messages() if r["topic"] == "TopicA"
            and ("key-37" in (r["keys"] or "").split(" ") or r["uniqKey"] == "key-37")]
    assert list(df["physical_offset"]) == want
    every = tmp_path / "all.csv"
    assert run("export", SAMPLE, "--to", every).exit_code == 0
    df = pd.read_csv(every)
    assert len(df) == len(messages()) and str(df["queue_id"].dtype) == "int64"
    assert str(df["queue_offset"].dtype) == "int64"
    assert run("export", SAMPLE, "--to", tmp_path / "all.parquet").exit_code == 0
    df = pd.read_parquet(tmp_path / "all.parquet")
    assert df["queue_id"].dtype.kind == df["queue_offset"].dtype.kind == "i" and df["topic"].notna().all()
    assert run("export", SAMPLE, "--to", tmp_path / "b.csv", "--include-blank").exit_code == 0
    assert len(pd.read_csv(tmp_path / "b.csv")) == len(readback("dev-sample")["commitlogRecords"])


def test_stats_filters():
    rows = json.loads(run("stats", SAMPLE, "--by", "topic", "--topic", "TopicA", "--topic", "TopicB",
                          "--since", "1795216389500", "-f", "json").stdout)
    want = {}
    for r in messages():
        if r["topic"] in ("TopicA", "TopicB") and r["storeTimestamp"] >= 1795216389500:
            want[r["topic"]] = want.get(r["topic"], 0) + 1
    assert {r["topic"]: r["messages"] for r in rows} == want


# -- 9. retries and dead letters count for their original topic; --by group --------------------------
def test_stats_attribute_retries_and_dlq_to_the_original_topic_and_group():
    rows = {r["topic"]: r for r in json.loads(run("stats", SAMPLE, "--by", "topic", "-f", "json").stdout)}
    want: dict[str, list[int]] = {}
    for r in messages():
        retry, dlq = r["topic"].startswith("%RETRY%"), r["topic"].startswith("%DLQ%")
        topic = r["properties"].get("RETRY_TOPIC", r["topic"]) if retry or dlq else r["topic"]
        counts = want.setdefault(topic, [0, 0, 0])
        counts[0] += 1
        counts[1] += retry
        counts[2] += dlq
    assert {t: [r["messages"], r["retries"], r["dlq"]] for t, r in rows.items()} == want
    assert not any(t.startswith("%") for t in rows) and any(r["retries"] for r in rows.values())
    groups = {r["group"]: r for r in json.loads(run("stats", SAMPLE, "--by", "group", "-f", "json").stdout)}
    named = [r for r in messages() if r["topic"].startswith(("%RETRY%", "%DLQ%"))]
    assert groups["ConsumerGroupX"]["messages"] == len(named)
    assert groups[None]["messages"] == len(messages()) - len(named)
    assert "kB" in run("stats", SAMPLE, "--by", "group", "-f", "plain").stdout     # bytes for people


# -- 10. query-key without index coverage says so; --scan --------------------------------------------
def test_query_key_says_when_the_index_does_not_cover_and_scans(store_copy):
    root = store_copy("dev-sample")
    wanted = [r["physicalOffset"] for r in messages() if r["topic"] == "TopicA"
              and ("key-37" in (r["keys"] or "").split(" ") or r["uniqKey"] == "key-37")]
    for p in (root / "index").iterdir():
        p.unlink()
    result = run("query-key", root, "TopicA", "key-37")
    assert result.exit_code == 1 and "no index files" in result.stderr and "--scan" in result.stderr
    result = run("query-key", root, "TopicA", "key-37", "--scan", "-f", "jsonl")
    assert [json.loads(line)["physical_offset"] for line in result.stdout.splitlines()] == wanted
    result = run("query-key", SAMPLE, "TopicA", "key-37", "--until", "2000-01-01")
    assert result.exit_code == 1 and "not this time window" in result.stderr


# -- 11. cat-cq resolves a queue offset to its message ----------------------------------------------
def test_cat_cq_message_at_a_queue_offset():
    r = next(r for r in messages() if r["topic"] == "TopicA" and r["queueId"] == 0 and r["queueOffset"] == 2)
    result = run("cat-cq", SAMPLE, "TopicA", "0", "--offset", "2", "-n", "1", "--message", "-f", "jsonl")
    row = json.loads(result.stdout)
    assert (row["physical_offset"], row["msg_id"], row["queue_offset"]) == (r["physicalOffset"], r["msgId"], 2)


def test_one_progress_helper_prints_its_description(monkeypatch):
    import io

    from rich.console import Console

    from rmqtool.cli import output
    buf = io.StringIO()
    monkeypatch.setattr(output, "stderr_console", lambda: Console(file=buf, force_terminal=True, width=100))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with output.progress_bar(1000, "verifying") as advance:
        advance(500)
    assert "verifying" in buf.getvalue() and "[progress.description]" not in buf.getvalue()


def test_cjk_text_aligns_in_plain():
    from wcwidth import wcswidth

    out = run("cat-commitlog", SAMPLE, "-f", "plain", "--fields", "tags,keys,topic,physical_offset").stdout
    assert len(out.splitlines()) < 1000       # all rows in the sample that sizes the columns
    lines = out.splitlines()[2:]
    assert any(wcswidth(line) != len(line) for line in lines)            # wide characters present
    assert len({wcswidth(line) - len(line.rsplit(None, 1)[1]) for line in lines}) == 1


def test_fields_on_every_command_that_prints_rows():
    from rmqtool.cli import cli as group
    for name, cmd in group.commands.items():
        if any(p.name == "tablefmt" for p in cmd.params):
            assert any("--fields" in p.opts for p in cmd.params if isinstance(p, click.Option)), name
    out = run("cat-cq", SAMPLE, "TopicA", "0", "-n", "2", "--fields", "queue_offset,physical_offset", "-f", "csv")
    assert out.stdout.splitlines()[0] == "queue_offset,physical_offset"
    bad = run("cat-cq", SAMPLE, "TopicA", "0", "--fields", "nope")
    assert bad.exit_code == 2 and "unknown field" in bad.stderr


def test_on_a_narrow_terminal_a_row_fits_and_ids_stay_whole(monkeypatch):
    import io

    from rich.cells import cell_len

    from rmqtool.cli.output import Format, write_rows

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("COLUMNS", "80")
    rows = [{"physical_offset": r["physicalOffset"], "store_timestamp": r["storeTimestamp"], "topic": r["topic"],
             "queue_id": r["queueId"], "queue_offset": r["queueOffset"], "keys": r["keys"], "body": "x" * 100}
            for r in messages()[:20]]
    for fmt in (Format.TABLE, Format.PLAIN):
        out = Tty()
        write_rows(iter(rows), fmt, optional=("queue_offset", "queue_id", "keys"), out=out)
        lines = out.getvalue().splitlines()
        stamps = [dt.datetime.fromtimestamp(r["store_timestamp"] / 1000, dt.timezone.utc)
                  .strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] for r in rows]
        if fmt is Format.TABLE:         # a table always fits: a topic wider than the screen makes it records
            assert max(map(cell_len, lines)) <= 80 and "physical_offset: " in out.getvalue(), out.getvalue()
            assert [line.split()[1] for line in lines if line.startswith("store_timestamp:")] == \
                [s.split()[0] for s in stamps]
            continue
        # plain: whole IDs, times and names may leave no room: then free text is at its narrowest
        assert max(map(cell_len, lines)) <= 80 or all("xxxxx… " in line for line in lines if "2026-" in line), \
            out.getvalue()
        assert all(re.search(rf"(?<!\d){r['physical_offset']}(?!\d)", line) and stamp in line
                   for r, stamp, line in zip(rows, stamps, [x for x in lines if "2026-" in x]))
        assert "queue_offset" not in lines[0 if fmt is Format.PLAIN else 1]


def test_progress_on_a_terminal_leaves_the_data_on_stdout(big_store):
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "rmqtool", "cat-commitlog", str(big_store), "-f", "csv",
                               "--fields", "physical_offset"], stdout=subprocess.PIPE, stderr=slave, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(slave)
        os.close(master)
    assert proc.returncode == 0
    lines = proc.stdout.decode().splitlines()
    assert lines[0] == "physical_offset" and len(lines) > 40000


def test_verdict_lines_fit_a_terminal_whole():
    """verify's verdict on an 80-column terminal: broken at spaces into lines that fit, the same words as
    the one line a pipe gets."""
    import pty

    store = str(store_path("dev-damage-midfile-magic-533"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", "RMQTOOL_NO_PROGRESS": "1"}
    argv = [sys.executable, "-m", "rmqtool", "verify", store, "-f", "plain"]
    piped = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=slave, timeout=120, env=env)
        shown = os.read(master, 1 << 16).decode().replace("\r", "")
    finally:
        os.close(slave)
        os.close(master)
    verdict = piped.stderr.splitlines()[-1]
    assert proc.returncode == piped.returncode == 1 and len(verdict) > 80 and verdict.startswith("4.9.7: ")
    lines = shown.splitlines()
    assert max(map(len, lines)) <= 80 and len(lines) > len(piped.stderr.splitlines())
    assert " ".join(shown.split()) == " ".join(piped.stderr.split())


def test_fields_pick_keys_of_single_objects():
    assert json.loads(run("info", SAMPLE, "-f", "jsonl", "--fields", "messages,topics").stdout) == \
        {"messages": len(messages()), "topics": len({r["topic"] for r in messages()})}
    out = run("info", SAMPLE, "-f", "plain", "--fields", "messages,index_files").stdout
    assert "messages" in out and "index files" in out and "consume queues" not in out
    assert run("checkpoint", SAMPLE, "-f", "record", "--fields", "confirm_phy_offset").stdout == \
        "confirm_phy_offset: 0\n"


@pytest.mark.parametrize("kind", ["stats", "export-file", "export-text-in-place", "export-dataset", "grep"])
def test_progress_advances_by_bytes_within_a_file(big_store, kind, tmp_path, monkeypatch):
    """Each bulk engine reports the bytes scanned batch by batch, summing to the input size (an export
    written in place: its count and its writing together)."""
    from rmqtool.ops import dataset, export, grep, scan, stats
    from rmqtool.ops.filters import RecordFilter

    files = scan.list_files([str(big_store)])
    calls: list[int] = []
    if kind == "stats":
        stats.stats_local(files, "topic", progress=calls.append)
    elif kind == "export-file":
        export.export_local([str(big_store)], tmp_path / "a.parquet", "parquet", progress=calls.append)
    elif kind == "export-text-in-place":                   # the count told as the first fifth
        from rmqtool.ops import workers

        told, real = [], workers.process_map
        monkeypatch.setattr(workers, "process_map", lambda *args: told.append(sum(calls)) or real(*args))
        export.export_local([str(big_store)], tmp_path / "a.jsonl", "jsonl", progress=calls.append, jobs=2)
        assert told == [0, sum(f.size for f in files) // 5]
    elif kind == "export-dataset":
        dataset.export_dataset([str(big_store)], tmp_path / "d", progress=calls.append)
    else:
        list(grep.grep_local(files, RecordFilter(topics=("nothing",)), progress=calls.append))
    assert sum(calls) == sum(f.size for f in files)
    assert len(calls) >= len(files) and calls[0] < files[0].size          # from the batches, not per file


def test_markup_table_formats_keep_their_escaping():
    out = run("cat-commitlog", SAMPLE, "--offset", "3948", "-n", "1", "-f", "plain", "--tablefmt", "html",
              "--fields", "physical_offset,keys").stdout
    assert out.startswith("<table>") and "&quot;" in out and '"key' not in out


# -- names, IDs, offsets and timestamps are never cut (issue: config, timer, topics, groups) ---------------
LONG_TOPIC = next(r["topic"] for r in messages() if len(r["topic"]) > 100)


@pytest.mark.parametrize("fmt", ["plain", "table", "record", "csv", "tsv"])
def test_long_names_print_whole_in_every_format(fmt):
    out = run("cat-commitlog", SAMPLE, "--topic", LONG_TOPIC, "-f", fmt, env={"COLUMNS": "80"}).stdout
    assert out.count(LONG_TOPIC) == sum(r["topic"] == LONG_TOPIC for r in messages())


@pytest.mark.parametrize("args,whole", [
    (["config", "dev-config-5x"], ["subscriptionGroup.json", "consumerOffset.json"]),
    (["timer", "dev-timer-5x"], ["2026-11-23 10:17:31.000", "pending(roll: re-enqueued at slot time)"]),
    (["timer", "dev-timer-5x", "--slots"], ["2026-11-23 06:59:15.000"]),
    (["topics", "dev-config-5x"], ["rmq_sys_SYNC_BROKER_MEMBER_broker-a", "rmq_sys_REVIVE_LOG_DefaultCluster"]),
    (["groups", "dev-config-5x"], ["CID_ONSAPI_PERMISSION"]),
])
def test_metadata_tables_fit_their_rows_in_plain(args, whole):
    result = run(args[0], store_path(args[1]), *args[2:], "-f", "plain")
    assert result.exit_code in (0, 1), result.output
    from rich.cells import cell_len

    lines = ["".join(ch if cell_len(ch) == 1 else "WW" for ch in line) for line in result.stdout.splitlines()]
    for text in whole:
        assert text in result.stdout
    rule = lines[1]
    assert set(rule) <= {"-", " "}
    starts = [i for i in range(len(rule)) if rule[i] == "-" and (i == 0 or rule[i - 1] == " ")]
    for line in lines[2:]:                 # every row's cells start where the header's columns do
        assert all(line[i - 2:i] in ("  ", "") for i in starts[1:] if i <= len(line)), line
    assert "…" not in result.stdout


@pytest.mark.parametrize("fmt,sep", [("csv", ","), ("tsv", "\t")])
def test_tsv_and_no_headers(fmt, sep):
    rows = run("cat-cq", SAMPLE, "TopicA", "0", "-f", fmt, "--fields", "queue_offset,physical_offset").stdout
    bare = run("cat-cq", SAMPLE, "TopicA", "0", "-f", fmt, "--fields", "queue_offset,physical_offset",
               "--no-headers").stdout
    assert rows.splitlines()[0] == f"queue_offset{sep}physical_offset"
    assert bare.splitlines() == rows.splitlines()[1:]
    assert bare.splitlines()[:2] == [f"0{sep}257", f"1{sep}15905"]


def test_no_headers_in_tables():
    plain = run("topics", store_path("dev-config-5x"), "-f", "plain", "--no-headers").stdout.splitlines()
    assert plain[0].startswith("BatchTopic ") and not any(set(line) <= {"-", " "} for line in plain)
    grid = run("topics", store_path("dev-config-5x"), "-f", "plain", "--tablefmt", "grid", "--no-headers").stdout
    assert grid.startswith("+---") and "| topic" not in grid


def test_an_unknown_tablefmt_is_refused():
    result = run("topics", store_path("dev-config-5x"), "-f", "plain", "--tablefmt", "nope")
    assert result.exit_code == 2 and "'nope' is not a table format" in result.stderr and result.stdout == ""


def test_sizes_are_rich_decimal_sizes():
    from rich.filesize import decimal

    rows = {r["topic"]: r["bytes"] for r in map(json.loads, run("stats", SAMPLE, "--by", "topic", "-f", "jsonl")
                                                  .stdout.splitlines())}
    plain = run("stats", SAMPLE, "--by", "topic", "-f", "plain", "--fields", "topic,bytes").stdout.splitlines()[2:]
    shown = dict((topic, size.strip()) for topic, size in (line.split(None, 1) for line in plain))
    assert shown == {t: decimal(b) for t, b in rows.items()}
    assert any(b < 1000 for b in rows.values())            # "… bytes", as rich writes it
    # what rich writes (powers of 1000, one decimal): the sizes the README and man pages show
    assert (shown["RawTopic"], shown["TopicA"], rows["RawTopic"], rows["TopicA"]) == ("454 bytes", "45.5 kB", 454, 45497)
    assert [decimal(n) for n in (0, 1, 999, 1000, 65536, 66999793)] == [
        "0 bytes", "1 byte", "999 bytes", "1.0 kB", "65.5 kB", "67.0 MB"]
