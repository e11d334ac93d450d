"""A consume queue's units walked as ConsumeQueue.recover views them, a read of units at a time in one
compiled pass (verify's plan of each queue: no numpy temporaries per read).

``walk_units`` takes the raw 20-byte units (PHYSICALOFFSET, size, tagsCode, big-endian) and gives where
the queue ends (the first unit with a negative offset or a size that is not positive), the blank units
after real ones, the checkable units (real, at or past the commit log's first offset) as one range with
its offsets, and the units whose offset is not above the previous checkable one's.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rmqtool import constants as C
from rmqtool.columnar.kernel import _i32, _i64, _jit, loaded, spend

_UNIT = C.CQ_STORE_UNIT_SIZE
_FILLER = C.CQ_FILLER_SIZE


class UnitWalk(NamedTuple):
    stop: int               # the unit that ends the queue, or the number of units read
    late: np.ndarray        # blank units after a real unit
    back: np.ndarray        # checkable units whose offset is not above the previous one's (past ``end`` left out)
    back_prev: np.ndarray   # that previous offset
    count: int              # checkable units
    first: int              # the first and last checkable unit (-1 without any)
    last: int
    first_phy: int          # the first checkable unit's offset, the least and the largest
    min_phy: int
    max_phy: int


@_jit
def _walk_units(d, min_offset, end, state, late, back, back_prev):
    """``walk_units`` into the caller's arrays (room for every unit read); ``state``: (previous checkable
    offset, whether a real unit was seen), carried from read to read and updated."""
    prev, seen = state[0], state[1]
    stop = len(d) // _UNIT
    n_late = n_back = count = np.int64(0)
    first = last = first_phy = min_phy = max_phy = np.int64(-1)
    for i in range(len(d) // _UNIT):
        p = i * _UNIT
        phy, size = _i64(d, p), _i32(d, p + 8)
        if phy < 0 or size <= 0:
            stop = i
            break
        if phy == 0 and size == _FILLER and _i64(d, p + 12) == 0:
            if seen:
                late[n_late] = i
                n_late += 1
            continue
        seen = 1
        if phy < min_offset:
            continue
        if count == 0:
            first, first_phy, min_phy, max_phy = i, phy, phy, phy
        last = i
        count += 1
        min_phy, max_phy = min(min_phy, phy), max(max_phy, phy)
        if end < 0 or phy + size <= end:
            if phy <= prev:
                back[n_back] = i
                back_prev[n_back] = prev
                n_back += 1
            prev = phy
    state[0], state[1] = prev, seen
    return stop, n_late, n_back, count, first, last, first_phy, min_phy, max_phy


def walk_units(data: bytes, min_offset: int, end: int, state: np.ndarray) -> UnitWalk:
    """The units of ``data`` (whole units) after those ``state`` has seen (``new_state()``); ``end``: the
    commit log's written end (units past it take no part in the order check), -1 for none."""
    n = len(data) // _UNIT
    rows = np.empty((3, n), np.int64)
    stop, n_late, n_back, *rest = loaded(_walk_units, np.frombuffer(data, np.uint8), min_offset, end, state, *rows)
    spend(stop)
    return UnitWalk(stop, rows[0, :n_late], rows[1, :n_back], rows[2, :n_back], *rest)


def new_state() -> np.ndarray:
    """A walk's state before a queue's first unit."""
    return np.array([-1, 0], np.int64)
