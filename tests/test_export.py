"""rmqtool export: Parquet, JSON lines and CSV against the record-at-a-time rows, and the command's
behaviour on bad input."""

from __future__ import annotations

import csv
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmqtool.format.rows import csv_cell, dumps
from rmqtool.format.rows import entry_row
from rmqtool.store.store import Store
from tests.conftest import CLEAN_SETS, FIXTURES, run, store_path
from tests.test_columnar import reference


def rows_of(path, body_encoding="base64", check_crc=False):
    return [entry_row(loc.entry, loc.offset, body_encoding=body_encoding, check_crc=check_crc)
            for loc in Store.open(path).commitlog.iter_entries()]


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_jsonl_lines_equal_cat_commitlog_rows(name, tmp_path):
    out = tmp_path / "out.jsonl"
    result = run("export", store_path(name), "--to", out, "--check-crc", "--include-blank")
    assert result.exit_code == 0, result.output
    want = [dumps(r) for r in rows_of(store_path(name), check_crc=True)]
    assert out.read_text("utf-8").splitlines() == want
    assert json.loads(want[0])["type"] == "message"


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_parquet_columns_and_values(name, tmp_path):
    out = tmp_path / "records.parquet"
    assert run("export", store_path(name), "--to", out, "--include-blank").exit_code == 0
    table = pq.read_table(out)
    assert table.schema.field("born_timestamp").type == pa.timestamp("ms", "UTC")
    assert table.schema.field("properties").type == pa.map_(pa.string(), pa.string())
    assert table.schema.field("body").type == pa.binary()
    expected, _ = reference(store_path(name))
    for name_ in ("born_timestamp", "store_timestamp"):
        table = table.set_column(table.schema.get_field_index(name_), name_, table[name_].cast(pa.int64()))
    got = table.to_pylist()
    assert len(got) == len(expected)
    for have, want in zip(got, expected):
        want = {k: v for k, v in want.items() if k != "crc_ok"}
        assert have.pop("store") == str(store_path(name))
        assert int(os.path.basename(have.pop("commitlog_file"))) <= have["physical_offset"]
        assert have == want


def test_csv_cells_equal_cat_commitlog_cells(tmp_path):
    out = tmp_path / "x.csv"
    assert run("export", store_path("dev-sample-5x"), "--to", out, "--body-encoding", "text", "--check-crc",
               "--include-blank").exit_code == 0
    with open(out, newline="", encoding="utf-8") as fh:
        got = list(csv.DictReader(fh))
    want = rows_of(store_path("dev-sample-5x"), "text", check_crc=True)
    assert len(got) == len(want)
    for have, row in zip(got, want):
        assert have == {k: str(csv_cell(v)) for k, v in row.items()}


def test_format_option_overrides_extension_and_several_stores(tmp_path):
    out = tmp_path / "out.data"
    result = run("export", store_path("dev-sample"), store_path("dev-sample-5x"), "--to", out, "-f", "jsonl",
                 "--include-blank")
    assert result.exit_code == 0, result.output
    lines = out.read_text("utf-8").splitlines()
    assert len(lines) == len(rows_of(store_path("dev-sample"))) + len(rows_of(store_path("dev-sample-5x")))


def test_unknown_extension_and_existing_output(tmp_path):
    result = run("export", store_path("dev-sample"), "--to", tmp_path / "out.data")
    assert result.exit_code == 4 and "--format" in result.output
    out = tmp_path / "o.jsonl"
    out.write_text("keep")
    result = run("export", store_path("dev-sample"), "--to", out)
    assert result.exit_code == 4 and "--force" in result.output and out.read_text() == "keep"
    assert run("export", store_path("dev-sample"), "--to", out, "--force").exit_code == 0


def test_damaged_store_fails_cleanly_or_stops_at_damage(tmp_path):
    torn = FIXTURES / "dev-sample-crash-torn" / "store"
    out = tmp_path / "t.jsonl"
    result = run("export", torn, "--to", out)
    assert result.exit_code == 3
    assert result.output.count("\n") == 1 and "offset 279071" in result.output
    assert not out.exists() and not list(tmp_path.iterdir())
    result = run("export", torn, "--to", out, "--read-anyway", "--include-blank")
    assert result.exit_code == 3 and "offset 279071" in result.output
    expected, error = reference(torn)
    assert error and len(out.read_text().splitlines()) == len(expected)


def test_missing_store(tmp_path):
    result = run("export", tmp_path / "nope", "--to", tmp_path / "o.parquet")
    assert result.exit_code == 4 and result.output.startswith("rmqtool: error:")


def test_parquet_export_in_process_spares_the_pandas_import(tmp_path):
    """Export called as a library (no CLI probe skipped): its batches, message counts and file column
    hand pyarrow no Python value, so pandas (~0.2 CPU-s) stays unimported (a generated store: the real
    fixtures' PROPERTIES take the record-at-a-time parser, which builds its columns with pa.array)."""
    import subprocess
    import sys

    from rmqtool.ops.generate import generate_store
    from tests.conftest import ROOT

    generate_store(tmp_path / "store", 1 << 20, index=False, seed=1)
    code = ("import sys; from rmqtool.ops.export import export_local; "
            f"r = export_local([{str(tmp_path / 'store')!r}], {str(tmp_path / 'o.parquet')!r}, 'parquet'); "
            "assert r.messages > 0; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_export_leaves_the_garbage_collector_as_it_found_it(tmp_path):
    """The cyclic collector is paused for the bulk loop only: back on after an export and after a failed one,
    still off where the caller had turned it off."""
    import gc

    from rmqtool.errors import StoreError
    from rmqtool.ops.export import export_local

    assert gc.isenabled()
    assert export_local([store_path("dev-sample")], tmp_path / "a.parquet", "parquet").records
    assert gc.isenabled()
    with pytest.raises(StoreError):
        export_local([tmp_path / "nope"], tmp_path / "b.parquet", "parquet")
    assert gc.isenabled() and not (tmp_path / "b.parquet").exists()
    gc.disable()
    try:
        export_local([store_path("dev-sample")], tmp_path / "c.jsonl", "jsonl")
        assert not gc.isenabled()
    finally:
        gc.enable()
