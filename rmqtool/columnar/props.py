"""The PROPERTIES column parsed columnarly into map<string,string>, plus the TAGS, KEYS, UNIQ_KEY,
REAL_TOPIC and REAL_QID columns, with the semantics of ``rmqtool.format.properties.parse_properties`` (4.9.1+ parser).

Items are the spans between \\x02 separators; an item's first \\x01 splits key and value, both
non-empty, or the item is dropped. Positions come from numpy over the concatenated raw bytes; keys and
values are picked from one zero-copy token array with a strided ``take``; keys are recognised by their
first eight bytes read as one integer. A batch with invalid UTF-8 or a repeated key in one record (a
dict keeps the last value) takes the record-at-a-time parser instead.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqtool import constants as C
from rmqtool.format.properties import parse_properties
from rmqtool.format.rows import real_queue_id

MAP_TYPE = pa.map_(pa.string(), pa.string())
_MASKS = np.array([(1 << 8 * i) - 1 for i in range(9)], np.uint64)     # the low i bytes


class _Irregular(Exception):
    """The batch needs the record-at-a-time parser."""


def property_columns(raw: pa.BinaryArray) -> dict[str, pa.Array]:
    """``properties``, ``tags``, ``keys``, ``uniq_key``, ``real_topic``, ``real_queue_id`` for a binary array
    of raw PROPERTIES."""
    try:
        return _vectorised(raw)
    except _Irregular:
        return _per_record(raw)


def _offsets(arr: pa.Array) -> np.ndarray:
    return np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4).astype(np.int64)


class _Items:
    """The items of a batch of raw PROPERTIES: per item its key start, its \\x01, its end, its record."""

    def __init__(self, raw: pa.BinaryArray):
        n = len(raw)
        po = _offsets(raw)
        data_buf = raw.buffers()[2]
        if data_buf is None or po[-1] == po[0]:
            data_buf = pa.py_buffer(b"")
        try:
            raw.cast(pa.string())          # valid UTF-8 per record: so is every token split at \x01/\x02
        except pa.ArrowInvalid as exc:
            raise _Irregular from exc
        data = np.frombuffer(data_buf, np.uint8)
        seg = data[po[0]:po[-1]]
        seps = np.flatnonzero(seg <= 2) + po[0]          # one pass for both separators (and NULs)
        kinds = data[seps]
        p2 = seps[kinds == 2]
        p1 = seps[kinds == 1]
        # Items: record starts and the positions after each \x02; ends: each \x02 and the record ends.
        r2 = np.searchsorted(po, p2, "right") - 1
        item_off = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(r2, minlength=n) + 1, out=item_off[1:])
        m = int(item_off[-1])
        j = np.arange(len(p2))
        starts = np.empty(m, np.int64)
        ends = np.empty(m, np.int64)
        starts[item_off[:-1]] = po[:-1]
        starts[j + r2 + 1] = p2 + 1
        ends[item_off[1:] - 1] = po[1:]
        ends[j + r2] = p2
        if len(p1) == m and ((p1 >= starts) & (p1 < ends)).all():
            cut = p1                                      # the usual case: one \x01 in every item
        else:
            p1 = np.append(p1, len(data))
            cut = p1[np.searchsorted(p1, starts)]
        valid = (cut > starts) & (cut < ends - 1)
        self.vs, self.vc, self.ve = starts[valid], cut[valid], ends[valid]
        counts_cum = np.zeros(m + 1, np.int64)
        np.cumsum(valid, out=counts_cum[1:])
        self.map_off = counts_cum[item_off]
        self.counts = np.diff(self.map_off)
        self.n, self.data, self.data_buf = n, data, data_buf
        self.rec_of = np.repeat(np.arange(n), self.counts)
        self.klen = self.vc - self.vs
        self.head = _head_words(data, self.vs, self.klen)
        self._keys = None

    def keys(self) -> pa.Array:
        if self._keys is None:
            self._keys, = pick_tokens(self.data_buf, [self.vs, self.vc], [0], pa.string())
        return self._keys

    def check_unique(self) -> None:
        """A record naming a key twice takes the record-at-a-time parser (a dict keeps the last value)."""
        if len(self.counts) and self.counts.max() > 1 and _has_repeated_key(
                self.keys, self.head, self.data, self.vc, self.klen, self.rec_of, self.counts):
            raise _Irregular

    def hits(self, name: str) -> np.ndarray:
        """The items whose key is ``name``: the first eight bytes as one integer, the rest compared after."""
        word = name.encode()
        hit = (self.klen == len(word)) & (self.head == np.uint64(int.from_bytes(word[:8], "little")))
        pos = np.flatnonzero(hit)
        for i in range(8, len(word)):
            pos = pos[self.data[self.vs[pos] + i] == word[i]]
        return pos

    def lookup(self, name: str, values_at) -> pa.Array:
        """One value per record (null where absent) from ``values_at(item positions)``."""
        pos = self.hits(name)
        pick = np.full(self.n, -1, np.int32)
        pick[self.rec_of[pos]] = np.arange(len(pos), dtype=np.int32)
        return values_at(pos).take(pa.array(pick, mask=pick < 0))


def _vectorised(raw: pa.BinaryArray) -> dict[str, pa.Array]:
    it = _Items(raw)
    keys, values = pick_tokens(it.data_buf, [it.vs, it.vc, it.vc + 1, it.ve], [0, 2], pa.string())
    it._keys = keys
    it.check_unique()
    out = {"properties": pa.MapArray.from_arrays(pa.array(it.map_off.astype(np.int32)), keys, values)}

    def lookup(name: str) -> pa.Array:
        return it.lookup(name, lambda pos: values.take(pa.array(pos)))

    out["tags"] = lookup(C.PROPERTY_TAGS)
    out["uniq_key"] = lookup(C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    out["keys"] = split_keys(lookup(C.PROPERTY_KEYS))
    out["real_topic"] = lookup(C.PROPERTY_REAL_TOPIC)
    out["real_queue_id"] = queue_ids(lookup(C.PROPERTY_REAL_QUEUE_ID))
    return out


def property_values(raw: pa.BinaryArray, names: tuple[str, ...]) -> dict[str, pa.Array]:
    """The values of ``names`` per record (null where absent) as ``property_columns`` reads them, without
    building the map: only the values asked for are copied."""
    try:
        it = _Items(raw)
        it.check_unique()
    except _Irregular:
        dicts = [parse_properties(b) for b in raw.to_pylist()]
        return {name: pa.array([d.get(name) for d in dicts], pa.string()) for name in names}
    return {name: it.lookup(name, lambda pos: pick_tokens(it.data_buf, [it.vc[pos] + 1, it.ve[pos]], [0],
                                                          pa.string())[0]) for name in names}


def queue_ids(text: pa.Array) -> pa.Array:
    """REAL_QID values as int32 (null where absent or not a Java int); only the few present are parsed."""
    present = np.flatnonzero(text.is_valid().to_numpy(zero_copy_only=False))
    values = np.zeros(len(text), np.int32)
    missing = np.ones(len(text), bool)
    for i, value in zip(present, text.take(pa.array(present, pa.int64())).to_pylist()):
        parsed = real_queue_id(value)
        if parsed is not None:
            values[i], missing[i] = parsed, False
    return pa.array(values, pa.int32(), mask=missing)


def _head_words(data: np.ndarray, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The first min(length, 8) bytes at each position as a little-endian uint64 (zero-filled)."""
    if len(data) < 8:
        data = np.concatenate([data, np.zeros(8, np.uint8)])
    last = len(data) - 8
    if len(pos) and pos.max() > last:
        words = np.ndarray((last + 1,), "<u8", data, 0, (1,))[np.minimum(pos, last)]
        words >>= (np.maximum(pos - last, 0) * 8).astype(np.uint64)      # positions near the end
    else:
        words = np.ndarray((last + 1,), "<u8", data, 0, (1,))[pos]
    return words & _MASKS[np.minimum(length, 8)]


def pick_tokens(data_buf: pa.Buffer, bounds: list[np.ndarray], picks: list[int],
                type_: pa.DataType = pa.binary()) -> list[pa.Array]:
    """Slices of ``data_buf`` without a Python object per slice.

    ``bounds`` are per-row positions p0 <= p1 <= ... (rows in buffer order); the spans between them form
    one zero-copy token array, and span i of every row is gathered with a strided take (one copy in C++).
    ``type_`` string is for bytes already known to be valid UTF-8 at every token.
    """
    width = len(bounds)
    rows = len(bounds[0])
    if rows == 0:
        return [pa.array([], type_) for _ in picks]
    offsets = np.empty(rows * width, np.int32)
    for i, b in enumerate(bounds):
        offsets[i::width] = b
    tokens = pa.Array.from_buffers(type_, rows * width - 1, [None, pa.py_buffer(offsets), data_buf])
    return [tokens.take(pa.array(np.arange(i, rows * width - 1, width, dtype=np.int32))) for i in picks]


def _has_repeated_key(keys, head: np.ndarray, data: np.ndarray, ends: np.ndarray, klen: np.ndarray,
                      rec_of: np.ndarray, counts: np.ndarray) -> bool:
    """Whether a record names a key twice: numeric key digests compared within each record first,
    the exact comparison only when two digests of one record agree."""
    long = klen > 8
    tail = np.zeros(len(klen), np.uint64)
    if long.any():
        tail[long] = _head_words(data, ends[long] - 8, np.full(int(long.sum()), 8))
    digest = head ^ (tail * np.uint64(0x9E3779B97F4A7C15)) ^ klen.astype(np.uint64)
    widest = int(counts.max())
    if widest <= 16:
        clash = any(((digest[d:] == digest[:-d]) & (rec_of[d:] == rec_of[:-d])).any() for d in range(1, widest))
        if not clash:
            return False
    codes = pc.dictionary_encode(keys()).indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return len(np.unique(rec_of * (int(codes.max()) + 1) + codes)) < len(codes)


def split_keys(keys_text: pa.Array) -> pa.ListArray:
    """KEYS split on one space with empty elements dropped (an absent KEYS gives [])."""
    parts = pc.split_pattern(keys_text.fill_null(""), C.KEY_SEPARATOR)
    flat = parts.flatten()
    keep = pc.greater(pc.binary_length(flat), 0)
    kept_cum = np.zeros(len(flat) + 1, np.int64)
    np.cumsum(keep.to_numpy(zero_copy_only=False), out=kept_cum[1:])
    offsets = kept_cum[_offsets(parts) - parts.offsets[0].as_py()]
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), flat.filter(keep))


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
