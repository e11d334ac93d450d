"""One batch of MESSAGE records, decoded column by column from the mapped file.

Given record starts from the boundary walk, the record's lengths are checked all at once (the parts
must add up to TOTALSIZE, as ``decode_entry`` demands); the fixed fields come from one strided gather
per host-width combination viewed as a big-endian structured dtype; topic, body and properties are
sliced out of the file buffer with ``pick_tokens``; hosts are formatted once per distinct value and
msgIds through a hex lookup table.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqtool import constants as C
from rmqtool.columnar.props import pick_tokens, property_columns, property_values, split_keys
from rmqtool.columnar.schema import record_schema
from rmqtool.columnar.walk import _HEAD_V4, _V6_BITS, _fixed_dtype, _strided
from rmqtool.format.hosts import Host
from rmqtool.format.java import java_string_hash, tags_code
from rmqtool.format.properties import parse_properties

_MAGIC_TEXT = pa.array([f"0x{C.MESSAGE_MAGIC_CODE:08x}", f"0x{C.MESSAGE_MAGIC_CODE_V2:08x}"])
_HEX = b"0123456789ABCDEF"
_HEX_LUT = np.array([_HEX[b >> 4] | _HEX[b & 15] << 8 for b in range(256)], "<u2")


def decode_batch(data: np.ndarray, buf: pa.Buffer, starts: np.ndarray, parts: dict[str, np.ndarray],
                 file_start: int, check_crc: bool) -> pa.RecordBatch:
    """The record batch of consistent records at ``starts`` (see ``check_lengths``)."""
    n = len(starts)
    base = int(starts[0])
    window = buf.slice(base, int(starts[-1] + parts["total"][-1]) - base)
    rel = {k: parts[k] - base for k in ("body_pos", "topic_pos", "props_pos")}
    body, = pick_tokens(window, [rel["body_pos"], rel["body_pos"] + parts["body_len"]], [0])
    topic_raw, props_raw = pick_tokens(
        window, [rel["topic_pos"], rel["topic_pos"] + parts["topic_len"], rel["props_pos"],
                 rel["props_pos"] + parts["props_len"]], [0, 2])
    cols: dict[str, pa.Array] = {
        "type": pa.repeat(pa.scalar("message"), n),
        "physical_offset": pa.array(starts + file_start),
        "total_size": pa.array(parts["total"].astype(np.int32)),
        "magic_code": _MAGIC_TEXT.take(pa.array(parts["v2"].astype(np.int8))),
    }
    fixed = _fixed_fields(data, starts, parts["sys_flag"], parts["head"])
    cols.update(fixed)
    cols["topic"] = _utf8(topic_raw)
    cols.update(property_columns(props_raw))
    cols["tags_code"] = _tags_codes(cols["tags"], cols["topic"], props_raw, fixed["store_timestamp"])
    cols["body_length"] = pa.array(parts["body_len"].astype(np.int32))
    cols["body"] = body
    cols["properties_raw"] = props_raw
    if check_crc:
        cols["crc_ok"] = pa.array(body_crcs(body) == fixed["body_crc"].to_numpy())
    schema = record_schema(check_crc)
    return pa.RecordBatch.from_arrays([cols[f.name] for f in schema], schema=schema)


# Properties the dispatch of batch and LMQ queues reads (CommitLog.setBatchSizeIfNeeded, multi-dispatch)
DISPATCH_PROPERTIES = (C.PROPERTY_INNER_NUM, C.PROPERTY_INNER_BASE, C.PROPERTY_INNER_MULTI_DISPATCH,
                       C.PROPERTY_INNER_MULTI_QUEUE_OFFSET)
FACT_COLUMNS = ("physical_offset", "total_size", "queue_id", "queue_offset", "sys_flag", "store_timestamp", "topic",
                "tags_code", "uniq_key", "keys", "properties_raw") + DISPATCH_PROPERTIES


def decode_facts(data: np.ndarray, buf: pa.Buffer, starts: np.ndarray, parts: dict[str, np.ndarray],
                 file_start: int, check_crc: bool) -> pa.RecordBatch:
    """The columns of ``decode_batch`` that the maintenance commands read (``FACT_COLUMNS``, and
    ``crc_ok``), with the same values, computed without copying bodies or formatting hosts and msgIds
    (CRCs are taken over the mapped bytes) and with only the properties they read (no map column)."""
    base = int(starts[0])
    window = buf.slice(base, int(starts[-1] + parts["total"][-1]) - base)
    topic_raw, props_raw = pick_tokens(
        window, [parts["topic_pos"] - base, parts["topic_pos"] - base + parts["topic_len"],
                 parts["props_pos"] - base, parts["props_pos"] - base + parts["props_len"]], [0, 2])
    head, sys_flag = parts["head"], parts["sys_flag"]
    store_ts = head["store_timestamp"].astype(np.int64)
    v6 = np.flatnonzero(sys_flag & C.SysFlag.BORNHOST_V6)
    if len(v6):                                        # STORETIMESTAMP follows a 20-byte born host
        at = starts[v6] + C.BORNHOST_POS + C.IPV6_HOST_LEN
        store_ts[v6] = np.ndarray((len(data) - 7,), ">i8", data, 0, (1,))[at]
    cols: dict[str, pa.Array] = {
        "physical_offset": pa.array(starts + file_start),
        "total_size": pa.array(parts["total"].astype(np.int32)),
        "queue_id": pa.array(head["queue_id"].astype(np.int32)),
        "queue_offset": pa.array(head["queue_offset"].astype(np.int64)),
        "sys_flag": pa.array(sys_flag.astype(np.int32)),
        "store_timestamp": pa.array(store_ts, pa.timestamp("ms")),
        "topic": _utf8(topic_raw),
        "properties_raw": props_raw,
    }
    wanted = (C.PROPERTY_TAGS, C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, C.PROPERTY_KEYS) + DISPATCH_PROPERTIES
    props = property_values(props_raw, wanted)
    cols.update({name: props[name] for name in DISPATCH_PROPERTIES})
    cols["uniq_key"], cols["keys"] = props[C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX], split_keys(props[C.PROPERTY_KEYS])
    cols["tags_code"] = _tags_codes(props[C.PROPERTY_TAGS], cols["topic"], props_raw, cols["store_timestamp"])
    names = list(FACT_COLUMNS)
    if check_crc:
        view = memoryview(buf)
        bodies = map(view.__getitem__, map(slice, parts["body_pos"].tolist(),
                                           (parts["body_pos"] + parts["body_len"]).tolist()))
        crcs = np.fromiter(map(zlib.crc32, bodies), np.int64, len(starts)) & 0x7FFFFFFF
        cols["crc_ok"] = pa.array(crcs == head["body_crc"].astype(np.int64))
        names.append("crc_ok")
    return pa.RecordBatch.from_arrays([cols[name] for name in names], names=names)


def _fixed_fields(data: np.ndarray, starts: np.ndarray, sys_flag: np.ndarray,
                  head: np.ndarray) -> dict[str, pa.Array]:
    """The fixed fields; ``head`` (the IPv4-layout headers) serves when no record has an IPv6 host."""
    combos = sys_flag & _V6_BITS
    kinds = [int(combos[0])] if (combos == combos[0]).all() else [int(c) for c in np.unique(combos)]
    if kinds == [0]:
        return _group_columns(head, _HEAD_V4)
    groups = []
    for kind in kinds:
        rows = np.flatnonzero(combos == kind) if len(kinds) > 1 else None
        dtype = _fixed_dtype(kind)
        recs = _strided(data, np.dtype(f"V{dtype.itemsize}"))[starts if rows is None else starts[rows]]
        recs = recs.view(dtype)          # one void gather, then big-endian field views
        groups.append((rows, _group_columns(recs, dtype)))
    if len(groups) == 1:
        return groups[0][1]
    order = np.argsort(np.concatenate([rows for rows, _ in groups]), kind="stable")
    indices = pa.array(order)
    return {name: pa.concat_arrays([g[name] for _, g in groups]).take(indices) for name in groups[0][1]}


def _group_columns(recs: np.ndarray, dtype: np.dtype) -> dict[str, pa.Array]:
    out = {}
    for name in ("body_crc", "queue_id", "flag", "queue_offset", "sys_flag", "reconsume_times",
                 "prepared_transaction_offset"):
        out[name] = pa.array(recs[name].astype(recs[name].dtype.newbyteorder("=")))
    for name in ("born_timestamp", "store_timestamp"):
        out[name] = pa.array(recs[name].astype(np.int64), pa.timestamp("ms"))
    out["born_host"] = _hosts(recs["born_host"], dtype["born_host"].itemsize - 4)
    out["store_host"] = _hosts(recs["store_host"], dtype["store_host"].itemsize - 4)
    out["msg_id"] = _msg_ids(recs, dtype["store_host"].itemsize)
    return out


def _hosts(raw: np.ndarray, addr_len: int) -> pa.Array:
    """"ip:port" strings, formatted once per distinct (address, port)."""
    width = addr_len + 4
    fixed = pa.Array.from_buffers(pa.binary(width), len(raw), [None, pa.py_buffer(np.ascontiguousarray(raw))])
    enc = pc.dictionary_encode(fixed)
    text = [str(Host(v[:addr_len], int.from_bytes(v[addr_len:], "big", signed=True)))
            for v in enc.dictionary.to_pylist()]
    return pa.array(text, pa.string()).take(enc.indices)


def _msg_ids(recs: np.ndarray, store_len: int) -> pa.Array:
    """offsetMsgId: store address, port and the stored PHYSICALOFFSET as upper-case hex."""
    n = len(recs)
    raw = np.empty((n, store_len + 8), np.uint8)
    raw[:, :store_len] = np.ascontiguousarray(recs["store_host"]).view(np.uint8).reshape(n, store_len)
    raw[:, store_len:] = recs["stored_physical_offset"].astype(">i8").view(np.uint8).reshape(n, 8)
    text = _HEX_LUT[raw].view(np.uint8)
    width = 2 * (store_len + 8)
    offsets = np.arange(0, n * width + 1, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(text)])


def _utf8(raw: pa.BinaryArray) -> pa.Array:
    """UTF-8 text; invalid bytes become U+FFFD, as Java's new String(bytes, UTF_8) does."""
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([b.decode("utf-8", "replace") for b in raw.to_pylist()], pa.string())


def _tags_codes(tags: pa.Array, topic: pa.Array, props_raw: pa.Array, store_ts: pa.Array) -> pa.Array:
    """TAGS hashCode (0 without tags); on the delay topic, the DELAY level's deliver time."""
    enc = pc.dictionary_encode(tags)
    hashes = np.array([java_string_hash(t) for t in enc.dictionary.to_pylist()] + [0], np.int64)
    idx = enc.indices.fill_null(len(hashes) - 1).to_numpy(zero_copy_only=False)
    codes = pa.array(hashes[idx])
    delayed = np.flatnonzero(pc.equal(topic, C.RMQ_SYS_SCHEDULE_TOPIC).to_numpy(zero_copy_only=False))
    if not len(delayed):
        return codes
    values = codes.to_pylist()
    ts = store_ts.cast(pa.int64())
    for i in delayed.tolist():
        try:
            values[i] = tags_code(C.RMQ_SYS_SCHEDULE_TOPIC, parse_properties(props_raw[i].as_py()), ts[i].as_py())
        except ValueError:          # a malformed DELAY: the broker rejects such a record
            values[i] = None
    return pa.array(values, pa.int64())


def body_crcs(body: pa.BinaryArray) -> np.ndarray:
    """UtilAll.crc32 of every body (zlib's CRC-32, top bit cleared)."""
    offsets = np.frombuffer(body.buffers()[1], np.int32, len(body) + 1, body.offset * 4).tolist()
    data = body.buffers()[2]
    view = memoryview(data if data is not None else b"")
    crc32 = zlib.crc32
    crcs = [crc32(view[a:b]) for a, b in zip(offsets, offsets[1:])]
    return np.array(crcs, np.int64) & 0x7FFFFFFF
