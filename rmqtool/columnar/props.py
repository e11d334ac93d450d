"""The PROPERTIES column as map<string,string>, plus the TAGS, KEYS, UNIQ_KEY, REAL_TOPIC and REAL_QID
columns, with the semantics of ``rmqtool.format.properties.parse_properties`` (4.9.1+ parser).

The scan kernel (``rmqtool.columnar.kernel``) finds the spans of every item and of the values the tools
read in its pass over the records; keys and values are then copied out of the mapped file in one compiled
gather each (KEYS split there too). A repeated key keeps its first place and its last value, as a dict
does; a batch with invalid UTF-8 takes the record-at-a-time parser instead. Arrays are built from
buffers: ``pa.array`` would import pandas (a third of a second) on its first call.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rmqtool import constants as C
from rmqtool.columnar.kernel import Window, gather_spans, prop_column, split_spans
from rmqtool.format.properties import parse_properties
from rmqtool.format.rows import real_queue_id

MAP_TYPE = pa.map_(pa.string(), pa.string())
_COLUMN_PROPERTIES = {"tags": C.PROPERTY_TAGS, "uniq_key": C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
                      "real_topic": C.PROPERTY_REAL_TOPIC}


def properties_from(data: np.ndarray, win: Window, raw: pa.BinaryArray) -> dict[str, pa.Array]:
    """``properties``, ``tags``, ``keys``, ``uniq_key``, ``real_topic`` and ``real_queue_id`` from a kernel
    window's property spans (``win.items`` filled) over ``data``; ``raw`` holds the same records' PROPERTIES
    (a batch with invalid UTF-8 takes the record-at-a-time parser)."""
    if as_text(raw) is None:
        return _per_record(raw)
    its, _ = win.item_spans()
    keys = spans(data, its[0], its[1])
    values = spans(data, its[1] + 1, its[2])
    offsets = np.zeros(win.n + 1, np.int32)
    offsets[1:] = win["items_end"] - win.item_base
    out = {"properties": pa.MapArray.from_arrays(arrow(offsets, pa.int32()), keys, values)}
    found = prop_spans(win, [*_COLUMN_PROPERTIES.values(), C.PROPERTY_KEYS, C.PROPERTY_REAL_QUEUE_ID])
    out.update({col: spans(data, *found[name]) for col, name in _COLUMN_PROPERTIES.items()})
    out["keys"] = key_lists(data, *found[C.PROPERTY_KEYS])
    out["real_queue_id"] = queue_ids(spans(data, *found[C.PROPERTY_REAL_QUEUE_ID]))
    return out


def property_values(data: np.ndarray, win: Window, names: dict[str, str]) -> dict[str, pa.Array]:
    """Column name -> the values of that property per record (null where absent), from the window's spans
    over ``data`` (valid UTF-8 assumed: the caller checked the records' PROPERTIES)."""
    found = prop_spans(win, names.values())
    return {col: spans(data, *found[name]) for col, name in names.items()}


def prop_spans(win: Window, names) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Property name -> (value starts, value ends) per record (``Window.prop``), as contiguous arrays made by
    one transposing copy of the window's property block (a strided copy per column costs twice that)."""
    cols = [prop_column(name) for name in names]
    if not cols:
        return {}
    lo = min(cols)
    block = np.ascontiguousarray(win.props[:win.n, lo:max(cols) + 2].T)
    return {name: (block[j - lo], block[j - lo + 1]) for name, j in zip(names, cols)}


def arrow(values: np.ndarray, type_: pa.DataType, missing: np.ndarray | None = None) -> pa.Array:
    """A fixed-width numpy array as an Arrow array of ``type_`` over the same memory (null where
    ``missing``)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(type_, len(values), [_validity(missing), pa.py_buffer(values)])


def strings(values: list[str | None]) -> pa.Array:
    """A string array of Python strings (null for None)."""
    raw = [b"" if v is None else v.encode() for v in values]
    offsets = np.zeros(len(raw) + 1, np.int32)
    np.cumsum([len(r) for r in raw], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(raw), [_validity(np.array([v is None for v in values], bool)),
                                                         pa.py_buffer(offsets), pa.py_buffer(b"".join(raw))])


def valid_rows(arr: pa.Array) -> np.ndarray:
    """Whether each row is not null, from the validity bitmap (Arrow's to_numpy of a bool array imports
    pandas)."""
    bitmap = arr.buffers()[0]
    if bitmap is None or not arr.null_count:
        return np.ones(len(arr), bool)
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), count=arr.offset + len(arr), bitorder="little")
    return bits[arr.offset:].astype(bool)


def _validity(missing: np.ndarray | None) -> pa.Buffer | None:
    return pa.py_buffer(np.packbits(~missing, bitorder="little")) if missing is not None and missing.any() else None


def spans(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, type_: pa.DataType = pa.string()) -> pa.Array:
    """data[starts[i]:ends[i]] per row as one Arrow array (null where the start is negative)."""
    offsets, out = gather_spans(data, starts, ends)
    return pa.Array.from_buffers(type_, len(starts), [_validity(starts < 0), pa.py_buffer(offsets), pa.py_buffer(out)])


def as_text(raw: pa.Array) -> pa.Array | None:
    """A binary array as a string array over the same buffers, or None where it is not valid UTF-8. Bytes
    that are all ASCII (mostly) need one max over the buffer: a tenth of Arrow's UTF-8 validation."""
    data = raw.buffers()[2]
    if data is None or np.frombuffer(data, np.uint8).max(initial=0) < 0x80:
        return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers(), raw.null_count, raw.offset)
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:
        return None


def _offsets(arr: pa.Array) -> np.ndarray:
    return np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4).astype(np.int64)


def queue_ids(text: pa.Array) -> pa.Array:
    """REAL_QID values as int32 (null where absent or not a Java int); only the few present are parsed."""
    if not text.null_count < len(text):
        return pa.nulls(len(text), pa.int32())
    present = np.flatnonzero(valid_rows(text))
    values = np.zeros(len(text), np.int32)
    missing = np.ones(len(text), bool)
    for i, value in zip(present, text.take(arrow(present.astype(np.int64), pa.int64())).to_pylist()):
        parsed = real_queue_id(value)
        if parsed is not None:
            values[i], missing[i] = parsed, False
    return arrow(values, pa.int32(), missing)


def key_lists(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.ListArray:
    """KEYS values (spans of ``data``) split on one space with empty elements dropped (absent: [])."""
    lists, offsets, out = split_spans(data, starts, ends, ord(C.KEY_SEPARATOR))
    parts = pa.Array.from_buffers(pa.string(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(out)])
    return pa.ListArray.from_arrays(arrow(lists, pa.int32()), parts)


def split_keys(keys_text: pa.Array) -> pa.ListArray:
    """KEYS split on one space with empty elements dropped (an absent KEYS gives [])."""
    offsets = _offsets(keys_text)
    data = keys_text.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(1, np.uint8)
    starts = np.where(valid_rows(keys_text), offsets[:-1], -1)
    return key_lists(data, starts, offsets[1:])


def _per_record(raw: pa.BinaryArray) -> dict[str, pa.Array]:
    dicts = [parse_properties(b) for b in raw.to_pylist()]
    return {
        "properties": pa.array([list(d.items()) for d in dicts], MAP_TYPE),
        "tags": pa.array([d.get(C.PROPERTY_TAGS) for d in dicts], pa.string()),
        "uniq_key": pa.array([d.get(C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) for d in dicts], pa.string()),
        "real_topic": pa.array([d.get(C.PROPERTY_REAL_TOPIC) for d in dicts], pa.string()),
        "real_queue_id": pa.array([real_queue_id(d.get(C.PROPERTY_REAL_QUEUE_ID)) for d in dicts], pa.int32()),
        "keys": pa.array([[k for k in d.get(C.PROPERTY_KEYS, "").split(C.KEY_SEPARATOR) if k] for d in dicts],
                         pa.list_(pa.string())),
    }
