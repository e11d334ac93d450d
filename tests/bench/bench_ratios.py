"""Whole-store throughput as same-run ratios to zlib.crc32 over the same files (not a pytest test).

    python tests/bench/bench_ratios.py [--store DIR] [--gib 1] [--repeat 3] [--out DIR] [--only verify ...]
                                       [--warm-memory GB]

The yardstick is ``zlib.crc32`` over the store's commit-log data (each file's written bytes, mapped, in one
call), on one core, in this run. Each command is run as a user runs it (``python -m rmqtool``,
its modules compiled to bytecode once, as an installed tool's are, the compiled scan cached, output to a
file or to /dev/null), one core (``--jobs 1`` where the command has workers); its figure is the user + sys
CPU seconds of its process (robust when other jobs share the cores; wall time is printed too), start-up
included. The ratio is the yardstick's CPU seconds over the command's (the same bytes), the median of
``--repeat`` runs, the yardstick measured before each run of each command. ``decode_crc`` is the columnar
decode with CRC (``iter_record_batches(check_crc=True)``, no output) in a process of its own, without its
start-up: GB per CPU second.

Without --store (or when DIR holds no store yet) a store of ``--gib`` GiB of commit log in 1 GiB files is
generated there first (rmqtool's generator: 2,000 queues, the default index geometry; ~2.5 min per GiB).
Outputs go to --out (default: a temporary directory), each removed after its run (untimed).

``--warm-memory GB``: right before each timed run, this process touches GB of memory and gives it back
(``warm_memory``), so that the run is given pages the machine has backed a moment ago: on a virtual machine
whose host takes back the guest's free memory within seconds, a run otherwise pays the host for every page it
allocates and every page of page cache it writes (a bare-metal host pays neither), which moves a command's
figure by up to 3x from run to run. It cannot warm the page cache a large export fills, and the pages it
touches may push the store's own page cache out: an experiment on such a machine, not a correction
(PERFORMANCE.md, "Memory the host took back", says where it moved the figures and where not).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GIB = 1 << 30
PYCACHE = Path(tempfile.gettempdir()) / "rmqtool-bench-pycache"    # compiled once, as an installed tool is
# name: (command line after "rmqtool", with {store} and {out}; target x zlib.crc32)
COMMANDS = {
    "verify": (["verify", "{store}", "--check-crc", "--jobs", "1"], 0.7),
    "stats": (["stats", "{store}", "--by", "topic", "--jobs", "1"], 0.6),
    "parquet": (["export", "{store}", "--to", "{out}/out.parquet"], 0.3),
    "jsonl": (["export", "{store}", "--to", "{out}/out.jsonl"], 0.25),
    "cat_jsonl": (["cat-commitlog", "{store}", "-f", "jsonl"], 0.35),
}
DECODE_TARGET = 2.5          # GB per CPU second, the columnar decode with CRC


def data_files(store: Path) -> list[tuple[Path, int]]:
    """(path, written bytes) of each commit-log file, up to the end of written data."""
    from rmqtool.store.store import Store

    cl = Store.open(store).commitlog
    end = cl.append_end()
    out = []
    for f in cl.queue.files:
        n = max(0, min(f.length, end - f.start))
        if n:
            out.append((f.path, n))
    return out


def cpu_self() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def touch_memory(size: int) -> None:
    """Map ``size`` bytes of anonymous memory, touch a byte a page, and unmap it."""
    import mmap

    import numpy as np
    with mmap.mmap(-1, size) as mm:
        np.frombuffer(mm, np.uint8)[::4096] = 1


def fresh_memory_rate(mb: int = 512) -> float:
    """GB per CPU second at which this process is given memory it has not touched (each page faulted in and
    zeroed). On a virtual machine whose host takes back the guest's free memory it moves from run to run
    (0.4-3.5 GB/s on the development machine); every command pays it for the memory it allocates and the
    page cache it writes, so its figures move with it: printed before and after the runs."""
    started = cpu_self()
    touch_memory(mb << 20)
    return (mb << 20) / 1e9 / (cpu_self() - started)


def warm_memory(gb: float) -> None:
    """Touch ``gb`` GB of memory and give it back: the next process is given those pages, backed by the
    host, instead of pages the host took back (see the module docstring)."""
    if gb > 0:
        touch_memory(int(gb * 1e9))


def yardstick(files: list[tuple[Path, int]]) -> float:
    """CPU seconds of zlib.crc32 over the files' written bytes, each file mapped and taken in one call (as
    the scan reads them: a read into a buffer would add a copy of every byte)."""
    import mmap
    import zlib
    started = cpu_self()
    for path, size in files:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as mm:
            with memoryview(mm) as view:
                zlib.crc32(view[:size])
    return cpu_self() - started


def decode_crc(store: Path) -> dict:
    """CPU seconds of the columnar decode with CRC over the store (compiled code loaded first, untimed: over
    the bundled sample store)."""
    from rmqtool.columnar import iter_record_batches
    from rmqtool.columnar.kernel import load_compiled
    load_compiled()
    for _ in iter_record_batches(ROOT / "fixtures" / "dev-sample" / "store", check_crc=True):
        pass
    records = 0
    started = cpu_self()
    for batch in iter_record_batches(store, check_crc=True):
        records += batch.num_rows
    return {"cpu": cpu_self() - started, "records": records}


def run_command(argv: list[str]) -> tuple[float, float]:
    """(wall, user + sys CPU seconds) of one command, stdout to /dev/null."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rmqtool", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"rmqtool {' '.join(argv)}: exit {os.waitstatus_to_exitcode(status)}: {err.decode()[-400:]}")
    return wall, usage.ru_utime + usage.ru_stime


def child(kind: str, store: Path) -> dict:
    if kind == "yardstick":
        return {"cpu": yardstick(data_files(store))}
    return decode_crc(store)


def in_child(kind: str, store: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--store", str(store)], check=True,
                         stdout=subprocess.PIPE).stdout
    return json.loads(out)


def ensure_store(store: Path, gib: int, file_mb: int = 1024) -> None:
    """A generated store of ``gib`` GiB of commit log in ``file_mb`` MiB files at ``store``, unless one is there."""
    from rmqtool.ops.generate import generate_store
    if not (store / "commitlog").is_dir():
        print(f"generating {gib} GiB in {file_mb} MiB files with 2,000 queues in {store} ...", file=sys.stderr,
              flush=True)
        started = time.perf_counter()
        g = generate_store(store, gib * GIB - (1 << 20), file_size=file_mb << 20, topics=200, queues=10, seed=gib)
        print(f"  {g.messages} messages, {g.files} files, {time.perf_counter() - started:.0f} s", file=sys.stderr,
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, help="store to use (generated there when missing)")
    ap.add_argument("--gib", type=int, default=1, help="GiB of commit log of a generated store")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measure; the median counts")
    ap.add_argument("--out", type=Path, help="directory for the exports' outputs")
    ap.add_argument("--only", nargs="*", help="measures to run (default: all)")
    ap.add_argument("--warm-memory", type=float, default=0, metavar="GB",
                    help="GB of memory touched and given back before each timed run (default: none)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.store)))
        return
    with tempfile.TemporaryDirectory(prefix="rmqtool-bench-") as tmp:
        store = args.store or Path(tmp) / "store"
        ensure_store(store, args.gib)
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        files = data_files(store)
        size = sum(n for _, n in files)
        for path, _ in files:
            subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)    # warm the page cache
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "rmqtool")], check=True,
                       env={**os.environ, "PYTHONPYCACHEPREFIX": str(PYCACHE)})
        run_command(["verify", str(store), "--check-crc", "--jobs", "1"])     # compiled code cached, untimed
        print(f"store {store}: {len(files)} commit-log files, {size / 1e6:,.0f} MB of records; "
              f"load average {os.getloadavg()[0]:.2f} before; {os.cpu_count()} cores; median of {args.repeat} runs; "
              f"fresh memory {fresh_memory_rate():.1f} GB/cpu-s; memory warmed before each run: "
              f"{args.warm_memory:g} GB")
        header = f"{'measure':<48} {'wall s':>7} {'cpu s':>7} {'MB/cpu-s':>9} {'zlib cpu s':>10} {'x zlib':>7}  target"
        print(header)
        print("-" * len(header))
        yard_all = []
        for name, (argv, target) in COMMANDS.items():
            if args.only and name not in args.only:
                continue
            runs = []
            for _ in range(max(args.repeat, 1)):
                yard = in_child("yardstick", store)["cpu"]
                yard_all.append(yard)
                warm_memory(args.warm_memory)
                wall, cpu = run_command([a.format(store=store, out=out) for a in argv])
                for p in out.glob("out.*"):
                    p.unlink()
                runs.append((wall, cpu, yard))
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            yard = statistics.median(r[2] for r in runs)
            ratio = statistics.median(r[2] / r[1] for r in runs)
            label = "rmqtool " + " ".join(argv).replace("{store}", "STORE").replace("{out}/", "")
            verdict = "met" if ratio >= target else "MISSED"
            print(f"{label:<48} {wall:7.2f} {cpu:7.2f} {size / 1e6 / cpu:9.0f} {yard:10.3f} {ratio:7.2f}  "
                  f">= {target}: {verdict}", flush=True)
        if not args.only or "decode_crc" in args.only:
            runs = []
            for _ in range(max(args.repeat, 1)):
                warm_memory(args.warm_memory)
                runs.append(in_child("decode_crc", store)["cpu"])
            cpu = statistics.median(runs)
            gbs = size / 1e9 / cpu
            verdict = "met" if gbs >= DECODE_TARGET else "MISSED"
            print(f"{'columnar decode with CRC (in-process)':<48} {'':>7} {cpu:7.2f} {size / 1e6 / cpu:9.0f} "
                  f"{'':>10} {'':>7}  >= {DECODE_TARGET} GB/cpu-s: {verdict} ({gbs:.2f})")
        if yard_all:
            y = statistics.median(yard_all)
            print(f"\nzlib.crc32 yardstick: median {y:.3f} CPU-s, {size / 1e6 / y:,.0f} MB/cpu-s "
                  f"(range {min(yard_all):.3f}-{max(yard_all):.3f})")
        print(f"load average {os.getloadavg()[0]:.2f} after; fresh memory {fresh_memory_rate():.1f} GB/cpu-s")


if __name__ == "__main__":
    main()
