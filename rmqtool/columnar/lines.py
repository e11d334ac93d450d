"""Text lines assembled from a batch's columns in one compiled pass (numba): JSON lines and CSV rows.

A line is a sequence of parts, one per column: each part writes its literal prefix, the cell and its
suffix (or its null text), all read in place from the Arrow buffers (by address): a string cell is
copied, an integer is printed in decimal, a binary value is printed in base64, a map<string,string> or a
list<string> as its items between the part's literals (JSON's ``{"k":"v",...}``, the same with doubled
quotes inside a CSV cell). What needs escaping or quoting is found per column by the caller (text.py) and
rendered there; this module only concatenates. Two passes over the rows: the lengths of the lines, then
their text into one buffer from Arrow's memory pool.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from rmqtool.columnar.kernel import _helper, _jit, load_compiled, read_only

load_compiled()       # these passes work on addresses: they have no plain form (kernel.py's small-input path)

TEXT, INT32, INT64, BASE64, MAP, LIST, NULL = range(7)
# Literal slots of a part: before and after a valid cell, instead of a null one; a map's or list's
# opening, key/value separator, item separator, closing, and its text when empty.
PRE, POST, NULL_TEXT, OPEN, KV, SEP, CLOSE, EMPTY = range(8)
# Columns of the part table: kind, validity bitmap address (0: no nulls), its bit offset, then addresses.
KIND, VALID, BIT, A0, A1, A2, A3, A4 = range(8)
CHUNK_ROWS = 1024    # lines a writer renders and writes at a time (their text fits in the CPU's cache)
WIDTH = 11          # the data ends: TEXT's at A1 + 3, a map's keys' and items' at A2 + 3 and A4 + 3
_B64 = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8).copy()
_B64X2 = (_B64[np.arange(4096) >> 6].astype(np.uint16) | _B64[np.arange(4096) & 63].astype(np.uint16) << 8)
_PAIRS = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode(), np.uint8).copy()
_TABLES = np.array([_B64.ctypes.data, _B64X2.ctypes.data, _PAIRS.ctypes.data], np.int64)


def _peek(bits: int, swap: bool = False):
    """The int of ``bits`` (unaligned; big-endian when ``swap``) at a memory address."""
    @intrinsic
    def peek(typingctx, addr):
        def codegen(context, builder, signature, args):
            ity = ir.IntType(bits)
            v = builder.load(builder.inttoptr(args[0], ity.as_pointer()), align=1)
            if swap:
                fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ity, [ity]), f"llvm.bswap.i{bits}")
                v = builder.call(fn, [v])
            return v
        return getattr(types, f"int{bits}")(types.int64), codegen
    return peek


_u8, _i16, _i32, _i64, _be64 = _peek(8), _peek(16), _peek(32), _peek(64), _peek(64, True)


@intrinsic
def _memcpy(typingctx, dst, src, n):
    """The n bytes at address ``src`` to address ``dst`` (no overlap): one llvm.memcpy."""
    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        cgutils.raw_memcpy(builder, builder.inttoptr(args[0], i8p), builder.inttoptr(args[1], i8p), args[2], 1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


# Every helper takes addresses and ints only: an array argument costs numba a reference count per call.
@intrinsic
def _poke(typingctx, addr, value):
    """Store ``value`` (an int) at a memory address (unaligned)."""
    def codegen(context, builder, signature, args):
        ity = context.get_value_type(signature.args[1])
        builder.store(args[1], builder.inttoptr(args[0], ity.as_pointer()), align=1)
        return context.get_dummy_value()
    return types.void(types.int64, value), codegen


@_helper
def _valid(bitmap, bit, i):
    if bitmap == 0:
        return True
    b = bit + i
    return (np.int64(_u8(bitmap + (b >> 3))) >> (b & 7)) & 1 == 1


@_helper
def _span(addr, i):
    """(start, length) of value i of a string array whose int32 offsets are at ``addr``."""
    a = np.int64(_i32(addr + 4 * i))
    return a, np.int64(_i32(addr + 4 * i + 4)) - a


@_helper
def _int(kind, addr, i):
    if kind == INT32:
        return np.int64(_i32(addr + 4 * i))
    return np.int64(_i64(addr + 8 * i))


@_helper
def _digits(v):
    """Characters of v in decimal."""
    n = 1
    if v < 0:
        n = 2
        u = np.uint64(0) - np.uint64(v)
    else:
        u = np.uint64(v)
    while u >= 100:
        u //= np.uint64(100)
        n += 2
    return n + 1 if u >= 10 else n


@_jit
def _lengths(n, parts, lit, end_len, offsets):
    """offsets[i + 1] - offsets[i]: the length of line i (a column at a time)."""
    lens = offsets[1:]
    for i in range(n):
        lens[i] = end_len
    for p in range(parts.shape[0]):
        kind, bitmap, bit, a0, a1, a3 = parts[p, KIND], parts[p, VALID], parts[p, BIT], parts[p, A0], parts[p, A1], \
            parts[p, A3]
        filled = lit[p, PRE + 1] - lit[p, PRE] + lit[p, POST + 1] - lit[p, POST]
        null = lit[p, NULL_TEXT + 1] - lit[p, NULL_TEXT]
        n0, n1, n2 = lit[p, KV] - lit[p, OPEN], lit[p, SEP] - lit[p, KV], lit[p, CLOSE] - lit[p, SEP]
        n3, n4 = lit[p, EMPTY] - lit[p, CLOSE], lit[p, EMPTY + 1] - lit[p, EMPTY]
        for i in range(n):
            if kind == NULL or not _valid(bitmap, bit, i):
                lens[i] += null
            elif kind == TEXT:
                lens[i] += filled + _span(a0, i)[1]
            elif kind == BASE64:
                lens[i] += filled + (_span(a0, i)[1] + 2) // 3 * 4
            elif kind == INT32 or kind == INT64:
                lens[i] += filled + _digits(_int(kind, a0, i))
            else:
                m, k = _span(a0, i)
                if k == 0:
                    lens[i] += filled + n4
                else:
                    t = n0 + n3 + (k - 1) * n2 + _span(a1, m + k)[0] - _span(a1, m)[0]
                    if kind == MAP:
                        t += k * n1 + _span(a3, m + k)[0] - _span(a3, m)[0]
                    lens[i] += filled + t
    offsets[0] = 0
    for i in range(n):
        offsets[i + 1] += offsets[i]


@_helper
def _copy(src, n, src_end, o, room):
    """The n bytes at address ``src`` to address ``o``: 8 bytes a move where both sides have room for the
    last move (``src_end``: the end of the source's buffer; ``room``: the end of the line), else memcpy."""
    if src + n + 8 <= src_end and o + n + 8 <= room:
        for k in range(0, n, 8):
            _poke(o + k, _i64(src + k))
    else:
        _memcpy(o, src, n)
    return o + n


@_helper
def _put_int(v, o, pairs):
    n = _digits(v)
    if v < 0:
        _poke(o, np.uint8(45))          # "-"
        u = np.uint64(0) - np.uint64(v)
    else:
        u = np.uint64(v)
    k = o + n
    while u >= 100:
        r = np.int64(u % np.uint64(100))
        u //= np.uint64(100)
        k -= 2
        _poke(k, _i16(pairs + 2 * r))
    if u >= 10:
        _poke(k - 2, _i16(pairs + 2 * np.int64(u)))
    else:
        _poke(k - 1, np.uint8(48 + u))
    return o + n


@_helper
def _put_base64(a, n, src_end, o, b64, b64x2):
    """Base64 of the n bytes at address a: six bytes to eight characters a step (one 8-byte load, four
    lookups of 12 bits, one 8-byte store) while the source has 8 bytes, then three bytes a step."""
    end = a + n - n % 3
    while a + 6 <= end and a + 8 <= src_end:
        v = np.uint64(_be64(a)) >> np.uint64(16)
        w = (np.uint64(_i16(b64x2 + 2 * np.int64(v >> np.uint64(36)))) & np.uint64(0xFFFF)
             | (np.uint64(_i16(b64x2 + 2 * np.int64((v >> np.uint64(24)) & np.uint64(4095)))) & np.uint64(0xFFFF)) << np.uint64(16)
             | (np.uint64(_i16(b64x2 + 2 * np.int64((v >> np.uint64(12)) & np.uint64(4095)))) & np.uint64(0xFFFF)) << np.uint64(32)
             | (np.uint64(_i16(b64x2 + 2 * np.int64(v & np.uint64(4095)))) & np.uint64(0xFFFF)) << np.uint64(48))
        _poke(o, w)
        a += 6
        o += 8
    while a < end:
        v = (np.int64(_u8(a)) & 255) << 16 | (np.int64(_u8(a + 1)) & 255) << 8 | (np.int64(_u8(a + 2)) & 255)
        _poke(o, _u8(b64 + (v >> 18)))
        _poke(o + 1, _u8(b64 + ((v >> 12) & 63)))
        _poke(o + 2, _u8(b64 + ((v >> 6) & 63)))
        _poke(o + 3, _u8(b64 + (v & 63)))
        a += 3
        o += 4
    r = n % 3
    if r:
        v = (np.int64(_u8(a)) & 255) << 16
        if r == 2:
            v |= (np.int64(_u8(a + 1)) & 255) << 8
        _poke(o, _u8(b64 + (v >> 18)))
        _poke(o + 1, _u8(b64 + ((v >> 12) & 63)))
        _poke(o + 2, _u8(b64 + ((v >> 6) & 63)) if r == 2 else np.int8(61))       # "="
        _poke(o + 3, np.int8(61))
        o += 4
    return o


@_jit
def _render(first, last, parts, lits, lit, end, offsets, out, tables, pos):
    """Lines first..last-1 from address ``out`` on, ``len(pos)`` rows at a time (their text stays in cache;
    ``pos``: their write positions), a column at a time. ``lits`` and the ``tables`` (base64 characters,
    their pairs for 12 bits, decimal digit pairs) are addresses too."""
    b64, b64x2, pairs = tables[0], tables[1], tables[2]
    base = out - offsets[first]
    lits_end = lits + lit[-1, -1] + 8 if parts.shape[0] else lits
    step = len(pos)
    for c in range(first, last, step):
        rows = last - c if last - c < step else step
        for r in range(rows):
            pos[r] = base + offsets[c + r]
        for p in range(parts.shape[0]):
            kind, bitmap, bit = parts[p, KIND], parts[p, VALID], parts[p, BIT]
            a0, a1, a2, a3, a4 = parts[p, A0], parts[p, A1], parts[p, A2], parts[p, A3], parts[p, A4]
            end1, end2, end4 = parts[p, A1 + 3], parts[p, A2 + 3], parts[p, A4 + 3]
            pre, post, nul, op, kv, sp, cl, em = (lits + lit[p, PRE], lits + lit[p, POST], lits + lit[p, NULL_TEXT],
                                                  lits + lit[p, OPEN], lits + lit[p, KV], lits + lit[p, SEP],
                                                  lits + lit[p, CLOSE], lits + lit[p, EMPTY])
            npre, npost, nnul, nop = post - pre, nul - post, op - nul, kv - op      # the literals lie in slot order
            nkv, nsp, ncl, nem = sp - kv, cl - sp, em - cl, lit[p, EMPTY + 1] - lit[p, EMPTY]
            for r in range(rows):
                i = c + r
                o, room = pos[r], base + offsets[i + 1]
                if kind == NULL or not _valid(bitmap, bit, i):
                    pos[r] = _copy(nul, nnul, lits_end, o, room)
                    continue
                o = _copy(pre, npre, lits_end, o, room)
                if kind == TEXT:
                    a, m = _span(a0, i)
                    o = _copy(a1 + a, m, end1, o, room)
                elif kind == BASE64:
                    a, m = _span(a0, i)
                    o = _put_base64(a1 + a, m, end1, o, b64, b64x2)
                elif kind == INT32 or kind == INT64:
                    o = _put_int(_int(kind, a0, i), o, pairs)
                else:
                    m, k = _span(a0, i)
                    if k == 0:
                        o = _copy(em, nem, lits_end, o, room)
                    else:
                        o = _copy(op, nop, lits_end, o, room)
                        for j in range(m, m + k):
                            if j > m:
                                o = _copy(sp, nsp, lits_end, o, room)
                            a, t = _span(a1, j)
                            o = _copy(a2 + a, t, end2, o, room)
                            if kind == MAP:
                                o = _copy(kv, nkv, lits_end, o, room)
                                a, t = _span(a3, j)
                                o = _copy(a4 + a, t, end4, o, room)
                        o = _copy(cl, ncl, lits_end, o, room)
                pos[r] = _copy(post, npost, lits_end, o, room)
        for r in range(rows):
            for k in range(len(end)):
                _poke(pos[r] + k, end[k])


@_jit
def _escapes(d):
    """Whether any byte of ``d`` is a control character, a quote or a backslash (what JSON escapes)."""
    hit = False
    for i in range(len(d)):
        c = d[i]
        hit |= (c < 32) | (c == 34) | (c == 92)
    return hit


def any_escape(data: np.ndarray) -> bool:
    """``_escapes`` of a column's bytes: one pass, where numpy's three comparisons made three arrays of the
    column's size (~0.05 CPU-s per GiB of JSON lines)."""
    return bool(_escapes(read_only(data)))


def _positions() -> np.ndarray:
    """Room for the write positions of the rows ``_render`` renders at a time."""
    return np.empty(1024, np.int64)


class Lines:
    """The parts of a batch's lines, added column by column; ``text()`` renders them."""

    def __init__(self, n: int):
        self.n = n
        self.parts: list[list[int]] = []
        self.lits: list[list[bytes]] = []
        self.keep: list = []            # the arrays whose buffers the parts address

    def add(self, kind: int, arr: pa.Array | None, pre: bytes, post: bytes = b"", null: bytes = b"",
            nested: tuple[bytes, bytes, bytes, bytes, bytes] = (b"",) * 5) -> None:
        """A column: ``arr`` (string or binary with int32 offsets, int32/int64, map<string,string> or
        list<string>; None for NULL) written as ``pre`` + cell + ``post``, or ``null`` where null."""
        row = [kind] + [0] * (WIDTH - 1)
        if arr is not None and kind != NULL:
            self.keep.append(arr)
            bufs = arr.buffers()
            if arr.null_count and bufs[0] is not None:
                row[VALID], row[BIT] = bufs[0].address, arr.offset
            if kind in (INT32, INT64):
                row[A0] = bufs[1].address + arr.offset * (4 if kind == INT32 else 8)
            else:
                row[A0] = bufs[1].address + 4 * arr.offset
                children = [arr] if kind in (TEXT, BASE64) else [arr.keys, arr.items] if kind == MAP else [arr.values]
                self.keep += children
                for k, child in enumerate(children):        # (offsets, data) at A1, A2 (A3, A4); data ends 3 on
                    cb = child.buffers()
                    if child is not arr:
                        row[A1 + 2 * k] = cb[1].address + 4 * child.offset
                    data = cb[2]
                    at = A1 if child is arr else A2 + 2 * k
                    row[at], row[at + 3] = (data.address, data.address + data.size) if data is not None else (0, 0)
        self.parts.append(row)
        self.lits.append([pre, post, null, *nested])

    def _prepare(self, end: bytes) -> tuple:
        flat = [s for slots in self.lits for s in slots]
        ends = np.cumsum([0] + [len(s) for s in flat], dtype=np.int64)
        slots = len(self.lits[0]) if self.lits else 0
        lit = np.stack([ends[p * slots:p * slots + slots + 1] for p in range(len(self.parts))]) \
            if self.parts else np.zeros((0, 9), np.int64)
        lits = np.frombuffer(b"".join(flat) + bytes(8), np.uint8)       # 8 bytes to spare for _copy
        parts = np.array(self.parts, np.int64).reshape(len(self.parts), WIDTH)
        offsets = np.empty(self.n + 1, np.int64)
        _lengths(self.n, parts, lit, len(end), offsets)
        return parts, lits, lit, np.frombuffer(end, np.uint8), offsets

    def length(self, end: bytes) -> int:
        """The bytes ``text`` would make, counted without rendering them."""
        return int(self._prepare(end)[-1][-1])

    def text(self, end: bytes) -> tuple[np.ndarray, np.ndarray]:
        """(int64 offsets of the lines, their bytes), each line ending in ``end``."""
        parts, lits, lit, end_arr, offsets = self._prepare(end)
        out = np.frombuffer(pa.allocate_buffer(max(int(offsets[-1]), 1)), np.uint8)
        _render(0, self.n, parts, lits.ctypes.data, lit, end_arr, offsets, out.ctypes.data, _TABLES, _positions())
        return offsets, out[:offsets[-1]]

    def chunks(self, end: bytes, rows: int) -> Iterator[memoryview]:
        """The text of ``rows`` lines at a time, each chunk in the same buffer (valid until the next): a
        writer copies it into the page cache while it is still in the CPU's cache (a whole batch's text
        would be read back from memory: ~0.4 CPU-s per GiB of JSON lines)."""
        parts, lits, lit, end_arr, offsets = self._prepare(end)
        cuts = np.append(np.arange(0, self.n, rows), self.n)
        size = int(np.diff(offsets[cuts]).max(initial=1))
        out, pos = np.frombuffer(pa.allocate_buffer(size), np.uint8), _positions()
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            _render(a, b, parts, lits.ctypes.data, lit, end_arr, offsets, out.ctypes.data, _TABLES, pos)
            yield memoryview(out[:offsets[b] - offsets[a]])
