"""The body CRC's tiers (rmqtool.columnar.crc) against zlib.crc32: every tier this CPU runs, at every length
from 0 to 1299 and several alignments, bodies against unreadable pages; the aarch64 tier compiled for
aarch64 (and its loop run here with its instruction emulated); the 512-bit tier compiled where the CPU
lacks it."""

from __future__ import annotations

import ctypes
import mmap
import zlib

import numpy as np
import pytest
from llvmlite import ir

from rmqtool.columnar import crc
from rmqtool.columnar.kernel import words

LENGTHS = range(1300)
ALIGNMENTS = (0, 1, 2, 3, 5, 7, 8, 13)


@pytest.fixture(scope="module")
def crc32_of():
    """crc32_of(data, p, n, t): ``crc.crc32`` (only compiled code calls it) of data[p:p+n]."""
    import numba

    @numba.njit
    def compiled(d, d64, shift, p, n, t):
        return crc.crc32(d, d64, shift, p, n, t)

    def crc32_of(data, p, n, t):
        return compiled(data, *words(data), p, n, t)
    return crc32_of


@pytest.mark.parametrize("tier", crc.runnable(), ids=lambda t: crc.NAMES[t])
def test_every_tier_this_cpu_runs_is_zlib(crc32_of, tier):
    rng = np.random.default_rng(35)
    data = rng.integers(0, 256, 4096, dtype=np.uint8)
    t = crc.argument(tier)
    for at in ALIGNMENTS:
        got = [crc32_of(data, at, n, t) for n in LENGTHS]
        want = [zlib.crc32(data[at:at + n]) for n in LENGTHS]
        assert got == want, next((n, at) for n in LENGTHS if got[n] != want[n])
    for fill in (0, 0xFF):          # no stray initial or final inversion hides in random bytes
        same = np.full(1300, fill, np.uint8)
        assert [crc32_of(same, 0, n, t) for n in LENGTHS] == [zlib.crc32(same[:n]) for n in LENGTHS]


@pytest.mark.parametrize("tier", crc.runnable(), ids=lambda t: crc.NAMES[t])
def test_no_tier_reads_a_byte_outside_the_body(crc32_of, tier):
    """Bodies that start right after, and end right before, a page that cannot be read (a fault, not a
    wrong CRC, if a tier read outside them)."""
    page = mmap.PAGESIZE
    if page < 1300:
        pytest.skip("pages smaller than the longest body tested")
    m = mmap.mmap(-1, 3 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    assert libc.mprotect(base, page, 0) == 0 and libc.mprotect(base + 2 * page, page, 0) == 0
    try:
        buf = (ctypes.c_ubyte * page).from_address(base + page)
        data = np.ctypeslib.as_array(buf)
        data[:] = np.random.default_rng(5).integers(0, 256, page, dtype=np.uint8)
        t = crc.argument(tier)
        for n in LENGTHS:
            assert crc32_of(data, 0, n, t) == zlib.crc32(data[:n]), n
            assert crc32_of(data, page - n, n, t) == zlib.crc32(data[page - n:]), n
    finally:
        libc.mprotect(base, 3 * page, mmap.PROT_READ | mmap.PROT_WRITE)
        del data, buf
        m.close()


def test_the_kernel_runs_the_best_tier_of_this_cpu():
    """What ``scan_window`` passes is the host's best tier, to this module's dispatch (once compiled code is
    loaded: the small-input path takes zlib's); on x86-64 every such CPU has PCLMULQDQ (since 2010)."""
    import platform

    from rmqtool.columnar import kernel
    kernel.load_compiled()
    assert kernel._crc_argument() is crc.ARGUMENT and kernel._crc32 is crc.crc32
    assert int(crc.ARGUMENT[0]) == crc.TIER == crc.host_tier()
    if platform.machine().lower() in ("x86_64", "amd64"):
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
        if "pclmulqdq" in flags:
            assert crc.TIER >= crc.PCLMULQDQ
        if "vpclmulqdq" in flags and "avx2" in flags:
            assert crc.TIER >= crc.VPCLMULQDQ_256


def _machine(triple: str, features: str = ""):
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm.Target.from_triple(triple).create_target_machine(features=features, opt=2)


def _assembly(module: ir.Module, triple: str) -> str:
    """``module`` compiled to machine code for ``triple`` (object code, and its assembly text returned)."""
    import llvmlite.binding as llvm
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    tm = _machine(triple)
    assert tm.emit_object(parsed)
    return tm.emit_assembly(parsed)


AARCH64 = "aarch64-unknown-linux-gnu"


def _compiles_to_crc_instructions(module: ir.Module) -> bool:
    """Whether ``module`` compiles for aarch64 to code that runs the four CRC instructions and calls out
    to nothing (an unknown intrinsic would be a call)."""
    import subprocess
    import sys
    compile_it = ("import sys\nimport llvmlite.binding as llvm\nllvm.initialize_all_targets()\n"
                  "llvm.initialize_all_asmprinters()\nm = llvm.parse_assembly(sys.stdin.read())\nm.verify()\n"
                  f"tm = llvm.Target.from_triple({AARCH64!r}).create_target_machine(opt=2)\n"
                  "assert tm.emit_object(m)\nprint(tm.emit_assembly(m))")
    # in a process of its own: LLVM aborts the process where it selects no instruction for an intrinsic
    proc = subprocess.run([sys.executable, "-c", compile_it], input=str(module), capture_output=True, text=True)
    if proc.returncode != 0:            # not valid IR for aarch64, or no instruction selected for it
        return False
    asm = proc.stdout
    code = [line.split()[0] for line in asm.splitlines() if line.startswith("\t") and not line.startswith("\t.")]
    return {"crc32x", "crc32w", "crc32h", "crc32b"} <= set(code) and not {"bl", "blr", "b.call"} & set(code)


def test_the_aarch64_tier_compiles_for_aarch64_to_its_crc_instructions():
    assert _compiles_to_crc_instructions(crc.module_with(AARCH64, crc.ARMV8_CRC))


@pytest.mark.parametrize("wrong", ["name", "type", "x86"])
def test_the_aarch64_compile_test_fails_on_a_wrong_instruction(wrong):
    """The compile test's control: an intrinsic that is not ARMv8's CRC32X (another name, the right name
    given 32 bits, x86's CRC32 instruction) fails it."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    name, ftype = {"name": ("llvm.aarch64.crc32cq", ir.FunctionType(i32, [i32, i64])),
                   "type": ("llvm.aarch64.crc32x", ir.FunctionType(i32, [i32, i32])),
                   "x86": ("llvm.x86.sse42.crc32.64.64", ir.FunctionType(i64, [i64, i64]))}[wrong]

    def instruction(b, bits, value, data):
        if bits != 64:
            return crc._arm_instruction(b, bits, value, data)
        fn = ir.Function(b.module, ftype, name)
        if wrong == "x86":
            return b.trunc(b.call(fn, [b.zext(value, i64), data]), i32)
        return b.call(fn, [value, data if wrong == "name" else b.trunc(data, i32)])
    assert not _compiles_to_crc_instructions(crc.module_with(AARCH64, crc.ARMV8_CRC, instruction=instruction))


def _emulated(b, bits, value, data):
    """What CRC32X/W/H/B compute (the reflected polynomial, no inversions), bit by bit."""
    i64 = ir.IntType(64)
    x = b.xor(b.zext(value, i64), b.zext(data, i64) if data.type.width < 64 else data)
    for _ in range(bits):
        x = b.xor(b.lshr(x, i64(1)), b.and_(i64(0xEDB88320), b.neg(b.and_(x, i64(1)))))
    return b.trunc(x, ir.IntType(32))


def test_the_aarch64_tier_with_its_instruction_emulated_is_zlib():
    """The aarch64 tier's loop and tail, run here with the instruction emulated: zlib.crc32 at every length
    and alignment (the instruction's own result is ARMv8's definition)."""
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = crc.module_with(llvm.get_process_triple(), crc.ARMV8_CRC, instruction=_emulated)
    parsed = llvm.parse_assembly(str(module))
    engine = llvm.create_mcjit_compiler(parsed, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)(
        engine.get_function_address("rmqtool_crc32_armv8_crc"))
    data = np.random.default_rng(8).integers(0, 256, 4096, dtype=np.uint8)
    for at in ALIGNMENTS:
        got = [fn(data.ctypes.data + at, n) for n in LENGTHS]
        assert got == [zlib.crc32(data[at:at + n]) for n in LENGTHS], at


@pytest.mark.parametrize("tier", crc.X86, ids=lambda t: crc.NAMES[t])
def test_every_x86_tier_compiles_whatever_the_cpu(tier):
    """Every x86 tier is compiled into every x86 build (each function with its own target features), on a
    plain x86-64 target machine too: the 512-bit one uses the 512-bit registers."""
    triple = "x86_64-unknown-linux-gnu"
    asm = _assembly(crc.module_with(triple, tier), triple)
    register = {crc.PCLMULQDQ: "%xmm", crc.VPCLMULQDQ_256: "%ymm", crc.VPCLMULQDQ_512: "%zmm"}[tier]
    assert any("pclmulqdq" in line and register in line for line in asm.splitlines()), tier


def _lane_by_lane(b, x, k, imm, width):
    """A ``width``-bit VPCLMULQDQ as one 128-bit PCLMULQDQ per lane."""
    i32 = ir.IntType(32)
    parts = [crc._clmul(b, *(b.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, 2), [2 * i, 2 * i + 1]))
                             for v in (x, k)), imm, 128) for i in range(width // 128)]
    while len(parts) > 1:
        parts = [b.shuffle_vector(parts[i], parts[i + 1], ir.Constant(ir.VectorType(i32, 2 * parts[i].type.count),
                                                                     list(range(2 * parts[i].type.count))))
                 for i in range(0, len(parts), 2)]
    return parts[0]


@pytest.mark.parametrize("tier", crc.X86, ids=lambda t: crc.NAMES[t])
def test_every_x86_tier_with_its_wide_multiplication_emulated_is_zlib(tier):
    """Each x86 tier's folding (its accumulators, constants, lanes and tail), its wide multiplication done
    128 bits at a time and its code built for PCLMULQDQ only: zlib.crc32 at every length and alignment,
    here on any CPU with PCLMULQDQ (the 512-bit tier included, where the CPU has no AVX-512)."""
    import llvmlite.binding as llvm
    if crc.TIER not in crc.X86:
        pytest.skip("no PCLMULQDQ on this CPU")
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = crc.module_with(llvm.get_process_triple(), tier, wide_clmul=_lane_by_lane,
                             features=crc.FEATURES[crc.PCLMULQDQ])
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(module)),
                                        llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    name = f"rmqtool_crc32_{crc.NAMES[tier].replace('-', '_')}"
    fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)(engine.get_function_address(name))
    data = np.random.default_rng(9).integers(0, 256, 4096, dtype=np.uint8)
    for at in ALIGNMENTS:
        got = [fn(data.ctypes.data + at, n) for n in LENGTHS]
        assert got == [zlib.crc32(data[at:at + n]) for n in LENGTHS], at


def test_the_tiers_compile_and_run_for_a_generic_cpu(tmp_path):
    """With NUMBA_CPU_NAME=generic (machine code for any CPU of the architecture, numba's way to share a
    cache between machines) every tier this CPU runs compiles and gives zlib.crc32: the tier is an argument,
    each tier's function carries its own target features."""
    import os
    import subprocess
    import sys

    from conftest import ROOT
    probe = ("import zlib\nimport numba\nimport numpy as np\nfrom rmqtool.columnar import crc\n"
             "from rmqtool.columnar.kernel import words\n"
             "f = numba.njit(lambda d, d64, shift, p, n, t: crc.crc32(d, d64, shift, p, n, t))\n"
             "data = np.random.default_rng(3).integers(0, 256, 2048, dtype=np.uint8)\n"
             "for tier in crc.runnable():\n"
             "    for n in (0, 1, 15, 16, 17, 63, 64, 100, 255, 256, 257, 1000, 2047):\n"
             "        assert f(data, *words(data), 1, n, crc.argument(tier)) == zlib.crc32(data[1:1 + n]), (tier, n)\n"
             "print(len(crc.runnable()))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0 and proc.stdout.split() == [str(len(crc.runnable()))], proc.stderr[-2000:]
