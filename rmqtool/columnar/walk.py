"""Vectorised record-boundary walk over a mapped commit-log file.

Every MESSAGE record starts with TOTALSIZE and a V1/V2 magic code. numpy finds the candidate positions
of the magic's first byte, keeps those carrying a whole magic code, and accepts the chain in which each
record ends where the next candidate begins. Candidates inside bodies (magic bytes in user data) are
skipped by re-entering the chain at the true next record; the chain stops at the first position that is
not a MESSAGE candidate (a BLANK, the zero end of data, damage, or the end of the scanned window).
"""

from __future__ import annotations

import numpy as np

from rmqtool import constants as C

_M1 = C.MESSAGE_MAGIC_CODE.to_bytes(4, "big")
_M2 = C.MESSAGE_MAGIC_CODE_V2.to_bytes(4, "big")
assert _M1[:3] == _M2[:3]


def read_i32(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Big-endian int32 at each position (positions must leave 4 bytes)."""
    b = [data[pos + i].astype(np.uint32) for i in range(4)]
    return ((b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3]).view(np.int32).astype(np.int64)


def candidates(data: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Positions p in [lo, hi) where a MESSAGE magic code sits at p + 4 (sorted)."""
    hi = min(hi, len(data) - 8 + 1)
    if hi <= lo:
        return np.empty(0, np.int64)
    c = np.flatnonzero(data[lo + 4:hi + 4] == _M1[0]).astype(np.int64) + lo
    if len(c):
        last = data[c + 7]
        c = c[(data[c + 5] == _M1[1]) & (data[c + 6] == _M1[2]) & ((last == _M1[3]) | (last == _M2[3]))]
    return c


def walk(data: np.ndarray, pos: int, limit: int) -> tuple[np.ndarray, int]:
    """Record starts of the MESSAGE chain that begins at ``pos``, for records starting before ``limit``.

    Returns (starts, next): ``next`` is where the chain stops (the end of its last record). A chain
    whose last record claims a size <= 0 stops there; the decoder reports that record.
    """
    c = candidates(data, pos, limit)
    size = read_i32(data, c) if len(c) else c
    nxt = c + size
    parts = []
    i = int(np.searchsorted(c, pos))
    while i < len(c) and c[i] == pos:
        ok = nxt[i:-1] == c[i + 1:]
        k = i + (int(np.argmin(ok)) if len(ok) and not ok.all() else len(c) - 1 - i)
        parts.append(c[i:k + 1])
        pos = int(nxt[k])
        if pos <= c[k]:
            break
        i = int(np.searchsorted(c, pos))   # skips candidates inside the record (magic bytes in a body)
    starts = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return starts, pos
