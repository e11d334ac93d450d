"""Message IDs: the broker's offsetMsgId and the client's UNIQ_KEY (MessageDecoder, MessageClientIDSetter)."""

from __future__ import annotations

import calendar
import dataclasses
import datetime as dt
import ipaddress
import struct

from rmqtool.errors import FormatError
from rmqtool.format.hosts import Host


def create_message_id(store_host: Host, physical_offset: int) -> str:
    """MessageDecoder.createMessageId: address, port (int32), offset (int64), upper-case hex."""
    return (store_host.address + struct.pack(">iq", store_host.port, physical_offset)).hex().upper()


def _hex_bytes(text: str, lengths: tuple[int, ...], what: str) -> bytes:
    if len(text) not in lengths:
        raise FormatError(f"{what} must have {' or '.join(map(str, lengths))} hex characters, "
                          f"got {len(text)}")
    try:
        return bytes.fromhex(text)
    except ValueError as exc:
        raise FormatError(f"{what} is not hexadecimal: {text!r}") from exc


def decode_message_id(msg_id: str) -> tuple[Host, int]:
    """MessageDecoder.decodeMessageId: (store host, physical offset) from a 32 or 56 hex-char ID."""
    raw = _hex_bytes(msg_id, (32, 56), "offsetMsgId")
    addr_len = 4 if len(raw) == 16 else 16
    port, offset = struct.unpack_from(">iq", raw, addr_len)
    return Host(raw[:addr_len], port), offset


@dataclasses.dataclass(frozen=True, slots=True)
class UniqKey:
    """UNIQ_KEY fields: client IP, low 16 bits of the pid, class-loader hash, ms since the producer's
    local month start, and the per-ID counter."""

    ip: str
    pid: int
    class_loader_hash: int
    time_diff: int
    counter: int

    def timestamp(self, born_timestamp: int | None = None, now_ms: int | None = None) -> int:
        """The creation time in epoch ms, anchored on the record's born time, else on ``now_ms``."""
        return anchor_month_diff(self.time_diff, born_timestamp, now_ms)


def decode_uniq_key(uniq_key: str) -> UniqKey:
    """The fields of a UNIQ_KEY; the time difference unsigned, as getNearlyTimeFromID reads it (a client
    writes it as (int) of up to 31 days of milliseconds, which passes 2^31 after day 24)."""
    raw = _hex_bytes(uniq_key, (32, 56), "UNIQ_KEY")
    ip_len = 4 if len(raw) == 16 else 16
    pid, cl_hash, diff, counter = struct.unpack_from(">HiIH", raw, ip_len)
    return UniqKey(str(ipaddress.ip_address(raw[:ip_len])), pid, cl_hash, diff, counter)


def encode_uniq_key(ip: bytes, pid: int, class_loader_hash: int, created_ms: int, month_start_ms: int,
                    counter: int) -> str:
    """MessageClientIDSetter.createUniqID: the client's IP (4 or 16 bytes), the low 16 bits of its pid, its
    class-loader hash (int32), (int)(created - month start), a negative one above -1,000,000 taken as 0
    (clock steps), and the low 16 bits of the counter; upper-case hex."""
    diff = (created_ms - month_start_ms + 2**31) % 2**32 - 2**31
    if -1_000_000 < diff < 0:
        diff = 0
    return (bytes(ip) + struct.pack(">HiiH", pid & 0xFFFF, class_loader_hash, diff, counter & 0xFFFF)).hex().upper()


def month_start_ms(ms: int) -> int:
    """The start of the UTC month of ``ms`` (a client whose JVM runs in UTC counts from it)."""
    day = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return _month_start_ms(day.year, day.month)


def _month_start_ms(year: int, month: int) -> int:
    return calendar.timegm((year, month, 1, 0, 0, 0)) * 1000


def anchor_month_diff(time_diff: int, born_timestamp: int | None = None, now_ms: int | None = None) -> int:
    """Pick the month start M (in any UTC offset) with M + diff closest to the born time.

    Without a born time, use the UTC month of ``now_ms`` (the previous one if that lies in the future),
    like MessageClientIDSetter.getNearlyTimeFromID: the caller says when now is; the one before when a
    difference longer than the previous month puts that in the future too (Java returns a future time).
    """
    if born_timestamp is None and now_ms is None:
        raise ValueError("anchor_month_diff needs a born time or now")
    anchor = now_ms if born_timestamp is None else born_timestamp
    day = dt.datetime.fromtimestamp(anchor / 1000, dt.timezone.utc)
    months = []
    for delta in (-2, -1, 0, 1):
        y, m = divmod(day.year * 12 + day.month - 1 + delta, 12)
        months.append(_month_start_ms(y, m + 1))
    if born_timestamp is None:
        candidates = [ms + time_diff for ms in months if ms + time_diff <= now_ms]
        return max(candidates)
    offsets = range(-14 * 3_600_000, 14 * 3_600_000 + 1, 15 * 60_000)   # UTC-14:00 .. +14:00
    return min((ms - off + time_diff for ms in months for off in offsets),
               key=lambda t: abs(t - born_timestamp))
