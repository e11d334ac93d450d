"""Commit-log entries: MESSAGE records (V1/V2 magic, IPv4/IPv6 hosts) and the end-of-file BLANK.

Layout (CommitLog.DefaultAppendMessageCallback / MessageExtEncoder), all big-endian:
TOTALSIZE i32 | MAGICCODE i32 | BODYCRC i32 | QUEUEID i32 | FLAG i32 | QUEUEOFFSET i64 |
PHYSICALOFFSET i64 | SYSFLAG i32 | BORNTIMESTAMP i64 | BORNHOST 8/20 | STORETIMESTAMP i64 |
STOREHOSTADDRESS 8/20 | RECONSUMETIMES i32 | PREPARED_TX_OFFSET i64 | BODYLEN i32 | BODY |
TOPICLEN i8 (V1) / i16 (V2) | TOPIC | PROPERTIESLEN i16 | PROPERTIES.
A BLANK is TOTALSIZE (bytes left in the file) and the BLANK magic; the rest of the file is don't-care
bytes, kept as ``padding`` so that re-encoding is exact.
"""

from __future__ import annotations

import dataclasses
import re
import struct
import zlib
from typing import Union

from rmqtool import constants as C
from rmqtool.errors import BadMagic, ChecksumMismatch, EncodeError, FormatError, InconsistentLength, Truncated
from rmqtool.format.hosts import Host
from rmqtool.format.java import DEFAULT_DELAY_MILLIS, body_crc, tags_code
from rmqtool.format.msgid import create_message_id
from rmqtool.format.properties import parse_properties

_HEAD = struct.Struct(">iIiiiqqiq")           # TOTALSIZE .. BORNTIMESTAMP (48 bytes)
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_MID = struct.Struct(">iqi")                  # RECONSUMETIMES, PREPARED_TX_OFFSET, BODYLEN

Buffer = Union[bytes, bytearray, memoryview]


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    """A MESSAGE record. Field names are the Java ones in snake_case."""

    topic: str
    body: bytes = b""
    properties_raw: bytes = b""
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = Host(bytes(4), 0)
    store_timestamp: int = 0
    store_host: Host = Host(bytes(4), 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int | None = None          # None: computed when encoding
    magic_code: int | None = None        # None: V1, or V2 when the topic needs it
    topic_raw: bytes | None = None       # the stored topic bytes when they are not valid UTF-8

    # -- derived values -------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return 2 if self.effective_magic == C.MESSAGE_MAGIC_CODE_V2 else 1

    @property
    def effective_magic(self) -> int:
        if self.magic_code is not None:
            return self.magic_code
        topic_len = len(self.topic_bytes)
        return C.MESSAGE_MAGIC_CODE_V2 if topic_len > C.TOPIC_MAX_LENGTH_V1 else C.MESSAGE_MAGIC_CODE

    @property
    def topic_bytes(self) -> bytes:
        return self.topic_raw if self.topic_raw is not None else self.topic.encode("utf-8")

    @property
    def total_size(self) -> int:
        return C.record_length(self.sys_flag, self.effective_magic, len(self.body),
                               len(self.topic_bytes), len(self.properties_raw))

    @property
    def properties(self) -> dict[str, str]:
        return parse_properties(self.properties_raw)

    @property
    def tags(self) -> str | None:
        return self.properties.get(C.PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        """KEYS split on one space, empty elements dropped (IndexService.buildIndex)."""
        return [k for k in self.properties.get(C.PROPERTY_KEYS, "").split(C.KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @property
    def msg_id(self) -> str:
        """offsetMsgId: store host address, port and this record's physical offset."""
        return create_message_id(self.store_host, self.physical_offset)

    @property
    def transaction_type(self) -> C.TransactionType:
        return C.transaction_type(self.sys_flag)

    @property
    def compressed(self) -> bool:
        return bool(self.sys_flag & C.SysFlag.COMPRESSED)

    def tags_code(self, delay_millis: tuple[int, ...] = DEFAULT_DELAY_MILLIS) -> int:
        return tags_code(self.topic, self.properties, self.store_timestamp, delay_millis)

    def crc_ok(self) -> bool:
        """An empty body is not checked (CommitLog.checkMessageAndReturnSize reads the CRC only when
        bodyLen > 0), as ``decode_entry`` does."""
        return self.body_crc is None or not self.body or body_crc(self.body) == self.body_crc

    def decompressed_body(self) -> bytes:
        """The body as the producer sent it (decompressed when the COMPRESSED bit is set)."""
        return decompress_body(self.body, self.sys_flag) if self.compressed else self.body


@dataclasses.dataclass(frozen=True, slots=True)
class Blank:
    """The BLANK record that pads a commit-log file to its end."""

    total_size: int
    padding: bytes = b""                 # bytes after the 8-byte header; may be stale (<= 4.9.0)
    physical_offset: int | None = None   # where it was read (not stored in the record)

    def __post_init__(self) -> None:
        if self.total_size < C.END_FILE_MIN_BLANK_LENGTH:
            raise EncodeError(f"BLANK total size {self.total_size} is below 8")

    @property
    def magic_code(self) -> int:
        return C.BLANK_MAGIC_CODE


Entry = Union[Message, Blank]


def decompress_body(body: bytes, sys_flag: int) -> bytes:
    """Decompress a stored body by the sysFlag compression type (ZLIB, LZ4 frame, ZSTD)."""
    kind = C.compression_type(sys_flag)
    try:
        if kind is C.CompressionType.ZLIB:
            return zlib.decompress(body)
        if kind is C.CompressionType.LZ4:
            import lz4.frame
            return lz4.frame.decompress(body)
        import zstandard
        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    except Exception as exc:  # each library has its own error type
        raise FormatError(f"cannot decompress {kind.name} body: {exc}") from exc


def peek_header(buf: Buffer, offset: int = 0) -> tuple[int, int]:
    """(TOTALSIZE, MAGICCODE as unsigned) at offset; Truncated if 8 bytes are not there."""
    if len(buf) - offset < 8:
        raise Truncated("record header", 8, max(len(buf) - offset, 0), offset=offset)
    size = _I32.unpack_from(buf, offset)[0]
    magic = _U32.unpack_from(buf, offset + 4)[0]
    return size, magic


def decode_entry(buf: Buffer, offset: int = 0, *, check_crc: bool = False) -> Entry:
    """Decode the entry at ``offset``. Strict: any inconsistency raises a FormatError carrying the offset.

    The PHYSICALOFFSET field is returned as stored (the broker never checks it against the position).
    """
    total_size, magic = peek_header(buf, offset)
    available = len(buf) - offset
    if magic == C.BLANK_MAGIC_CODE:
        if total_size < C.END_FILE_MIN_BLANK_LENGTH:
            raise FormatError(f"BLANK total size {total_size} is below 8", offset=offset)
        if total_size > available:
            raise Truncated("BLANK record", total_size, available, offset=offset)
        return Blank(total_size, bytes(buf[offset + 8:offset + total_size]), offset)
    if magic not in (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2):
        raise BadMagic(magic, offset=offset)
    if total_size < C.FIXED_WITHOUT_HOSTS + 2 * C.IPV4_HOST_LEN + 1:
        raise FormatError(f"total size {total_size} is below the minimum record size", offset=offset)
    if total_size > available:
        raise Truncated("record", total_size, available, offset=offset)
    end = offset + total_size
    try:
        return _decode_message(buf, offset, end, magic, check_crc)
    except FormatError as exc:
        raise exc.at(offset=offset)


def _need(pos: int, n: int, end: int, what: str, offset: int) -> None:
    """A length field that runs past TOTALSIZE is the broker's "[BUG] length mismatch" case."""
    if n < 0:
        raise FormatError(f"negative {what} length {n}", offset=offset)
    if pos + n > end:
        raise InconsistentLength(end - offset, pos + n - offset, offset=offset)


def _decode_message(buf: Buffer, offset: int, end: int, magic: int, check_crc: bool) -> Message:
    (total_size, _, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
     born_ts) = _HEAD.unpack_from(buf, offset)
    born_len, store_len = C.host_lengths(sys_flag)
    pos = offset + C.BORNHOST_POS
    _need(pos, born_len + 8 + store_len + 16, end, "fixed fields", offset)
    born_host = Host(bytes(buf[pos:pos + born_len - 4]), _I32.unpack_from(buf, pos + born_len - 4)[0])
    pos += born_len
    store_ts = _I64.unpack_from(buf, pos)[0]
    pos += 8
    store_host = Host(bytes(buf[pos:pos + store_len - 4]), _I32.unpack_from(buf, pos + store_len - 4)[0])
    pos += store_len
    reconsume, prepared, body_len = _MID.unpack_from(buf, pos)
    pos += 16
    _need(pos, body_len, end, "body", offset)
    body = bytes(buf[pos:pos + body_len])
    pos += body_len
    if magic == C.MESSAGE_MAGIC_CODE_V2:
        _need(pos, 2, end, "topic length", offset)
        topic_len = _I16.unpack_from(buf, pos)[0]
        pos += 2
    else:
        _need(pos, 1, end, "topic length", offset)
        topic_len = struct.unpack_from(">b", buf, pos)[0]   # a signed byte: 128..255 read negative
        pos += 1
    _need(pos, topic_len, end, "topic", offset)
    topic_raw = bytes(buf[pos:pos + topic_len])
    pos += topic_len
    _need(pos, 2, end, "properties length", offset)
    props_len = _I16.unpack_from(buf, pos)[0]
    pos += 2
    _need(pos, props_len, end, "properties", offset)
    properties_raw = bytes(buf[pos:pos + props_len])
    pos += props_len
    if pos != end:
        raise InconsistentLength(total_size, pos - offset, offset=offset)
    if check_crc and body_len > 0 and body_crc(body) != crc:
        raise ChecksumMismatch(crc, body_crc(body), offset=offset)
    try:
        topic, raw = topic_raw.decode("utf-8"), None
    except UnicodeDecodeError:
        topic, raw = topic_raw.decode("utf-8", "replace"), topic_raw
    return Message(
        topic=topic, body=body, properties_raw=properties_raw, queue_id=queue_id, flag=flag,
        queue_offset=queue_offset, physical_offset=physical_offset, sys_flag=sys_flag,
        born_timestamp=born_ts, born_host=born_host, store_timestamp=store_ts, store_host=store_host,
        reconsume_times=reconsume, prepared_transaction_offset=prepared, body_crc=crc,
        magic_code=magic, topic_raw=raw,
    )


def encode_entry(entry: Entry) -> bytes:
    return encode_blank(entry) if isinstance(entry, Blank) else encode_message(entry)


def encode_blank(blank: Blank) -> bytes:
    if len(blank.padding) not in (0, blank.total_size - 8):
        raise EncodeError(f"BLANK padding of {len(blank.padding)} bytes does not fit total size "
                          f"{blank.total_size}")
    padding = blank.padding or bytes(blank.total_size - 8)
    return _I32.pack(blank.total_size) + _U32.pack(C.BLANK_MAGIC_CODE) + padding


def encode_message(msg: Message) -> bytes:
    """Encode a MESSAGE record; refuses what the broker could not have written (never truncates)."""
    magic = msg.effective_magic
    topic = msg.topic_bytes
    if magic not in (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2):
        raise EncodeError(f"not a message magic code: 0x{magic:08x}")
    max_topic = 32767 if magic == C.MESSAGE_MAGIC_CODE_V2 else C.TOPIC_MAX_LENGTH_V1
    if len(topic) > max_topic:
        raise EncodeError(f"topic of {len(topic)} bytes does not fit a V{2 if max_topic > 127 else 1} record")
    if len(msg.properties_raw) > C.MAX_PROPERTIES_LEN:
        raise EncodeError(f"properties of {len(msg.properties_raw)} bytes exceed 32767")
    born_len, store_len = C.host_lengths(msg.sys_flag)
    for name, host, width in (("born", msg.born_host, born_len), ("store", msg.store_host, store_len)):
        if len(host.address) != width - 4:
            raise EncodeError(f"{name} host {host} does not match the sysFlag v6 bit")
    total = msg.total_size
    if total > 0x7FFFFFFF:
        raise EncodeError(f"record of {total} bytes is too large")
    crc = body_crc(msg.body) if msg.body_crc is None else msg.body_crc
    topic_len = _I16.pack(len(topic)) if magic == C.MESSAGE_MAGIC_CODE_V2 else bytes([len(topic)])
    try:
        return b"".join((
            _HEAD.pack(total, magic, crc, msg.queue_id, msg.flag, msg.queue_offset,
                       msg.physical_offset, msg.sys_flag, msg.born_timestamp),
            msg.born_host.address, _I32.pack(msg.born_host.port),
            _I64.pack(msg.store_timestamp),
            msg.store_host.address, _I32.pack(msg.store_host.port),
            _MID.pack(msg.reconsume_times, msg.prepared_transaction_offset, len(msg.body)),
            msg.body, topic_len, topic, _I16.pack(len(msg.properties_raw)), msg.properties_raw,
        ))
    except struct.error as exc:
        raise EncodeError(f"field out of range: {exc}") from exc


# -- the 5.2+ whole-record CRC property (enabledAppendPropCRC) ----------------------------------------
# MessageExtEncoder.encode reserves CommitLog.CRC32_RESERVED_LEN bytes at the end of the properties (after a
# \x02 it adds when they do not end with one); DefaultAppendMessageCallback.doAppend then takes
# UtilAll.crc32 (CRC-32 & 0x7FFFFFFF) of the whole record except those bytes and writes them with
# MessageDecoder.createCrc32: "__CRC32#" \x01, ten decimal digits least significant first, \x02.
# CommitLog.checkMessageAndReturnSize checks it only with forceVerifyPropCRC (default false).
CRC32_PREFIX = C.PROPERTY_CRC32.encode() + C.NAME_VALUE_SEPARATOR
CRC32_RESERVED_LEN = len(CRC32_PREFIX) + 10 + 1


def encode_crc32_property(crc: int) -> bytes:
    """MessageDecoder.createCrc32: the reserved tail holding ``crc``."""
    digits = bytes(0x30 + crc // 10 ** i % 10 for i in range(10)) if crc > 0 else b"0" * 10
    return CRC32_PREFIX + digits + C.PROPERTY_SEPARATOR


def record_crc32(record: Buffer) -> int:
    """UtilAll.crc32 of a record without its reserved tail: what the tail must hold."""
    return zlib.crc32(memoryview(record)[:len(record) - CRC32_RESERVED_LEN]) & 0x7FFFFFFF


def stored_crc32(record: Buffer) -> int | None:
    """The CRC a record's tail holds (the expectedCRC of checkMessageAndReturnSize), None without one."""
    tail = bytes(memoryview(record)[len(record) - CRC32_RESERVED_LEN:])
    if len(tail) != CRC32_RESERVED_LEN or not tail.startswith(CRC32_PREFIX) or tail[-1:] != C.PROPERTY_SEPARATOR:
        return None
    digits = tail[len(CRC32_PREFIX):-1]
    if not digits.isdigit():
        return None
    return sum((d - 0x30) * 10 ** i for i, d in enumerate(digits))


_CRC32_PROPERTY = re.compile(rb"(?:^|(?<=\x02))" + re.escape(CRC32_PREFIX) + rb"[^\x02]*(?:\x02|$)")


def without_crc32(properties_raw: bytes) -> bytes:
    """The properties without __CRC32#: CommitLog.asyncPutMessage deletes PROPERTY_CRC32 from a message it
    puts without enabledAppendPropCRC (MessageUtils.deleteProperty: each ``name\x01value\x02`` cut out of
    the string); with it, the tail is written anew."""
    return _CRC32_PROPERTY.sub(b"", properties_raw) if CRC32_PREFIX in properties_raw else properties_raw


def reserve_crc32(properties_raw: bytes) -> bytes:
    """Properties as MessageExtEncoder lays them out with enabledAppendPropCRC: a \x02 added when they do
    not end with one, then the tail reserved (zero CRC until seal_crc32)."""
    if properties_raw and not properties_raw.endswith(C.PROPERTY_SEPARATOR):
        properties_raw += C.PROPERTY_SEPARATOR
    return properties_raw + encode_crc32_property(0)


def seal_crc32(record: bytes) -> bytes:
    """DefaultAppendMessageCallback.doAppend: the encoded record with its reserved tail filled in."""
    return record[:-CRC32_RESERVED_LEN] + encode_crc32_property(record_crc32(record))
