"""Record batches printed a batch at a time: people's tables (plain, table) and JSON.

A table's cells are built a column at a time in a few Arrow passes and a batch's rows are joined and
written at once. The text is exactly what ``write_records`` prints for the same rows (``hit_rows``,
``present_bodies``, ``output.cell``, ``output._fix``): values the vectorised passes do not cover
(control characters, non-ASCII text whose terminal width differs from its length, text that JSON
escapes, a body that is not UTF-8, times beyond 2242) go through those same functions, one value at a
time. Accepts binary/string columns and their view and large variants.
"""

from __future__ import annotations

import base64
import codecs
import itertools
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.cells import cell_len

from rmqtool.cli.output import (FREE_TEXT_WIDTHS, SAMPLE_ROWS, SIZE_FIELDS, TIMESTAMP_FIELDS, Format, TableFrame,
                                _chosen_fields, _fix, cell, check_fields, escape, open_table)
from rmqtool.columnar.text import column, encode_bodies
from rmqtool.ops.grep import BLANK_FIELDS, row_fields

_CONTROL_RX = "[\\x00-\\x1f\\x{7f}-\\x{9f}]"                  # output.escape's characters
_JSON_RX = '[\\x00-\\x1f"\\\\\\x{7f}-\\x{9f}]'               # what json.dumps escapes, and escape() after it
_EXACT_MS = 2**33 * 1000        # below this, ms / 1000 as a double rounds back to the exact millisecond
_SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "                 # the ASCII characters str.isspace() knows


def table_supported(fmt: Format, tablefmt: str, body: str | None, charset: str, body_dir: str | None) -> bool:
    """Whether ``write_table_batches`` prints these options (else the row path does)."""
    from rmqtool.cli.output import MARKUP_TABLEFMTS

    return (fmt in (Format.TABLE, Format.PLAIN) and tablefmt not in MARKUP_TABLEFMTS and not body_dir
            and (body not in (None, "text") or codecs.lookup(charset).name == "utf-8"))


def write_table_batches(batches: Iterable[pa.RecordBatch], fmt: Format, columns: list[str], tablefmt: str, out,
                        *, body: str | None, body_chars: int, records: Callable[[Iterable[pa.RecordBatch]],
                                                                                 Iterator[dict]],
                        optional: tuple[str, ...] = ()) -> int:
    """``write_records(hit_rows(batches), fmt, ...)`` for a table or plain, a batch at a time: the columns
    fit the first SAMPLE_ROWS rows, as a streamed table's do. A table wider than the terminal prints the
    ``records(batches)`` rows (as the row path has them) in the record layout."""
    it = iter(batches)
    sample: list[pa.RecordBatch] = []
    failed = None
    try:
        for batch in it:
            sample.append(batch)
            if sum(b.num_rows for b in sample) >= SAMPLE_ROWS:
                break
    except BaseException as exc:       # noqa: BLE001 - re-raised once the rows before it are out
        failed = exc
    if not sample:
        if failed:
            raise failed
        return 0
    chosen = _chosen_fields()
    if chosen:
        check_fields(chosen, row_fields(sample[0].schema))
        columns, optional = chosen, ()
    wanted = body or "text"
    cells = [_cells(b, columns, wanted, body_chars) for b in sample]
    widths = []
    for c in columns:
        sizes = [_cell_lengths(t[c])[0] for t in cells]
        counted = np.concatenate(sizes)[:SAMPLE_ROWS]
        widths.append(max(cell_len(c), int(counted.max(initial=0))))
    types = {f.name: f.type for f in sample[0].schema}
    truncates = [c in FREE_TEXT_WIDTHS and not (pa.types.is_integer(types[c]) or pa.types.is_floating(types[c]))
                 if c in types else c in FREE_TEXT_WIDTHS for c in columns]
    frame = open_table(columns, widths, truncates, fmt, tablefmt, None, out, optional)
    if frame is None:                 # wider than the terminal: the record layout, as the row path prints it
        from rmqtool.cli.output import _write_record_view

        n = _write_record_view(records(itertools.chain(sample, () if failed else it)), columns, out)
        if failed:
            raise failed
        return n
    cut = dict(zip(columns, truncates))
    n = 0
    rest = () if failed else ((b, None) for b in it)
    for batch, batch_cells in itertools.chain(_sample_rows_first(sample, cells), rest):
        if batch_cells is None:
            batch_cells = _cells(batch, frame.cols, wanted, body_chars)
        lines = _lines(batch_cells, frame, cut)
        if frame.between:                     # before every row but the very first
            lines = pc.binary_join_element_wise(frame.between, lines, "")
        data = _utf8_bytes(lines)
        write_bytes(out, data[len(frame.between.encode()):] if n == 0 and frame.between else data)
        n += batch.num_rows
    if failed:                       # the rows before a damaged record print, then its error
        raise failed
    out.write(frame.tail)
    return n


def first_rows(batches: Iterable[pa.RecordBatch], count: int | None) -> Iterator[pa.RecordBatch]:
    """The batches' first ``count`` rows (all when None)."""
    left = count
    for batch in batches:
        if left is not None:
            if left <= 0:
                return
            batch = batch.slice(0, left)
            left -= batch.num_rows
        if batch.num_rows:
            yield batch


def _sample_rows_first(sample: list[pa.RecordBatch], cells: list[dict]) -> Iterator[tuple[pa.RecordBatch, dict]]:
    """The sample batches and their cells, the first SAMPLE_ROWS rows on their own: they print as soon
    as the widths are known."""
    before = 0
    for batch, batch_cells in zip(sample, cells):
        cut = SAMPLE_ROWS - before
        if 0 < cut < batch.num_rows:
            yield batch.slice(0, cut), {c: t.slice(0, cut) for c, t in batch_cells.items()}
            yield batch.slice(cut), {c: t.slice(cut) for c, t in batch_cells.items()}
        else:
            yield batch, batch_cells
        before += batch.num_rows


def write_json_batches(batches: Iterable[pa.RecordBatch], body_encoding: str, out) -> int:
    """``write_rows(hit_rows(batches), Format.JSON)`` a batch at a time: the JSON lines joined by ",\\n"
    (a JSON line holds no newline) inside "[\\n" ... "\\n]\\n"."""
    from rmqtool.columnar.text import text_bytes

    out.write("[")
    n = 0
    for batch in batches:
        if batch.num_rows:
            text = bytes(text_bytes(batch, body_encoding, "json"))
            write_bytes(out, (b",\n" if n else b"\n") + text[:-1].replace(b"\n", b",\n"))
            n += batch.num_rows
    out.write("\n]\n" if n else "]\n")
    return n


# -- cells --------------------------------------------------------------------------------------------
def _cells(batch: pa.RecordBatch, cols: list[str], wanted: str, body_chars: int) -> dict[str, pa.Array]:
    """Each column's cells: ``cell(c, row.get(c))`` of every row of ``hit_rows`` after ``present_bodies``."""
    names = batch.schema.names
    blank = None
    out = {}
    for c in cols:
        if c not in names and c != "body_encoding":
            text = _empty(batch.num_rows)
        elif c in ("body", "body_encoding"):
            text = _body_cells(batch, wanted, body_chars)[c == "body_encoding"]
        else:
            text = cell_column(c, column(batch, c))
        if c not in BLANK_FIELDS and "type" in names:
            if blank is None:
                blank = pc.equal(column(batch, "type"), "blank").fill_null(False)
            if pc.any(blank).as_py():
                text = pc.if_else(blank, "", text)
        out[c] = text
    return out


def _empty(n: int) -> pa.Array:
    return pa.nulls(n, pa.string()).fill_null("")


def cell_column(name: str, arr: pa.Array) -> pa.Array:
    """``cell(name, value)`` of every value of a batch column, as ``hit_rows`` gives the values
    (timestamps in epoch ms, ``properties`` as a dict, binary in base64)."""
    t = arr.type
    if pa.types.is_timestamp(t):
        arr, t = arr.cast(pa.int64()), pa.int64()
    if pa.types.is_integer(t) and name not in SIZE_FIELDS:
        text = arr.cast(pa.string())
        if name in TIMESTAMP_FIELDS and len(arr):
            ms = arr.cast(pa.int64())
            readable = pc.and_(pc.greater(ms, 0), pc.less(ms, _EXACT_MS)).fill_null(False)
            if pc.any(readable).as_py():
                stamps = pc.strftime(pc.if_else(readable, ms, 0).cast(pa.timestamp("ms")), "%Y-%m-%d %H:%M:%S")
                text = pc.if_else(readable, stamps, text)
            text = _per_value(name, arr, text, pc.greater_equal(ms, _EXACT_MS))
        return text.fill_null("")
    if pa.types.is_boolean(t):
        return pc.if_else(arr, "yes", "no").fill_null("")
    if _is_text(t):
        return _escaped(_string(arr))
    if _is_bytes(t):                 # properties_raw: base64, which needs no escaping
        from rmqtool.columnar.text import _base64
        raw = _binary(arr)
        return pc.if_else(raw.is_null(), "", _base64(raw))
    if pa.types.is_list(t) and _is_text(t.value_type):
        return _json_list_cells(name, arr)
    if pa.types.is_map(t) and _is_text(t.key_type) and _is_text(t.item_type):
        return _json_map_cells(name, arr)
    return _per_value(name, arr, _empty(len(arr)), pa.repeat(True, len(arr)))


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_bytes(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)


def _string(arr: pa.Array) -> pa.Array:
    return arr if pa.types.is_string(arr.type) else arr.cast(pa.string())


def _binary(arr: pa.Array) -> pa.Array:
    return arr if pa.types.is_binary(arr.type) else arr.cast(pa.binary())


def _per_value(name: str, arr: pa.Array, text: pa.Array, mask: pa.Array) -> pa.Array:
    """``text`` with ``cell(name, value)`` where ``mask`` is set, one value at a time."""
    mask = mask.fill_null(False)
    if not pc.any(mask).as_py():
        return text
    values = arr.filter(mask)
    if pa.types.is_timestamp(values.type):
        values = values.cast(pa.int64())
    picked = values.to_pylist()                    # as hit_rows puts them in a row:
    if pa.types.is_map(values.type):
        picked = [None if v is None else dict(v) for v in picked]
    elif _is_bytes(values.type):
        picked = [None if v is None else base64.b64encode(v).decode("ascii") for v in picked]
    return pc.replace_with_mask(text, mask, pa.array([cell(name, v) for v in picked], pa.string()))


def _any_bytes(arr: pa.Array, json: bool = False) -> bool:
    """Whether a string column may hold a character ``escape`` changes (or, ``json``, one json.dumps
    escapes): a control byte, DEL, the lead byte of U+0080..U+00BF (C1 controls), a quote or backslash."""
    arr = _string(arr)
    if len(arr) == 0 or arr.buffers()[2] is None:
        return False
    offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
    data = np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
    hit = (data < 0x20) | (data == 0x7F) | (data == 0xC2)
    if json:
        hit |= (data == 0x22) | (data == 0x5C)
    return bool(hit.any())


def _escaped(text: pa.Array) -> pa.Array:
    """``escape`` of every value ("" for null)."""
    if _any_bytes(text):
        mask = pc.match_substring_regex(text, _CONTROL_RX).fill_null(False)
        if pc.any(mask).as_py():
            text = pc.replace_with_mask(text, mask, pa.array([escape(v) for v in text.filter(mask).to_pylist()],
                                                             pa.string()))
    return text.fill_null("")


def _item_rows(offsets: np.ndarray, bad_items: np.ndarray, n: int) -> np.ndarray:
    """The rows of a list column holding a flagged item."""
    rows = np.zeros(n, bool)
    flagged = np.flatnonzero(bad_items)
    if len(flagged):
        rows[np.searchsorted(offsets, flagged + offsets[0], "right") - 1] = True
    return rows


def _json_items(items: pa.Array, offsets: np.ndarray, n: int) -> np.ndarray:
    """Rows with an item that json.dumps escapes or that is null (those go one value at a time)."""
    items = _string(items)
    bad = np.zeros(len(items), bool)
    if _any_bytes(items, json=True):
        bad |= pc.match_substring_regex(items, _JSON_RX).fill_null(False).to_numpy(zero_copy_only=False)
    if items.null_count:
        bad |= items.is_null().to_numpy(zero_copy_only=False)
    return _item_rows(offsets, bad, n)


def _list_offsets(arr) -> np.ndarray:
    return arr.offsets.to_numpy()


def _json_list_cells(name: str, arr: pa.ListArray) -> pa.Array:
    """``escape(json.dumps(list, ensure_ascii=False))``: '["a", "b"]', "[]"."""
    offsets = _list_offsets(arr)
    items = _string(arr.values.slice(offsets[0], offsets[-1] - offsets[0]))
    rebased = pa.array(offsets - offsets[0], pa.int32())
    joined = pc.binary_join(pa.ListArray.from_arrays(rebased, items.fill_null("")), '", "')
    text = pc.if_else(pa.array(np.diff(offsets) == 0), "[]",
                      pc.binary_join_element_wise('["', joined, '"]', ""))
    text = pc.if_else(arr.is_null(), "", text)
    bad = _json_items(items, offsets - offsets[0], len(arr))
    return _per_value(name, arr, text, pa.array(bad))


def _json_map_cells(name: str, arr: pa.MapArray) -> pa.Array:
    """``escape(json.dumps(dict, ensure_ascii=False))``: '{"k": "v", "k2": "v2"}', "{}" (the decoder's
    maps hold each key once, as a dict)."""
    offsets = _list_offsets(arr)
    lo, hi = offsets[0], offsets[-1]
    keys = _string(arr.keys.slice(lo, hi - lo))
    values = _string(arr.items.slice(lo, hi - lo))
    pairs = pc.binary_join_element_wise('"', keys.fill_null(""), '": "', values.fill_null(""), '"', "")
    rebased = pa.array(offsets - lo, pa.int32())
    joined = pc.binary_join(pa.ListArray.from_arrays(rebased, pairs), ", ")
    text = pc.if_else(pa.array(np.diff(offsets) == 0), "{}",
                      pc.binary_join_element_wise("{", joined, "}", ""))
    text = pc.if_else(arr.is_null(), "", text)
    bad = _json_items(keys, offsets - lo, len(arr)) | _json_items(values, offsets - lo, len(arr))
    return _per_value(name, arr, text, pa.array(bad))


def _body_cells(batch: pa.RecordBatch, wanted: str, body_chars: int) -> tuple[pa.Array, pa.Array]:
    """(body, body_encoding) cells of ``present_bodies`` for people: with "text", a UTF-8 body cut to
    ``body_chars`` characters + "…", one that is not UTF-8 as "(N bytes, not UTF-8)" labelled base64."""
    raw = _binary(column(batch, "body"))
    n = len(raw)
    message = pc.equal(column(batch, "type"), "message").fill_null(False) if "type" in batch.schema.names \
        else pa.repeat(True, n)
    if wanted != "text":
        label = pa.scalar(None if wanted == "none" else wanted, pa.string())
        return (_escaped(encode_bodies(raw, wanted)),
                pc.if_else(message, label, pa.scalar(None, pa.string())).fill_null(""))
    try:
        text = raw.cast(pa.string())
        valid = None
    except pa.ArrowInvalid:
        valid = pa.array([v is None or _utf8(v) for v in raw.to_pylist()])
        text = pc.if_else(valid, raw, b"").cast(pa.string())
    long = pc.greater(pc.utf8_length(text), body_chars).fill_null(False)
    if pc.any(long).as_py():
        text = pc.if_else(long, pc.binary_join_element_wise(pc.utf8_slice_codeunits(text, 0, body_chars), "…", ""),
                          text)
    label = pc.if_else(message, "text", pa.scalar(None, pa.string()))
    if valid is not None:
        sizes = pc.binary_join_element_wise("(", pc.binary_length(raw).cast(pa.string()), " bytes, not UTF-8)", "")
        text = pc.if_else(valid, text, sizes)
        label = pc.if_else(valid, label, "base64")
    text = pc.if_else(pc.and_(message, raw.is_valid()), text, pa.scalar(None, pa.string()))
    return _escaped(text), label.fill_null("")


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# -- rows ---------------------------------------------------------------------------------------------
def _single_cell_rx() -> str:
    """A regex for text whose every character takes one terminal cell as rich measures it (rich's own
    single-cell ranges, where it counts len(), and the "…" that ends a cut body)."""
    from rich import cells

    ranges = getattr(cells, "_SINGLE_CELL_UNICODE_RANGES", [(0x20, 0x7E)])
    return "^[" + "".join(f"\\x{{{a:x}}}-\\x{{{b:x}}}" for a, b in ranges) + "\\x{2026}]*$"


_SINGLE_CELL_RX = _single_cell_rx()


def _cell_lengths(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(terminal cells of each value as rich counts them, whether each of its characters takes one cell)."""
    single = pc.string_is_ascii(text).to_numpy(zero_copy_only=False)
    sizes = pc.utf8_length(text).to_numpy(zero_copy_only=False).astype(np.int64)
    if not single.all():
        other = np.flatnonzero(~single)
        found = pc.match_substring_regex(text.take(pa.array(other)), _SINGLE_CELL_RX).to_numpy(zero_copy_only=False)
        single[other[found]] = True
        rest = other[~found]
        sizes[rest] = [cell_len(v) for v in text.take(pa.array(rest)).to_pylist()]
    return sizes, single


def _lines(cells: dict[str, pa.Array], frame: TableFrame, cut: dict[str, bool]) -> pa.Array:
    """Each row's line (with its newline): ``frame.line`` of the ``_fix``ed cells, right-stripped in plain."""
    parts: list = []
    for i, (c, w) in enumerate(zip(frame.cols, frame.widths)):
        text = cells[c]
        sizes, single = _cell_lengths(text)
        fixed = pc.utf8_rpad(text, w)
        over = single & (sizes > w) & cut[c] & (w > 0)
        if over.any():
            fixed = pc.if_else(pa.array(over), pc.binary_join_element_wise(pc.utf8_slice_codeunits(text, 0, w - 1),
                                                                           "…", ""), fixed)
        other = ~single
        if other.any():
            fixed = pc.replace_with_mask(fixed, pa.array(other), pa.array(
                [_fix(v, w, cut[c]) for v in text.filter(pa.array(other)).to_pylist()], pa.string()))
        parts += [frame.parts[i], fixed]
    line = pc.binary_join_element_wise(*parts, frame.parts[-1], "")
    if frame.strip:
        line = _rstrip(line)
    return pc.binary_join_element_wise(line, "\n", "")


def _rstrip(line: pa.Array) -> pa.Array:
    """``str.rstrip()`` of every line: ASCII blanks in one pass, Python's rstrip where a non-ASCII
    character ends what is left (it may be a Unicode space)."""
    trimmed = pc.utf8_rtrim(line, _SPACES)
    offsets = np.frombuffer(trimmed.buffers()[1], np.int32, len(trimmed) + 1, trimmed.offset * 4)
    if trimmed.buffers()[2] is None:
        return trimmed
    data = np.frombuffer(trimmed.buffers()[2], np.uint8)
    ends = offsets[1:]
    nonempty = ends > offsets[:-1]
    last = np.zeros(len(trimmed), np.uint8)
    last[nonempty] = data[ends[nonempty] - 1]
    other = last >= 0x80
    if other.any():
        mask = pa.array(other)
        trimmed = pc.replace_with_mask(trimmed, mask, pa.array([v.rstrip() for v in line.filter(mask).to_pylist()],
                                                               pa.string()))
    return trimmed


# -- output -------------------------------------------------------------------------------------------
def _utf8_bytes(text: pa.Array) -> memoryview:
    """The concatenated UTF-8 bytes of a string column without nulls."""
    if len(text) == 0 or text.buffers()[2] is None:
        return memoryview(b"")
    offsets = np.frombuffer(text.buffers()[1], np.int32, len(text) + 1, text.offset * 4)
    return memoryview(text.buffers()[2])[offsets[0]:offsets[-1]]


def write_utf8(out, text: pa.Array) -> None:
    """Write a string column's values back to back to the text stream ``out``."""
    write_bytes(out, _utf8_bytes(text))


def write_bytes(out, data) -> None:
    """UTF-8 bytes to the text stream ``out``: straight to its binary buffer when it encodes UTF-8."""
    binary = getattr(out, "buffer", None)
    if binary is not None and codecs.lookup(getattr(out, "encoding", None) or "ascii").name == "utf-8":
        out.flush()
        binary.write(data)
        binary.flush()
    else:
        out.write(bytes(data).decode("utf-8"))
