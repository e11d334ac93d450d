"""DLedger commit log (``enableDLegerCommitLog``): data-file entries, index units, the file-end BLANK and
the ``checkpoint`` / ``currterm`` text files (DLedger 0.3.x: DLedgerEntry, DLedgerEntryCoder,
DLedgerMmapFileStore).

Entry, big-endian: magic i32 | size i32 (= 48 + body) | index i64 | term i64 | pos i64 (its absolute
position) | channel i32 | chainCrc i32 | bodyCrc i32 | bodySize i32 | body. In RocketMQ the body is one
complete commit-log MESSAGE record whose PHYSICALOFFSET is ``pos + 48``.
Index unit (32 bytes, entry ``i`` at byte ``i * 32``): magic i32 | pos i64 | size i32 | index i64 | term i64.
BLANK: int -1, int remaining, then don't-care bytes to the end of the data file.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import NamedTuple

from rmqtool.errors import EncodeError, FormatError, Truncated
from rmqtool.format.commitlog import Blank

HEADER = struct.Struct(">iiqqqiiii")
HEADER_SIZE = HEADER.size             # DLedgerEntry.BODY_OFFSET = 48
INDEX_UNIT = struct.Struct(">iqiqq")
INDEX_UNIT_SIZE = INDEX_UNIT.size     # DLedgerMmapFileStore.INDEX_UNIT_SIZE = 32
MAGIC = 1                             # DLedgerEntry.MAGIC_1 (0.4+: entry types NORMAL 1, NOOP 2, CONFIG_CHANGE 3)
VALID_MAGICS = (1, 2, 3)
BLANK_MAGIC = -1                      # MmapFileList.BLANK_MAGIC_CODE
MIN_BLANK_LEN = 8
POS_OFFSET = 24

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class EntryHeader(NamedTuple):
    """The 48-byte entry header as stored (nothing checked)."""

    magic: int
    size: int
    index: int
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body_size: int


@dataclasses.dataclass(frozen=True, slots=True)
class DLedgerEntry:
    index: int
    term: int
    pos: int
    body: bytes = b""
    magic: int = MAGIC
    channel: int = 0
    chain_crc: int = 0
    body_crc: int = 0

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.body)

    @property
    def header(self) -> EntryHeader:
        return EntryHeader(self.magic, self.size, self.index, self.term, self.pos, self.channel,
                           self.chain_crc, self.body_crc, len(self.body))


@dataclasses.dataclass(frozen=True, slots=True)
class DLedgerBlank(Blank):
    """The BLANK that ends a DLedger data file: -1 and the bytes left (``total_size``), then padding."""

    @property
    def magic_code(self) -> int:
        return BLANK_MAGIC & 0xFFFFFFFF


class IndexUnit(NamedTuple):
    magic: int
    pos: int
    size: int
    index: int
    term: int


def peek_magic(buf, offset: int = 0) -> int:
    if len(buf) - offset < 4:
        raise Truncated("DLedger entry magic", 4, max(len(buf) - offset, 0), offset=offset)
    return _I32.unpack_from(buf, offset)[0]


def decode_header(buf, offset: int = 0) -> EntryHeader:
    if len(buf) - offset < HEADER_SIZE:
        raise Truncated("DLedger entry header", HEADER_SIZE, max(len(buf) - offset, 0), offset=offset)
    return EntryHeader._make(HEADER.unpack_from(buf, offset))


def check_header(h: EntryHeader, offset: int, available: int) -> None:
    """The entry checks of DLedgerMmapFileStore.recover that need no neighbour (``offset`` = absolute)."""
    if h.magic not in VALID_MAGICS:
        raise FormatError(f"bad DLedger entry magic {h.magic} (expected {MAGIC})", offset=offset)
    if h.size < HEADER_SIZE or h.body_size + HEADER_SIZE != h.size:
        raise FormatError(f"DLedger entry size {h.size} does not match its body size {h.body_size} + 48",
                          offset=offset)
    if h.pos != offset:
        raise FormatError(f"DLedger entry records position {h.pos}", offset=offset)
    if h.size > available:
        raise Truncated("DLedger entry", h.size, available, offset=offset)


def decode_entry(buf, offset: int = 0, file_start: int = 0) -> DLedgerEntry | DLedgerBlank:
    """The entry (or BLANK) at ``offset`` of a data file starting at absolute position ``file_start``.

    Strict: a torn or inconsistent entry raises a FormatError with its absolute position.
    """
    where = file_start + offset
    if peek_magic(buf, offset) == BLANK_MAGIC:
        return decode_blank(buf, offset, file_start)
    h = decode_header(buf, offset)
    check_header(h, where, len(buf) - offset)
    body = bytes(buf[offset + HEADER_SIZE:offset + h.size])
    return DLedgerEntry(h.index, h.term, h.pos, body, h.magic, h.channel, h.chain_crc, h.body_crc)


def decode_blank(buf, offset: int = 0, file_start: int = 0) -> DLedgerBlank:
    where = file_start + offset
    if len(buf) - offset < MIN_BLANK_LEN:
        raise Truncated("DLedger BLANK", MIN_BLANK_LEN, max(len(buf) - offset, 0), offset=where)
    magic, remaining = struct.unpack_from(">ii", buf, offset)
    if magic != BLANK_MAGIC:
        raise FormatError(f"not a DLedger BLANK (magic {magic})", offset=where)
    if remaining != len(buf) - offset:
        raise FormatError(f"DLedger BLANK claims {remaining} bytes, {len(buf) - offset} remain in the file",
                          offset=where)
    return DLedgerBlank(remaining, bytes(buf[offset + MIN_BLANK_LEN:]), where)


def encode_entry(entry: DLedgerEntry) -> bytes:
    try:
        return HEADER.pack(*entry.header) + entry.body
    except struct.error as exc:
        raise EncodeError(f"DLedger entry field out of range: {exc}") from exc


def encode_blank(blank: Blank) -> bytes:
    if len(blank.padding) not in (0, blank.total_size - MIN_BLANK_LEN):
        raise EncodeError(f"BLANK padding of {len(blank.padding)} bytes does not fit total size {blank.total_size}")
    return struct.pack(">ii", BLANK_MAGIC, blank.total_size) + (blank.padding or bytes(blank.total_size - 8))


def decode_index_unit(buf, offset: int = 0) -> IndexUnit:
    if len(buf) - offset < INDEX_UNIT_SIZE:
        raise Truncated("DLedger index unit", INDEX_UNIT_SIZE, max(len(buf) - offset, 0), offset=offset)
    return IndexUnit._make(INDEX_UNIT.unpack_from(buf, offset))


def encode_index_unit(unit: IndexUnit) -> bytes:
    try:
        return INDEX_UNIT.pack(*unit)
    except struct.error as exc:
        raise EncodeError(f"DLedger index unit out of range: {unit}") from exc


def decode_index_units(buf) -> list[IndexUnit]:
    """Every 32-byte unit of an index file (its zero tail included)."""
    if len(buf) % INDEX_UNIT_SIZE:
        raise FormatError(f"DLedger index file size {len(buf)} is not a multiple of 32",
                          offset=len(buf) - len(buf) % INDEX_UNIT_SIZE)
    return [IndexUnit._make(t) for t in INDEX_UNIT.iter_unpack(buf)]


def index_unit_of(entry: DLedgerEntry) -> IndexUnit:
    """The index unit DLedger writes for an entry."""
    return IndexUnit(entry.magic, entry.pos, entry.size, entry.index, entry.term)


def is_dledger_data(buf, file_start: int) -> bool:
    """A data file written by DLedger: it begins with an entry header whose pos is the file's start."""
    if len(buf) < HEADER_SIZE:
        return False
    magic, size = struct.unpack_from(">ii", buf, 0)
    return magic in VALID_MAGICS and size >= HEADER_SIZE and _I64.unpack_from(buf, POS_OFFSET)[0] == file_start


# -- checkpoint / currterm (java.util.Properties text, as DLedger's IOUtils writes it) ---------------------
def decode_properties_text(text: str) -> dict[str, str]:
    """``key=value`` lines (``#`` comments and blank lines skipped) in file order."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise FormatError(f"line {n} is not key=value: {line[:40]!r}")
        out[key.strip()] = value.strip()
    return out


def encode_properties_text(values: dict[str, object]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


class LedgerCheckpoint(NamedTuple):
    """dledger-<id>/checkpoint: what DLedgerMmapFileStore persists (periodically and at shutdown)."""

    committed_index: int
    end_index: int


def decode_ledger_checkpoint(text: str) -> LedgerCheckpoint:
    values = decode_properties_text(text)
    try:
        return LedgerCheckpoint(int(values["committedIndex"]), int(values["endIndex"]))
    except (KeyError, ValueError) as exc:
        raise FormatError(f"DLedger checkpoint lacks a numeric {exc}") from None


def encode_ledger_checkpoint(cp: LedgerCheckpoint) -> str:
    return encode_properties_text({"committedIndex": cp.committed_index, "endIndex": cp.end_index})


class CurrentTerm(NamedTuple):
    """dledger-<id>/currterm: MemberState.persistTerm (voteLeader may be empty)."""

    curr_term: int
    vote_leader: str | None


def decode_currterm(text: str) -> CurrentTerm:
    values = decode_properties_text(text)
    try:
        return CurrentTerm(int(values["currTerm"]), values.get("voteLeader") or None)
    except (KeyError, ValueError) as exc:
        raise FormatError(f"DLedger currterm lacks a numeric {exc}") from None


def encode_currterm(ct: CurrentTerm) -> str:
    return encode_properties_text({"voteLeader": ct.vote_leader or "", "currTerm": ct.curr_term})
