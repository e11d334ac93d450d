"""Vectorised record-boundary walk over a mapped commit-log file.

Every MESSAGE record starts with TOTALSIZE and a V1/V2 magic code. numpy finds the candidate positions
of the magic's first byte, keeps those carrying a whole magic code, and accepts the chain in which each
record ends where the next candidate begins. Candidates inside bodies (magic bytes in user data) are
skipped by re-entering the chain at the true next record; the chain stops at the first position that is
not a MESSAGE candidate (a BLANK, the zero end of data, damage, or the end of the scanned window).
The scan goes through the window in cache-sized steps with one reused comparison buffer.
"""

from __future__ import annotations

import numpy as np

from rmqtool import constants as C
from rmqtool.format.dledger import HEADER_SIZE as DLEDGER_HEADER_SIZE, VALID_MAGICS as DLEDGER_MAGICS

_M1 = C.MESSAGE_MAGIC_CODE.to_bytes(4, "big")
assert _M1[:3] == C.MESSAGE_MAGIC_CODE_V2.to_bytes(4, "big")[:3]
STEP_BYTES = 2 * 1024 * 1024          # bytes compared per numpy pass (stays in cache)
WINDOW_BYTES = 16 * 1024 * 1024       # bytes of a file walked and decoded at a time (cache-sized)
_V6_BITS = C.SysFlag.BORNHOST_V6 | C.SysFlag.STOREHOSTADDRESS_V6



def read_i32(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Big-endian int32 at each position (positions must leave 4 bytes)."""
    words = np.ndarray((max(len(data) - 3, 0),), ">i4", data, 0, (1,))
    return words[pos].astype(np.int64)


def candidates(data: np.ndarray, lo: int, hi: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """Positions p in [lo, hi) where a MESSAGE magic code sits at p + 4 (sorted)."""
    hi = min(hi, len(data) - 8 + 1)
    if hi <= lo:
        return np.empty(0, np.int64)
    seg = data[lo + 4:hi + 4]
    hits = np.equal(seg, _M1[0], out=None if scratch is None else scratch[:len(seg)])
    c = np.flatnonzero(hits) + lo
    if len(c):
        magic = read_i32(data, c + 4)
        c = c[(magic == C.MESSAGE_MAGIC_CODE - (1 << 32)) | (magic == C.MESSAGE_MAGIC_CODE_V2 - (1 << 32))]
    return c


def walk(data: np.ndarray, pos: int, limit: int, gap: int = 0) -> tuple[np.ndarray, int]:
    """Record starts of the MESSAGE chain that begins at ``pos`` + ``gap``, for records starting before
    ``limit`` + ``gap``.

    ``gap`` is the number of bytes in front of every record (a DLedger entry header: 48; 0 for a
    plain commit log). Returns (starts, next): ``next`` is where the chain stops (the end of its last
    record). A chain whose last record claims a size <= 0 stops there; the decoder reports that record.
    """
    scratch = np.empty(min(STEP_BYTES, max(limit - pos, 0)), np.bool_)
    parts = []
    while pos < limit:
        hi = min(pos + STEP_BYTES, limit)
        c = candidates(data, pos + gap, hi + gap, scratch)
        nxt = c + read_i32(data, c)
        i = 0
        while i < len(c) and c[i] == pos + gap:
            ok = nxt[i:-1] + gap == c[i + 1:]
            k = i + (int(np.argmin(ok)) if len(ok) and not ok.all() else len(c) - 1 - i)
            parts.append(c[i:k + 1])
            pos = int(nxt[k])
            if pos <= c[k]:
                break
            i = int(np.searchsorted(c, pos + gap))   # skips candidates inside the record (magic bytes in a body)
        if i < len(c) or pos < hi or (parts and pos <= parts[-1][-1]):
            break                               # the chain stopped inside this step
    starts = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return starts, pos


def read_i64(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return (read_i32(data, pos) << 32) | (read_i32(data, pos + 4) & 0xFFFFFFFF)


def ledger_headers_ok(data: np.ndarray, starts: np.ndarray, total: np.ndarray, file_start: int) -> int:
    """How many leading records sit in a sound DLedger entry: magic, size = record + 48, pos = its
    position, bodySize = record size (DLedgerMmapFileStore.recover's checks on one entry)."""
    head = starts - DLEDGER_HEADER_SIZE
    ok = ((head >= 0) & np.isin(read_i32(data, np.maximum(head, 0)), DLEDGER_MAGICS)
          & (read_i32(data, np.maximum(head, 0) + 4) == total + DLEDGER_HEADER_SIZE)
          & (read_i64(data, np.maximum(head, 0) + 24) == head + file_start)
          & (read_i32(data, starts - 4) == total))
    return len(ok) if ok.all() else int(np.argmin(ok))


# -- record lengths: the fixed header of every record, gathered at once ---------------------------------
def _fixed_dtype(sys_flag: int) -> np.dtype:
    """TOTALSIZE .. BODYLEN for one host-width combination, big-endian."""
    born, store = C.host_lengths(sys_flag)
    fields = [("total_size", ">i4"), ("magic_code", ">u4"), ("body_crc", ">i4"), ("queue_id", ">i4"),
              ("flag", ">i4"), ("queue_offset", ">i8"), ("stored_physical_offset", ">i8"),
              ("sys_flag", ">i4"), ("born_timestamp", ">i8"), ("born_host", f"V{born}"),
              ("store_timestamp", ">i8"), ("store_host", f"V{store}"), ("reconsume_times", ">i4"),
              ("prepared_transaction_offset", ">i8"), ("body_length", ">i4")]
    return np.dtype(fields)   # packed: offsets follow the record layout


def _strided(data: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Every byte position of ``data`` viewed as the start of a ``dtype`` item (no copy)."""
    count = max(len(data) - dtype.itemsize + 1, 0)
    return np.ndarray((count,), dtype, data, 0, (1,))


_INT_TYPES = {1: np.dtype("i1"), 2: np.dtype(">i2"), 4: np.dtype(">i4")}
_HEAD_V4 = _fixed_dtype(0)


def _read(data: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Big-endian signed integers of 1, 2 or 4 bytes at positions (clipped into the data)."""
    if len(pos) and (pos.min() < 0 or pos.max() > len(data) - width):
        pos = np.clip(pos, 0, len(data) - width)
    return _strided(data, _INT_TYPES[width])[pos].astype(np.int64)


def check_lengths(data: np.ndarray, starts: np.ndarray) -> tuple[int, dict[str, np.ndarray]]:
    """(number of leading records whose lengths are consistent, their part positions).

    One gather reads every record's fixed header in the IPv4 layout (``head``, reused by the decoder);
    only records with an IPv6 host read their BODYLEN again.
    """
    last = len(data) - _HEAD_V4.itemsize
    if last < 0:
        return 0, {}
    head = _strided(data, np.dtype(f"V{_HEAD_V4.itemsize}"))[np.minimum(starts, last)].view(_HEAD_V4)
    total = head["total_size"].astype(np.int64)
    sys_flag = head["sys_flag"].astype(np.int64)
    v2 = head["magic_code"] == C.MESSAGE_MAGIC_CODE_V2
    body_pos = starts + _HEAD_V4.itemsize
    body_len = head["body_length"].astype(np.int64)
    v6 = (sys_flag & _V6_BITS) != 0
    if v6.any():
        body_pos += ((sys_flag & C.SysFlag.BORNHOST_V6 > 0) * (C.IPV6_HOST_LEN - C.IPV4_HOST_LEN)
                     + (sys_flag & C.SysFlag.STOREHOSTADDRESS_V6 > 0) * (C.IPV6_HOST_LEN - C.IPV4_HOST_LEN))
        body_len[v6] = _read(data, body_pos[v6] - 4, 4)
    tl_pos = body_pos + body_len
    topic_len = _read(data, tl_pos, 1)
    if v2.any():
        topic_len[v2] = _read(data, tl_pos[v2], 2)
    topic_pos = tl_pos + 1 + v2
    props_len = _read(data, topic_pos + topic_len, 2)
    props_pos = topic_pos + topic_len + 2
    end = starts + total
    ok = ((starts <= last) & (body_len >= 0) & (topic_len >= 0) & (props_len >= 0) & (props_pos + props_len == end)
          & (end <= len(data)))
    good = len(ok) if ok.all() else int(np.argmin(ok))
    parts = dict(total=total, sys_flag=sys_flag, v2=v2, body_pos=body_pos, body_len=body_len,
                 topic_pos=topic_pos, topic_len=topic_len, props_pos=props_pos, props_len=props_len, head=head)
    return good, {k: v[:good] for k, v in parts.items()}
