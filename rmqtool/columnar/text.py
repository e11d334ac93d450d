"""Record batches as JSON lines and CSV cells, built column by column (no dict per row).

A JSON line is byte-for-byte what ``rmqtool.cli.output.dumps(entry_row(...))`` prints for the record;
CSV cells are what ``write_rows`` prints (maps and lists as JSON, None as an empty cell).
"""

from __future__ import annotations

import binascii
import csv
import io
import json
import re

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


def _join_lists(offsets: pa.Array, items: pa.Array, arr: pa.Array, open_: str, close: str,
                bare: bool) -> pa.Array | Bare:
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, items), ",")
    if bare and arr.null_count == 0:
        return Bare(joined, open_, close)
    wrapped = pc.binary_join_element_wise(open_, joined, close, "")
    return wrapped if arr.null_count == 0 else pc.if_else(arr.is_null(), "null", wrapped)


def json_object(maps: pa.MapArray, bare: bool = False) -> pa.Array | Bare:
    keys, values = maps.keys, maps.items
    if _bare(keys) and _bare(values):       # the usual case: one join quotes both
        items = pc.binary_join_element_wise('"', keys, '":"', values, '"', "")
    else:
        items = pc.binary_join_element_wise(json_string(keys), json_string(values), ":")
    return _join_lists(maps.offsets, items, maps, "{", "}", bare)


def json_array(lists: pa.ListArray, bare: bool = False) -> pa.Array | Bare:
    return _join_lists(lists.offsets, json_string(lists.values), lists, "[", "]", bare)


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


def _bare(arr: pa.Array, plain: bool = False) -> bool:
    """Whether the strings become JSON literals by quoting alone (no nulls, nothing to escape)."""
    return arr.null_count == 0 and (plain or not _any_escape(arr))


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


class Bare:
    """A text column that still needs its opening and closing characters (``text_columns(..., bare=True)``)."""

    def __init__(self, values: pa.Array, open_: str = '"', close: str = '"'):
        self.values, self.open, self.close = values, open_, close


def text_names(batch: pa.RecordBatch) -> list[str]:
    """The row fields of a batch's records, in row order."""
    return [n for n in RECORD_FIELDS + ["crc_ok"] if n in batch.schema.names or n == "body_encoding"]


def text_columns(batch: pa.RecordBatch, body_encoding: str, *, json_text: bool,
                 bare: bool = False) -> dict[str, pa.Array | Bare]:
    """The row fields of ``entry_row`` as text (JSON literals when ``json_text``, else CSV cells).
    ``bare``: JSON columns without nulls that need only quotes or brackets come as ``Bare``."""
    cols: dict[str, pa.Array] = {}
    for name in text_names(batch):
        if name == "body_encoding":
            col = pc.if_else(pc.equal(column(batch, "type"), "message"),
                             pa.scalar(None if body_encoding == "none" else body_encoding, pa.string()),
                             pa.scalar(None, pa.string()))
            if body_encoding == "text":
                col = pc.if_else(text_fallbacks(column(batch, "body")), pa.scalar("base64"), col)
        elif name == "body":
            col = encode_bodies(column(batch, "body"), body_encoding)
        elif name == "properties_raw":
            raw = column(batch, name)
            col = pc.if_else(raw.is_null(), pa.scalar(None, pa.string()), _base64(raw))
        else:
            col = column(batch, name)
        if pa.types.is_map(col.type) or pa.types.is_list(col.type):
            text = (json_object if pa.types.is_map(col.type) else json_array)(col, bare and json_text)
            cols[name] = text if json_text else pc.if_else(col.is_null(), pa.scalar(None, pa.string()), text)
        elif pa.types.is_string(col.type):
            plain = name in _PLAIN or (name == "body" and body_encoding != "text")
            if not json_text:
                cols[name] = col
            elif bare and _bare(col, plain):
                cols[name] = Bare(col)
            else:
                cols[name] = json_string(col, plain=plain)
        elif pa.types.is_boolean(col.type) and not json_text:
            cols[name] = pc.if_else(col, "true", "false")      # as in JSON, not Python reprs
        else:
            if pa.types.is_timestamp(col.type):
                col = col.cast(pa.int64())
            cols[name] = col.cast(pa.string()).fill_null("null") if json_text else col
    return cols


def json_lines(batch: pa.RecordBatch, body_encoding: str = "base64") -> pa.Array:
    """One JSON object per record, each ending in a newline (one join of literals and columns)."""
    parts: list = []
    literal = "{"
    for name, text in text_columns(batch, body_encoding, json_text=True, bare=True).items():
        literal += json.dumps(name) + ":"
        if isinstance(text, Bare):
            parts += [literal + text.open, text.values]
            literal = text.close + ","
        else:
            parts += [literal, text]
            literal = ","
    return pc.binary_join_element_wise(*parts, literal[:-1] + "}\n", "")


def csv_table(batch: pa.RecordBatch, body_encoding: str = "base64") -> pa.Table:
    return pa.table(text_columns(batch, body_encoding, json_text=False))


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


def csv_lines(batch: pa.RecordBatch, body_encoding: str = "base64") -> pa.Array:
    """One CSV line per record, each ending in a newline: byte-for-byte the rows ``cli.output``'s csv
    writer prints for the record (cells quoted only where needed, None as an empty cell)."""
    parts = []
    for name, col in text_columns(batch, body_encoding, json_text=False).items():
        if not pa.types.is_string(col.type):
            col = col.cast(pa.string())
        elif _any_byte(col, _CSV_SPECIALS):
            if name in batch.schema.names and _nested(batch.schema.field(name).type):
                needs = pc.greater(pc.binary_length(col), 2)     # JSON text: quotes in all but {} and []
            else:
                needs = pc.match_substring_regex(col, _CSV_QUOTE_RX)
            quoted = pc.binary_join_element_wise('"', pc.replace_substring(col, '"', '""'), '"', "")
            col = pc.if_else(needs.fill_null(False), quoted, col)
        parts += [col.fill_null(""), ","]
    return pc.binary_join_element_wise(*parts[:-1], "\n", "")


def _nested(t: pa.DataType) -> bool:
    return pa.types.is_map(t) or pa.types.is_list(t)
