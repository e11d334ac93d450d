"""What worker processes gain: each whole-store command with ``--jobs 2`` against ``--jobs 1`` (not a pytest test).

    python tests/bench/bench_jobs.py [--store DIR] [--gib 1] [--file-mb 256] [--repeat 3] [--out DIR]
                                     [--only verify ...]

Each command runs as a user runs it (``python -m rmqtool``, its modules compiled to bytecode once, as an installed
tool's are, the compiled scan cached, output to /dev/null or to --out), ``--jobs 1`` and ``--jobs 2`` runs
alternating; a command runs in a process that reads its own and its workers' CPU seconds when it ends. Printed per
command, medians of ``--repeat`` runs: the wall seconds of each, their ratio (the target: ``--jobs 2`` at least
1.6x ``--jobs 1`` on 2 cores; wall time means something only on a machine with nothing else running, so the load
average is printed before and after), and the CPU seconds of the command's own process and of its workers with
``--jobs 2`` (robust when other jobs share the cores).

Without --store (or when DIR holds no store yet) a store of ``--gib`` GiB of commit log in ``--file-mb`` MiB files
is generated there first (rmqtool's generator: 2,000 queues, the default index geometry; ~2.5 min per GiB).
Outputs go to --out (default: a temporary directory), each removed after its run (untimed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
from bench_ratios import PYCACHE, ensure_store  # noqa: E402  (after the path)

TARGET = 1.6
COMMANDS = {               # name: command line after "rmqtool", with {store} and {out}
    "verify": ["verify", "{store}", "--check-crc"],
    "stats": ["stats", "{store}", "--by", "topic"],
    "export": ["export", "{store}", "--to", "{out}/out.parquet"],
    "grep": ["grep", "{store}", "--key", "no-such-key"],
    "rebuild-cq": ["rebuild-cq", "{store}", "--out", "{out}/cq"],
    "rebuild-index": ["rebuild-index", "{store}"],
}
# runs rmqtool's command line in this process, then prints (own CPU s, workers' CPU s) to stderr's last line
PROBE = ("import json, resource, runpy, sys\n"
         "sys.argv = ['rmqtool', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('rmqtool', run_name='__main__')\n"
         "except SystemExit as exc:\n    code = exc.code\n"
         "s, c = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))\n"
         "sys.stderr.write('\\n' + json.dumps([code, s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime]) + '\\n')\n")


def run_command(argv: list[str]) -> tuple[float, float, float]:
    """(wall, own CPU, workers' CPU) seconds of one command, stdout to /dev/null."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          env=env, cwd=ROOT)
    wall = time.perf_counter() - started
    code, own, workers = json.loads(proc.stderr.decode().rstrip().rpartition("\n")[2])
    if code not in (None, 0, 1):             # grep finds nothing: 1
        raise SystemExit(f"rmqtool {' '.join(argv)}: exit {code}: {proc.stderr.decode()[-400:]}")
    return wall, own, workers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, help="store to use (generated there when missing); only read")
    ap.add_argument("--gib", type=int, default=1, help="GiB of commit log of a generated store")
    ap.add_argument("--file-mb", type=int, default=256, help="commit-log file size of a generated store, MiB")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measure; the median counts")
    ap.add_argument("--out", type=Path, help="directory for the outputs")
    ap.add_argument("--only", nargs="*", choices=list(COMMANDS), help="commands to run (default: all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rmqtool-bench-") as tmp:
        store = args.store or Path(tmp) / "store"
        ensure_store(store, args.gib, args.file_mb)
        out = args.out or Path(tmp) / "out"
        out.mkdir(parents=True, exist_ok=True)
        files = sorted((store / "commitlog").iterdir())
        for path in files:
            subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)    # warm the page cache
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "rmqtool")], check=True,
                       env={**os.environ, "PYTHONPYCACHEPREFIX": str(PYCACHE)})

        def clear() -> None:
            for p in out.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()

        for name in args.only or COMMANDS:          # compiled code cached, untimed
            run_command([a.format(store=store, out=out) for a in COMMANDS[name]] + ["--jobs", "2"])
            clear()
        print(f"store {store}: {len(files)} commit-log files; {len(os.sched_getaffinity(0))} cores; load average "
              f"{os.getloadavg()[0]:.2f} before; median of {args.repeat} runs")
        header = (f"{'command':<48} {'jobs 1 s':>8} {'jobs 2 s':>8} {'x':>6} {'own cpu s':>9} {'workers cpu s':>13}"
                  "  target")
        print(header)
        print("-" * len(header))
        for name in args.only or COMMANDS:
            argv = [a.format(store=store, out=out) for a in COMMANDS[name]]
            runs: dict[str, list] = {"1": [], "2": []}
            for _ in range(max(args.repeat, 1)):
                for jobs in runs:
                    runs[jobs].append(run_command(argv + ["--jobs", jobs]))
                    clear()
            one = statistics.median(r[0] for r in runs["1"])
            two = statistics.median(r[0] for r in runs["2"])
            ratio = statistics.median(a[0] / b[0] for a, b in zip(runs["1"], runs["2"]))
            own = statistics.median(r[1] for r in runs["2"])
            workers = statistics.median(r[2] for r in runs["2"])
            label = "rmqtool " + " ".join(COMMANDS[name]).replace("{store}", "STORE").replace("{out}/", "")
            print(f"{label:<48} {one:8.2f} {two:8.2f} {ratio:6.2f} {own:9.2f} {workers:13.2f}  >= {TARGET}: "
                  f"{'met' if ratio >= TARGET else 'MISSED'}", flush=True)
        print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
