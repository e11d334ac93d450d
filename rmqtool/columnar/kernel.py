"""The compiled scan kernel: one pass over a window of a mapped commit-log file (numba).

``scan_window`` walks the MESSAGE chain from a position and, for every record, in the same pass: checks the
magic code and that the lengths add up to TOTALSIZE inside the file (what ``decode_entry`` demands; the
first record that fails stops the window and ``decode_entry`` names the reason), gathers the fixed fields
into columns (an IPv4 host also as one int64: address and port), takes the body CRC (UtilAll.crc32: zlib's
CRC-32, top bit cleared; the best tier of ``crc`` this CPU has) when asked, and
parses PROPERTIES as the 4.9.1+ broker does (items split at \\x02, key and value at the first \\x01, both
non-empty; eight bytes a step): the value spans of the properties the tools read and, when asked, the span
of every item (for the ``properties`` map), the copies of body, topic and properties (properties parsed in
their copy) and the msgId text. What makes it run at memory speed: the records' cache lines are prefetched
ahead of the walk (the chain of records is a chain of dependent loads that otherwise waits for memory on
every header), fields are read as one unaligned big-endian load each, copies are memcpy, nothing is
allocated or grown in the loop (numba counts references on every such array), and the output buffers come
from Arrow's memory pool (which reuses freed pages; numpy's large allocations return to the system and fault
in again). ``gather_spans`` copies spans of the mapped file into one Arrow-ready buffer; ``split_spans``
splits them (KEYS); ``java_hashes`` hashes them (tagsCode).

Compiled code is cached on disk (numba's ``cache=True``), built once per install on first use (the scan
about 0.6 CPU seconds without copies, 0.9 with them: every function compiles for one set of argument types
only, so the kernel reads the mapped file and its own copies as read-only arrays of one type and no counter
starts as a literal 0; what a command does not ask for (the CRC, the copies) is passed as None and compiled
out; helpers are compiled without Python entry points or cache entries of their own, ``_helper``): under
``NUMBA_CACHE_DIR`` when set, else beside this module (``__pycache__``), else (a read-only install) in the
user's cache directory; where none is writable it is compiled in memory once per process (one line on
stderr says so). Entries are keyed on every source of this package and on rmqtool.constants (``_jit``).

The small-input path: numba is not imported until the first compiled call (``load_compiled``), and a process's
first ``SMALL_RECORDS`` records are scanned by the same functions run as plain Python (numpy scalars, the
intrinsics' Python forms, zlib's CRC): importing numba and loading the cached machine code costs ~0.5
CPU-s, more than plain Python spends on a few thousand records, and a first run on a small store compiles
nothing. The budget counts records scanned and consume-queue units walked (``spend``), and a scan whose
chain of records is longer than what is left of it loads the compiled code at once (``_chain_longer``):
on a large store the plain path would only add its ~0.1 ms a record to the load.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import math
import pkgutil
import sys

import zlib

import numpy as np

from rmqtool import constants as C

# llvmlite's and numba's modules, bound by ``load_compiled`` (the intrinsics' code generators use them)
ir = types = cgutils = None

# Rows of the per-record column block returned by the kernel (all int64).
FIELDS = ("start", "total", "v2", "body_crc", "queue_id", "flag", "queue_offset", "stored_physical_offset",
          "sys_flag", "born_timestamp", "born_host_pos", "store_timestamp", "store_host_pos", "reconsume_times",
          "prepared_transaction_offset", "body_pos", "body_len", "topic_pos", "topic_len", "props_pos",
          "props_len", "crc_ok", "items_end", "body_off", "topic_off", "props_off", "born_key",
          "store_key", "id_off", "props_high")      # props_high: scans without items only
_F = {name: i for i, name in enumerate(FIELDS)}
MIN_RECORD = C.FIXED_WITHOUT_HOSTS + 2 * C.IPV4_HOST_LEN + 1
_BORN_V6 = int(C.SysFlag.BORNHOST_V6)
_STORE_V6 = int(C.SysFlag.STOREHOSTADDRESS_V6)

# Properties whose value spans every scan returns (``Window.prop``): the columns' and those the bulk commands read.
PROPERTIES = (C.PROPERTY_TAGS, C.PROPERTY_KEYS, C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, C.PROPERTY_REAL_TOPIC,
              C.PROPERTY_REAL_QUEUE_ID, C.PROPERTY_INNER_NUM, C.PROPERTY_INNER_BASE,
              C.PROPERTY_INNER_MULTI_DISPATCH, C.PROPERTY_INNER_MULTI_QUEUE_OFFSET, C.PROPERTY_RETRY_TOPIC)
_NAME_BYTES = np.frombuffer(b"".join(n.encode() for n in PROPERTIES), np.uint8)
_NAME_OFF = np.cumsum([0] + [len(n) for n in PROPERTIES]).astype(np.int64)
_ID_ROOM = 2 * (C.IPV6_HOST_LEN + 8)    # msgId hex digits of a record at most (IPv6 store host and offset)


SMALL_RECORDS = 2000     # records a process scans as plain Python before it loads the compiled code
_PLAIN = [SMALL_RECORDS]    # the records left to the plain path; None once compiled code is loaded
_UNCACHED: list[str] = []
_SOURCES = ""


def spend(items: int) -> None:
    """Charge ``items`` (records scanned, consume-queue units walked) to the small-input path's budget:
    once it is spent, the next compiled function's call loads the compiled code (a large store's consume
    queues walked before any record would otherwise all run as plain Python)."""
    if _PLAIN[0]:
        _PLAIN[0] = max(_PLAIN[0] - items, 0)


def plain_path() -> bool:
    """Whether this process still scans as plain Python (a small input: its first SMALL_RECORDS records)."""
    return bool(_PLAIN[0])


class _Lazy:
    """A compiled function (or an intrinsic without a plain form) before numba is loaded: ``plain`` runs it
    in the interpreter (None: none), ``build()`` makes numba's object on the first compiled call."""

    __slots__ = ("plain", "build", "native")

    def __init__(self, plain, build):
        self.plain, self.build, self.native = plain, build, None

    def __call__(self, *args):
        if self.plain is not None and _PLAIN[0]:
            with np.errstate(over="ignore"):        # int64 arithmetic wraps, as in compiled code
                return self.plain(*args)
        if self.native is None:
            load_compiled()
            _built(self)            # held by a caller outside the modules load_compiled rebinds
        return self.native(*args)


# Helpers and intrinsics with a plain form are that form itself until numba is loaded (a call costs what a
# Python call does): id -> [plain form, build, numba's object]
_PLAIN_FORMS: dict[int, list] = {}


def load_compiled() -> None:
    """Import numba, build every lazy object of the columnar modules and bind their names to what numba made
    (compiled code finds its callees by name), and leave the plain path for good (work spread over worker
    processes: before they fork, so that each inherits the compiled code instead of loading it)."""
    global ir, types, cgutils, _SOURCES
    if _PLAIN[0] is None:
        return
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    _SOURCES = _sources_stamp()
    _PLAIN[0] = None
    package = __name__.rpartition(".")[0] + "."
    for module in [m for name, m in list(sys.modules.items()) if name.startswith(package)]:
        for name, value in list(vars(module).items()):
            if isinstance(value, _Lazy) or id(value) in _PLAIN_FORMS:
                setattr(module, name, _built(value))


def _built(lazy):
    """numba's object for a lazy object or plain form (anything else: itself)."""
    if isinstance(lazy, _Lazy):
        if lazy.native is None:
            lazy.native = lazy.build()
        return lazy.native
    entry = _PLAIN_FORMS.get(id(lazy))
    if entry is None or entry[0] is not lazy:
        return lazy
    if entry[2] is None:
        entry[2] = entry[1]()
    return entry[2]


def _lazy(plain, build, *, wrap: bool = False):
    """``build()`` now once compiled code is loaded; else ``plain`` itself (``wrap``: a ``_Lazy``, which
    Python callers call)."""
    if _PLAIN[0] is None:
        return build()
    if wrap or plain is None:
        return _Lazy(plain, build)
    _PLAIN_FORMS[id(plain)] = [plain, build, None]
    return plain


def _boxed(value):
    """A plain run's result as compiled code returns it: Python ints and bools, not numpy scalars."""
    if isinstance(value, tuple):
        return tuple(_boxed(v) for v in value)
    return value.item() if isinstance(value, np.generic) else value


def _jit(fn, *, plain: bool = True):
    """Compiled with numba, its machine code cached on disk; where numba finds no writable cache location
    (a read-only install, an unwritable home and no NUMBA_CACHE_DIR) it is compiled once per process, said
    in one line on stderr. Python calls it: no C-callable wrapper (only first-class function values need
    one; it costs ~1 ms of a first compile per array argument). ``plain``: it also runs as plain Python on
    the small-input path (False where its helpers have no plain form)."""
    def build():
        from numba import njit
        try:
            compiled = njit(cache=True, nogil=True, no_cfunc_wrapper=True)(fn)
        except RuntimeError:          # numba's "cannot cache function ...: no locator available"
            return _uncached(fn, "no writable cache directory for the compiled scan kernel (set NUMBA_CACHE_DIR "
                                 "to one)")
        # numba keys a cache entry on the source of the function's own file, but the machine code holds the
        # helpers and constants it calls from other files (this module's loads and hashes in facts.py,
        # units.py, joins.py, lines.py; crc.py's tiers in the scan; rmqtool.constants): the entry is keyed on
        # all of them too, so that a change to a helper alone (an upgrade, a checkout) recompiles its callers
        # instead of running their old code
        cache = compiled._cache
        index = getattr(cache, "_cache_file", None)         # numba.core.caching.IndexDataCacheFile
        if not hasattr(index, "_source_stamp"):             # a numba whose cache rmqtool cannot key so
            return _uncached(fn, f"numba {_numba_version()} keeps its cache in a way this rmqtool does not know")
        index._source_stamp = (index._source_stamp, _SOURCES)
        if all(hasattr(cache, name) for name in ("_load_overload", "_guard_against_spurious_io_errors")):
            cache.load_overload = _load_overload.__get__(cache)
        return compiled
    return _lazy((lambda *args: _boxed(fn(*args))) if plain else None, build, wrap=True)


def _uncached(fn, why: str):
    """``fn`` compiled for this process only (said once, on stderr)."""
    from numba import njit
    if not _UNCACHED:
        _UNCACHED.append(fn.__name__)
        sys.stderr.write(f"rmqtool: note: {why}: compiling it for this run only (a few seconds)\n")
    return njit(nogil=True, no_cfunc_wrapper=True)(fn)


def _numba_version() -> str:
    import numba
    return numba.__version__


def _load_overload(cache, sig, target_context):
    """numba's ``Cache.load_overload`` without its ``target_context.refresh()``: loading machine code needs the
    runtime (NRT) only, not the typing and lowering registries the refresh installs (~0.2 CPU-s, most of
    what loading cached code costs a process); a miss compiles, and compiling refreshes the contexts itself
    (``compiler.compile_extra``)."""
    from numba.core.runtime import rtsys
    rtsys.initialize(target_context)
    with cache._guard_against_spurious_io_errors():
        return cache._load_overload(sig, target_context)


def _sources_stamp() -> str:
    """A hash of this package's sources and rmqtool.constants (read through their loaders: a zip works too)."""
    package = __name__.rpartition(".")[0]
    names = sorted(f"{package}.{m.name}" for m in pkgutil.iter_modules(sys.modules[package].__path__))
    h = hashlib.sha256()
    for name in names + [C.__name__]:
        h.update((importlib.util.find_spec(name).loader.get_source(name) or "").encode())
    return h.hexdigest()


def _helper(fn):
    """A function only compiled code calls: compiled without the entry points Python calls and without a
    cache entry of its own (its callers' cached code holds it), about half of what numba spends on a small
    function. On the plain path it is the function itself."""
    def build():
        from numba import njit
        return njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)(fn)
    return _lazy(fn, build)


def _intrinsic(plain):
    """An intrinsic (the typer and code generator it decorates), ``plain`` its Python form (None: none)."""
    def wrap(fn):
        def build():
            from numba.extending import intrinsic
            return intrinsic(fn)
        return _lazy(plain, build)
    return wrap


_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8).copy()


def _load(bits: int, swap: bool):
    """An unaligned load of an int of ``bits`` at d[p] (d: a byte array), big-endian when ``swap``: one
    instruction where assembling bytes takes a dozen."""
    size, order = bits // 8, "big" if swap else "little"

    @_intrinsic(lambda d, p: np.int64(int.from_bytes(d[p:p + size].tobytes(), order, signed=True)))
    def load(typingctx, arr, idx):
        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ity = ir.IntType(bits)
            v = builder.load(builder.bitcast(builder.gep(ary.data, [args[1]]), ity.as_pointer()), align=1)
            if swap:
                fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ity, [ity]), f"llvm.bswap.i{bits}")
                v = builder.call(fn, [v])
            return v
        return getattr(types, f"int{bits}")(arr, idx), codegen
    return load


_be32, _be64, _le64 = _load(32, True), _load(64, True), _load(64, False)


def _st64_plain(arr, idx, value):
    arr[idx:idx + 8] = np.frombuffer(int(value).to_bytes(8, "little"), np.uint8)


@_intrinsic(_st64_plain)
def _st64(typingctx, arr, idx, value):
    """An unaligned store of a uint64 at arr[idx] (arr: a byte array)."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i64 = ir.IntType(64)
        builder.store(args[2], builder.bitcast(builder.gep(ary.data, [args[1]]), i64.as_pointer()), align=1)
        return context.get_dummy_value()
    return types.void(arr, idx, types.uint64), codegen


def _st64be_plain(arr, idx, value):
    arr[idx:idx + 8] = np.frombuffer(int(value).to_bytes(8, "big"), np.uint8)


@_intrinsic(_st64be_plain)
def _st64be(typingctx, arr, idx, value):
    """An unaligned big-endian store of a uint64 at arr[idx] (arr: a byte array)."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64]), "llvm.bswap.i64")
        builder.store(builder.call(fn, [args[2]]), builder.bitcast(builder.gep(ary.data, [args[1]]), i64.as_pointer()),
                      align=1)
        return context.get_dummy_value()
    return types.void(arr, idx, types.uint64), codegen


@_intrinsic(lambda arr, idx: None)
def _prefetch(typingctx, arr, idx):
    """Ask the CPU to fetch the cache line of arr[idx] (llvm.prefetch). The chain of records is a chain of
    dependent loads: without it every record header waits for memory."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(builder.gep(ary.data, [args[1]]), i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return types.void(arr, idx), codegen


def _memcpy_plain(src, a, n, dst, o):
    dst[o:o + n] = src[a:a + n]


@_intrinsic(_memcpy_plain)
def _memcpy(typingctx, src, a, n, dst, o):
    """dst[o:o+n] = src[a:a+n] (byte arrays, no overlap) as one llvm.memcpy."""
    def codegen(context, builder, signature, args):
        s = context.make_array(signature.args[0])(context, builder, args[0])
        d = context.make_array(signature.args[3])(context, builder, args[3])
        cgutils.raw_memcpy(builder, builder.gep(d.data, [args[4]]), builder.gep(s.data, [args[1]]), args[2], 1)
        return context.get_dummy_value()
    return types.void(src, a, n, dst, o), codegen


@_intrinsic(lambda x: np.uint64((int(x) & -int(x)).bit_length() - 1))
def _ctz(typingctx, x):
    """Trailing zero bits of a non-zero uint64."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, ir.IntType(1)]), "llvm.cttz.i64")
        return builder.call(fn, [args[0], ir.IntType(1)(1)])
    return types.uint64(x), codegen


@_helper
def _i32(d, p):
    return np.int64(_be32(d, p))


@_helper
def _i64(d, p):
    return np.int64(_be64(d, p))


def _crc32_compiled():
    from rmqtool.columnar import crc        # llvmlite's tiers: loaded with the compiled code
    return crc.crc32


# The body CRC of d[p:p+n]: zlib's on the small-input path, else ``crc.crc32`` (the tier ``t``: _crc_argument)
_crc32 = _lazy(lambda d, d64, shift, p, n, t: np.int64(zlib.crc32(d[p:p + n])), _crc32_compiled)


def _crc_argument():
    """The scan's ``t`` for a CRC: ``crc.ARGUMENT`` (this CPU's tier, a run-time argument: the cached machine
    code holds every tier) once compiled code is loaded; zlib on the small-input path takes none."""
    if _PLAIN[0]:
        return ()
    from rmqtool.columnar import crc
    return crc.ARGUMENT


@_jit
def _scan(d, d64, shift, pos, limit, gap, t, names, name_off, cols, props, items, bodies, topics, properties, parsed,
          ids):
    """(n, next, bad, full, body_used, topic_used, props_used, ids_used): see ``scan_window``, into the
    caller's buffers (``full``: the window stopped where they are full); ``t``: ``_crc_argument()``, None for
    no CRC; with ``items`` (else None, and the buffers after it too) bodies, topics and properties are copied
    while the record is in cache, each kind one after another into its buffer (at body_off, topic_off,
    props_off), and the msgId texts into ``ids`` (at id_off). No array is made or grown in the loop (that
    costs reference counting on every record). A None argument compiles its part out (numba drops a branch
    on ``argument is None`` before typing): a command compiles only the variant it runs."""
    size = len(d)
    m1 = np.int64(C.MESSAGE_MAGIC_CODE) - (np.int64(1) << 32)
    m2 = np.int64(C.MESSAGE_MAGIC_CODE_V2) - (np.int64(1) << 32)
    zero = np.int64(0)               # not the literal 0: helpers would compile once more for Literal[int](0)
    body_used = topic_used = props_used = ids_used = m = n = zero
    bad = -1
    full = False
    ahead = pos
    while pos < limit:
        p = pos + gap
        if p + 8 > size:
            break
        while ahead < p + 2048 and ahead < size:
            _prefetch(d, ahead)
            ahead += 64
        magic = _i32(d, p + 4)
        if magic != m1 and magic != m2:
            break
        total = _i32(d, p)
        end = p + total
        if total < MIN_RECORD or end > size:
            bad = p
            break
        sys_flag = _i32(d, p + 36)
        born_len = C.IPV6_HOST_LEN if sys_flag & _BORN_V6 else C.IPV4_HOST_LEN
        store_len = C.IPV6_HOST_LEN if sys_flag & _STORE_V6 else C.IPV4_HOST_LEN
        q = p + C.BORNHOST_POS + born_len
        if q + 8 + store_len + 16 > end:
            bad = p
            break
        store_ts = _i64(d, q)
        store_host = q + 8
        q = store_host + store_len
        body_len = _i32(d, q + 12)
        body_pos = q + 16
        q = body_pos + body_len
        v2 = magic == m2
        if body_len < 0 or q + 1 + v2 > end:
            bad = p
            break
        if v2:
            topic_len = (np.int64(d[q]) << 8) | np.int64(d[q + 1])
            topic_len = topic_len - 65536 if topic_len >= 32768 else topic_len
        else:
            topic_len = np.int64(d[q])
            topic_len = topic_len - 256 if topic_len >= 128 else topic_len
        topic_pos = q + 1 + v2
        q = topic_pos + topic_len
        if topic_len < 0 or q + 2 > end:
            bad = p
            break
        props_len = (np.int64(d[q]) << 8) | np.int64(d[q + 1])
        props_pos = q + 2
        if props_len >= 32768 or props_pos + props_len != end:
            bad = p
            break
        if n == cols.shape[1] or items is not None and (
                m + props_len // 2 + 1 > items.shape[1] or ids_used + 2 * (store_len + 8) > len(ids)
                or body_used + body_len > len(bodies) or topic_used + topic_len > len(topics)
                or props_used + props_len > len(properties)):
            full = True
            break
        for j in range(props.shape[1]):
            props[n, j] = -1
        cols[0, n] = p
        cols[1, n] = total
        cols[2, n] = v2
        cols[3, n] = _i32(d, p + 8)
        cols[4, n] = _i32(d, p + 12)
        cols[5, n] = _i32(d, p + 16)
        cols[6, n] = _i64(d, p + 20)
        cols[7, n] = _i64(d, p + 28)
        cols[8, n] = sys_flag
        cols[9, n] = _i64(d, p + 40)
        cols[10, n] = p + C.BORNHOST_POS
        cols[11, n] = store_ts
        cols[12, n] = store_host
        cols[13, n] = _i32(d, store_host + store_len)
        cols[14, n] = _i64(d, store_host + store_len + 4)
        cols[15, n] = body_pos
        cols[16, n] = body_len
        cols[17, n] = topic_pos
        cols[18, n] = topic_len
        cols[19, n] = props_pos
        cols[20, n] = props_len
        # an empty body is not checked (CommitLog.checkMessageAndReturnSize: CRC inside bodyLen > 0)
        cols[21, n] = body_len == 0 or (_crc32(d, d64, shift, body_pos, body_len, t) & 0x7FFFFFFF) == cols[3, n] \
            if t is not None else 1
        cols[26, n] = _i64(d, p + C.BORNHOST_POS)          # an IPv4 host's address and port
        cols[27, n] = _i64(d, store_host)
        if items is not None:
            cols[28, n] = ids_used
            ids_used = _msg_id(d, store_host, store_len, cols[7, n], ids, ids_used)
            cols[23, n] = body_used
            body_used = _copy(d, body_pos, body_len, bodies, body_used)
            cols[24, n] = topic_used
            topic_used = _copy(d, topic_pos, topic_len, topics, topic_used)
            cols[25, n] = props_used
            props_used = _copy(d, props_pos, props_len, properties, props_used)
            # parsed in the copy (in cache; spans in the copies, which later gathers read in order)
            m = _properties(parsed, props_used - props_len, props_used, props, n, items, m, names, name_off)
        else:
            m = _properties(d, props_pos, end, props, n, items, m, names, name_off)
            cols[29, n] = _high(d, props_pos, end)       # while in cache: is the text ASCII (decode_columns)
        cols[22, n] = m
        n += 1
        pos = end
    return n, pos, bad, full, body_used, topic_used, props_used, ids_used


@_helper
def _copy(d, a, n, out, o):
    """d[a:a+n] into out at o; returns o + n."""
    _memcpy(d, a, n, out, o)
    return o + n


@_helper
def _high(d, a, e):
    """1 where a byte of d[a:e] is 0x80 or above (not ASCII), else 0; eight bytes a step."""
    while a + 8 <= e:
        if np.uint64(_le64(d, a)) & _HIGH:
            return 1
        a += 8
    while a < e:
        if d[a] >= 128:
            return 1
        a += 1
    return 0


_U4, _U7, _U8, _U16, _U32 = (np.uint64(k) for k in (4, 7, 8, 16, 32))
_LOW16, _HIGH16, _LOW32 = np.uint64(0xFFFF), np.uint64(0xFFFF0000), np.uint64(0xFFFFFFFF)
_B1, _B0 = np.uint64(0x0000FF000000FF00), np.uint64(0x000000FF000000FF)
_N1, _N0 = np.uint64(0x00F000F000F000F0), np.uint64(0x000F000F000F000F)
_SIX, _ONES, _ZEROS = np.uint64(0x0606060606060606), np.uint64(0x0101010101010101), np.uint64(0x3030303030303030)


@_helper
def _hex8(v):
    """The 8 upper-case hex digits of the 32-bit ``v`` as the bytes of a uint64, the last digit in its lowest
    byte (stored big-endian, they read in order): the nibbles spread one to a byte, then made digits or
    letters without a branch."""
    x = ((v & _HIGH16) << _U16) | (v & _LOW16)
    x = ((x & _B1) << _U8) | (x & _B0)
    x = ((x & _N1) << _U4) | (x & _N0)
    return x + _ZEROS + (((x + _SIX) >> _U4) & _ONES) * _U7


@_helper
def _msg_id(d, host, host_len, offset, out, o):
    """Write the offsetMsgId text (MessageDecoder.createMessageId: store address and port, then the
    stored PHYSICALOFFSET, as upper-case hex) at out[o:]; returns the end. Eight digits a store."""
    if host_len == C.IPV4_HOST_LEN:               # address and port: one 8-byte load
        v = np.uint64(_be64(d, host))
        _st64be(out, o, _hex8(v >> _U32))
        _st64be(out, o + 8, _hex8(v & _LOW32))
        o += 16
    else:
        for j in range(host_len):
            b = d[host + j]
            out[o] = _HEX[b >> 4]
            out[o + 1] = _HEX[b & 15]
            o += 2
    v = np.uint64(offset)
    _st64be(out, o, _hex8(v >> _U32))
    _st64be(out, o + 8, _hex8(v & _LOW32))
    return o + 16


@_helper
def _same(d, a, e, b, n):
    """Whether d[a:a+n] == e[b:b+n] (eight bytes a step)."""
    i = 0
    while i + 8 <= n:
        if _le64(d, a + i) != _le64(e, b + i):
            return False
        i += 8
    while i < n:
        if d[a + i] != e[b + i]:
            return False
        i += 1
    return True


_LOW = np.uint64(0x0101010101010101)
_HIGH = np.uint64(0x8080808080808080)
_THREE = np.uint64(0x0303030303030303)
_TWO = np.uint64(0x0202020202020202)
_TWO_ONLY, _BELOW_3 = np.bool_(True), np.bool_(False)      # typed globals, not literals: _find compiles once


@_helper
def _find(d, a, end, two_only):
    """The first position in d[a:end] of a byte \\x02 (``two_only``) or one below 3, else ``end``: eight bytes
    a step (the lowest flagged byte of the SWAR test is exact)."""
    while a + 8 <= end:
        w = np.uint64(_le64(d, a))
        if two_only:
            w ^= _TWO
            hit = (w - _LOW) & ~w & _HIGH
        else:
            hit = (w - _THREE) & ~w & _HIGH
        if hit:
            return a + np.int64(_ctz(hit) >> np.uint64(3))
        a += 8
    while a < end:
        if d[a] == 2 or (d[a] < 3 and not two_only):
            return a
        a += 1
    return end


@_helper
def _properties(d, a, end, props, row, items, m, names, name_off):
    """Parse the PROPERTIES in d[a:end] as the 4.9.1+ broker does (items between \\x02; key and value at
    the first \\x01, both non-empty): the value span of each name in ``names`` into ``props[row]`` (start,
    end per name; the last one of a repeated key, as a dict keeps), and with ``items`` (else None) each
    item's (key start, \\x01, end) appended to ``items`` at ``m`` (room for all made by the caller); a
    repeated key keeps its first place and takes its last value, as a dict does (4.9.7's batch messages
    repeat WAIT). Returns the new m."""
    k = len(name_off) - 1
    first_item = m
    while a < end:
        b = _find(d, a, end, _BELOW_3)
        while b < end and d[b] == 0:
            b = _find(d, b + 1, end, _BELOW_3)
        cut = -1
        if b < end and d[b] == 1:
            cut = b
            b = _find(d, b + 1, end, _TWO_ONLY)
        if cut > a and cut < b - 1:
            klen = cut - a
            for j in range(k):
                s = name_off[j]
                if name_off[j + 1] - s == klen and d[a] == names[s] and _same(d, a, names, s, klen):
                    props[row, 2 * j] = cut + 1
                    props[row, 2 * j + 1] = b
                    break
            if items is not None:
                i = first_item
                while i < m and not (items[1, i] - items[0, i] == klen and _same(d, items[0, i], d, a, klen)):
                    i += 1
                items[0, i] = a
                items[1, i] = cut
                items[2, i] = b
                if i == m:
                    m += 1
        a = b + 1
    return m


@_jit
def _span_offsets(starts, ends, offsets):
    """Offsets of the spans starts[i]:ends[i] one after another (a negative start: empty); returns the total
    (one compiled pass: numpy's where and cumsum took ~0.09 CPU-s more per GiB in temporaries)."""
    total = 0
    offsets[0] = 0
    for i in range(len(starts)):
        if starts[i] >= 0:
            total += ends[i] - starts[i]
        offsets[i + 1] = total
    return total


@_jit
def _span_copy(d, starts, ends, out):
    """The spans one after another into ``out`` (32 bytes longer than they need): a span of up to 32 bytes
    (property keys and values, KEYS parts) as four 8-byte moves where the data has 32 bytes from its start,
    whatever its length (no branch to mispredict): twice the rate of a memcpy call per span. (Inline: a call
    that passes arrays counts references on them, which costs more than the moves.)"""
    o = np.int64(0)
    for i in range(len(starts)):
        a = starts[i]
        if a >= 0:
            n = ends[i] - a
            if n <= 32 and a + 32 <= len(d):
                for j in range(0, 32, 8):
                    _st64(out, o + j, np.uint64(_le64(d, a + j)))
                o += n
            else:
                o = _copy(d, a, n, out, o)


def gather_spans(d: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 offsets, bytes): the spans d[starts[i]:ends[i]] one after another (a negative start: empty)."""
    d, starts, ends = read_only(d), np.ascontiguousarray(starts), np.ascontiguousarray(ends)    # one compiled type
    offsets = _pooled((len(starts) + 1,), np.int32)
    total = _span_offsets(starts, ends, offsets)
    out = _pooled((total + 32,), np.uint8)
    _span_copy(d, starts, ends, out)
    return offsets, out[:total]


@_jit
def _split(d, starts, ends, sep, lists, part_starts, part_ends):
    """Each span (a negative start: none) split at ``sep`` bytes, empty parts dropped: the parts' spans into
    ``part_starts``/``part_ends``, each span's running count of parts into ``lists`` (n + 1). Returns the
    number of parts. The next ``sep`` is searched eight bytes a step (the lowest flagged byte of the SWAR
    test is exact)."""
    pattern = np.uint64(sep) * _LOW
    k = np.int64(0)
    lists[0] = 0
    for i in range(len(starts)):
        j = starts[i]
        e = ends[i] if j >= 0 else j
        while j < e:
            b = j
            while j + 8 <= e:
                w = np.uint64(_le64(d, j)) ^ pattern
                hit = (w - _LOW) & ~w & _HIGH
                if hit:
                    j += np.int64(_ctz(hit) >> np.uint64(3))
                    break
                j += 8
            else:                       # fewer than 8 bytes left and no sep among the words before
                while j < e and d[j] != sep:
                    j += 1
            if j > b:
                part_starts[k], part_ends[k] = b, j
                k += 1
            j += 1
        lists[i + 1] = k
    return k


def split_spans(d: np.ndarray, starts: np.ndarray, ends: np.ndarray, sep: int):
    """(list offsets n + 1, part offsets, bytes): each span split at ``sep``, empty parts dropped."""
    d, starts, ends = read_only(d), np.ascontiguousarray(starts), np.ascontiguousarray(ends)    # one compiled type
    room = int(np.where(starts >= 0, ends - starts, 0).sum()) // 2 + len(starts) + 1
    lists = _pooled((len(starts) + 1,), np.int32)
    part_starts, part_ends = _pooled((room,), np.int64), _pooled((room,), np.int64)
    parts = _split(d, starts, ends, sep, lists, part_starts, part_ends)
    return (lists, *gather_spans(d, part_starts[:parts], part_ends[:parts]))


_M32 = 0xFFFFFFFF
_HASH_SEED = np.int64(0)     # a typed global, not a literal: text_hash compiles once
_HIGH_BITS = np.int64(0x8080808080808080 - (1 << 64))     # the top bit of each byte of a word
_P31_8 = np.int64(31 ** 8 & _M32)


@_helper
def text_hash(d, a, b, h):
    """String.hashCode continued from ``h`` over the UTF-8 text d[a:b] as Java holds it (UTF-16 code units,
    a code point above U+FFFF as its surrogate pair; unsigned 32-bit); -1 where d[a:b] is not valid UTF-8
    (as Python's decoder judges it: no overlong forms, surrogates or code points above U+10FFFF). ASCII
    eight bytes a step (one load: 31^8 h + 31^7 c0 + ...: a shorter chain of multiplies), then four."""
    while a < b:
        if a + 8 <= b:
            w = _le64(d, a)
            if w & _HIGH_BITS == 0:
                h = (h * _P31_8 + (w & 0xFF) * 27512614111 + (w >> 8 & 0xFF) * 887503681
                     + (w >> 16 & 0xFF) * 28629151 + (w >> 24 & 0xFF) * 923521 + (w >> 32 & 0xFF) * 29791
                     + (w >> 40 & 0xFF) * 961 + (w >> 48 & 0xFF) * 31 + (w >> 56)) & _M32
                a += 8
                continue
        if a + 4 <= b:
            c0, c1, c2, c3 = np.int64(d[a]), np.int64(d[a + 1]), np.int64(d[a + 2]), np.int64(d[a + 3])
            if (c0 | c1 | c2 | c3) < 128:
                h = (h * 923521 + c0 * 29791 + c1 * 961 + c2 * 31 + c3) & _M32
                a += 4
                continue
        c = np.int64(d[a])
        if c < 0x80:
            h = (h * 31 + c) & _M32
            a += 1
            continue
        n = 1 if c < 0xE0 else 2 if c < 0xF0 else 3
        if c < 0xC2 or c > 0xF4 or a + n >= b:
            return -1
        lo, hi = 0x80, 0xBF                     # the second byte's range (RFC 3629 table)
        if c == 0xE0:
            lo = 0xA0
        elif c == 0xED:
            hi = 0x9F
        elif c == 0xF0:
            lo = 0x90
        elif c == 0xF4:
            hi = 0x8F
        cp = c & (0x1F if n == 1 else 0x0F if n == 2 else 0x07)
        for j in range(1, n + 1):
            x = np.int64(d[a + j])
            if x < (lo if j == 1 else 0x80) or x > (hi if j == 1 else 0xBF):
                return -1
            cp = cp << 6 | (x & 0x3F)
        a += n + 1
        if cp >= 0x10000:
            cp -= 0x10000
            h = (h * 31 + 0xD800 + (cp >> 10)) & _M32
            cp = 0xDC00 + (cp & 0x3FF)
        h = (h * 31 + cp) & _M32
    return h


@_jit
def java_hashes(d, starts, ends, out):
    """java.lang.String.hashCode of the UTF-8 text of each span (valid UTF-8; a negative start: 0) into
    ``out`` (``text_hash``, signed)."""
    for i in range(len(starts)):
        h = text_hash(d, starts[i], ends[i], _HASH_SEED) if starts[i] >= 0 else _HASH_SEED
        out[i] = h - (np.int64(1) << 32) if h >= (np.int64(1) << 31) else h


def prop_column(name: str) -> int:
    """The column of ``Window.props`` holding property ``name``'s value starts (its ends: the next one)."""
    return 2 * PROPERTIES.index(name)


class Window:
    """The records of one window that decode (``n``), column by column: ``window["queue_id"]``, ...;
    ``next``: where the chain stopped; ``bad``: the start of the first record that does not decode, or -1.
    Property items of the records: ``items[:, item_base:window["items_end"][-1]]``; with them ``ids``: the
    records' msgId texts one after another (each at ``id_off``)."""

    __slots__ = ("cols", "props", "items", "heap", "ids", "item_base", "n", "next", "bad")

    def __init__(self, cols, props, items, heap, n, nxt, bad, item_base=0, ids=None):
        self.cols, self.props, self.items, self.heap, self.n, self.next, self.bad = cols, props, items, heap, n, nxt, bad
        self.item_base, self.ids = item_base, ids

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[_F[name], :self.n]

    @property
    def starts(self) -> np.ndarray:
        return self["start"]

    def prop(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(value starts, value ends) of property ``name`` per record, -1 where absent; positions in
        ``heap[2]`` when the window holds copies, else in the scanned data."""
        j = prop_column(name)
        return self.props[:self.n, j], self.props[:self.n, j + 1]

    def item_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """(items: key start, \\x01, end per property item of these records, in the positions of ``prop``;
        each record's number of items)."""
        ends = self["items_end"]
        counts = np.diff(ends, prepend=self.item_base)
        return self.items[:, self.item_base:self.item_base + int(counts.sum())], counts

    def slice(self, lo: int, hi: int) -> "Window":
        """Records lo..hi-1."""
        base = int(self.cols[_F["items_end"], lo - 1]) if lo else self.item_base
        return Window(self.cols[:, lo:hi], self.props[lo:hi], self.items, self.heap, hi - lo, self.next, self.bad,
                      base, self.ids)

    def head(self, count: int) -> "Window":
        return self.slice(0, count)


def words(data: np.ndarray) -> tuple[np.ndarray, int]:
    """(words, shift): ``data[shift:]`` viewed as aligned little-endian uint64 words (the CRC's reads)."""
    shift = -data.ctypes.data % 8 if len(data) else 0
    return data[shift:shift + (max(len(data) - shift, 0) & ~7)].view("<u8"), shift


def read_only(a: np.ndarray) -> np.ndarray:
    """``a`` read-only (typed as the mapped file is: numba compiles a function once per array type)."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


def _pooled(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised array in Arrow's memory pool: the pool keeps freed memory for the next window, where
    numpy's large allocations go back to the system and fault their pages in again (a third of a scan).
    The small-input path's are numpy's (its few records do not need the pool, nor pyarrow its import)."""
    if _PLAIN[0]:
        return np.empty(shape, dtype)
    import pyarrow as pa
    count = math.prod(shape)
    out = np.frombuffer(pa.allocate_buffer(max(count * dtype().itemsize, 8)), dtype, count)
    return out.reshape(shape) if len(shape) > 1 else out


def _reused(scratch: dict | None, key: str, shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised int64 array of ``shape``: over ``scratch[key]``'s buffer where it is large enough
    (else a new one kept there), or a new one without ``scratch``."""
    if scratch is None:
        return _pooled(shape, np.int64)
    count = math.prod(shape)
    buf = scratch.get(key)
    if buf is None or len(buf) < count:
        buf = scratch[key] = _pooled((count,), np.int64)
    return buf[:count].reshape(shape)


_LOADED: list[bool] = []


def loaded(fn, *args):
    """``fn(*args)`` (a compiled function), the process's first such call with the cyclic collector off:
    numba's first load of compiled code builds its typing and target registries (~60,000 long-lived
    objects, ~0.1 CPU-s), during which the collector would walk all of the process's objects several
    times (~0.03 CPU-s; one young collection follows instead)."""
    if _LOADED or not gc.isenabled():
        return fn(*args)
    gc.disable()
    try:
        return fn(*args)
    finally:
        gc.enable()
        _LOADED.append(True)


def _chain_longer(data: np.ndarray, pos: int, gap: int, count: int) -> bool:
    """Whether the chain of record sizes from ``pos`` (each record ``gap`` bytes after the previous one's end)
    holds more than ``count`` records: a walk of their TOTALSIZE fields alone (a few microseconds a record,
    where the plain path takes ~0.1 ms)."""
    size = len(data)
    for _ in range(count + 1):
        p = pos + gap
        if p + 4 > size:
            return False
        total = int.from_bytes(data[p:p + 4].tobytes(), "big", signed=True)
        if total <= 0:
            return False
        pos = p + total
    return True


def scan_window(data: np.ndarray, pos: int, limit: int, gap: int = 0, *, check_crc: bool = False,
                items: bool = False, data64: tuple[np.ndarray, int] | None = None, scratch: dict | None = None
                ) -> Window:
    """The MESSAGE chain that begins at ``pos`` + ``gap``, for records starting before ``limit`` + ``gap``.

    ``gap``: bytes in front of every record (a DLedger entry header: 48; 0 for a plain commit log), so
    ``next`` is the end of the last record (the next entry's position). ``check_crc`` fills ``crc_ok``;
    ``items`` the spans of every property item (``Window.items``: key start, \\x01, item end; row
    ``items_end`` is each record's end in it) and the copies of bodies, topics and properties
    (``Window.heap``: three buffers, each record's at ``body_off``, ``topic_off``, ``props_off``) and the
    msgId texts (``Window.ids``, at ``id_off``). ``data64``: ``words(data)``, computed once per file.
    ``scratch``: a dict the caller keeps from window to window, whose buffers hold the field table, the
    property spans and the items of the next window too (the caller copies out what it keeps before the
    next scan): fresh ones for each window are pages the system zeroes again, ~0.1 CPU-s per GiB.
    """
    d64, shift = words(data) if data64 is None else data64
    data, d64 = read_only(data), read_only(d64)    # one compiled kernel, whatever the caller's arrays
    limit = min(limit, len(data))        # no record starts past the data: columns sized to what can be there
    span = max(limit - pos, 0)
    if _PLAIN[0] and _chain_longer(data, pos, gap, _PLAIN[0]):
        load_compiled()                # a large input: the plain path's records would be spent for nothing
    while True:
        cap = span // (MIN_RECORD + gap) + 2
        plain = _PLAIN[0]
        if plain:
            cap = min(cap, plain)   # the plain path's share: the caller goes on from ``next``
        cols = _reused(scratch, "cols", (len(FIELDS), cap))
        props = _reused(scratch, "props", (cap, 2 * len(PROPERTIES)))
        its = bodies = topics = properties = parsed = ids = None
        if items:
            heap = span + 4096
            its, ids = _reused(scratch, "items", (3, heap // 4)), _pooled((cap * _ID_ROOM,), np.uint8)
            bodies, topics, properties = (_pooled((heap,), np.uint8) for _ in range(3))
            parsed = read_only(properties)
        n, nxt, bad, full, body_used, topic_used, props_used, ids_used = loaded(
            _scan, data, d64, shift, pos, limit, gap, _crc_argument() if check_crc else None, _NAME_BYTES, _NAME_OFF,
            cols, props, its, bodies, topics, properties, parsed, ids)
        spend(n)
        if n or not full:
            break
        span = len(data) - pos             # one record larger than the window: room for the rest of the data
    if not items:
        return Window(cols, props, None, (), n, nxt, bad)
    return Window(cols, props, its, (bodies[:body_used], topics[:topic_used], properties[:props_used]), n, nxt, bad,
                  ids=ids[:ids_used])
