"""One batch of MESSAGE records as Arrow columns, from a window of the scan kernel.

The kernel (``rmqtool.columnar.kernel``) has checked the records, gathered their fixed fields and found
the spans of topic, body, properties and the property values; here those become Arrow arrays: numeric
columns over its output, bodies, topics, properties and msgIds (as hex) as the kernel copied them in its
pass, property keys and values copied out of the mapped file in one compiled gather per column, hosts
formatted once per distinct value, tagsCode hashed by the kernel. Columns are built from numpy buffers, not
by Arrow compute calls (each costs tens of microseconds a batch before it starts).
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

from rmqtool import constants as C
from rmqtool.columnar.facts import DISPATCH_PROPERTIES, delay_tags_code
from rmqtool.columnar.kernel import PROPERTIES, Window, java_hashes, read_only
from rmqtool.columnar.props import (arrow, as_text, properties_from, property_values, queue_ids, spans,
                                   split_keys, strings, valid_rows)
from rmqtool.columnar.schema import record_schema
from rmqtool.format.hosts import Host
from rmqtool.format.properties import parse_properties

_MAGIC_CODES = [f"0x{C.MESSAGE_MAGIC_CODE:08x}", f"0x{C.MESSAGE_MAGIC_CODE_V2:08x}"]
_MAGIC_TEXT = strings(_MAGIC_CODES)
_SCHEDULE_TOPIC = np.frombuffer(C.RMQ_SYS_SCHEDULE_TOPIC.encode(), np.uint8)
_TS = pa.timestamp("ms")


def decode_batch(data: np.ndarray, win: Window, file_start: int, check_crc: bool) -> pa.RecordBatch:
    """The record batch of the records of ``win`` (scanned with ``items=True``) over the mapped ``data``."""
    n = win.n
    sys_flag = win["sys_flag"]
    props_raw = _heap(win, 2, "props")
    cols: dict[str, pa.Array] = {
        "type": _repeated("message", n),
        "physical_offset": _field(win, "start", plus=file_start),
        "total_size": _int32(win["total"]),
        "magic_code": _magic_codes(win["v2"]),
        "body_crc": _int32(win["body_crc"]),
        "queue_id": _int32(win["queue_id"]),
        "flag": _int32(win["flag"]),
        "queue_offset": _field(win, "queue_offset"),
        "sys_flag": _int32(sys_flag),
        "born_timestamp": _field(win, "born_timestamp", _TS),
        "born_host": _hosts(data, win, "born", sys_flag & C.SysFlag.BORNHOST_V6),
        "store_timestamp": _field(win, "store_timestamp", _TS),
        "store_host": _hosts(data, win, "store", sys_flag & C.SysFlag.STOREHOSTADDRESS_V6),
        "reconsume_times": _int32(win["reconsume_times"]),
        "prepared_transaction_offset": _field(win, "prepared_transaction_offset"),
        "body_length": _int32(win["body_len"]),
        "body": _heap(win, 0, "body"),
        "properties_raw": props_raw,
    }
    cols["topic"], cols["topic_raw"] = _topics(_heap(win, 1, "topic"))
    if ((sys_flag >> 2) & 3 == C.TransactionType.ROLLBACK >> 2).any():     # rare: look for repair's placeholders
        cols["type"] = _salvaged(cols["topic"], sys_flag, n)
    cols.update(properties_from(win.heap[2], win, props_raw))
    cols["msg_id"] = _msg_ids(win)
    cols["tags_code"] = _tags_codes(cols["tags"], cols["topic"], props_raw, cols["store_timestamp"])
    if check_crc:
        cols["crc_ok"] = _bools(win["crc_ok"])
    schema = record_schema(check_crc)
    return pa.RecordBatch.from_arrays([cols[f.name] for f in schema], schema=schema)


_INT32 = {"total_size": "total", "body_crc": "body_crc", "queue_id": "queue_id", "flag": "flag", "sys_flag": "sys_flag",
          "reconsume_times": "reconsume_times", "body_length": "body_len"}
_INT64 = {"queue_offset": "queue_offset", "prepared_transaction_offset": "prepared_transaction_offset"}
_TIMES = ("born_timestamp", "store_timestamp")
_TEXT_PROPERTIES = {"tags": C.PROPERTY_TAGS, "uniq_key": C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
                    "real_topic": C.PROPERTY_REAL_TOPIC}
# what decode_columns makes: these columns of decode_batch, and the value of any property of kernel.PROPERTIES
# (a column named as the property)
COLUMNS = frozenset(["type", "physical_offset", "magic_code", "born_host", "store_host", "topic", "topic_raw",
                     "properties_raw", "keys", "real_queue_id", "tags_code", "crc_ok", *_INT32, *_INT64, *_TIMES,
                     *_TEXT_PROPERTIES]) | frozenset(PROPERTIES)


def decode_columns(data: np.ndarray, win: Window, file_start: int, names) -> pa.RecordBatch:
    """Columns ``names`` (of ``COLUMNS``) of the records of ``win``, scanned without copies (``items=False``),
    over the mapped ``data``: the values of ``decode_batch``'s columns, without making the bodies, msgIds and
    properties map a command does not read (copying bodies is most of the kernel's pass)."""
    made = _Columns(data, win, file_start)
    return pa.RecordBatch.from_arrays([made[name] for name in names], names=list(names))


class _Columns(dict):
    """The columns of one ``decode_columns`` call, each made once, when first asked for (``_column``: one may
    be made of others). Not a closure that calls itself: that is a reference cycle, and every window's arrays
    would wait for the cyclic collector (~125 MB per GiB scanned at the CLI's collection threshold)."""

    def __init__(self, data: np.ndarray, win: Window, file_start: int):
        super().__init__()
        self.source = data, win, file_start

    def __missing__(self, name: str) -> pa.Array:
        made = self[name] = _column(name, *self.source, self.__getitem__)
        return made


def _column(name: str, data: np.ndarray, win: Window, file_start: int, col) -> pa.Array:
    """One column of ``decode_columns`` (``col``: the others, made once)."""
    if name in _INT32:
        return _int32(win[_INT32[name]])
    if name in _INT64:
        return _field(win, _INT64[name])
    if name in _TIMES:
        return _field(win, name, _TS)
    if name == "physical_offset":
        return _field(win, "start", plus=file_start)
    if name == "crc_ok":
        return _bools(win["crc_ok"])
    if name == "magic_code":
        return _magic_codes(win["v2"])
    if name in ("born_host", "store_host"):
        which = name[:-5]
        return _hosts(data, win, which, win["sys_flag"] & (C.SysFlag.BORNHOST_V6 if which == "born"
                                                           else C.SysFlag.STOREHOSTADDRESS_V6))
    if name == "type":
        sys_flag = win["sys_flag"]
        if ((sys_flag >> 2) & 3 == C.TransactionType.ROLLBACK >> 2).any():
            return _salvaged(col("topic"), sys_flag, win.n)
        return _repeated("message", win.n)
    if name in ("topic", "topic_raw"):
        pos = win["topic_pos"]
        return _topics(spans(data, pos, pos + win["topic_len"], pa.binary()))[name == "topic_raw"]
    if name == "properties_raw":
        pos = win["props_pos"]
        return spans(data, pos, pos + win["props_len"], pa.binary())
    if name == "tags_code":
        return _tags_codes(col("tags"), col("topic"), col("properties_raw"), col("store_timestamp"))
    if name == "real_queue_id":
        return queue_ids(col(C.PROPERTY_REAL_QUEUE_ID))
    if name == "keys":
        return split_keys(col(C.PROPERTY_KEYS))
    if name == "_text":            # whether the records' PROPERTIES are UTF-8 (ASCII, mostly: not copied out)
        return not win["props_high"].any() or as_text(col("properties_raw")) is not None
    prop = _TEXT_PROPERTIES.get(name, name)
    if not col("_text"):                              # invalid UTF-8: the record-at-a-time parser
        return pa.array([parse_properties(b).get(prop) for b in col("properties_raw").to_pylist()], pa.string())
    return property_values(data, win, {prop: prop})[prop]


FACT_COLUMNS = ("physical_offset", "total_size", "queue_id", "queue_offset", "sys_flag", "store_timestamp", "topic",
                "tags_code", "uniq_key", "keys", "properties_raw") + DISPATCH_PROPERTIES
_FACT_PROPERTIES = {name: name for name in (C.PROPERTY_TAGS, C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
                                            C.PROPERTY_KEYS) + DISPATCH_PROPERTIES}


def decode_facts(data: np.ndarray, win: Window, file_start: int, check_crc: bool) -> pa.RecordBatch:
    """The columns of ``decode_batch`` that the maintenance commands read (``FACT_COLUMNS``, and
    ``crc_ok``), with the same values, without bodies, hosts, msgIds or the properties map."""
    props_raw = spans(data, win["props_pos"], win["props_pos"] + win["props_len"], pa.binary())
    cols: dict[str, pa.Array] = {
        "physical_offset": _int64(win.starts + file_start),
        "total_size": _int32(win["total"]),
        "queue_id": _int32(win["queue_id"]),
        "queue_offset": _int64(win["queue_offset"]),
        "sys_flag": _int32(win["sys_flag"]),
        "store_timestamp": arrow(win["store_timestamp"], _TS),
        "topic": _utf8(spans(data, win["topic_pos"], win["topic_pos"] + win["topic_len"], pa.binary())),
        "properties_raw": props_raw,
    }
    if as_text(props_raw) is not None:
        props = property_values(win.heap[2] if win.heap else data, win, _FACT_PROPERTIES)
    else:                                             # invalid UTF-8: the record-at-a-time parser
        dicts = [parse_properties(b) for b in props_raw.to_pylist()]
        props = {name: pa.array([d.get(name) for d in dicts], pa.string()) for name in _FACT_PROPERTIES}
    cols.update({name: props[name] for name in DISPATCH_PROPERTIES})
    cols["uniq_key"], cols["keys"] = props[C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX], split_keys(props[C.PROPERTY_KEYS])
    cols["tags_code"] = _tags_codes(props[C.PROPERTY_TAGS], cols["topic"], props_raw, cols["store_timestamp"])
    names = list(FACT_COLUMNS)
    if check_crc:
        cols["crc_ok"] = _bools(win["crc_ok"])
        names.append("crc_ok")
    return pa.RecordBatch.from_arrays([cols[name] for name in names], names=names)


def _int32(values: np.ndarray) -> pa.Array:
    return arrow(values.astype(np.int32), pa.int32())


def _int64(values: np.ndarray) -> pa.Array:
    return arrow(values, pa.int64())


def _bools(values: np.ndarray) -> pa.Array:
    bits = np.packbits(values != 0, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])


def _field(win: Window, name: str, type_: pa.DataType = pa.int64(), plus: int = 0) -> pa.Array:
    """A 64-bit field of the window (+ ``plus``) in a buffer of its own from Arrow's pool: an array over the
    kernel's field table would keep all of the table (~40 MB for a 16 MiB window) for as long as the batch
    lives (export holds a row group's batches), and later windows would fault in fresh pages for theirs."""
    values = win[name]
    kept = np.frombuffer(pa.allocate_buffer(max(values.nbytes, 8)), np.int64, len(values))
    np.add(values, plus, out=kept)
    return arrow(kept, type_)


def _magic_codes(v2: np.ndarray) -> pa.Array:
    """The magic code's text per record (a window holds records of one magic code, mostly)."""
    if len(v2) and (v2 == v2[0]).all():
        return _repeated(_MAGIC_CODES[v2[0]], len(v2))
    return _MAGIC_TEXT.take(_int64(v2))


_REPEATED: dict[str, pa.Array] = {}


def _salvaged(topic: pa.Array, sys_flag: np.ndarray, n: int) -> pa.Array:
    """The type column where rollback-type records on C.SALVAGED_TOPIC (rmqtool repair's placeholders for
    damaged records) are ``salvaged_record``."""
    import pyarrow.compute as pc

    rollback = pa.array((sys_flag >> 2) & 3 == C.TransactionType.ROLLBACK >> 2)
    hit = pc.and_(rollback, pc.equal(topic, strings([C.SALVAGED_TOPIC])[0])).fill_null(False)
    return pc.if_else(hit, strings(["salvaged_record"])[0], _repeated("message", n))


def _repeated(text: str, n: int) -> pa.Array:
    """``text`` n times: the first n rows of one array kept per text (building n copies costs ~50 us a
    batch; a column of one value is common: type, magic code, store host)."""
    have = _REPEATED.get(text)
    if have is None or len(have) < n:
        have = _REPEATED[text] = pa.repeat(strings([text])[0], max(n, 1 << 17))   # a scalar: a Python value
    return have.slice(0, n)                                                         # would import pandas


def _copied(win: Window, buf: np.ndarray, starts: np.ndarray, last: int, type_: pa.DataType) -> pa.Array:
    """Values the kernel wrote one after another into ``buf``: each record's at ``starts``, the last one
    ``last`` bytes long."""
    offsets = np.empty(win.n + 1, np.int32)
    offsets[:-1] = starts
    offsets[-1] = offsets[-2] + last if win.n else 0
    return pa.Array.from_buffers(type_, win.n, [None, pa.py_buffer(offsets), pa.py_buffer(buf)])


def _heap(win: Window, k: int, part: str) -> pa.Array:
    """The bodies, topics or properties (``part``) the kernel copied into its buffer ``k``."""
    return _copied(win, win.heap[k], win[f"{part}_off"], win[f"{part}_len"][-1] if win.n else 0, pa.binary())


def _topics(raw: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(topic, topic_raw): the text as the broker reads it (_utf8), and the stored bytes of the topics that are
    not UTF-8 (null for the others)."""
    text = as_text(raw)
    if text is not None:
        return text, pa.nulls(len(raw), pa.binary())
    values = raw.to_pylist()
    return _utf8(raw), pa.array([None if b is None or _is_utf8(b) else b for b in values], pa.binary())


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _utf8(raw: pa.Array) -> pa.Array:
    """UTF-8 text; invalid bytes become U+FFFD, as Java's new String(bytes, UTF_8) does."""
    text = as_text(raw)
    return pa.array([b.decode("utf-8", "replace") for b in raw.to_pylist()], pa.string()) if text is None else text


def _hosts(data: np.ndarray, win: Window, which: str, v6: np.ndarray) -> pa.Array:
    """"ip:port" strings, formatted once per distinct (address, port): IPv4 hosts by the kernel's
    ``*_key`` (address and port as one int64), others by their bytes."""
    import pyarrow.compute as pc

    if v6.any():
        pos = win[f"{which}_host_pos"]
        width = np.where(v6 != 0, C.IPV6_HOST_LEN, C.IPV4_HOST_LEN)
        enc = pc.dictionary_encode(spans(data, pos, pos + width, pa.binary()))
        text = [str(Host(v[:-4], int.from_bytes(v[-4:], "big", signed=True))) for v in enc.dictionary.to_pylist()]
    else:
        keys = win[f"{which}_key"]
        if len(keys) and (keys == keys[0]).all():         # one host (the store host, mostly): no hashing
            return _repeated(_ipv4_host(int(keys[0])), len(keys))
        enc = pc.dictionary_encode(_int64(keys))
        text = [_ipv4_host(k) for k in enc.dictionary.to_pylist()]
    return strings(text).take(enc.indices)


@functools.lru_cache(maxsize=4096)
def _ipv4_host(key: int) -> str:
    """The text of an IPv4 host from the kernel's key (address and port as one int64); the same few hosts
    come back in every window."""
    return str(Host((key >> 32 & 0xFFFFFFFF).to_bytes(4, "big"), (key & 0xFFFFFFFF) - ((key & 0x80000000) << 1)))


def _msg_ids(win: Window) -> pa.Array:
    """The msgIds the kernel wrote (hex of the store host and the offset: 32 digits for IPv4, 56 for IPv6)."""
    last = 56 if win.n and win["sys_flag"][-1] & C.SysFlag.STOREHOSTADDRESS_V6 else 32
    return _copied(win, win.ids, win["id_off"], last, pa.string())


def _tags_codes(tags: pa.Array, topic: pa.Array, props_raw: pa.Array, store_ts: pa.Array) -> pa.Array:
    """TAGS hashCode (0 without tags); on the delay topic, the DELAY level's deliver time."""
    offsets = np.frombuffer(tags.buffers()[1], np.int32, len(tags) + 1, tags.offset * 4).astype(np.int64)
    text = tags.buffers()[2]
    hashes = np.empty(len(tags), np.int64)
    java_hashes(read_only(np.frombuffer(text, np.uint8) if text is not None else np.zeros(1, np.uint8)),
                np.where(valid_rows(tags), offsets[:-1], -1), offsets[1:], hashes)
    delayed = _delay_topic_rows(topic)
    if not len(delayed):
        return _int64(hashes)
    bad = np.zeros(len(hashes), bool)
    ts = store_ts.cast(pa.int64())
    for i in delayed.tolist():
        code = delay_tags_code(props_raw[i].as_py(), ts[i].as_py())
        hashes[i], bad[i] = (0, True) if code is None else (code, False)
    return arrow(hashes, pa.int64(), bad)


def _delay_topic_rows(topic: pa.Array) -> np.ndarray:
    """The rows whose topic is the delay topic (SCHEDULE_TOPIC_XXXX)."""
    offsets = np.frombuffer(topic.buffers()[1], np.int32, len(topic) + 1, topic.offset * 4)
    rows = np.flatnonzero(np.diff(offsets) == len(_SCHEDULE_TOPIC))
    if not len(rows):
        return rows
    text = np.frombuffer(topic.buffers()[2], np.uint8)
    return rows[(text[offsets[rows, None] + np.arange(len(_SCHEDULE_TOPIC))] == _SCHEDULE_TOPIC).all(axis=1)]
