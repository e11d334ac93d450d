"""Rendering rows for people and scripts: table (rich), plain (tabulate), record (one field per line),
json, jsonl, csv, tsv.

Rows are dicts with the documented field names. Every format streams: tables get fixed column widths
(from all rows when the caller has them in a list, else from the field types) and print each row as it
comes. Human formats (table, plain, record) escape control characters and show sizes and dates for
people; machine formats carry the values exactly. No format cuts IDs, offsets, timestamps or names: only
free text (bodies, properties) may end in "…" in a table; a finding's message and a plan's detail wrap
onto more lines instead. On a terminal a table fits the screen: optional columns go, free text narrows,
and a table that still does not fit prints in the record layout, whose values wrap at the screen's edge
(``plain`` stays as wide as its widest row). Data goes to stdout, everything else to stderr.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime as dt
import enum
import itertools
import json
import os
import re
import shutil
import sys
from typing import Any, Callable, Iterable, Iterator

import click

from rmqtool.format.rows import csv_cell, dumps, json_default


class Format(str, enum.Enum):
    TABLE = "table"
    JSON = "json"
    JSONL = "jsonl"
    CSV = "csv"
    TSV = "tsv"
    PLAIN = "plain"
    RECORD = "record"


FORMAT_CHOICES = [f.value for f in Format]
PEOPLE = (Format.TABLE, Format.PLAIN, Format.RECORD)
TIMESTAMP_FIELDS = frozenset({"born_timestamp", "store_timestamp", "begin_timestamp", "end_timestamp",
                              "physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp",
                              "min_store_timestamp", "max_store_timestamp", "deliver_timestamp",
                              "min_timestamp", "min_timestamp_index", "created_timestamp", "time_stamp"})
SIZE_FIELDS = frozenset({"bytes", "commitlog_file_size", "commitlog_bytes", "file_size", "input_bytes"})
# A table's columns fit its first SAMPLE_ROWS rows (all rows of a shorter output, or of a list the caller
# has); later rows stream in those widths. Only free text (these fields) is ever cut, ending in "…": in a
# streamed table beyond the width given here, and on a terminal while a row does not fit. Every other value
# (IDs, offsets, timestamps, names, keys, tags) is printed whole: a longer one widens its row.
FREE_TEXT_WIDTHS = {"body": 40, "properties": 40, "problems": 30, "detail": 50, "message": 50, "state": 40,
                    "fallback_reason": 50}
# Free text that wraps onto more lines on a terminal rather than being cut (what a finding or plan says).
WRAPPED_FIELDS = frozenset({"message", "detail"})
WRAP_MIN_WIDTH = 24       # the least a wrapped column narrows to
SAMPLE_ROWS = 1000
MARKUP_TABLEFMTS = frozenset({"html", "latex", "latex_booktabs", "latex_longtable", "mediawiki", "moinmoin",
                              "textile", "jira", "asciidoc"})   # tabulate escapes their cells itself
MIN_WIDTH = 6             # the least a text column shrinks to on a narrow terminal


def resolve_format(value: str | None) -> Format:
    """The --format value; by default a table on a terminal and jsonl in a pipe."""
    if value:
        return Format(value)
    return Format.TABLE if sys.stdout.isatty() else Format.JSONL


FIELDS_META = "rmqtool.fields"


def _remember_fields(ctx: click.Context, _param, value: str | None) -> None:
    if value:
        ctx.meta[FIELDS_META] = [f.strip() for f in value.split(",") if f.strip()]


NO_HEADERS_META = "rmqtool.no_headers"


def _remember_no_headers(ctx: click.Context, _param, value: bool) -> None:
    if value:
        ctx.meta[NO_HEADERS_META] = True


def _check_tablefmt(_ctx, param, value: str) -> str:
    """A tabulate format name; another is a usage error naming them."""
    if value != "simple":
        from tabulate import tabulate_formats

        if value not in tabulate_formats:
            raise click.BadParameter(f"{value!r} is not a table format; formats are {', '.join(tabulate_formats)}",
                                     param=param)
    return value


def output_options(fn: Callable) -> Callable:
    """--format, --tablefmt, --fields and --no-headers, shared by every command that prints rows."""
    fn = click.option("--no-headers", is_flag=True, expose_value=False, callback=_remember_no_headers,
                      help="Leave out the header line (csv, tsv, plain, table).")(fn)
    fn = click.option("--fields", metavar="A,B,...", expose_value=False, callback=_remember_fields,
                      help="Only these fields, in this order (default: all; a few in tables).")(fn)
    fn = click.option("--tablefmt", default="simple", show_default=True, metavar="NAME", callback=_check_tablefmt,
                      help="tabulate table format for --format plain (github, grid, psql, ...).")(fn)
    fn = click.option("--format", "-f", "fmt", type=click.Choice(FORMAT_CHOICES), default=None,
                      envvar="RMQTOOL_FORMAT",
                      help="Output format: table, plain (aligned text), record (one field per line), "
                           "jsonl, json, csv, tsv [default: table on a terminal, jsonl otherwise].")(fn)
    return fn


def format_timestamp(ms: int | None) -> str:
    if ms is None:
        return ""
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except (OverflowError, OSError, ValueError):
        return str(ms)


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_NAMED_CONTROLS = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(text: str) -> str:
    """C0/C1 control characters (ESC, CR, LF, BEL, ...) as visible escapes: message bytes never reach
    the terminal as commands."""
    return _CONTROL.sub(lambda m: _NAMED_CONTROLS.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def cell(key: str, value: Any) -> str:
    """One value as people read it (escaped, dates and sizes readable)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key in TIMESTAMP_FIELDS and isinstance(value, int):
        return format_timestamp(value) if value > 0 else str(value)
    if key in SIZE_FIELDS and isinstance(value, int):
        from rich.filesize import decimal          # 66999793 -> '67.0 MB', 999 -> '999 bytes'

        return decimal(value)
    if isinstance(value, (dict, list)):
        return escape(json.dumps(value, ensure_ascii=False))
    return escape(str(value))


class Timestamp(click.ParamType):
    """A point in time: epoch milliseconds, ISO-8601, or what people write ("-2h", "yesterday",
    "2026-11-20 10:00"), read by dateparser. A time without a zone is local time; a relative one counts
    from now (rmqtool.clock: --now, else the system clock)."""

    name = "TIME"

    def convert(self, value: Any, param, ctx) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if re.fullmatch(r"-?\d+", text):
            if not -2**63 <= int(text) < 2**63:         # a Java long, as the broker stores times
                self.fail(f"{value!r} is out of range for a time in epoch milliseconds", param, ctx)
            return int(text)
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            when = _parse_human(text)
        if when is None:
            self.fail(f"{value!r} is not a time (epoch ms, ISO-8601, or e.g. -2h, yesterday, "
                      "'2026-11-20 10:00')", param, ctx)
        if when.tzinfo is None:
            when = when.astimezone()          # local time
        return (when - _EPOCH) // dt.timedelta(milliseconds=1)


def _parse_human(text: str) -> dt.datetime | None:
    import dateparser

    from rmqtool import clock

    base = dt.datetime.fromtimestamp(clock.now_ms() / 1000)         # local, as dateparser's own now
    return dateparser.parse(text, settings={"PREFER_DATES_FROM": "past", "RETURN_AS_TIMEZONE_AWARE": False,
                                            "RELATIVE_BASE": base})


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
TIMESTAMP = Timestamp()


class CalendarTime(Timestamp):
    """A TIME that the month starts around it are computed from (--now, --born): 1970 to November 9999."""

    HIGH = (dt.datetime(9999, 12, 1, tzinfo=dt.timezone.utc) - _EPOCH) // dt.timedelta(milliseconds=1) - 1

    def convert(self, value: Any, param, ctx) -> int:
        ms = super().convert(value, param, ctx)
        if not 0 <= ms <= self.HIGH:
            self.fail(f"{value!r} is out of range (a time from 1970 to November 9999)", param, ctx)
        return ms


CALENDAR_TIME = CalendarTime()


def write_rows(rows: Iterable[dict], fmt: Format, *, columns: list[str] | None = None,
               tablefmt: str = "simple", title: str | None = None, out=None, select: bool = True,
               optional: tuple[str, ...] = ()) -> int:
    """Write rows in the chosen format, each as it comes; returns the number of rows written. When
    ``rows`` is a list, table widths fit its contents, else they come from the field types. The
    command's --fields (when ``select``) replace ``columns``; otherwise the ``optional`` columns are
    left out of a table, in that order, while a row does not fit the terminal."""
    out = out or sys.stdout
    if select and _chosen_fields():
        rows, columns = _select(rows, _chosen_fields())
        optional = ()
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
    if fmt in (Format.CSV, Format.TSV):
        return _write_csv(rows, columns, out, fmt)
    if fmt is Format.RECORD:
        return _write_record_view(rows, columns, out)
    return _write_table(rows, fmt, columns, tablefmt, title, out, optional)


def _chosen_fields() -> list[str] | None:
    """The command's --fields, if given."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(FIELDS_META) if ctx else None


def _headers() -> bool:
    """False under the command's --no-headers."""
    ctx = click.get_current_context(silent=True)
    return not (ctx and ctx.meta.get(NO_HEADERS_META))


def check_fields(fields: list[str], known: Iterable[str]) -> None:
    """A usage error naming the known fields when --fields names another."""
    known = list(known)
    unknown = [f for f in fields if f not in known]
    if unknown:
        raise click.BadParameter(f"unknown field(s) {', '.join(unknown)}; fields are {', '.join(known)}",
                                 param_hint="--fields")


def _select(rows: Iterable[dict], fields: list[str]):
    """(rows, columns) of --fields; an unknown field is a usage error naming the known ones."""
    known = rows if isinstance(rows, list) else None
    it = iter(rows)
    first = next(it, None)
    if first is None:
        return [], fields
    check_fields(fields, first)
    picked = ({f: r.get(f) for f in fields} for r in _chain(first, it))
    return (list(picked) if known is not None else picked), fields


def _write_csv(rows: Iterable[dict], columns: list[str] | None, out, fmt: Format = Format.CSV) -> int:
    """CSV (RFC 4180 quoting) or TSV (tab-separated, no quotes: a cell's tab, newline, carriage return and
    backslash as ``\\t``, ``\\n``, ``\\r``, ``\\\\``, as PostgreSQL's text COPY and MySQL's LOAD DATA read them)."""
    it: Iterator[dict] = iter(rows)
    first = next(it, None)
    if first is None:
        return 0
    cols = columns or list(first)
    if fmt is Format.TSV:
        def writerow(cells: list) -> None:
            out.write("\t".join(_tsv_escape(str(c)) for c in cells) + "\n")
    else:
        writerow = csv.writer(out, lineterminator="\n").writerow
    if _headers():
        writerow(cols)
    n = 0
    for row in _chain(first, it):
        writerow([csv_cell(row.get(c)) for c in cols])
        n += 1
    return n


_TSV_SPECIAL = re.compile(r"[\\\t\n\r]")
_TSV_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _tsv_escape(text: str) -> str:
    return _TSV_SPECIAL.sub(lambda m: _TSV_ESCAPES[m.group()], text)


def _chain(first: dict, rest: Iterator[dict]) -> Iterator[dict]:
    yield first
    yield from rest


def _write_record_view(rows: Iterable[dict], columns: list[str] | None, out) -> int:
    """One ``field: value`` per line, a blank line between records (as mqadmin queryMsgById prints); on a
    terminal a value wider than the screen continues on the next lines, under its first."""
    n = 0
    screen = _screen(out)
    for row in rows:
        cols = columns or list(row)
        width = max(map(len, cols), default=0) + 1
        room = screen - width - 1 if screen else 0
        lines = []
        for c in cols:
            parts = _wrap(cell(c, row.get(c)), room) if room >= WRAP_MIN_WIDTH else [cell(c, row.get(c))]
            lines.append(f"{c + ':':<{width}} {parts[0]}".rstrip(" " if not parts[0] else "") + "\n")
            lines += [" " * (width + 1) + part + "\n" for part in parts[1:]]
        out.write(("\n" if n else "") + "".join(lines))
        out.flush()
        n += 1
    return n


def _screen(out) -> int | None:
    """The terminal's width when ``out`` is a terminal (COLUMNS first, as shutil reads it), else None."""
    if not (hasattr(out, "isatty") and out.isatty()):
        return None
    return shutil.get_terminal_size((200, 24)).columns


def say(text: str) -> None:
    """A status line on stderr; on a terminal, broken at spaces to its width (continued lines indented)."""
    width = _screen(sys.stderr)
    if width and len(text) > width:
        first, *rest = _wrap(text, width)
        text = "\n".join([first, *("  " + line for line in _wrap(" ".join(rest), width - 2))])
    click.echo(text, err=True)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` as lines of at most ``width`` terminal cells, broken at spaces where it has them (whole:
    nothing is left out but the spaces lines break at)."""
    from rich.cells import cell_len, chop_cells

    if cell_len(text) <= width:
        return [text]
    lines, line = [], ""
    for word in text.split(" "):
        joined = f"{line} {word}" if line else word
        if cell_len(joined) <= width:
            line = joined
            continue
        if line:
            lines.append(line)
        parts = chop_cells(word, width) if word else [""]
        lines += parts[:-1]
        line = parts[-1]
    lines.append(line)
    return lines


# -- streamed tables --------------------------------------------------------------------------------
def _write_table(rows: Iterable[dict], fmt: Format, columns: list[str] | None, tablefmt: str,
                 title: str | None, out, optional: tuple[str, ...] = ()) -> int:
    from rich.cells import cell_len

    streamed = not isinstance(rows, list)
    if not streamed:
        sample, rest, failed = rows, iter(()), None
    else:
        rest = iter(rows)
        sample, failed = _head(rest, SAMPLE_ROWS)
    if not sample:
        if failed:
            raise failed
        return 0
    first = sample[0]
    cols = columns or _union(sample)
    texts = [[cell(c, r.get(c)) for c in cols] for r in sample]
    widths = [max([cell_len(c)] + [cell_len(t[i]) for t in texts]) for i, c in enumerate(cols)]
    table = open_table(cols, widths, [_truncates(c, first.get(c)) for c in cols], fmt, tablefmt, title, out,
                       optional, streamed)
    if table is None:                # wider than the terminal: the record layout
        if title and _headers():
            out.write(title + "\n\n")
        n = _write_record_view(itertools.chain(sample, () if failed else rest), cols, out)
        if failed:
            raise failed
        return n
    n = 0
    for row in itertools.chain(sample, () if failed else rest):
        out.write((table.between if n else "") + "".join(
            (text.rstrip() if table.strip else text) + "\n" for text in table.lines(row)))
        out.flush()
        n += 1
    if failed:                       # the rows before a damaged record print, then its error
        raise failed
    out.write(table.tail)
    return n


@dataclasses.dataclass
class TableFrame:
    """A table with fixed column widths whose head is written: ``line(cells)`` renders a row of cells
    already fitted to ``widths``; ``between`` goes before every row but the first, ``tail`` after the
    last; ``strip``: rows lose their trailing blanks (plain); ``wraps``: the columns whose text wraps onto
    more lines rather than being cut (on a terminal)."""
    cols: list[str]
    widths: list[int]
    line: Callable[[list[str]], str]
    parts: list[str] | None          # line(cells) is parts[0] + cells[0] + parts[1] + ... (None: markup)
    between: str
    tail: str
    strip: bool
    wraps: list[bool] = dataclasses.field(default_factory=list)

    def lines(self, row: dict) -> list[str]:
        """The lines of one row: one, or more when a wrapped column's text is wider than its column."""
        texts = [cell(c, row.get(c)) for c in self.cols]
        wrapped = [_wrap(t, w) if wrap else [t] for t, w, wrap in zip(texts, self.widths, self.wraps or
                                                                     [False] * len(texts))]
        first = self.line([_fix(parts[0], w, _truncates(c, row.get(c)))
                           for c, w, parts in zip(self.cols, self.widths, wrapped)])
        more = max(map(len, wrapped)) - 1
        return [first] + [self.line([_fix(parts[k] if k < len(parts) else "", w, False)
                                     for w, parts in zip(self.widths, wrapped)]) for k in range(1, more + 1)]


def open_table(cols: list[str], widths: list[int], truncates: list[bool], fmt: Format, tablefmt: str,
               title: str | None, out, optional: tuple[str, ...] = (), streamed: bool = True) -> TableFrame | None:
    """Fix the columns and widths of a table whose sample rows' cells need ``widths`` terminal cells
    (``truncates``: the column is free text that may be cut, or wrap), write its title and head, return its
    frame; None, writing nothing, for a table (not plain) wider than the terminal it goes to."""
    from rich.cells import cell_len

    wraps = {c for c, t in zip(cols, truncates) if t and c in WRAPPED_FIELDS and _screen(out)}
    if streamed:                              # free text to its usual width, not that of one long body
        widths = [min(w, max(cell_len(c), FREE_TEXT_WIDTHS[c])) if t and c not in wraps else w
                  for c, w, t in zip(cols, widths, truncates)]
    cols, widths, fits = _fit(cols, widths, truncates, out, optional, wraps)
    if not fits and fmt is Format.TABLE and tablefmt not in MARKUP_TABLEFMTS:
        return None
    if fmt is Format.PLAIN:
        widths = [max(w, cell_len(c) + 2) for c, w in zip(cols, widths)]   # tabulate pads headers by 2
    head, line, parts, between, tail = _frame(cols, widths, fmt, tablefmt)
    strip = fmt is Format.PLAIN                  # plain: no trailing blanks after the last column
    if strip:
        head, between, tail = ([s.rstrip() for s in part] for part in (head, between, tail))
    if title and fmt is Format.TABLE and _headers():
        out.write(title + "\n")
    if not _headers():              # a top border stays; the header line and the rule under it go
        head = head[:next(k for k, s in enumerate(head) if all(c in s for c in cols))]
    out.write("".join(s + "\n" for s in head))
    return TableFrame(cols, widths, line, parts, "".join(s + "\n" for s in between),
                      "".join(s + "\n" for s in tail), strip, [c in wraps for c in cols])


def _head(it: Iterator[dict], n: int) -> tuple[list[dict], BaseException | None]:
    """The first ``n`` rows, and the error (or Ctrl-C) that ended them early, if any."""
    got: list[dict] = []
    try:
        for row in it:
            got.append(row)
            if len(got) >= n:
                break
    except BaseException as exc:       # noqa: BLE001 - re-raised once the rows before it are out
        return got, exc
    return got, None


def _union(rows: list[dict]) -> list[str]:
    cols: dict[str, None] = {}
    for r in rows:
        cols.update(dict.fromkeys(r))
    return list(cols)


def _truncates(key: str, value: Any) -> bool:
    """Free text may be cut to its column; numbers, times, IDs, offsets and names never are."""
    return key in FREE_TEXT_WIDTHS and not isinstance(value, (int, float))


def _fit(cols: list[str], widths: list[int], truncates: list[bool], out, optional: tuple[str, ...] = (),
         wraps: set[str] = frozenset()) -> tuple[list[str], list[int], bool]:
    """On a terminal, leave out ``optional`` columns and narrow the text columns (``truncates``: cut; in
    ``wraps``: wrapped, to WRAP_MIN_WIDTH at least; widest first) until a row fits the screen; whether it
    does."""
    screen = _screen(out)
    if screen is None:
        return cols, widths, True
    cut_ok = dict(zip(cols, truncates))
    pairs = list(zip(cols, widths))

    def floor(c: str) -> int:
        return max(WRAP_MIN_WIDTH if c in wraps else MIN_WIDTH, len(c))

    def least(c: str, w: int) -> int:
        return min(w, floor(c)) if cut_ok[c] else w

    for name in optional:
        if sum(least(c, w) for c, w in pairs) + 3 * len(pairs) + 1 <= screen:
            break
        pairs = [(c, w) for c, w in pairs if c != name]
    cols, widths = [c for c, _ in pairs], [w for _, w in pairs]
    room = screen - 3 * len(cols) - 1
    while sum(widths) > room:
        cut = [i for i, c in enumerate(cols) if cut_ok[c] and widths[i] > floor(c)]
        if not cut:
            break
        i = max(cut, key=lambda j: widths[j])
        widths[i] -= 1
    return cols, widths, sum(widths) <= room


def _fix(text: str, width: int, truncate: bool) -> str:
    """``text`` padded to ``width`` terminal cells; cut with '…' when it may be."""
    from rich.cells import cell_len, set_cell_size

    size = cell_len(text)
    if size <= width:
        return text + " " * (width - size)
    return set_cell_size(text, width - 1) + "…" if truncate else text


def _frame(cols: list[str], widths: list[int], fmt: Format, tablefmt: str):
    """(head lines, row renderer, its parts around the cells (None for a markup format), lines between
    rows, tail lines) of a table with these fixed widths, taken from the renderer's output for
    placeholder rows."""
    render = _render_plain if fmt is Format.PLAIN else _render_rich
    x, y = [ch for ch in "XYQZKW" if not any(ch in c for c in cols)][:2]     # placeholders, not in headers
    a = render(cols, widths, [[x * w for w in widths]], tablefmt)
    ab = render(cols, widths, [[x * w for w in widths], [y * w for w in widths]], tablefmt)
    i = next(k for k, s in enumerate(a) if x * widths[0] in s)
    j = next(k for k, s in enumerate(ab) if y * widths[0] in s)
    parts, pos = [], 0
    template = a[i]
    for w in widths:
        start = template.index(x * w, pos)
        parts.append(template[pos:start])
        pos = start + w
    parts.append(template[pos:])

    def line(cells: list[str]) -> str:
        return "".join(p + c for p, c in zip(parts, cells)) + parts[-1]

    def markup_line(cells: list[str]) -> str:       # the format escapes its cells: let it
        return render(cols, widths, [cells], tablefmt)[i]

    if tablefmt in MARKUP_TABLEFMTS:
        return a[:i], markup_line, None, ab[i + 1:j], a[i + 1:]
    return a[:i], line, parts, ab[i + 1:j], a[i + 1:]


def _render_plain(cols, widths, rows, tablefmt) -> list[str]:
    from tabulate import tabulate

    return tabulate(rows, headers=cols, tablefmt=tablefmt, disable_numparse=True).splitlines()


def _render_rich(cols, widths, rows, _tablefmt) -> list[str]:
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(show_lines=False, highlight=False)
    for c, w in zip(cols, widths):
        table.add_column(c, min_width=w, max_width=w, no_wrap=True, overflow="crop")
    for row in rows:
        table.add_row(*row)
    buf = io.StringIO()
    Console(file=buf, width=sum(widths) + 3 * len(widths) + 4, markup=False, highlight=False,
            color_system=None, soft_wrap=False).print(table)
    return buf.getvalue().splitlines()


def write_record(row: dict, fmt: Format, out=None, tablefmt: str = "simple", select: bool = True) -> None:
    """One object (e.g. a header or a summary): key/value pairs for people, one line for scripts;
    the command's --fields (when ``select``) pick its keys."""
    out = out or sys.stdout
    if select and _chosen_fields():
        (row,), _ = _select([row], _chosen_fields())
    if fmt in (Format.JSONL, Format.JSON):
        out.write((json.dumps(row, ensure_ascii=False, default=json_default, indent=2)
                   if fmt is Format.JSON else dumps(row)) + "\n")
        return
    if fmt in (Format.CSV, Format.TSV):
        _write_csv([row], None, out, fmt)
    elif fmt is Format.RECORD:
        _write_record_view([row], None, out)
    else:
        from rich.cells import cell_len

        pairs = [{"field": k, "value": cell(k, v)} for k, v in row.items()]
        screen = _screen(out) if fmt is Format.TABLE else None
        if screen and max((len(k) + cell_len(p["value"]) + 7 for k, p in zip(row, pairs)), default=0) > screen:
            _write_record_view([row], None, out)      # wider than the terminal: field: value, values wrapped
            return
        write_rows(pairs, fmt, columns=["field", "value"], tablefmt=tablefmt, out=out, select=False)


def skip_pandas_probe() -> None:
    """Spare a command that never hands pandas objects to pyarrow the import of pandas (~0.2 CPU-s) that
    pyarrow makes on its first conversion of a Python or numpy value, only to ask whether the value is a
    pandas object: that first probe finds no pandas. pyarrow still imports it where it needs it
    (to_pandas, from_pandas). Before pyarrow is imported (a command that needs it for some stores only:
    verify of a small store needs none), the probe is left to run when it is."""
    if "pandas" in sys.modules:
        return
    if "pyarrow" not in sys.modules:
        if _ProbeAfterPyarrow not in sys.meta_path:
            sys.meta_path.insert(0, _ProbeAfterPyarrow)
        return
    sys.meta_path.insert(0, _NoPandas)          # import pandas fails while the probe runs
    try:
        import pyarrow

        pyarrow.scalar(0)
    finally:
        sys.meta_path.remove(_NoPandas)


class _NoPandas:
    @staticmethod
    def find_spec(name: str, path=None, target=None):
        if name.partition(".")[0] == "pandas":
            raise ImportError(f"{name}: not imported here")
        return None


class _ProbeAfterPyarrow:
    """Finds pyarrow as the other finders do, and runs ``skip_pandas_probe`` once it is imported."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):
        if name != "pyarrow":
            return None
        sys.meta_path.remove(_ProbeAfterPyarrow)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module) -> None:
                load(module)
                skip_pandas_probe()
            spec.loader.exec_module = exec_module
        return spec


def stderr_console():
    from rich.console import Console
    return Console(stderr=True, markup=False, highlight=False)


@contextlib.contextmanager
def progress_bar(total: int, label: str, *, streaming: bool = False) -> Iterator[Callable[[int], None] | None]:
    """The one progress bar: advanced by bytes scanned through the ``progress(n)`` callback that ops
    functions take; on stderr, on a terminal only (None otherwise, and under RMQTOOL_NO_PROGRESS).
    A command that prints rows while it scans (``streaming``) shows it only when stdout is not the
    terminal too. stdout is never redirected: data stays on stdout."""
    if (not sys.stderr.isatty() or total <= 0 or os.environ.get("RMQTOOL_NO_PROGRESS")
            or (streaming and sys.stdout.isatty())):
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), transient=True, console=stderr_console(), redirect_stdout=False,
                  redirect_stderr=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
        bar.update(task, completed=total)     # done: 100 %, whatever the bytes counted (zero tails, BLANKs)
        bar.refresh()
