"""Consume-queue units (ConsumeQueue, 20 bytes) and ConsumeQueueExt units.

Unit: commitlog physical offset i64 | record size i32 | tagsCode i64. Pre-fill units written by
``fillPreBlank`` are ``(0, 0x7FFFFFFF, 0)``. A tagsCode <= ConsumeQueueExt.MAX_ADDR is an ext address.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from rmqtool import constants as C
from rmqtool.errors import EncodeError, FormatError, Truncated

UNIT = struct.Struct(">qiq")
_EXT_HEAD = struct.Struct(">hqqh")
_LONG_MIN = -(2**63)


class CqUnit(NamedTuple):
    physical_offset: int
    size: int
    tags_code: int

    @property
    def is_filler(self) -> bool:
        return self == FILLER_UNIT

    @property
    def is_empty(self) -> bool:
        """The zero tail of a pre-allocated file: the end of written units."""
        return self.physical_offset == 0 and self.size == 0 and self.tags_code == 0

    @property
    def is_valid(self) -> bool:
        """ConsumeQueue.recover's test (fillers pass it too)."""
        return self.physical_offset >= 0 and self.size > 0

    @property
    def has_ext_address(self) -> bool:
        return is_ext_addr(self.tags_code)


FILLER_UNIT = CqUnit(0, C.CQ_FILLER_SIZE, 0)


def is_ext_addr(tags_code: int) -> bool:
    return tags_code <= C.CQ_EXT_MAX_ADDR


def ext_addr_to_offset(address: int) -> int:
    """ConsumeQueueExt.unDecorate: the byte offset in the ext file queue."""
    return address - _LONG_MIN


def offset_to_ext_addr(offset: int) -> int:
    return offset + _LONG_MIN


def decode_unit(buf, offset: int = 0) -> CqUnit:
    if len(buf) - offset < C.CQ_STORE_UNIT_SIZE:
        raise Truncated("consume-queue unit", C.CQ_STORE_UNIT_SIZE, max(len(buf) - offset, 0), offset=offset)
    return CqUnit._make(UNIT.unpack_from(buf, offset))


def encode_unit(unit: CqUnit) -> bytes:
    try:
        return UNIT.pack(*unit)
    except struct.error as exc:
        raise EncodeError(f"consume-queue unit out of range: {unit}") from exc


def decode_units(buf) -> list[CqUnit]:
    """Every 20-byte unit of a consume-queue file (its zero tail included)."""
    if len(buf) % C.CQ_STORE_UNIT_SIZE:
        raise FormatError(f"consume-queue file size {len(buf)} is not a multiple of 20")
    return [CqUnit._make(t) for t in UNIT.iter_unpack(buf)]


def decode_written_units(buf) -> list[CqUnit]:
    """The units before the first one that fails ConsumeQueue.recover's test; the rest of the file
    (a pre-allocated file's zero tail) is not read."""
    if len(buf) % C.CQ_STORE_UNIT_SIZE:
        raise FormatError(f"consume-queue file size {len(buf)} is not a multiple of 20")
    return decode_units(buf[:valid_prefix(buf)[0] * C.CQ_STORE_UNIT_SIZE])


def encode_units(units) -> bytes:
    return b"".join(encode_unit(u) for u in units)


class CqExtUnit(NamedTuple):
    """ConsumeQueueExt.CqExtUnit: size i16 | tagsCode i64 | msgStoreTime i64 | bitMapSize i16 | bitmap."""

    tags_code: int
    msg_store_time: int
    filter_bitmap: bytes = b""

    @property
    def size(self) -> int:
        return C.CQ_EXT_MIN_UNIT_SIZE + len(self.filter_bitmap)


def decode_ext_unit(buf, offset: int = 0) -> CqExtUnit | None:
    """The ext unit at ``offset``; None at the end of a file (size <= 0: the -1 end marker or zeros)."""
    if len(buf) - offset < 2:
        return None
    size = struct.unpack_from(">h", buf, offset)[0]
    if size <= 0:
        return None
    if size < C.CQ_EXT_MIN_UNIT_SIZE or len(buf) - offset < size:
        raise Truncated("consume-queue ext unit", size, len(buf) - offset, offset=offset)
    _, tags, store_time, bitmap_size = _EXT_HEAD.unpack_from(buf, offset)
    if bitmap_size != size - C.CQ_EXT_MIN_UNIT_SIZE:
        raise FormatError(f"ext unit size {size} does not match bitmap size {bitmap_size}", offset=offset)
    start = offset + C.CQ_EXT_MIN_UNIT_SIZE
    return CqExtUnit(tags, store_time, bytes(buf[start:start + bitmap_size]))


def encode_ext_unit(unit: CqExtUnit) -> bytes:
    if unit.size > 32767:
        raise EncodeError(f"ext unit of {unit.size} bytes exceeds 32767")
    return _EXT_HEAD.pack(unit.size, unit.tags_code, unit.msg_store_time, len(unit.filter_bitmap)) \
        + unit.filter_bitmap


def decode_ext_units(buf) -> list[tuple[int, CqExtUnit]]:
    """(position, unit) for every ext unit of one file, up to its end marker."""
    out = []
    pos = 0
    while (unit := decode_ext_unit(buf, pos)) is not None:
        out.append((pos, unit))
        pos += unit.size
    return out


UNIT_FIELDS = [("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")]     # a numpy dtype of one unit
_PREFIX_CHUNKS = (1024, 1 << 18)      # units read first and at most at once: reads grow x4 between them


def valid_prefix(buf, commitlog_end: int | None = None) -> tuple[int, int]:
    """(number of leading units that pass recovery's test, max physical end of them: offset + size,
    -1 without any), read in growing chunks so that a mostly empty pre-allocated file costs little (the
    first chunk without numpy: a short queue's tail is read without importing it)."""
    n = len(buf) // C.CQ_STORE_UNIT_SIZE
    reach = -1
    first = min(_PREFIX_CHUNKS[0], n)
    for i, (phy, size, _) in enumerate(UNIT.iter_unpack(memoryview(buf)[:first * C.CQ_STORE_UNIT_SIZE])):
        if phy < 0 or size <= 0 or commitlog_end is not None and phy >= commitlog_end:
            return i, reach
        reach = phy + size
    if first == n:
        return n, reach
    import numpy as np

    lo, chunk = first, _PREFIX_CHUNKS[0] * 4
    while lo < n:
        units = np.frombuffer(buf, UNIT_FIELDS, min(chunk, n - lo), lo * C.CQ_STORE_UNIT_SIZE)
        phy, size = units["phy"].astype(np.int64), units["size"].astype(np.int64)
        stop = (phy < 0) | (size <= 0)
        if commitlog_end is not None:
            stop |= phy >= commitlog_end
        valid = int(np.argmax(stop)) if stop.any() else len(units)
        if valid:
            reach = int(phy[valid - 1]) + int(size[valid - 1])
        if valid < len(units):
            return lo + valid, reach
        lo, chunk = lo + len(units), min(chunk * 4, _PREFIX_CHUNKS[1])
    return n, reach
