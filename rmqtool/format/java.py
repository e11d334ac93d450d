"""The Java semantics the store depends on: String.hashCode, the index key hash, tagsCode, body CRC."""

from __future__ import annotations

import re
import zlib

from rmqtool.constants import (
    DEFAULT_DELAY_LEVELS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TAGS,
    RMQ_SYS_SCHEDULE_TOPIC,
)

_INT_MIN = -(2**31)
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_UNIT = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def java_string_hash(s: str) -> int:
    """java.lang.String.hashCode over UTF-16 code units, as a signed int32."""
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def index_key_hash(key: str) -> int:
    """IndexFile.indexKeyHashMethod: abs(hashCode), with Integer.MIN_VALUE mapped to 0."""
    h = java_string_hash(key)
    return 0 if h == _INT_MIN else abs(h)


def body_crc(body: bytes | memoryview) -> int:
    """UtilAll.crc32: zlib's CRC-32 with the top bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


def java_utf8_decode(data: bytes | memoryview) -> str:
    """new String(bytes, UTF_8): malformed input becomes U+FFFD."""
    return bytes(data).decode("utf-8", "replace")


def parse_java_int(text: str) -> int:
    """Integer.parseInt: ASCII digits with an optional sign, in int32 range; ValueError otherwise."""
    if not _JAVA_INT.fullmatch(text):
        raise ValueError(f"not a Java int: {text!r}")
    value = int(text)
    if not _INT_MIN <= value < 2**31:
        raise ValueError(f"out of int range: {text!r}")
    return value


def parse_delay_levels(spec: str = DEFAULT_DELAY_LEVELS) -> tuple[int, ...]:
    """ScheduleMessageService.parseDelayLevel: level N (1-based) waits levels[N-1] milliseconds."""
    return tuple(int(item[:-1]) * _UNIT[item[-1]] for item in spec.split())


DEFAULT_DELAY_MILLIS = parse_delay_levels()


def compute_deliver_timestamp(level: int, store_timestamp: int,
                              delay_millis: tuple[int, ...] = DEFAULT_DELAY_MILLIS) -> int:
    """computeDeliverTimestamp: store time + the level's delay (1 s for an unknown level)."""
    if 1 <= level <= len(delay_millis):
        return store_timestamp + delay_millis[level - 1]
    return store_timestamp + 1000


def tags_code(topic: str, properties: dict[str, str], store_timestamp: int,
              delay_millis: tuple[int, ...] = DEFAULT_DELAY_MILLIS) -> int:
    """The consume-queue tagsCode, as CommitLog.checkMessageAndReturnSize derives it.

    TAGS.hashCode() sign-extended (0 without tags); on the delay topic with a DELAY property,
    the deliver time instead. A malformed DELAY raises ValueError, as Integer.parseInt would.
    """
    tags = properties.get(PROPERTY_TAGS)
    code = java_string_hash(tags) if tags else 0
    if topic == RMQ_SYS_SCHEDULE_TOPIC:
        level_text = properties.get(PROPERTY_DELAY_TIME_LEVEL)
        if level_text is not None:
            level = min(parse_java_int(level_text), len(delay_millis))
            if level > 0:
                code = compute_deliver_timestamp(level, store_timestamp, delay_millis)
    return code


def hashmap_order(keys: list[str], initial_capacity: int = 128) -> list[str]:
    """The iteration order of a java.util.HashMap filled with ``keys`` in this order: bucket index
    ``(h ^ h >>> 16) & (cap - 1)`` ascending, insertion order within a bucket (no treeification below 8);
    ``cap`` is the initial capacity rounded up to a power of two, doubled while size > 0.75 * cap."""
    cap = 1
    while cap < initial_capacity:
        cap <<= 1
    while len(keys) > 0.75 * cap:
        cap <<= 1

    def bucket(key: str) -> int:
        h = java_string_hash(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (cap - 1)

    return [k for _, _, k in sorted((bucket(k), i, k) for i, k in enumerate(keys))]
