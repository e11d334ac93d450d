"""Benchmark of the body CRC's tiers (rmqtool.columnar.crc), per record, from memory and in cache (not a
pytest test).

    python tests/bench/bench_crc.py [--mb 512] [--sizes 64 256 1024 4096] [--repeat 3]

Bodies of one size each, one after another with a 100-byte gap (a record's header: the CRC reads them as
the scan does), over --mb MB of random bytes (far more than the last-level cache: "from memory") and over
1 MB read again and again ("in cache"); each tier this CPU runs, called per body from compiled code. The
yardstick is zlib.crc32 over the whole buffer in one call. GB/s = 10^9 body bytes per CPU second of the
measuring thread (robust when other jobs share the cores); the fastest of --repeat runs counts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rmqtool.columnar import crc  # noqa: E402
from rmqtool.columnar.kernel import words  # noqa: E402

GAP = 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=512, help="MB of bodies read from memory")
    ap.add_argument("--sizes", type=int, nargs="*", default=[64, 256, 1024, 4096], help="body sizes (bytes)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measure; the fastest counts")
    args = ap.parse_args()

    import numba

    @numba.njit(nogil=True)
    def run(d, d64, shift, starts, size, t):
        s = 0
        for p in starts:
            s ^= crc.crc32(d, d64, shift, p, size, t)
        return s

    data = np.random.default_rng(1).integers(0, 256, args.mb * 10**6, dtype=np.uint8)
    d64, shift = words(data)
    hot = data[:10**6]
    hot64 = words(hot)

    def best(fn) -> float:
        times = []
        for _ in range(args.repeat):
            started = time.thread_time()
            fn()
            times.append(time.thread_time() - started)
        return min(times)

    yard = len(data) / best(lambda: zlib.crc32(data)) / 1e9
    print(f"CPU: {_cpu_name()}; load average {os.getloadavg()[0]:.1f}; host tier: {crc.NAMES[crc.TIER]}")
    print(f"zlib.crc32 over {args.mb} MB in one call: {yard:.2f} GB/s")
    print(f"{'tier':<16}{'body B':>8}{'memory GB/s':>13}{'cache GB/s':>12}{'x zlib':>8}")
    for tier in crc.runnable():
        t = crc.argument(tier)
        for size in args.sizes:
            starts = np.arange(GAP, len(data) - size, size + GAP, dtype=np.int64)
            hot_starts = np.arange(GAP, len(hot) - size, size + GAP, dtype=np.int64)
            assert run(data[:4096], *words(data[:4096]), starts[:1], size, t) == zlib.crc32(data[GAP:GAP + size])
            rounds = max(1, len(data) // len(hot))
            memory = len(starts) * size / best(lambda: run(data, d64, shift, starts, size, t)) / 1e9
            cache = rounds * len(hot_starts) * size / best(
                lambda: [run(hot, *hot64, hot_starts, size, t) for _ in range(rounds)]) / 1e9
            print(f"{crc.NAMES[tier]:<16}{size:>8}{memory:>13.2f}{cache:>12.2f}{memory / yard:>8.2f}")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
