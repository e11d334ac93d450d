"""Record batches as JSON lines and CSV lines, built column by column (no dict per row).

A JSON line is byte-for-byte what ``rmqtool.cli.output.dumps(entry_row(...))`` prints for the record;
a CSV line what ``write_rows`` prints (maps and lists as JSON, None as an empty cell), or for ``export``
what pyarrow's CSV writer printed (every string quoted). Each column becomes a part of the lines
(``rmqtool.columnar.lines`` renders them in one compiled pass); the few values that need JSON escaping
or CSV quoting are rendered here first, with Arrow, in the columns that hold them.
"""

from __future__ import annotations

import binascii
import csv
import io
import json
import re
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqtool.format.rows import RECORD_FIELDS, body_field

_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'
_PLAIN = {"type", "magic_code", "born_host", "store_host", "msg_id", "body_encoding", "properties_raw"}
_HEX = b"0123456789abcdef"
_HEX_LUT = np.array([_HEX[b >> 4] | _HEX[b & 15] << 8 for b in range(256)], "<u2")
_PADS = pa.Array.from_buffers(pa.binary(), 3, [None, pa.py_buffer(np.array([0, 0, 1, 3], np.int32)),
                                                pa.py_buffer(b"\0\0\0")])          # b"", b"\0", b"\0\0"


def json_string(arr: pa.Array, *, plain: bool = False) -> pa.Array:
    """JSON string literals (``null`` for nulls); the rare values that need escaping go through json.
    ``plain``: the values never need escaping (hex, base64, hosts)."""
    quoted = pc.binary_join_element_wise('"', arr, '"', "")
    if not plain and _any_escape(arr):
        needs = pc.match_substring_regex(arr, _NEEDS_ESCAPE).fill_null(False)
        escaped = [json.dumps(v, ensure_ascii=False) for v in arr.filter(needs).to_pylist()]
        quoted = pc.replace_with_mask(quoted, needs, pa.array(escaped, pa.string()))
    return quoted.fill_null("null")


def _any_escape(arr: pa.Array) -> bool:
    """Whether any byte of the column is a control character, a quote or a backslash (one numpy pass)."""
    data = _bytes(arr)
    return bool(((data < 0x20) | (data == 0x22) | (data == 0x5C)).any())


def _any_byte(arr: pa.Array, chars: str) -> bool:
    """Whether any value of a string column holds one of these ASCII characters."""
    data = _bytes(arr)
    return any(bool((data == ord(c)).any()) for c in chars)


def _bytes(arr: pa.Array) -> np.ndarray:
    """The UTF-8 bytes of a string column's values, back to back."""
    if len(arr) == 0 or arr.buffers()[2] is None:
        return np.zeros(0, np.uint8)
    offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
    return np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]


def _join_lists(offsets: pa.Array, items: pa.Array, arr: pa.Array, open_: str, close: str) -> pa.Array:
    wrapped = pc.binary_join_element_wise(open_, pc.binary_join(pa.ListArray.from_arrays(offsets, items), ","),
                                          close, "")
    return wrapped if arr.null_count == 0 else pc.if_else(arr.is_null(), pa.scalar(None, pa.string()), wrapped)


def json_object(maps: pa.MapArray) -> pa.Array:
    """Each map as JSON text (null where the map is null)."""
    items = pc.binary_join_element_wise(json_string(maps.keys), json_string(maps.items), ":")
    return _join_lists(maps.offsets, items, maps, "{", "}")


def json_array(lists: pa.ListArray) -> pa.Array:
    return _join_lists(lists.offsets, json_string(lists.values), lists, "[", "]")


def encode_bodies(body: pa.BinaryArray, encoding: str) -> pa.Array:
    """``rmqtool.format.rows.encode_body`` for a whole column (string, null where the body is null); with
    "text", bodies that are not UTF-8 come in base64 (``text_fallbacks`` tells which)."""
    if encoding == "none":
        return pa.nulls(len(body), pa.string())
    offsets = np.frombuffer(body.buffers()[1], np.int32, len(body) + 1, body.offset * 4)
    data = body.buffers()[2] or pa.py_buffer(b"")
    if encoding == "hex":
        text = _HEX_LUT[np.frombuffer(data, np.uint8)].view(np.uint8)
        out = pa.Array.from_buffers(pa.string(), len(body), [None, pa.py_buffer(offsets * 2), pa.py_buffer(text)])
    elif encoding == "base64":
        out = _base64(body)
    else:
        try:
            out = body.cast(pa.string())
        except pa.ArrowInvalid:
            out = pa.array([None if b is None else body_field(b, "text")[0] for b in body.to_pylist()], pa.string())
    return pc.if_else(body.is_null(), pa.scalar(None, pa.string()), out)


def text_fallbacks(body: pa.BinaryArray) -> pa.Array:
    """True where a body is not UTF-8 (given in base64 when text is asked for)."""
    try:
        body.cast(pa.string())
        return pa.repeat(pa.scalar(False), len(body))
    except pa.ArrowInvalid:
        return pa.array([b is not None and body_field(b, "text")[1] != "text" for b in body.to_pylist()], pa.bool_())


def _base64(body: pa.BinaryArray) -> pa.Array:
    """Base64 of every value in one binascii call: each value is zero-padded to a multiple of 3 bytes
    so that its text is a slice of the whole text, then the padding's characters become '='."""
    lengths = pc.binary_length(body).fill_null(0).to_numpy().astype(np.int64)
    pad = -lengths % 3
    padded = pc.binary_join_element_wise(body.fill_null(b""), _PADS.take(pa.array(pad.astype(np.int8))), b"")
    data = padded.buffers()[2]
    text = np.frombuffer(bytearray(binascii.b2a_base64(memoryview(data or b"")[:(lengths + pad).sum()],
                                                          newline=False)), np.uint8)
    text_off = np.zeros(len(body) + 1, np.int64)
    np.cumsum((lengths + pad) // 3 * 4, out=text_off[1:])
    ends = text_off[1:]
    text[ends[pad == 2] - 2] = ord("=")
    text[ends[pad > 0] - 1] = ord("=")
    return pa.Array.from_buffers(pa.string(), len(body), [None, pa.py_buffer(text_off.astype(np.int32)),
                                                          pa.py_buffer(text)])


_PLAIN_TYPES = {pa.string_view(): pa.string(), pa.large_string(): pa.string(), pa.binary_view(): pa.binary(),
                pa.large_binary(): pa.binary()}


def column(batch: pa.RecordBatch, name: str) -> pa.Array:
    """A batch column with view and large string/binary types as plain string/binary (the formatters
    here read 32-bit offsets), lists and maps of them too."""
    col = batch.column(name)
    t = col.type
    if t in _PLAIN_TYPES:
        return col.cast(_PLAIN_TYPES[t])
    if pa.types.is_list(t) and t.value_type in _PLAIN_TYPES:
        return col.cast(pa.list_(_PLAIN_TYPES[t.value_type]))
    if pa.types.is_map(t) and (t.key_type in _PLAIN_TYPES or t.item_type in _PLAIN_TYPES):
        return col.cast(pa.map_(_PLAIN_TYPES.get(t.key_type, t.key_type), _PLAIN_TYPES.get(t.item_type, t.item_type)))
    return col


def text_names(batch: pa.RecordBatch) -> list[str]:
    """The row fields of a batch's records, in row order."""
    return [n for n in RECORD_FIELDS + ["crc_ok"] if n in batch.schema.names or n == "body_encoding"]


def _csv_specials() -> str:
    """The characters that make Python's csv writer (lineterminator "\\n") quote a cell: the delimiter,
    the quote, "\\n" and, from Python 3.12, "\\r"."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    specials = ""
    for c in ',"\n\r':
        out.seek(0)
        out.truncate()
        writer.writerow([f"a{c}", "b"])
        specials += c if out.getvalue().startswith('"') else ""
    return specials


_CSV_SPECIALS = _csv_specials()
_CSV_QUOTE_RX = "[" + re.escape(_CSV_SPECIALS) + "]"


def csv_header(batch: pa.RecordBatch) -> str:
    return ",".join(text_names(batch)) + "\n"




def export_csv_header(batch: pa.RecordBatch) -> str:
    """The header of ``export``'s CSV (pyarrow's CSV writer's: every name quoted)."""
    return ",".join(f'"{n}"' for n in text_names(batch)) + "\n"


# The literals of a map and a list (opening, key/value separator, item separator, closing, empty) as
# JSON, as JSON inside a quoted CSV cell, and as that for ``export`` (where every string is quoted).
_MAP = {"json": (b'{"', b'":"', b'","', b'"}', b"{}"), "csv": (b'"{""', b'"":""', b'"",""', b'""}"', b"{}"),
        "export_csv": (b'"{""', b'"":""', b'"",""', b'""}"', b'"{}"')}
_LIST = {"json": (b'["', b"", b'","', b'"]', b"[]"), "csv": (b'"[""', b"", b'"",""', b'""]"', b"[]"),
         "export_csv": (b'"[""', b"", b'"",""', b'""]"', b'"[]"')}


def _lines(batch: pa.RecordBatch, body_encoding: str, style: str) -> tuple:
    """(``lines.Lines``, the end of a line): one line per record in ``style``: "json" (``dumps(entry_row(...))``),
    "csv" (``cli.output``'s csv writer: a cell quoted only where needed) or "export_csv" (pyarrow's CSV
    writer: every string quoted)."""
    from rmqtool.columnar.lines import BASE64, INT32, INT64, LIST, MAP, NULL, TEXT, Lines, any_escape
    from rmqtool.columnar.props import strings      # Arrow scalars: a Python value makes pyarrow import pandas

    lines = Lines(batch.num_rows)
    json_text, quote_all = style == "json", style == "export_csv"
    for i, name in enumerate(text_names(batch)):
        sep = b"," if i else b"{" if json_text else b""
        pre = sep + (f'"{name}":'.encode() if json_text else b"")
        null = pre + b"null" if json_text else sep
        quoted = (pre + b'"', b'"') if json_text or quote_all else (pre, b"")
        if name == "body_encoding":
            message, base64, null_ = strings(["message", "base64", None])
            col = pc.if_else(pc.equal(column(batch, "type"), message),
                             null_ if body_encoding == "none" else strings([body_encoding])[0], null_)
            if body_encoding == "text":
                col = pc.if_else(text_fallbacks(column(batch, "body")), base64, col)
        elif name == "body" and body_encoding != "base64":
            col = encode_bodies(column(batch, "body"), body_encoding)
        else:
            col = column(batch, name)
        t = col.type
        if pa.types.is_binary(t):                        # body and properties_raw in base64
            lines.add(BASE64, col, *quoted, null)
        elif pa.types.is_timestamp(t) or t in (pa.int32(), pa.int64()):
            lines.add(INT32 if t == pa.int32() else INT64, col, pre, b"", null)
        elif pa.types.is_integer(t):
            lines.add(INT64, col.cast(pa.int64()), pre, b"", null)
        elif pa.types.is_null(t):
            lines.add(NULL, None, pre, b"", null)
        elif pa.types.is_boolean(t):
            lines.add(TEXT, col.cast(pa.string()), pre, b"", null)          # true, false
        elif pa.types.is_map(t) or pa.types.is_list(t):
            is_map = pa.types.is_map(t)
            items = [col.keys, col.items] if is_map else [col.values]
            if all(v.null_count == 0 and not any_escape(_bytes(v)) for v in items):
                lines.add(MAP if is_map else LIST, col, pre, b"", null, (_MAP if is_map else _LIST)[style])
            else:
                text = (json_object if is_map else json_array)(col)
                if json_text:
                    lines.add(TEXT, text, pre, b"", null)
                else:                      # JSON text holds quotes in all but {} and []
                    _add_csv_text(lines, text, pre, null, quote_all, pc.greater(pc.binary_length(text), 2))
        elif json_text:
            plain = name in _PLAIN or (name == "body" and body_encoding != "text")
            if plain or not any_escape(_bytes(col)):
                lines.add(TEXT, col, *quoted, null)
            else:
                lines.add(TEXT, json_string(col), pre, b"", null)
        else:
            _add_csv_text(lines, col, pre, null, quote_all)
    return lines, b"}\n" if json_text else b"\n"


def _add_csv_text(lines, col: pa.Array, pre: bytes, null: bytes, quote_all: bool, needs=None) -> None:
    """A string column as CSV cells: every value quoted (``quote_all``) or those that hold a special
    character (or where ``needs``), a quote doubled inside quotes."""
    from rmqtool.columnar.lines import TEXT

    if quote_all:
        if _any_byte(col, '"'):
            col = pc.replace_substring(col, '"', '""')
        lines.add(TEXT, col, pre + b'"', b'"', null)
        return
    if _any_byte(col, _CSV_SPECIALS):
        if needs is None:
            needs = pc.match_substring_regex(col, _CSV_QUOTE_RX)
        from rmqtool.columnar.props import strings
        quote, empty = strings(['"', ""])
        quoted = pc.binary_join_element_wise(quote, pc.replace_substring(col, '"', '""'), quote, empty)
        col = pc.if_else(needs, quoted, col)          # null only where the cell is
    lines.add(TEXT, col, pre, b"", null)


def _array(lines, end: bytes) -> pa.Array:
    offsets, data = lines.text(end)
    n = len(offsets) - 1
    if offsets[-1] < 2 ** 31:
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])
    return pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def json_lines(batch: pa.RecordBatch, body_encoding: str = "base64") -> pa.Array:
    """One JSON object per record, each ending in a newline."""
    return _array(*_lines(batch, body_encoding, "json"))


def csv_lines(batch: pa.RecordBatch, body_encoding: str = "base64") -> pa.Array:
    """One CSV line per record, each ending in a newline: byte-for-byte the rows ``cli.output``'s csv
    writer prints for the record (cells quoted only where needed, None as an empty cell)."""
    return _array(*_lines(batch, body_encoding, "csv"))


def text_bytes(batch: pa.RecordBatch, body_encoding: str, style: str) -> memoryview:
    """The lines of ``_lines`` back to back."""
    lines, end = _lines(batch, body_encoding, style)
    return memoryview(lines.text(end)[1])


def text_chunks(batch: pa.RecordBatch, body_encoding: str, style: str, rows: int | None = None
                ) -> Iterator[memoryview]:
    """The lines of ``_lines`` ``rows`` at a time (``lines.CHUNK_ROWS``), each chunk valid until the next:
    what a writer writes."""
    from rmqtool.columnar.lines import CHUNK_ROWS

    lines, end = _lines(batch, body_encoding, style)
    return lines.chunks(end, rows or CHUNK_ROWS)


def text_length(batch: pa.RecordBatch, body_encoding: str, style: str) -> int:
    """The bytes of ``text_chunks``' lines, counted without rendering them."""
    lines, end = _lines(batch, body_encoding, style)
    return lines.length(end)
