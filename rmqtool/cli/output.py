"""Rendering rows for people and scripts: table (rich), plain (tabulate), json, jsonl, csv.

Rows are dicts with the documented field names; output is streamed row by row. Data goes to stdout,
everything else to stderr.
"""

from __future__ import annotations

import csv
import datetime as dt
import enum
import json
import sys
from typing import Any, Callable, Iterable, Iterator

import click


class Format(str, enum.Enum):
    TABLE = "table"
    JSON = "json"
    JSONL = "jsonl"
    CSV = "csv"
    PLAIN = "plain"


FORMAT_CHOICES = [f.value for f in Format]
TIMESTAMP_FIELDS = frozenset({"born_timestamp", "store_timestamp", "begin_timestamp", "end_timestamp",
                              "physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp",
                              "min_store_timestamp", "max_store_timestamp", "deliver_timestamp",
                              "min_timestamp", "min_timestamp_index", "created_timestamp"})


def resolve_format(value: str | None) -> Format:
    """The --format value; by default a table on a terminal and jsonl in a pipe."""
    if value:
        return Format(value)
    return Format.TABLE if sys.stdout.isatty() else Format.JSONL


def output_options(fn: Callable) -> Callable:
    """--format and --tablefmt, shared by every command that prints rows."""
    fn = click.option("--tablefmt", default="simple", show_default=True, metavar="NAME",
                      help="tabulate table format for --format plain (github, grid, psql, ...).")(fn)
    fn = click.option("--format", "-f", "fmt", type=click.Choice(FORMAT_CHOICES), default=None,
                      envvar="RMQTOOL_FORMAT",
                      help="Output format [default: table on a terminal, jsonl otherwise].")(fn)
    return fn


def format_timestamp(ms: int | None) -> str:
    if ms is None:
        return ""
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except (OverflowError, OSError, ValueError):
        return str(ms)


class Timestamp(click.ParamType):
    """A point in time: epoch milliseconds, or ISO-8601 (a time without a zone is UTC)."""

    name = "TIME"

    def convert(self, value: Any, param, ctx) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            self.fail(f"{value!r} is neither epoch milliseconds nor an ISO-8601 time", param, ctx)
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        return (when - _EPOCH) // dt.timedelta(milliseconds=1)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
TIMESTAMP = Timestamp()


def _cell(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key in TIMESTAMP_FIELDS and isinstance(value, int):
        return format_timestamp(value) if value > 0 else str(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        import base64
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, enum.Enum):
        return value.value
    return str(value)


def dumps(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False, default=_json_default, separators=(",", ":"))


def write_rows(rows: Iterable[dict], fmt: Format, *, columns: list[str] | None = None,
               tablefmt: str = "simple", title: str | None = None, out=None) -> int:
    """Write rows in the chosen format; returns the number of rows written."""
    out = out or sys.stdout
    if fmt is Format.JSONL:
        n = 0
        for row in rows:
            out.write(dumps(row) + "\n")
            n += 1
        return n
    if fmt is Format.JSON:
        n = 0
        out.write("[")
        for row in rows:
            out.write(("\n" if n == 0 else ",\n") + dumps(row))
            n += 1
        out.write("\n]\n" if n else "]\n")
        return n
    if fmt is Format.CSV:
        return _write_csv(rows, columns, out)
    rows = list(rows)
    cols = columns or _columns(rows)
    cells = [[_cell(c, r.get(c)) for c in cols] for r in rows]
    if fmt is Format.PLAIN:
        from tabulate import tabulate
        if rows:
            out.write(tabulate(cells, headers=cols, tablefmt=tablefmt, disable_numparse=True) + "\n")
        return len(rows)
    if rows:
        _rich_table(cols, cells, title, out)
    return len(rows)


def _columns(rows: list[dict]) -> list[str]:
    cols: dict[str, None] = {}
    for r in rows:
        cols.update(dict.fromkeys(r))
    return list(cols)


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return dumps(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _json_default(value)
    return value


def _write_csv(rows: Iterable[dict], columns: list[str] | None, out) -> int:
    it: Iterator[dict] = iter(rows)
    first = next(it, None)
    if first is None:
        return 0
    cols = columns or list(first)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(cols)
    writer.writerow([_csv_cell(first.get(c)) for c in cols])
    n = 1
    for row in it:
        writer.writerow([_csv_cell(row.get(c)) for c in cols])
        n += 1
    return n


def _rich_table(cols: list[str], cells: list[list[str]], title: str | None, out) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False, highlight=False)
    for c in cols:
        table.add_column(c, overflow="fold")
    for row in cells:
        table.add_row(*row)
    Console(file=out, markup=False, highlight=False, soft_wrap=False).print(table)


def write_record(row: dict, fmt: Format, out=None, tablefmt: str = "simple") -> None:
    """One object (e.g. a header or a summary): key/value pairs for people, one line for scripts."""
    out = out or sys.stdout
    if fmt in (Format.JSONL, Format.JSON):
        out.write((json.dumps(row, ensure_ascii=False, default=_json_default, indent=2)
                   if fmt is Format.JSON else dumps(row)) + "\n")
        return
    pairs = [{"field": k, "value": _cell(k, v)} for k, v in row.items()]
    if fmt is Format.CSV:
        _write_csv([row], None, out)
    else:
        write_rows(pairs, fmt, columns=["field", "value"], tablefmt=tablefmt, out=out)


def stderr_console():
    from rich.console import Console
    return Console(stderr=True, markup=False, highlight=False)

