"""Message batches: the client's encoded batch body (MessageDecoder.encodeMessages / MessageBatch.encode),
stored whole as the body of an inner-batch record (sysFlag INNER_BATCH).

Frame per message, big-endian: TOTALSIZE i32 | MAGIC i32 (0) | BODYCRC i32 (0) | FLAG i32 | BODYLEN i32 |
BODY | PROPLEN i16 | PROPERTIES.
"""

from __future__ import annotations

import dataclasses
import struct

from rmqtool.constants import COMPRESSION_TYPE_MASK, PROPERTY_INNER_BASE, SysFlag
from rmqtool.errors import EncodeError, FormatError, Truncated
from rmqtool.format.commitlog import Message
from rmqtool.format.properties import parse_properties

_HEAD = struct.Struct(">iiiii")
_I16 = struct.Struct(">h")
_FIXED = _HEAD.size + _I16.size         # 22 bytes besides body and properties


@dataclasses.dataclass(frozen=True, slots=True)
class BatchItem:
    """One message of a batch body as the client encoded it."""

    body: bytes = b""
    properties_raw: bytes = b""
    flag: int = 0
    magic: int = 0
    body_crc: int = 0

    @property
    def total_size(self) -> int:
        return _FIXED + len(self.body) + len(self.properties_raw)

    @property
    def properties(self) -> dict[str, str]:
        return parse_properties(self.properties_raw)


def decode_batch(buf, offset: int = 0, end: int | None = None) -> list[BatchItem]:
    """Every frame in ``buf[offset:end]``; a frame that does not fit raises a FormatError at its offset."""
    end = len(buf) if end is None else end
    out = []
    pos = offset
    while pos < end:
        if end - pos < _FIXED:
            raise Truncated("batch frame", _FIXED, end - pos, offset=pos)
        size, magic, crc, flag, body_len = _HEAD.unpack_from(buf, pos)
        if size < _FIXED or size > end - pos:
            raise FormatError(f"batch frame size {size} does not fit the {end - pos} bytes left", offset=pos)
        if body_len < 0 or _HEAD.size + body_len + _I16.size > size:
            raise FormatError(f"batch frame body length {body_len} overruns the frame size {size}", offset=pos)
        body_at = pos + _HEAD.size
        props_len = _I16.unpack_from(buf, body_at + body_len)[0]
        if _FIXED + body_len + props_len != size:
            raise FormatError(f"batch frame size {size} != 22 + body {body_len} + properties {props_len}", offset=pos)
        props_at = body_at + body_len + _I16.size
        out.append(BatchItem(bytes(buf[body_at:body_at + body_len]), bytes(buf[props_at:props_at + props_len]),
                             flag, magic, crc))
        pos += size
    return out


def encode_batch(items: list[BatchItem]) -> bytes:
    try:
        return b"".join(_HEAD.pack(i.total_size, i.magic, i.body_crc, i.flag, len(i.body)) + i.body
                        + _I16.pack(len(i.properties_raw)) + i.properties_raw for i in items)
    except struct.error as exc:
        raise EncodeError(f"batch frame field out of range: {exc}") from exc


def is_inner_batch(msg: Message) -> bool:
    return bool(msg.sys_flag & SysFlag.INNER_BATCH)


def inner_messages(msg: Message) -> list[Message]:
    """The messages of an inner-batch record (sysFlag INNER_BATCH) as a consumer receives them: each one
    with its own body, properties and flag, the record's other fields, and queue offset INNER_BASE + i
    (the record's queue offset when INNER_BASE is absent). Its stored BODYCRC is the frame's (0)."""
    props = msg.properties
    try:
        base = int(props.get(PROPERTY_INNER_BASE, msg.queue_offset))
    except ValueError:
        raise FormatError(f"bad INNER_BASE {props[PROPERTY_INNER_BASE]!r}", offset=msg.physical_offset) from None
    body = msg.decompressed_body() if msg.compressed else msg.body
    try:
        items = decode_batch(body)
    except FormatError as exc:
        raise FormatError(f"inner batch body: {exc.message} (at body byte {exc.offset})",
                          offset=msg.physical_offset) from None
    flags = msg.sys_flag & ~(SysFlag.NEED_UNWRAP | SysFlag.INNER_BATCH | SysFlag.COMPRESSED | COMPRESSION_TYPE_MASK)
    return [dataclasses.replace(msg, body=item.body, properties_raw=item.properties_raw, flag=item.flag,
                                queue_offset=base + i, sys_flag=flags, body_crc=item.body_crc)
            for i, item in enumerate(items)]
