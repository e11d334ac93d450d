"""BatchConsumeQueue units (5.x, 46 bytes) and the look-up of a message offset in them.

Unit, big-endian: physOffset i64 | size i32 | tagsCode i64 | storeTime i64 | msgBaseOffset i64 |
batchSize i16 | compactedOffset i32 (written as -1) | reserved i32. A unit covers the message offsets
msgBaseOffset .. msgBaseOffset + batchSize - 1 (one inner-batch record, or one single message).
"""

from __future__ import annotations

import bisect
import struct
from typing import NamedTuple, Sequence

from rmqtool import constants as C
from rmqtool.errors import EncodeError, FormatError, Truncated

UNIT = struct.Struct(">qiqqqhii")
assert UNIT.size == C.BCQ_STORE_UNIT_SIZE


class BatchCqUnit(NamedTuple):
    physical_offset: int
    size: int
    tags_code: int
    store_time: int
    msg_base_offset: int
    batch_size: int
    compacted_offset: int = C.BCQ_INVALID_POS
    reserved: int = 0

    @property
    def is_valid(self) -> bool:
        """BatchConsumeQueue.recover's test."""
        return self.physical_offset >= 0 and self.size > 0 and self.msg_base_offset >= 0 and self.batch_size > 0

    @property
    def next_offset(self) -> int:
        """The message offset after this unit's last message."""
        return self.msg_base_offset + self.batch_size

    def covers(self, queue_offset: int) -> bool:
        return self.msg_base_offset <= queue_offset < self.next_offset


def decode_unit(buf, offset: int = 0) -> BatchCqUnit:
    if len(buf) - offset < C.BCQ_STORE_UNIT_SIZE:
        raise Truncated("batch consume-queue unit", C.BCQ_STORE_UNIT_SIZE, max(len(buf) - offset, 0), offset=offset)
    return BatchCqUnit._make(UNIT.unpack_from(buf, offset))


def encode_unit(unit: BatchCqUnit) -> bytes:
    try:
        return UNIT.pack(*unit)
    except struct.error as exc:
        raise EncodeError(f"batch consume-queue unit out of range: {unit}") from exc


def decode_units(buf) -> list[BatchCqUnit]:
    """Every 46-byte unit of a batch consume-queue file (its zero tail included)."""
    if len(buf) % C.BCQ_STORE_UNIT_SIZE:
        raise FormatError(f"batch consume-queue file size {len(buf)} is not a multiple of 46",
                          offset=len(buf) - len(buf) % C.BCQ_STORE_UNIT_SIZE)
    return [BatchCqUnit._make(t) for t in UNIT.iter_unpack(buf)]


UNIT_FIELDS = [("physical_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8"), ("store_time", ">i8"),
               ("msg_base_offset", ">i8"), ("batch_size", ">i2"), ("compacted_offset", ">i4"),
               ("reserved", ">i4")]     # a numpy dtype of one unit


def valid_units(buf):
    """The leading units of a file that pass BatchConsumeQueue.recover's test (``BatchCqUnit.is_valid``;
    a sparse compaction queue's END_POSITION unit fails it too), as a numpy array of ``UNIT_FIELDS``."""
    import numpy as np

    units = np.frombuffer(buf, UNIT_FIELDS, count=len(buf) // C.BCQ_STORE_UNIT_SIZE)
    bad = np.flatnonzero((units["physical_offset"] < 0) | (units["size"] <= 0) | (units["msg_base_offset"] < 0)
                         | (units["batch_size"] <= 0))
    return units[:bad[0]] if len(bad) else units


def find_unit(units: Sequence[BatchCqUnit], queue_offset: int) -> int | None:
    """The index of the unit holding message ``queue_offset`` (units in queue order), as
    BatchConsumeQueue.getCqUnitAndStoreTime finds it (a binary search on msgBaseOffset); None: none."""
    i = bisect.bisect_right([u.msg_base_offset for u in units], queue_offset) - 1
    return i if i >= 0 and units[i].covers(queue_offset) else None
