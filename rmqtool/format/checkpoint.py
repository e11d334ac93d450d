"""StoreCheckpoint: a 4096-byte file of big-endian longs.

physicMsgTimestamp @0, logicsMsgTimestamp @8, indexMsgTimestamp @16, masterFlushedOffset @24 (5.0+),
confirmPhyOffset @32 (5.1.1+). Bytes after the fields are kept as ``rest`` for an exact round trip.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from rmqtool import constants as C
from rmqtool.errors import EncodeError, FormatError, Truncated

_FIELDS = struct.Struct(">qqqqq")


class Checkpoint(NamedTuple):
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0
    rest: bytes = bytes(C.CHECKPOINT_FILE_SIZE - _FIELDS.size)

    @property
    def min_timestamp(self) -> int:
        """StoreCheckpoint.getMinTimestamp: min(physic, logics) - 3000, not below 0."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.index_msg_timestamp)


def decode_checkpoint(buf) -> Checkpoint:
    if len(buf) < _FIELDS.size:
        raise Truncated("checkpoint", _FIELDS.size, len(buf), offset=0)
    return Checkpoint(*_FIELDS.unpack_from(buf, 0), bytes(buf[_FIELDS.size:]))


def decode_checkpoint_mapped(buf) -> Checkpoint:
    """The checkpoint as the broker reads it (4.9.7 and 5.x): StoreCheckpoint.<init> maps one OS page READ_WRITE
    and FileChannel.map extends a shorter file with zeros, so the fields a short file lacks read 0 (and its
    next StoreCheckpoint.flush writes every field)."""
    return decode_checkpoint(bytes(buf) + bytes(max(0, C.CHECKPOINT_FILE_SIZE - len(buf))))


def decode_checkpoint_file(buf) -> Checkpoint:
    """A whole checkpoint file: StoreCheckpoint maps exactly one OS page (MappedFile.OS_PAGE_SIZE), so a
    file of another size (a commit-log file, say) is not one."""
    cp = decode_checkpoint(buf)
    if len(buf) != C.CHECKPOINT_FILE_SIZE:
        raise FormatError(f"not a checkpoint file: {len(buf)} bytes (the broker's checkpoint is "
                          f"{C.CHECKPOINT_FILE_SIZE})", offset=0)
    return cp


def encode_checkpoint(cp: Checkpoint) -> bytes:
    try:
        return _FIELDS.pack(*cp[:5]) + cp.rest
    except struct.error as exc:
        raise EncodeError(f"checkpoint field out of range: {exc}") from exc
