"""Record batches as JSON lines and CSV cells, built column by column (no dict per row).

A JSON line is byte-for-byte what ``rmqtool.cli.output.dumps(entry_row(...))`` prints for the record;
CSV cells are what ``write_rows`` prints (maps and lists as JSON, None as an empty cell).
"""

from __future__ import annotations

import binascii
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqtool.ops.rows import RECORD_FIELDS

_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'
_PLAIN = {"type", "magic_code", "born_host", "store_host", "msg_id", "body_encoding"}
_HEX = b"0123456789abcdef"
_HEX_LUT = np.array([_HEX[b >> 4] | _HEX[b & 15] << 8 for b in range(256)], "<u2")


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
    if len(arr) == 0 or arr.buffers()[2] is None:
        return False
    offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
    data = np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
    return bool(((data < 0x20) | (data == 0x22) | (data == 0x5C)).any())


def _join_lists(offsets: pa.Array, items: pa.Array, is_null: pa.Array, open_: str, close: str) -> pa.Array:
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, items), ",")
    return pc.if_else(is_null, "null", pc.binary_join_element_wise(open_, joined, close, ""))


def json_object(maps: pa.MapArray) -> pa.Array:
    items = pc.binary_join_element_wise(json_string(maps.keys), json_string(maps.items), ":")
    return _join_lists(maps.offsets, items, maps.is_null(), "{", "}")


def json_array(lists: pa.ListArray) -> pa.Array:
    return _join_lists(lists.offsets, json_string(lists.values), lists.is_null(), "[", "]")


def encode_bodies(body: pa.BinaryArray, encoding: str) -> pa.Array:
    """``rmqtool.ops.rows.encode_body`` for a whole column (string, null where the body is null)."""
    if encoding == "none":
        return pa.nulls(len(body), pa.string())
    offsets = np.frombuffer(body.buffers()[1], np.int32, len(body) + 1, body.offset * 4)
    data = body.buffers()[2] or pa.py_buffer(b"")
    if encoding == "hex":
        text = _HEX_LUT[np.frombuffer(data, np.uint8)].view(np.uint8)
        out = pa.Array.from_buffers(pa.string(), len(body), [None, pa.py_buffer(offsets * 2), pa.py_buffer(text)])
    elif encoding == "base64":
        view = memoryview(data)
        b64 = binascii.b2a_base64
        bounds = offsets.tolist()
        out = pa.array([b64(view[a:b], newline=False) for a, b in zip(bounds, bounds[1:])], pa.binary())
        out = out.cast(pa.string())
    else:
        try:
            out = body.cast(pa.string())
        except pa.ArrowInvalid:
            out = pa.array([b.decode("utf-8", "replace") for b in body.to_pylist()], pa.string())
    return pc.if_else(body.is_null(), pa.scalar(None, pa.string()), out)


def text_columns(batch: pa.RecordBatch, body_encoding: str, *, json_text: bool) -> dict[str, pa.Array]:
    """The row fields of ``entry_row`` as text (JSON literals when ``json_text``, else CSV cells)."""
    cols: dict[str, pa.Array] = {}
    names = [n for n in RECORD_FIELDS + ["crc_ok"] if n in batch.schema.names or n == "body_encoding"]
    for name in names:
        if name == "body_encoding":
            col = pc.if_else(pc.equal(batch.column("type"), "message"),
                             pa.scalar(None if body_encoding == "none" else body_encoding, pa.string()),
                             pa.scalar(None, pa.string()))
        elif name == "body":
            col = encode_bodies(batch.column("body"), body_encoding)
        else:
            col = batch.column(name)
        if pa.types.is_map(col.type):
            text = json_object(col)
            cols[name] = text if json_text else pc.if_else(col.is_null(), pa.scalar(None, pa.string()), text)
        elif pa.types.is_list(col.type):
            text = json_array(col)
            cols[name] = text if json_text else pc.if_else(col.is_null(), pa.scalar(None, pa.string()), text)
        elif pa.types.is_string(col.type):
            plain = name in _PLAIN or (name == "body" and body_encoding != "text")
            cols[name] = json_string(col, plain=plain) if json_text else col
        elif pa.types.is_boolean(col.type) and not json_text:
            cols[name] = pc.if_else(col, "True", "False")      # Python's csv writes str(True)
        else:
            if pa.types.is_timestamp(col.type):
                col = col.cast(pa.int64())
            cols[name] = col.cast(pa.string()).fill_null("null") if json_text else col
    return cols


def json_lines(batch: pa.RecordBatch, body_encoding: str = "base64") -> pa.Array:
    """One JSON object per record, each ending in a newline."""
    parts: list = []
    for i, (name, text) in enumerate(text_columns(batch, body_encoding, json_text=True).items()):
        parts += [("{" if i == 0 else ",") + json.dumps(name) + ":", text]
    return pc.binary_join_element_wise(*parts, "}\n", "")


def csv_table(batch: pa.RecordBatch, body_encoding: str = "base64") -> pa.Table:
    return pa.table(text_columns(batch, body_encoding, json_text=False))
