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
