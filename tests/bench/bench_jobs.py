"""What worker processes gain: each whole-store command with ``--jobs 2`` against ``--jobs 1`` (not a pytest test).

    python tests/bench/bench_jobs.py [--store DIR] [--gib 1] [--file-mb 256] [--repeat 3] [--out DIR]
                                     [--only verify ...] [--warm-memory GB]

Each command runs as a user runs it (``python -m rmqtool``, its modules compiled to bytecode once, as an installed
tool's are, the compiled scan cached, output to /dev/null or to --out), ``--jobs 1`` and ``--jobs 2`` runs
alternating; a command runs in a process that reads its own and its workers' CPU seconds when it ends. Printed per
command, medians of ``--repeat`` runs: the wall seconds of each, their ratio (the target: ``--jobs 2`` at least
1.6x ``--jobs 1`` on 2 cores; wall time means something only on a machine with nothing else running, so the load
average is printed before and after; the lowest and highest run's ratio follow the verdict), and CPU seconds,
robust when other jobs share the cores: ``--jobs 1``'s, and ``--jobs 2``'s in the command's own process and in its
workers. That process's CPU is split where it is alone: before its first worker is forked ("serial": start-up,
planning) plus after its last worker is reaped (the merge's tail), and while workers run ("during": its own share
of the files, joins, writes); "max w" is the busiest worker's (summed over verify's two steps, each with its own
workers). "crit" = serial + max(during, max w), the CPU on the critical path with a core per process, and
"x crit" = ``--jobs 1``'s CPU / crit: the speed-up a quiet machine can give.

Without --store (or when DIR holds no store yet) a store of ``--gib`` GiB of commit log in ``--file-mb`` MiB files
is generated there first (rmqtool's generator: 2,000 queues, the default index geometry; ~2.5 min per GiB).
Outputs go to --out (default: a temporary directory), each removed after its run (untimed), but for a tree of
queue files (``rebuild-cq``), moved aside and removed at the end: ext4 without a journal (this machine's) passes
over inodes freed in the last minute or more when it makes files and directories (``recently_deleted``), so
2,000 queue directories removed before a run cost the next one 1-2 s of system time that no rebuild after a
quiet minute pays.

``--warm-memory GB``: GB of memory touched and given back right before each timed run (bench_ratios.py's
``warm_memory``, and what it cannot do): on a virtual machine whose host takes back the guest's free memory,
the pages each run is given are then backed, as on a bare-metal host.
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
from bench_ratios import PYCACHE, ensure_store, fresh_memory_rate, warm_memory  # noqa: E402  (after the path)

TARGET = 1.6
KEEP = {"rebuild-cq"}       # outputs moved aside until the end (see above)
COMMANDS = {               # name: command line after "rmqtool", with {store} and {out}
    "verify": ["verify", "{store}", "--check-crc"],
    "stats": ["stats", "{store}", "--by", "topic"],
    "export": ["export", "{store}", "--to", "{out}/out.parquet"],
    "export-jsonl": ["export", "{store}", "--to", "{out}/out.jsonl"],
    "grep": ["grep", "{store}", "--key", "no-such-key"],
    "rebuild-cq": ["rebuild-cq", "{store}", "--out", "{out}/cq"],
    "rebuild-cq-plan": ["rebuild-cq", "{store}"],
    "rebuild-index": ["rebuild-index", "{store}"],
}
# runs rmqtool's command line in this process, then prints [exit status, own CPU s, workers' CPU s, own CPU s
# before the first fork, at the last worker's reaping, the workers' critical path: the busiest worker's CPU s of
# each set of workers in turn (verify's two steps), summed] to stderr's last line
PROBE = """import json, os, resource, runpy, sys
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
marks, busiest, step, fork = {}, {}, {}, os.fork
def forked():
    marks.setdefault('fork', cpu())
    if not step:                         # none alive: a new set of workers
        marks['sets'] = marks.get('sets', 0) + 1
    pid = fork()
    if pid:
        step[pid] = marks['sets']
    return pid
def reaped(pid, options):                # multiprocessing reaps its workers with os.waitpid: each one's rusage
    p, status, ru = os.wait4(pid, options)
    if p in step:
        at = step.pop(p)
        busiest[at] = max(busiest.get(at, 0.0), ru.ru_utime + ru.ru_stime)
        marks['reap'] = cpu()
    return p, status
os.fork, os.waitpid = forked, reaped
sys.argv = ['rmqtool', *sys.argv[1:]]
code = 0
try:
    runpy.run_module('rmqtool', run_name='__main__')
except SystemExit as exc:
    code = exc.code
own, children = cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stderr.write('\\n' + json.dumps([code, own, children.ru_utime + children.ru_stime, marks.get('fork', own),
                                      marks.get('reap', own), sum(busiest.values())]) + '\\n')
"""


def run_command(argv: list[str]) -> tuple[float, ...]:
    """(wall, own CPU, workers' CPU, own CPU before the first fork, at the last reaping, busiest worker's CPU)
    seconds of one command, stdout to /dev/null."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          env=env, cwd=ROOT)
    wall = time.perf_counter() - started
    code, *cpu = json.loads(proc.stderr.decode().rstrip().rpartition("\n")[2])
    if code not in (None, 0, 1):             # grep finds nothing: 1
        raise SystemExit(f"rmqtool {' '.join(argv)}: exit {code}: {proc.stderr.decode()[-400:]}")
    return (wall, *cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, help="store to use (generated there when missing); only read")
    ap.add_argument("--gib", type=int, default=1, help="GiB of commit log of a generated store")
    ap.add_argument("--file-mb", type=int, default=256, help="commit-log file size of a generated store, MiB")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measure; the median counts")
    ap.add_argument("--out", type=Path, help="directory for the outputs")
    ap.add_argument("--only", nargs="*", choices=list(COMMANDS), help="commands to run (default: all)")
    ap.add_argument("--warm-memory", type=float, default=0, metavar="GB",
                    help="GB of memory touched and given back before each timed run (default: none)")
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

        kept = out / ".kept"

        def clear(name: str) -> None:
            for p in out.iterdir():
                if p == kept:
                    continue
                if name in KEEP:
                    kept.mkdir(exist_ok=True)
                    p.rename(kept / f"{len(list(kept.iterdir()))}")
                else:
                    shutil.rmtree(p) if p.is_dir() else p.unlink()

        for name in args.only or COMMANDS:          # compiled code cached, untimed
            run_command([a.format(store=store, out=out) for a in COMMANDS[name]] + ["--jobs", "2"])
            clear(name)
        print(f"store {store}: {len(files)} commit-log files; {len(os.sched_getaffinity(0))} cores; load average "
              f"{os.getloadavg()[0]:.2f} before; median of {args.repeat} runs; fresh memory "
              f"{fresh_memory_rate():.1f} GB/cpu-s; memory warmed before each run: {args.warm_memory:g} GB")
        header = (f"{'command':<44} {'jobs 1 s':>8} {'jobs 2 s':>8} {'x':>5} | {'cpu 1':>5} {'own':>5} "
                  f"{'wrks':>5} | {'serial':>6} {'during':>6} {'max w':>5} {'crit':>5} {'x crit':>6}  target (x; the runs' x)")
        print(header)
        print("-" * len(header))
        for name in args.only or COMMANDS:
            argv = [a.format(store=store, out=out) for a in COMMANDS[name]]
            runs: dict[str, list] = {"1": [], "2": []}
            for _ in range(max(args.repeat, 1)):
                for jobs in runs:
                    warm_memory(args.warm_memory)
                    runs[jobs].append(run_command(argv + ["--jobs", jobs]))
                    clear(name)

            def median(jobs: str, column) -> float:
                return statistics.median(column(r) for r in runs[jobs])

            one, two = median("1", lambda r: r[0]), median("2", lambda r: r[0])
            ratios = [a[0] / b[0] for a, b in zip(runs["1"], runs["2"])]
            ratio = statistics.median(ratios)
            cpu1, own, workers = median("1", lambda r: r[1]), median("2", lambda r: r[1]), median("2", lambda r: r[2])
            serial = median("2", lambda r: r[3] + r[1] - r[4])
            during = median("2", lambda r: r[4] - r[3])
            busiest = median("2", lambda r: r[5])
            crit = serial + max(during, busiest)
            label = "rmqtool " + " ".join(COMMANDS[name]).replace("{store}", "STORE").replace("{out}/", "")
            print(f"{label:<44} {one:8.2f} {two:8.2f} {ratio:5.2f} | {cpu1:5.2f} {own:5.2f} {workers:5.2f} | "
                  f"{serial:6.2f} {during:6.2f} {busiest:5.2f} {crit:5.2f} {cpu1 / crit:6.2f}  >= {TARGET}: "
                  f"{'met' if ratio >= TARGET else 'MISSED'} (runs {min(ratios):.2f}-{max(ratios):.2f})", flush=True)
        print(f"load average {os.getloadavg()[0]:.2f} after; fresh memory {fresh_memory_rate():.1f} GB/cpu-s")
        shutil.rmtree(kept, ignore_errors=True)


if __name__ == "__main__":
    main()
