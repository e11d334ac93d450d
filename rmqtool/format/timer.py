"""The 5.x timer store: timer-log units, timer-wheel slots and ``config/timercheck`` (``TimerLog``,
``TimerWheel``/``Slot``, ``TimerCheckpoint``), all big-endian.

Timer-log unit (52 bytes): size i32 (= 52) @0 | prevPos i64 @4 (the slot's previous unit, -1 for the
first) | magic i32 @12 (bits DEFAULT 1, ROLL 2, DELETE 4) | currWriteTimeMs i64 @16 | delayedTime i32 @24
(relative to currWriteTimeMs) | offsetPy i64 @28 | sizePy i32 @36 | hashCode of REAL_TOPIC i32 @40 |
reserved i64 @44. When fewer than 52 + 16 bytes remain in a file, ``TimerLog.append`` first writes the
BLANK: remaining i32, 0 i64, magic 0xCBD43194 i32 (the rest of the file stays zero).

Wheel slot (32 bytes, slot ``(timeMs / precisionMs) % slotCount``): timeMs / precisionMs i64 | firstPos
i64 | lastPos i64 | num i32 (messages minus deletes) | magic i32.

timercheck (a 4 KiB page): lastReadTimeMs, lastTimerLogFlushPos, lastTimerQueueOffset,
masterTimerQueueOffset, dataVersion stateVersion, timestamp, counter: i64 at 0, 8, ..., 48.

timermetrics (``TimerMetrics.persist``, compact fastjson): ``{"dataVersion":{...},"timingCount":
{topic:{"count":N,"timeStamp":ms}}}``, the number of timer messages per real topic not yet delivered.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Union

from rmqtool.errors import EncodeError, FormatError, Truncated
from rmqtool.format.fastjson import DataVersion, as_int, data_version, dumps_compact, parse_fastjson

UNIT_SIZE = 52
SLOT_SIZE = 32
MIN_BLANK_LEN = 16
BLANK_MAGIC_CODE = 0xCBD43194 - (1 << 32)   # as the signed int it is stored as
MAGIC_DEFAULT, MAGIC_ROLL, MAGIC_DELETE = 1, 2, 4
TIMER_WHEEL_TTL_DAY = 7
DEFAULT_PRECISION_MS = 1000
TIMERCHECK_SIZE = 4096

_UNIT = struct.Struct(">iqiqiqiiq")
_BLANK = struct.Struct(">iqi")
_SLOT = struct.Struct(">qqqii")
_CHECK = struct.Struct(">7q")


class TimerUnit(NamedTuple):
    size: int
    prev_pos: int
    magic: int
    curr_write_time_ms: int
    delayed_time: int          # relative to curr_write_time_ms
    offset_py: int
    size_py: int
    real_topic_hash: int
    reserved: int

    @property
    def delayed_time_ms(self) -> int:
        """The slot time the unit was written to (for a rolled unit: the roll target)."""
        return self.curr_write_time_ms + self.delayed_time

    @property
    def is_roll(self) -> bool:
        return bool(self.magic & MAGIC_ROLL)

    @property
    def is_delete(self) -> bool:
        return bool(self.magic & MAGIC_DELETE)


class TimerBlank(NamedTuple):
    """The end-of-file filler; ``size`` is the number of bytes left in the file from here."""

    size: int
    padding: bytes = b""       # bytes after the 16-byte header, kept for an exact round trip


TimerLogEntry = Union[TimerUnit, TimerBlank]


def magic_flags(magic: int) -> str:
    """The magic bits by name, e.g. ``DEFAULT|ROLL``."""
    names = [n for bit, n in ((MAGIC_DEFAULT, "DEFAULT"), (MAGIC_ROLL, "ROLL"), (MAGIC_DELETE, "DELETE"))
             if magic & bit]
    return "|".join(names) or "0"


def is_unit_ok(size: int, magic: int) -> bool:
    """TimerMessageStore.recover's test of a unit: the unit size and a magic within the four low bits."""
    return size == UNIT_SIZE and (magic | 0xF) == 0xF


def decode_timerlog_entry(buf, offset: int = 0) -> TimerLogEntry:
    """The unit or BLANK at ``offset`` (a BLANK takes the rest of ``buf``)."""
    available = len(buf) - offset
    if available >= 16 and _BLANK.unpack_from(buf, offset)[2] == BLANK_MAGIC_CODE:
        size = _BLANK.unpack_from(buf, offset)[0]
        if size != available:
            raise FormatError(f"timer-log BLANK says {size} bytes remain, the file has {available}",
                              offset=offset)
        return TimerBlank(size, bytes(buf[offset + MIN_BLANK_LEN:offset + size]))
    if available < UNIT_SIZE:
        raise Truncated("timer-log unit", UNIT_SIZE, available, offset=offset)
    unit = TimerUnit(*_UNIT.unpack_from(buf, offset))
    if not is_unit_ok(unit.size, unit.magic):
        raise FormatError(f"not a timer-log unit: size {unit.size}, magic {unit.magic:#x}", offset=offset)
    return unit


def encode_timerlog_entry(entry: TimerLogEntry) -> bytes:
    try:
        if isinstance(entry, TimerBlank):
            if entry.size != MIN_BLANK_LEN + len(entry.padding):
                raise EncodeError(f"timer-log BLANK of {entry.size} bytes with {len(entry.padding)} "
                                  "bytes of padding")
            return _BLANK.pack(entry.size, 0, BLANK_MAGIC_CODE) + entry.padding
        if not is_unit_ok(entry.size, entry.magic):
            raise EncodeError(f"not a timer-log unit: size {entry.size}, magic {entry.magic:#x}")
        return _UNIT.pack(*entry)
    except struct.error as exc:
        raise EncodeError(f"timer-log field out of range: {exc}") from exc


class TimerSlot(NamedTuple):
    ticks: int                 # timeMs / precisionMs, as stored
    first_pos: int
    last_pos: int
    num: int
    magic: int

    def time_ms(self, precision_ms: int) -> int:
        return self.ticks * precision_ms

    @property
    def is_empty(self) -> bool:
        return self == EMPTY_SLOT


EMPTY_SLOT = TimerSlot(0, 0, 0, 0, 0)


def decode_slot(buf, offset: int = 0) -> TimerSlot:
    if len(buf) - offset < SLOT_SIZE:
        raise Truncated("timer-wheel slot", SLOT_SIZE, len(buf) - offset, offset=offset)
    return TimerSlot(*_SLOT.unpack_from(buf, offset))


def encode_slot(slot: TimerSlot) -> bytes:
    try:
        return _SLOT.pack(*slot)
    except struct.error as exc:
        raise EncodeError(f"timer-wheel slot field out of range: {exc}") from exc


def slot_index(time_ms: int, precision_ms: int, slot_count: int) -> int:
    """TimerWheel.getSlotIndex: (timeMs / precisionMs) % (slotsTotal * 2), the wheel's slot count."""
    return (time_ms // precision_ms) % slot_count


class TimerCheckpoint(NamedTuple):
    last_read_time_ms: int = 0
    last_timer_log_flush_pos: int = 0
    last_timer_queue_offset: int = 0
    master_timer_queue_offset: int = 0
    state_version: int = 0
    timestamp: int = 0
    counter: int = 0
    rest: bytes = bytes(TIMERCHECK_SIZE - _CHECK.size)


def decode_timercheck(buf) -> TimerCheckpoint:
    if len(buf) < _CHECK.size:
        raise Truncated("timercheck", _CHECK.size, len(buf), offset=0)
    return TimerCheckpoint(*_CHECK.unpack_from(buf, 0), bytes(buf[_CHECK.size:]))


def encode_timercheck(cp: TimerCheckpoint) -> bytes:
    try:
        return _CHECK.pack(*cp[:7]) + cp.rest
    except struct.error as exc:
        raise EncodeError(f"timercheck field out of range: {exc}") from exc


class TimerMetric(NamedTuple):
    count: int
    time_stamp: int


class TimerMetrics(NamedTuple):
    data_version: DataVersion
    timing_count: dict[str, TimerMetric]     # real topic -> metric, in file order


def decode_timer_metrics(value) -> TimerMetrics:
    """From parsed JSON (see ``parse_timer_metrics`` for the text)."""
    if not isinstance(value, dict) or not isinstance(value.get("timingCount", {}), dict):
        raise FormatError("timermetrics is not an object with a timingCount object")
    counts = {}
    for topic, metric in value.get("timingCount", {}).items():
        if not isinstance(metric, dict):
            raise FormatError(f"timingCount of {topic!r} is not an object")
        counts[topic] = TimerMetric(as_int(metric.get("count", 0), f"{topic}.count"),
                                    as_int(metric.get("timeStamp", 0), f"{topic}.timeStamp"))
    return TimerMetrics(data_version(value) or DataVersion(), counts)


def parse_timer_metrics(text: str) -> TimerMetrics:
    return decode_timer_metrics(parse_fastjson(text))


def encode_timer_metrics(metrics: TimerMetrics) -> str:
    return dumps_compact({"dataVersion": metrics.data_version.to_json(),
                          "timingCount": {t: {"count": m.count, "timeStamp": m.time_stamp}
                                          for t, m in metrics.timing_count.items()}})
