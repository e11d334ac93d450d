"""The body CRC (UtilAll.crc32: zlib's CRC-32, reflected polynomial 0xEDB88320) at the speed of the CPU it
runs on, in tiers, the best one this CPU has chosen when this module is imported (``TIER``: with the compiled
code, by ``kernel.load_compiled``; the kernel's small-input path takes zlib's), each one using the one below
for what it does not cover:

- ``vpclmulqdq-512`` / ``vpclmulqdq-256``: four 512-bit (AVX-512) or 256-bit (AVX2) accumulators folded by
  carry-less multiplication (VPCLMULQDQ), for bodies of 256 bytes and more; shorter ones as ``pclmulqdq``;
- ``pclmulqdq``: four independent 128-bit accumulators (PCLMULQDQ, x86 since 2010), then 16 bytes a step,
  the ragged tail folded as one more block (the last 16 bytes, the accumulator shifted under them), a body
  under 16 bytes as one zero-padded block; Barrett reduction to 32 bits (Intel's "Fast CRC Computation for
  Generic Polynomials Using PCLMULQDQ", the constants of Linux's crc32-pclmul and zlib-ng);
- ``armv8-crc``: the ARMv8 CRC32X/W/H/B instructions (aarch64), which compute this very polynomial;
- ``tables``: slice-by-8, where none of these exist.

The hardware tiers are LLVM functions built here (``module_with``) and linked into the compiled kernel;
each carries its own target features, so every x86 tier is in every x86 build, whatever CPU compiled it
(also ``NUMBA_CPU_NAME=generic``), and the tier is an argument of the call (``ARGUMENT``), not a constant of
the code: machine code that numba caches on one CPU holds no choice of that CPU's and stays valid for
another that loads it.
"""

from __future__ import annotations

import platform
import zlib

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

TABLES, PCLMULQDQ, VPCLMULQDQ_256, VPCLMULQDQ_512, ARMV8_CRC = range(5)
NAMES = ("tables", "pclmulqdq", "vpclmulqdq-256", "vpclmulqdq-512", "armv8-crc")
X86 = (PCLMULQDQ, VPCLMULQDQ_256, VPCLMULQDQ_512)
WIDE_MIN = 256                  # the shortest body the VPCLMULQDQ tiers fold 4 vectors at a time

# LLVM target features of each hardware tier's function
FEATURES = {PCLMULQDQ: "+sse2,+pclmul", VPCLMULQDQ_256: "+sse2,+pclmul,+avx,+avx2,+vpclmulqdq",
            VPCLMULQDQ_512: "+sse2,+pclmul,+avx,+avx2,+avx512f,+evex512,+vpclmulqdq", ARMV8_CRC: "+crc"}
_WIDTH = {PCLMULQDQ: 128, VPCLMULQDQ_256: 256, VPCLMULQDQ_512: 512}


def host_tier() -> int:
    """The best tier this CPU (and its operating system, for the wide registers) has."""
    import llvmlite.binding as llvm
    machine = platform.machine().lower()
    try:
        has = llvm.get_host_cpu_features()
    except RuntimeError:            # features not known on this host
        return TABLES
    if machine in ("x86_64", "amd64") and has.get("pclmul"):
        if has.get("vpclmulqdq") and has.get("avx512f"):
            return VPCLMULQDQ_512
        return VPCLMULQDQ_256 if has.get("vpclmulqdq") and has.get("avx2") else PCLMULQDQ
    if machine in ("aarch64", "arm64") and (has.get("crc") or has.get("crc32")):
        return ARMV8_CRC
    return TABLES


def _tables() -> np.ndarray:
    t = np.zeros((8, 256), np.uint64)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[0, i] = c
    for k in range(1, 8):
        t[k] = (t[k - 1] >> np.uint64(8)) ^ t[0][(t[k - 1] & np.uint64(0xFF)).astype(np.int64)]
    return t


TIER = host_tier()
ARGUMENT = (np.int64(TIER), _tables())      # what ``crc32`` takes as ``t``


def runnable() -> list[int]:
    """The tiers this CPU runs: ``TIER`` and the ones below it."""
    if TIER == ARMV8_CRC:
        return [TABLES, ARMV8_CRC]
    return [TABLES] + [t for t in X86 if t <= TIER]


def argument(tier: int) -> tuple:
    """``t`` for ``crc32`` running ``tier`` (tests and benchmarks: a tier this CPU has)."""
    return np.int64(tier), ARGUMENT[1]


# --- the LLVM functions ------------------------------------------------------------------------------------

_I8, _I16, _I32, _I64, _I128 = (ir.IntType(b) for b in (8, 16, 32, 64, 128))
_V2 = ir.VectorType(_I64, 2)
_SIG = ir.FunctionType(_I64, [_I8.as_pointer(), _I64])      # (pointer, length) -> zlib.crc32
_P = 0x104C11DB7                    # the CRC-32 polynomial, x^32 included


def _xpow(e: int) -> int:
    r = 1
    for _ in range(e):
        r <<= 1
        if r >> 32 & 1:
            r ^= _P
    return r


def _k(e: int) -> int:
    """x^e mod P, bit-reflected and shifted as the reflected fold multiplies by it."""
    return int(f"{_xpow(e):032b}"[::-1], 2) << 1


_MU, _POLY = 0x1F7011641, 0x1DB710641       # Barrett: floor(x^64 / P) and P, reflected
_EMPTY_BLOCKS = [zlib.crc32(bytes(n)) for n in range(16)]    # the initial ~0 carried over n zero bytes


class _Attributes(ir.values.FunctionAttributes):
    """Function attributes plus the function's own target features."""

    def __init__(self, features: str):
        super().__init__(["nounwind"])
        self.features = features

    def _to_list(self, ret_type):
        return super()._to_list(ret_type) + [f'"target-features"="{self.features}"']


def _function(module: ir.Module, name: str, features: str | None = None) -> tuple[ir.Function, bool]:
    """(the function ``name`` of ``_SIG``, whether it still needs a body); defined once per module and
    merged with its copies in other modules (linkonce_odr)."""
    if name in module.globals:
        return module.globals[name], False
    fn = ir.Function(module, _SIG, name)
    fn.linkage = "linkonce_odr"
    if features:
        fn.attributes = _Attributes(features)
    return fn, True


def _declare(module: ir.Module, name: str, ftype: ir.FunctionType) -> ir.Function:
    return module.globals.get(name) or ir.Function(module, ftype, name)


def _var(b: ir.IRBuilder, ty):
    """A local variable (an alloca in the entry block, where LLVM turns it into registers)."""
    with b.goto_entry_block():
        return b.alloca(ty)


def _load(b: ir.IRBuilder, p, offset, ty):
    return b.load(b.bitcast(b.gep(p, [offset]), ty.as_pointer()), align=1)


def _while(b: ir.IRBuilder, cond, body) -> None:
    head, loop, after = (b.append_basic_block(s) for s in ("head", "loop", "after"))
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(cond(), loop, after)
    b.position_at_end(loop)
    body()
    b.branch(head)
    b.position_at_end(after)


def _clmul(b: ir.IRBuilder, x, k, imm: int, width: int):
    vt = ir.VectorType(_I64, width // 64)
    name = "llvm.x86.pclmulqdq" + ("" if width == 128 else f".{width}")
    return b.call(_declare(b.module, name, ir.FunctionType(vt, [vt, vt, _I8])), [x, k, _I8(imm)])


def _fold(b: ir.IRBuilder, x, distance: int, width: int, clmul=_clmul):
    """Every 128-bit lane of ``x`` carried ``distance`` bits on: its low half times x^(d+32), its high half
    times x^(d-32)."""
    k = ir.Constant(ir.VectorType(_I64, width // 64), [_k(distance + 32), _k(distance - 32)] * (width // 128))
    return b.xor(clmul(b, x, k, 0x00, width), clmul(b, x, k, 0x11, width))


def _mul64(b: ir.IRBuilder, a, k: int):
    """(low, high) 64 bits of the carry-less product of i64 ``a`` and the constant ``k``."""
    r = _clmul(b, b.insert_element(ir.Constant(_V2, [0, 0]), a, _I32(0)), ir.Constant(_V2, [k, 0]), 0x00, 128)
    return b.extract_element(r, _I32(0)), b.extract_element(r, _I32(1))


def _reduce(b: ir.IRBuilder, x):
    """The CRC register (i64, 32 bits) of a message whose folded remainder is the 128-bit ``x``."""
    ones = _I64(0xFFFFFFFF)
    lo, hi = b.extract_element(x, _I32(0)), b.extract_element(x, _I32(1))
    a_lo, a_hi = _mul64(b, lo, _k(96))                   # 128 -> 64 bits (and 32 zero bits appended)
    lo, hi = b.xor(hi, a_lo), a_hi
    u = b.and_(lo, ones)                                 # 64 -> 32 bits
    lo = b.or_(b.lshr(lo, _I64(32)), b.shl(hi, _I64(32)))
    lo = b.xor(lo, _mul64(b, u, _k(64))[0])
    q = _mul64(b, b.and_(lo, ones), _MU)[0]              # Barrett reduction
    r = _mul64(b, b.and_(q, ones), _POLY)[0]
    return b.and_(b.lshr(b.xor(lo, r), _I64(32)), ones)


def _short_block(b: ir.IRBuilder, p, n):
    """The 1..15 bytes at ``p`` as the low bytes of an i128, read without touching a byte past them."""
    slot = _var(b, _I128)
    with b.if_else(b.icmp_unsigned(">=", n, _I64(8))) as (eight, under):
        with eight:       # two overlapping 8-byte reads
            lo = b.zext(_load(b, p, _I64(0), _I64), _I128)
            hi = b.zext(_load(b, p, b.sub(n, _I64(8)), _I64), _I128)
            b.store(b.or_(lo, b.shl(hi, b.zext(b.mul(b.sub(n, _I64(8)), _I64(8)), _I128))), slot)
        with under:
            with b.if_else(b.icmp_unsigned(">=", n, _I64(4))) as (four, few):
                with four:
                    lo = b.zext(_load(b, p, _I64(0), _I32), _I128)
                    hi = b.zext(_load(b, p, b.sub(n, _I64(4)), _I32), _I128)
                    b.store(b.or_(lo, b.shl(hi, b.zext(b.mul(b.sub(n, _I64(4)), _I64(8)), _I128))), slot)
                with few:         # bytes 0, n/2 and n-1 cover 1 to 3 bytes
                    v = _I128(0)
                    for at in (_I64(0), b.lshr(n, _I64(1)), b.sub(n, _I64(1))):
                        byte = b.zext(_load(b, p, at, _I8), _I128)
                        v = b.or_(v, b.shl(byte, b.zext(b.mul(at, _I64(8)), _I128)))
                    b.store(v, slot)
    return b.load(slot)


def _empty_blocks(module: ir.Module) -> ir.GlobalVariable:
    name = "rmqtool_crc32_empty_blocks"
    if name in module.globals:
        return module.globals[name]
    table = ir.GlobalVariable(module, ir.ArrayType(_I64, 16), name)
    table.linkage, table.global_constant = "linkonce_odr", True
    table.initializer = ir.Constant(ir.ArrayType(_I64, 16), _EMPTY_BLOCKS)
    return table


def _define_fold(module: ir.Module, tier: int, wide_clmul=_clmul, features: str | None = None) -> ir.Function:
    """``rmqtool_crc32_<tier>(p, n)``: zlib.crc32 of p[0:n] by carry-less folding (an x86 tier). ``wide_clmul``
    emits the tier's own carry-less multiplication, ``features`` replaces its target features (tests: the
    512-bit tier run where the CPU lacks it)."""
    fn, new = _function(module, f"rmqtool_crc32_{NAMES[tier].replace('-', '_')}", features or FEATURES[tier])
    if not new:
        return fn
    width = _WIDTH[tier]
    p, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    with b.if_then(b.icmp_unsigned("==", n, _I64(0))):
        b.ret(_I64(0))
    with b.if_then(b.icmp_unsigned("<", n, _I64(16))):
        # one block, the bytes at its end: folds what the bytes fold to; the initial ~0 is added after
        block = b.shl(_short_block(b, p, n), b.zext(b.mul(b.sub(_I64(16), n), _I64(8)), _I128))
        empty = b.load(b.gep(_empty_blocks(module), [_I64(0), n]))
        b.ret(b.xor(_reduce(b, b.bitcast(block, _V2)), empty))
    x, pos = _var(b, _V2), _var(b, _I64)

    def stage(w: int) -> None:
        """Four accumulators of ``w`` bits (n >= 4 * w / 8), folded into x at pos."""
        vt, step = ir.VectorType(_I64, w // 64), w // 8
        init = ir.Constant(vt, [0xFFFFFFFF] + [0] * (w // 64 - 1))
        acc = [_var(b, vt) for _ in range(4)]
        for i, a in enumerate(acc):
            v = _load(b, p, _I64(i * step), vt)
            b.store(b.xor(v, init) if i == 0 else v, a)
        b.store(_I64(4 * step), pos)

        def four() -> None:
            at = b.load(pos)
            for i, a in enumerate(acc):
                b.store(b.xor(_fold(b, b.load(a), 4 * w, w, wide_clmul), _load(b, p, b.add(at, _I64(i * step)), vt)), a)
            b.store(b.add(at, _I64(4 * step)), pos)
        _while(b, lambda: b.icmp_unsigned(">=", b.sub(n, b.load(pos)), _I64(4 * step)), four)
        v = b.load(acc[0])
        for a in acc[1:]:
            v = b.xor(_fold(b, v, w, w, wide_clmul), b.load(a))
        if w > 128:
            one = _var(b, vt)
            b.store(v, one)

            def single() -> None:
                at = b.load(pos)
                b.store(b.xor(_fold(b, b.load(one), w, w, wide_clmul), _load(b, p, at, vt)), one)
                b.store(b.add(at, _I64(step)), pos)
            _while(b, lambda: b.icmp_unsigned(">=", b.sub(n, b.load(pos)), _I64(step)), single)
            v = b.load(one)
            lanes = [b.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 2), [2 * i, 2 * i + 1]))
                     for i in range(w // 128)]
            v = lanes[0]
            for lane in lanes[1:]:
                v = b.xor(_fold(b, v, 128, 128), lane)
        b.store(v, x)

    def narrow() -> None:
        with b.if_else(b.icmp_unsigned(">=", n, _I64(64))) as (lanes, one):
            with lanes:
                stage(128)
            with one:
                b.store(b.xor(_load(b, p, _I64(0), _V2), ir.Constant(_V2, [0xFFFFFFFF, 0])), x)
                b.store(_I64(16), pos)

    if width > 128:
        with b.if_else(b.icmp_unsigned(">=", n, _I64(max(WIDE_MIN, 4 * width // 8)))) as (wide, short):
            with wide:
                stage(width)
            with short:
                narrow()
    else:
        narrow()

    def step16() -> None:
        at = b.load(pos)
        b.store(b.xor(_fold(b, b.load(x), 128, 128), _load(b, p, at, _V2)), x)
        b.store(b.add(at, _I64(16)), pos)
    _while(b, lambda: b.icmp_unsigned(">=", b.sub(n, b.load(pos)), _I64(16)), step16)
    r = b.sub(n, b.load(pos))
    with b.if_then(b.icmp_unsigned("!=", r, _I64(0))):
        # the last r bytes: x's first r bytes as one block, folded over [x's other bytes, the r bytes]
        # (the last 16 bytes of the body with its first 16 - r bytes replaced by x's)
        v = b.bitcast(b.load(x), _I128)
        keep = b.zext(b.mul(b.sub(_I64(16), r), _I64(8)), _I128)
        head = b.shl(v, keep)
        last = _load(b, p, b.sub(n, _I64(16)), _I128)
        rest = b.or_(b.lshr(v, b.zext(b.mul(r, _I64(8)), _I128)), b.shl(b.lshr(last, keep), keep))
        b.store(b.xor(_fold(b, b.bitcast(head, _V2), 128, 128), b.bitcast(rest, _V2)), x)
    b.ret(b.xor(_reduce(b, b.load(x)), _I64(0xFFFFFFFF)))
    return fn


def _arm_instruction(b: ir.IRBuilder, bits: int, crc, data):
    """The ARMv8 CRC32X/W/H/B instruction: crc (i32) over the ``bits`` of data (reflected, this polynomial)."""
    suffix = {64: "x", 32: "w", 16: "h", 8: "b"}[bits]
    dt = _I64 if bits == 64 else _I32
    fn = _declare(b.module, f"llvm.aarch64.crc32{suffix}", ir.FunctionType(_I32, [_I32, dt]))
    return b.call(fn, [crc, data if bits in (64, 32) else b.zext(data, _I32)])


def _define_arm(module: ir.Module, instruction=_arm_instruction) -> ir.Function:
    """``rmqtool_crc32_armv8_crc(p, n)``: zlib.crc32 of p[0:n], 8 bytes an instruction, then 4, 2, 1.
    ``instruction`` emits the CRC instruction (tests put an emulation of it in its place)."""
    fn, new = _function(module, "rmqtool_crc32_armv8_crc", FEATURES[ARMV8_CRC])
    if not new:
        return fn
    p, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    crc, pos = _var(b, _I32), _var(b, _I64)
    b.store(_I32(0xFFFFFFFF), crc)
    b.store(_I64(0), pos)

    def eight() -> None:
        at = b.load(pos)
        b.store(instruction(b, 64, b.load(crc), _load(b, p, at, _I64)), crc)
        b.store(b.add(at, _I64(8)), pos)
    _while(b, lambda: b.icmp_unsigned(">=", b.sub(n, b.load(pos)), _I64(8)), eight)
    for bits, ty in ((32, _I32), (16, _I16), (8, _I8)):
        with b.if_then(b.icmp_unsigned(">=", b.sub(n, b.load(pos)), _I64(bits // 8))):
            at = b.load(pos)
            b.store(instruction(b, bits, b.load(crc), _load(b, p, at, ty)), crc)
            b.store(b.add(at, _I64(bits // 8)), pos)
    b.ret(b.zext(b.xor(b.load(crc), _I32(0xFFFFFFFF)), _I64))
    return fn


def _define_dispatch(module: ir.Module) -> ir.Function:
    """``rmqtool_crc32(p, n, tier)``: the tier's function for this module's target (x86 or aarch64)."""
    name = "rmqtool_crc32"
    if name in module.globals:
        return module.globals[name]
    fn = ir.Function(module, ir.FunctionType(_I64, [_I8.as_pointer(), _I64, _I64]), name)
    fn.linkage = "linkonce_odr"
    fn.attributes.add("alwaysinline")
    p, n, tier = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    arch = (module.triple or "").split("-")[0]
    if arch in ("x86_64", "amd64"):
        for t in (VPCLMULQDQ_512, VPCLMULQDQ_256):
            with b.if_then(b.icmp_signed("==", tier, _I64(t))):
                b.ret(b.call(_define_fold(module, t), [p, n]))
        b.ret(b.call(_define_fold(module, PCLMULQDQ), [p, n]))
    elif arch in ("aarch64", "arm64"):
        b.ret(b.call(_define_arm(module), [p, n]))
    else:                   # no hardware tier here: TIER is TABLES and this is never called
        b.ret(_I64(0))
    return fn


def module_with(triple: str, *tiers: int, instruction=_arm_instruction, wide_clmul=_clmul,
                features: str | None = None) -> ir.Module:
    """A module for ``triple`` holding the functions of ``tiers`` (tests: compile for another target, run
    with an instruction emulated; see ``_define_arm``, ``_define_fold``)."""
    module = ir.Module(name="rmqtool_crc32")
    module.triple = triple
    for tier in tiers:
        fn = _define_arm(module, instruction) if tier == ARMV8_CRC else _define_fold(module, tier, wide_clmul, features)
        fn.linkage = ""             # external: kept when nothing in the module calls it
    return module


@intrinsic
def _hardware(typingctx, arr, p, n, tier):
    """zlib.crc32 of arr[p:p+n] by the hardware tier ``tier`` (int64)."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), _I8.as_pointer())
        return builder.call(_define_dispatch(builder.module), [ptr, args[2], args[3]])
    return types.int64(arr, p, n, tier), codegen


_M8 = np.uint64(0xFF)
_ONES = np.uint64(0xFFFFFFFF)


@njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _crc32_tables(d, d64, shift, p, n, t):
    """zlib.crc32 of d[p:p+n], slice-by-8; ``d64`` is d[shift:] viewed as little-endian uint64 words
    (aligned reads)."""
    crc = _ONES
    e = p + n
    while p < e and ((p - shift) & 7) != 0:
        crc = t[0, (crc ^ np.uint64(d[p])) & _M8] ^ (crc >> np.uint64(8))
        p += 1
    while p + 8 <= e:
        w = d64[(p - shift) >> 3] ^ crc
        crc = (t[7, w & _M8] ^ t[6, (w >> np.uint64(8)) & _M8] ^ t[5, (w >> np.uint64(16)) & _M8]
               ^ t[4, (w >> np.uint64(24)) & _M8] ^ t[3, (w >> np.uint64(32)) & _M8]
               ^ t[2, (w >> np.uint64(40)) & _M8] ^ t[1, (w >> np.uint64(48)) & _M8] ^ t[0, w >> np.uint64(56)])
        p += 8
    while p < e:
        crc = t[0, (crc ^ np.uint64(d[p])) & _M8] ^ (crc >> np.uint64(8))
        p += 1
    return np.int64(crc ^ _ONES)


@njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def crc32(d, d64, shift, p, n, t):
    """zlib.crc32 of d[p:p+n] (a byte array) by the tier ``t[0]`` (``t``: ``ARGUMENT``, or ``argument(tier)``;
    ``d64``, ``shift``: ``kernel.words(d)``, the tables' aligned reads). Only compiled code calls it."""
    if t[0] == TABLES:
        return _crc32_tables(d, d64, shift, p, n, t[1])
    return _hardware(d, p, n, t[0])
