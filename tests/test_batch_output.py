"""Output at the scan's pace: plain, table and JSON built a record batch at a time print exactly what
the row-by-row writers print (``write_records`` over ``hit_rows``) for the same records, on random
records with wide, combining, control and invalid characters, terminal widths and every option the
batch path takes; and cat-commitlog takes the batch path on the fixtures with the same text."""

from __future__ import annotations

import contextlib
import io
import os

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rmqtool.cli.batch_output as batch_output
import rmqtool.cli.output as output
import rmqtool.cli.read as read
from rmqtool.cli.output import FIELDS_META, NO_HEADERS_META, Format
from rmqtool.cli.read import NARROW_DROPS, SCAN_COLUMNS, TABLE_BODY_CHARS, people_rows, row_encoding, write_records
from rmqtool.columnar import iter_record_batches
from rmqtool.format.commitlog import Message, encode_message
from rmqtool.format.hosts import Host
from rmqtool.format.rows import RECORD_FIELDS
from rmqtool.ops.grep import hit_rows
from rmqtool.store.appender import CommitLogAppender, FileSink
from tests.conftest import run, store_path

# characters that take 0, 1 or 2 terminal cells, escapes, JSON specials, Unicode spaces, the cut mark
_NASTY = ("a", "Z", " ", "~", "\x00", "\x1b", "\n", "\t", "\x7f", "\x85", "\x9b", "\xa0", "é", "ß", "Ж", "中", "語",
          "\u0301", "\u200b", "\u200d", "\ufe0f", "👍", "\U0001f1e9", "\U0001f1ea", "\u3000", "\u2028", "…", '"', "\\", "ü", "ｱ", "\uffff")
_TEXT = st.text(st.sampled_from(_NASTY), max_size=70)
_WORD = st.text(st.sampled_from(_NASTY).filter(lambda c: c not in "\x01\x02 "), min_size=1, max_size=12)


@st.composite
def _records(draw) -> list[Message]:
    msgs = []
    for i in range(draw(st.integers(1, 14))):
        props = {"TAGS": draw(_WORD)} if draw(st.booleans()) else {}
        keys = draw(st.lists(_WORD, max_size=3))
        if keys:
            props["KEYS"] = " ".join(keys)
        if draw(st.booleans()):
            props[draw(_WORD)] = draw(_TEXT.filter(lambda t: "\x01" not in t and "\x02" not in t))
        body = draw(st.one_of(_TEXT.map(str.encode), st.binary(max_size=50), st.just(b"x" * 70)))
        msgs.append(Message(
            topic=draw(st.one_of(st.sampled_from(["T", "TopicA", "x" * 90]), _WORD)), body=body,
            properties_raw="\x02".join(f"{k}\x01{v}" for k, v in props.items()).encode(),
            queue_id=i % 3, flag=0, queue_offset=i, sys_flag=0,
            born_timestamp=draw(st.sampled_from([0, 1, 1767225600001, 8590417229352, 200000846885253])),
            born_host=Host(bytes([10, 0, 0, 1]), 1000), store_host=Host(bytes([10, 0, 0, 2]), 10911),
            store_timestamp=draw(st.integers(1, 2**43)), reconsume_times=0))
    return msgs


def _batches(tmp_path_factory, msgs: list[Message], batch_rows: int):
    d = tmp_path_factory.mktemp("cl") / "commitlog"
    file_size = 1600                        # small files: BLANK records at the file ends
    sink = FileSink(d, file_size)
    sink(0, 0, b"")
    out = CommitLogAppender(file_size, 0, sink)
    for m in msgs:
        size = len(encode_message(m))
        if size + 8 <= file_size:
            out.write(encode_message(Message(**{**{k: getattr(m, k) for k in Message.__slots__},
                                                "physical_offset": out.reserve(size)})))
    sink.close()
    return list(iter_record_batches(d, check_crc=True, batch_rows=batch_rows))


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _both(batches, fmt: Format, tablefmt: str, body: str | None, fields, headers: bool, columns: int | None):
    """(row path, batch path) output of the same batches."""
    printed = []
    for batch_path in (False, True):
        out = _Terminal() if columns else io.StringIO()
        env = {"COLUMNS": str(columns)} if columns else {}
        with click.Context(click.Command("cat-commitlog")) as ctx, contextlib.redirect_stdout(out), \
                _environ(env):
            if fields:
                ctx.meta[FIELDS_META] = fields
            if not headers:
                ctx.meta[NO_HEADERS_META] = True
            enc = row_encoding(body, fmt, None)
            if not batch_path:
                write_records(hit_rows(iter(batches), enc), fmt, tablefmt, SCAN_COLUMNS, body=body)
            elif fmt is Format.JSON:
                batch_output.write_json_batches(iter(batches), enc, out)
            else:
                batch_output.write_table_batches(iter(batches), fmt, SCAN_COLUMNS, tablefmt, out, body=body,
                                                 body_chars=TABLE_BODY_CHARS, optional=NARROW_DROPS,
                                                 records=lambda bs: people_rows(bs, fmt, body))
        printed.append(out.getvalue())
    return printed


@contextlib.contextmanager
def _environ(env: dict):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msgs=_records(), batch_rows=st.sampled_from([1, 3, 100]), sample=st.sampled_from([2, 5, 1000]),
       fmt=st.sampled_from([Format.PLAIN, Format.TABLE]),
       tablefmt=st.sampled_from(["simple", "grid", "github", "tsv", "plain", "rst"]),
       body=st.sampled_from([None, "text", "hex", "base64", "none"]),
       fields=st.sampled_from([None, ["topic", "body", "keys"], RECORD_FIELDS + ["crc_ok"], ["body_encoding", "tags"],
                               ["keys", "topic"], ["born_timestamp", "properties"]]),
       headers=st.booleans(), columns=st.sampled_from([None, 30, 80, 200]))
def test_tables_a_batch_at_a_time_are_the_row_writers_text(tmp_path_factory, monkeypatch, msgs, batch_rows, sample,
                                                           fmt, tablefmt, body, fields, headers, columns):
    batches = _batches(tmp_path_factory, msgs, batch_rows)
    with monkeypatch.context() as m:
        m.setattr(output, "SAMPLE_ROWS", sample)           # later rows stream in the first rows' widths
        m.setattr(batch_output, "SAMPLE_ROWS", sample)
        rows, by_batch = _both(batches, fmt, "simple" if fmt is Format.TABLE else tablefmt, body, fields, headers,
                               columns)
    assert by_batch == rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msgs=_records(), batch_rows=st.sampled_from([1, 4, 100]), body=st.sampled_from([None, "hex", "none"]))
def test_json_a_batch_at_a_time_is_the_row_writers_text(tmp_path_factory, msgs, batch_rows, body):
    batches = _batches(tmp_path_factory, msgs, batch_rows)
    rows, by_batch = _both(batches, Format.JSON, "simple", body, None, True, None)
    assert by_batch == rows
    assert _both([], Format.JSON, "simple", body, None, True, None) == ["[]\n", "[]\n"]


def _export_csv_reference(rows: list[dict]) -> bytes:
    """What ``export`` wrote with pyarrow's CSV writer (quoting "needed": every string quoted, numbers
    and booleans bare, None empty), from the rows."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    cols = {}
    for name in rows[0]:
        values = [output.csv_cell(r[name]) if isinstance(r[name], (dict, list, bytes)) else r[name] for r in rows]
        cols[name] = pa.array(values)
    out = io.BytesIO()
    pacsv.write_csv(pa.table(cols), out, pacsv.WriteOptions(quoting_style="needed"))
    return out.getvalue()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msgs=_records(), batch_rows=st.sampled_from([1, 4, 100]),
       body=st.sampled_from(["base64", "text", "hex", "none"]))
def test_json_and_csv_lines_are_the_row_writers_bytes(tmp_path_factory, msgs, batch_rows, body):
    """JSON lines, cat-commitlog's CSV and export's CSV (one compiled pass over a batch's columns) are
    byte for byte ``dumps(entry_row)``, the csv writer's rows and pyarrow's CSV writer's."""
    from rmqtool.columnar.text import csv_header, export_csv_header, text_bytes, text_chunks

    batches = _batches(tmp_path_factory, msgs, batch_rows)
    rows = list(hit_rows(iter(batches), body))
    assert b"".join(text_bytes(b, body, "json") for b in batches) == \
        "".join(output.dumps(r) + "\n" for r in rows).encode()
    want = io.StringIO()
    output._write_csv(rows, None, want)
    assert (csv_header(batches[0]) + "".join(bytes(text_bytes(b, body, "csv")).decode() for b in batches)) == \
        want.getvalue()
    assert export_csv_header(batches[0]).encode() + b"".join(text_bytes(b, body, "export_csv") for b in batches) \
        == _export_csv_reference(rows)
    for style in ("json", "csv", "export_csv"):          # what the writers write: a few lines at a time
        assert [b"".join(bytes(c) for c in text_chunks(b, body, style, rows)) for b in batches for rows in (1, 3)] \
            == [bytes(text_bytes(b, body, style)) for b in batches for _ in (1, 3)]


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x", "dev-batchcq-5x", "dev-dledger-5x"])
@pytest.mark.parametrize("args", [["-f", "plain"], ["-f", "table", "--check-crc"], ["-f", "json"],
                                  ["-f", "plain", "--tablefmt", "grid", "--body-encoding", "hex"]])
def test_cat_commitlog_batches_print_the_row_path_text(monkeypatch, name, args):
    """The whole command: the batch path (taken; the fixtures are small enough for the record-at-a-time path
    otherwise) against the row path (forced) on the fixtures."""
    monkeypatch.setattr(read, "FEW_BYTES", 0)
    taken = []
    for fn in ("write_table_batches", "write_json_batches"):
        real = getattr(batch_output, fn)
        monkeypatch.setattr(batch_output, fn, lambda *a, _real=real, **k: taken.append(fn) or _real(*a, **k))
    fast = run("cat-commitlog", store_path(name), *args)
    assert taken and fast.exit_code == 0
    monkeypatch.setattr(batch_output, "table_supported", lambda *a: False)
    monkeypatch.setattr(batch_output, "write_json_batches",
                        lambda batches, enc, out: output.write_rows(hit_rows(batches, enc), Format.JSON, out=out))
    slow = run("cat-commitlog", store_path(name), *args)
    assert slow.exit_code == 0 and fast.stdout == slow.stdout and len(fast.stdout.splitlines()) > 20


@pytest.mark.parametrize("name", ["dev-sample", "dev-dledger"])
@pytest.mark.parametrize("filters", [["--body-regex", "order-42"], ["--body-regex", "emoji", "--topic", "TopicB"],
                                     ["--key", "key-82"]])
def test_cat_commitlog_small_store_path_filters_as_the_scan_does(monkeypatch, name, filters):
    """A small store's record-at-a-time path keeps the records the columnar scan keeps, the body regex
    searching decompressed bodies (a third of these matches are in compressed records)."""
    small = run("cat-commitlog", store_path(name), *filters, "-f", "jsonl")
    monkeypatch.setattr(read, "FEW_BYTES", 0)
    scan = run("cat-commitlog", store_path(name), *filters, "-f", "jsonl")
    assert small.exit_code == scan.exit_code and small.stdout == scan.stdout
    assert small.stdout.count("\n") >= 20 or filters[0] != "--body-regex" or "--topic" in filters


def _as_views(batch):
    """The batch with its strings and binaries as view types (what the decoder may give)."""
    import pyarrow as pa

    views = {pa.string(): pa.string_view(), pa.binary(): pa.binary_view()}
    cols = []
    for col in batch.columns:
        t = col.type
        if t in views:
            col = col.cast(views[t])
        elif pa.types.is_list(t) and t.value_type in views:
            col = col.cast(pa.list_(views[t.value_type]))
        elif pa.types.is_map(t):
            col = col.cast(pa.map_(views[t.key_type], views[t.item_type]))
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, names=batch.schema.names)


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x"])
def test_view_typed_batches_print_the_same_text(name):
    """binary_view / string_view columns (lists and maps of them too) give the same bytes in every format."""
    from rmqtool.columnar.text import csv_lines, json_lines

    batches = list(iter_record_batches(store_path(name), check_crc=True, batch_rows=50))
    views = [_as_views(b) for b in batches]
    assert str(views[0].schema.field("body").type) == "binary_view"
    for enc in ("base64", "text", "hex"):
        for fn in (json_lines, csv_lines):
            assert [fn(v, enc) for v in views] == [fn(b, enc) for b in batches]
    for fmt in (Format.PLAIN, Format.TABLE, Format.JSON):
        assert _both(views, fmt, "simple", None, None, True, None)[1] == _both(batches, fmt, "simple", None, None,
                                                                                True, None)[0]


@pytest.mark.parametrize("command,fmt", [("cat-commitlog", "jsonl"), ("cat-commitlog", "plain"), ("grep", "plain"),
                                         ("grep", "jsonl")])
def test_bulk_printing_spares_the_pandas_import(command, fmt):
    """pyarrow's first conversion would import pandas only to ask whether a value is a pandas object;
    cat-commitlog and grep hand it none and skip that probe (~0.2 CPU-s of their start-up)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "rmqtool", command,
                             str(store_path("dev-sample")), "-f", fmt], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and len(result.stdout.splitlines()) > 100
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert not any(name.startswith("pandas.") for name in imported)   # a probe's failed "import pandas" shows
    # as one line: its submodules show where pandas really loads. cat-commitlog over a commit log of up to
    # 1 MiB (this one) takes the record-at-a-time decoder and imports no pyarrow at all
    assert ("pyarrow" in imported) == (command == "grep")


def test_pyarrow_still_finds_pandas_where_it_needs_it():
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys; from rmqtool.cli.output import skip_pandas_probe; skip_pandas_probe(); "
            "import pyarrow as pa; pa.array([1]); assert 'pandas' not in sys.modules; "
            "print(pa.table({'a': [1, 2]}).to_pandas()['a'].sum())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and result.stdout.strip() == "3", result.stderr
