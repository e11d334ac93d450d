"""First run after an install: CPU seconds of whole commands with an empty compiled-code cache (not a
pytest test).

    python tests/bench/bench_first_compile.py [--store DIR] [--repeat 3] [--only verify,cat_jsonl]

Each command runs ``--repeat`` times in its own process, each time with a fresh empty NUMBA_CACHE_DIR
(numba compiles every function the command uses), and once more with the cache the last run left (the
cached start); the table gives the median user + sys CPU seconds of the first runs (robust when other
jobs share the cores), the cached run's, and their difference (what compiling costs). Without --store
the 4.9.7 sample store of the test fixtures is used (its files are only read): its 161 records take the
kernel's plain-Python path and compile nothing; the compiled path's first run needs a store of more than
2,000 records (``rmqtool generate DIR --size 8M --file-size 8M``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = 3.0        # CPU seconds for the first run of a command (issue: first compile <= 3 s)
COMMANDS = {
    "export_parquet": ["export", "{store}", "--to", "{tmp}/out.parquet"],
    "stats": ["stats", "{store}"],
    "cat_jsonl": ["cat-commitlog", "{store}", "-f", "jsonl"],     # every record: the bulk path (-n up to
    "cat_csv": ["cat-commitlog", "{store}", "-f", "csv"],         # FEW_RECORDS compiles nothing)
    "verify": ["verify", "{store}"],
}


def run(args: list[str], cache: str) -> float:
    """User + sys CPU seconds of one command (its output discarded)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "rmqtool", *args], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):           # verify's exit 1: findings (the command still ran)
        raise SystemExit(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.decode()[-400:]}")
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=ROOT / "fixtures" / "dev-sample" / "store")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated names of: " + ", ".join(COMMANDS))
    opts = ap.parse_args()
    names = opts.only.split(",") if opts.only else list(COMMANDS)
    print(f"store {opts.store}; load {os.getloadavg()[0]:.2f}; median of {opts.repeat} first runs")
    print(f"{'command':16} {'first CPU-s':>11} {'cached':>7} {'compile':>8}  target <= {TARGET}")
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            firsts = []
            for k in range(opts.repeat + 1):
                out = tempfile.mkdtemp(dir=tmp)             # the command's output files, if any
                args = [a.format(store=opts.store, tmp=out) for a in COMMANDS[name]]
                if k < opts.repeat:
                    cache = tempfile.mkdtemp(dir=tmp)
                    firsts.append(run(args, cache))
                else:
                    cached = run(args, cache)
        first = statistics.median(firsts)
        print(f"{name:16} {first:11.2f} {cached:7.2f} {first - cached:8.2f}  {'met' if first <= TARGET else 'MISSED'}"
              f"  ({', '.join(f'{t:.2f}' for t in firsts)})", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
