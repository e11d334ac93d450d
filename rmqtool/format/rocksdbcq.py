"""RocksDB consume queue keys and values (5.2+, storeType=defaultRocksDB; RocksDBConsumeQueueTable and
RocksDBConsumeQueueOffsetTable). Integers big-endian; CTRL_1 = 0x01 separates the parts.

Column family ``default`` (one entry per unit):
  key   topic length i32 · 01 · topic · 01 · queueId i32 · 01 · queue offset i64
  value commit-log offset i64 · size i32 · tagsCode i64 · store timestamp i64 (28 bytes)
Column family ``offset`` (a queue's newest and oldest unit):
  key   topic length i32 · 01 · topic · 01 · "max" | "min" · 01 · queueId i32
  value commit-log offset i64 · queue offset i64 (16 bytes); for topic CHECKPOINT_TOPIC / max / 0 an 8-byte
        value: the highest dispatched commit-log offset.
DeleteTopic drops a queue with one DeleteRange over ``key prefix · 00`` .. ``key prefix · 02`` in ``default``
and point deletes of its max/min keys in ``offset`` (RocksDBConsumeQueueTable.destroyCQ).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from rmqtool.errors import EncodeError, FormatError

CTRL_1 = b"\x01"
CHECKPOINT_TOPIC = "CHECKPOINT_TOPIC"
_VALUE = struct.Struct(">qiqq")
_OFFSET_VALUE = struct.Struct(">qq")


class RocksCqUnit(NamedTuple):
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int
    store_time: int


class OffsetEntry(NamedTuple):
    topic: str
    kind: str               # "max" or "min"
    queue_id: int
    physical_offset: int
    queue_offset: int | None  # None: the 8-byte CHECKPOINT_TOPIC value


def _topic_prefix(topic: str) -> bytes:
    raw = topic.encode("utf-8")
    return struct.pack(">i", len(raw)) + CTRL_1 + raw + CTRL_1


def _split_topic(key: bytes) -> tuple[str, int]:
    """(topic, position after its trailing CTRL_1)."""
    if len(key) < 6:
        raise FormatError(f"RocksDB consume-queue key of {len(key)} bytes is too short")
    n = struct.unpack_from(">i", key)[0]
    end = 5 + n
    if n < 0 or key[4:5] != CTRL_1 or key[end:end + 1] != CTRL_1:
        raise FormatError(f"RocksDB consume-queue key {key.hex()} has no topic part")
    try:
        return key[5:end].decode("utf-8"), end + 1
    except UnicodeDecodeError:
        raise FormatError(f"RocksDB consume-queue key {key.hex()}: topic is not UTF-8") from None


def queue_prefix(topic: str, queue_id: int) -> bytes:
    """The ``default`` key prefix of one queue (DeleteRange covers prefix·00 .. prefix·02)."""
    return _topic_prefix(topic) + struct.pack(">i", queue_id) + CTRL_1


def encode_unit(unit: RocksCqUnit) -> tuple[bytes, bytes]:
    try:
        return (queue_prefix(unit.topic, unit.queue_id) + struct.pack(">q", unit.queue_offset),
                _VALUE.pack(unit.physical_offset, unit.size, unit.tags_code, unit.store_time))
    except struct.error as exc:
        raise EncodeError(f"RocksDB consume-queue unit out of range: {unit}") from exc


def decode_unit(key: bytes, value: bytes) -> RocksCqUnit:
    topic, pos = _split_topic(key)
    if len(key) != pos + 13 or key[pos + 4:pos + 5] != CTRL_1:
        raise FormatError(f"RocksDB consume-queue key {key.hex()} is not topic·queueId·offset")
    if len(value) != _VALUE.size:
        raise FormatError(f"RocksDB consume-queue value of {len(value)} bytes (expected 28)")
    queue_id = struct.unpack_from(">i", key, pos)[0]
    queue_offset = struct.unpack_from(">q", key, pos + 5)[0]
    return RocksCqUnit(topic, queue_id, queue_offset, *_VALUE.unpack(value))


def encode_offset(entry: OffsetEntry) -> tuple[bytes, bytes]:
    key = _topic_prefix(entry.topic) + entry.kind.encode() + CTRL_1 + struct.pack(">i", entry.queue_id)
    if entry.queue_offset is None:
        return key, struct.pack(">q", entry.physical_offset)
    return key, _OFFSET_VALUE.pack(entry.physical_offset, entry.queue_offset)


def decode_offset(key: bytes, value: bytes) -> OffsetEntry:
    topic, pos = _split_topic(key)
    kind = key[pos:pos + 3].decode("latin-1")
    if kind not in ("max", "min") or len(key) != pos + 8 or key[pos + 3:pos + 4] != CTRL_1:
        raise FormatError(f"RocksDB offset key {key.hex()} is not topic·max|min·queueId")
    queue_id = struct.unpack_from(">i", key, pos + 4)[0]
    if len(value) == 8 and topic == CHECKPOINT_TOPIC:
        return OffsetEntry(topic, kind, queue_id, struct.unpack(">q", value)[0], None)
    if len(value) != _OFFSET_VALUE.size:
        raise FormatError(f"RocksDB offset value of {len(value)} bytes (expected 16)")
    return OffsetEntry(topic, kind, queue_id, *_OFFSET_VALUE.unpack(value))
