"""One Parquet file from Parquet files written apart (export to one file in worker processes): each part's
row groups are copied as they are and the output's footer lists them all, their offsets moved to where
they now start. The footer is Parquet's FileMetaData in Thrift's compact protocol; it is decoded into
(field id, type, value) triples and encoded back exactly as it was, only the offsets, the row groups'
ordinals and the row count changed. Parts are written without page indexes or bloom filters (pyarrow's
default), whose own bytes hold offsets.
"""

from __future__ import annotations

import os
import struct

MAGIC = b"PAR1"
_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
# field ids of parquet.thrift
_FMD_NUM_ROWS, _FMD_ROW_GROUPS = 3, 4
_RG_COLUMNS, _RG_FILE_OFFSET, _RG_ORDINAL = 1, 5, 7
_CC_FILE_OFFSET, _CC_META, _CC_OFFSET_INDEX, _CC_COLUMN_INDEX = 2, 3, 4, 6
_CMD_OFFSETS = (9, 10, 11, 14)     # data_page_offset, index_page_offset, dictionary_page_offset, bloom_filter_offset


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return out

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, kind: int):
        if kind in (_BOOL_TRUE, _BOOL_FALSE):       # a field's value is its type; a list's, one byte
            return kind
        if kind == _BYTE:
            return self.byte()
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _DOUBLE:
            self.pos += 8
            return self.data[self.pos - 8:self.pos]
        if kind == _BINARY:
            n = self.varint()
            self.pos += n
            return self.data[self.pos - n:self.pos]
        if kind in (_LIST, _SET):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            elem = head & 0x0F
            return elem, [self.byte() if elem in (_BOOL_TRUE, _BOOL_FALSE) else self.value(elem) for _ in range(size)]
        if kind == _STRUCT:
            fields, last = [], 0
            while True:
                head = self.byte()
                if head == 0:
                    return fields
                kind_ = head & 0x0F
                last = last + (head >> 4) if head >> 4 else self.zigzag()
                fields.append([last, kind_, self.value(kind_)])
        raise ValueError(f"Thrift type {kind} in a Parquet footer")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append(n & 0x7F | 0x80)
        n >>= 7


def _encode(kind: int, value, out: bytearray) -> None:
    if kind in (_BOOL_TRUE, _BOOL_FALSE):
        return
    if kind == _BYTE:
        out.append(value)
    elif kind in (_I16, _I32, _I64):
        out += _varint((value << 1) ^ (value >> 63))
    elif kind == _DOUBLE:
        out += value
    elif kind == _BINARY:
        out += _varint(len(value)) + value
    elif kind in (_LIST, _SET):
        elem, items = value
        out += bytes([len(items) << 4 | elem]) if len(items) < 15 else bytes([0xF0 | elem]) + _varint(len(items))
        for item in items:
            out.append(item) if elem in (_BOOL_TRUE, _BOOL_FALSE) else _encode(elem, item, out)
    else:                                           # a struct
        last = 0
        for fid, kind_, v in value:
            out += bytes([(fid - last) << 4 | kind_]) if 0 < fid - last <= 15 else \
                bytes([kind_]) + _varint((fid << 1) ^ (fid >> 63))
            last = fid
            _encode(kind_, v, out)
        out.append(0)


def decode_footer(data: bytes) -> list:
    return _Reader(data).value(_STRUCT)


def encode_footer(fields: list) -> bytes:
    out = bytearray()
    _encode(_STRUCT, fields, out)
    return bytes(out)


def _field(fields: list, fid: int) -> list | None:
    return next((f for f in fields if f[0] == fid), None)


def footer_of(path: str | os.PathLike) -> tuple[int, list]:
    """(where the footer starts, the footer decoded) of the Parquet file at ``path``."""
    with open(path, "rb") as fh:
        fh.seek(-8, os.SEEK_END)
        size = fh.tell() + 8
        length, magic = struct.unpack("<i4s", fh.read(8))
        if magic != MAGIC:
            raise ValueError(f"{path}: not a Parquet file")
        fh.seek(size - 8 - length)
        return size - 8 - length, decode_footer(fh.read(length))


def moved_row_groups(footer: list, by: int, first_ordinal: int) -> list:
    """The row groups of a part's ``footer``, their offsets moved ``by`` bytes and numbered from
    ``first_ordinal``."""
    groups = _field(footer, _FMD_ROW_GROUPS)[2][1]
    for k, group in enumerate(groups):
        for fid, _, value in group:
            if fid == _RG_COLUMNS:
                for chunk in value[1]:
                    for f in chunk:
                        if f[0] in (_CC_OFFSET_INDEX, _CC_COLUMN_INDEX):
                            raise ValueError("a part with page indexes cannot be moved")
                        if f[0] == _CC_FILE_OFFSET and f[2]:        # deprecated: parquet-cpp writes 0
                            f[2] += by
                        elif f[0] == _CC_META:
                            for m in f[2]:
                                if m[0] in _CMD_OFFSETS:
                                    m[2] += by
        for f in group:
            if f[0] == _RG_FILE_OFFSET:
                f[2] += by
            elif f[0] == _RG_ORDINAL:
                f[2] = first_ordinal + k
    return groups


class Stitcher:
    """The footer of one Parquet file made of parts, their row groups in the order they are added; ``base`` is
    the footer of an empty file of the same schema and options."""

    def __init__(self, base: list):
        self.footer = base
        self.groups = _field(base, _FMD_ROW_GROUPS)[2][1]
        self.rows = _field(base, _FMD_NUM_ROWS)

    def add(self, path: str | os.PathLike, by: int) -> int:
        """List the row groups of the part at ``path``, whose bytes move ``by`` bytes in the output; returns
        where they end in the part (its footer's start)."""
        start, footer = footer_of(path)
        self.groups += moved_row_groups(footer, by, len(self.groups))
        self.rows[2] += _field(footer, _FMD_NUM_ROWS)[2]
        return start

    def tail(self) -> bytes:
        """The footer, its length and the closing magic number."""
        data = encode_footer(self.footer)
        return data + struct.pack("<i", len(data)) + MAGIC
