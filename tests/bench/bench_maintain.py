"""Benchmark of the whole-store maintenance commands at production shape (not a pytest test).

    python tests/bench/bench_maintain.py [--dir DIR] [--sizes 1 4] [--queues 2000] [--only verify ...]

For each size (GiB of commit log, in 1 GiB files) a store is generated under DIR when missing (rmqtool's
generator: 2,000 queues with 6,000,000-byte consume-queue files, the default 5M/20M index geometry;
about 2.5 minutes per GiB). Every measure runs in its own process, the store read into the page cache
first; the table gives wall time, MB/s of commit log, the ratio to the columnar decode with CRC of the
same run (wall clock), the CPU seconds of the measure's process tree, MB per CPU second and its ratio to
the decode's (robust when other jobs share the cores: the one-process rate targets are judged on it),
the CPU seconds of the measuring process itself ("own cpu": with worker processes, the rest is theirs),
for a measure in worker processes its wall-clock rate over the one-process rate, and peak RSS of the
measure's whole process tree (the sum over its processes, sampled every 50 ms, or the largest one's
peak from wait4 when that is higher) and peak PSS (the same sum of proportional set sizes, sampled every
0.2 s: pages a forked worker shares with its parent counted once). Rate targets are judged on the stores
of 4 GiB and more, RSS at every size.
Outputs go under DIR/scratch-*, each measure's in its own directory, written back after the measure (sync) and
removed when the script ends: files removed just before a measure would make its own file creation slower
(ext4 without a journal, as here, passes over the inodes freed in the last minute when it allocates one:
rebuild-cq's 2,000 queue directories and files took ~0.3 CPU-s instead of ~0.05 right after the previous
measure's were removed, and only rebuild-cq, run after rebuild-cq-1, paid it). Runs of the script less than a
minute apart carry that cost into the next run's first rebuild-cq measure.

- ``decode_crc``: ``iter_record_batches(check_crc=True)`` over every file (the reference rate)
- ``verify``: ``verify --check-crc`` (commit log, consume-queue and index cross-checks) in its default worker
  processes (one per core as memory allows); ``verify-1``: the same in one process (``--jobs 1``)
- ``rebuild-cq``: every consume queue rebuilt into a scratch directory (``--out``), the walk and most queue
  writes in the default worker processes; ``rebuild-cq-1``: in one process
- ``rebuild-index``: every index file rebuilt (``--dry-run``: built beside ``index/``, then removed), the
  walk in the default worker processes; ``rebuild-index-1``: in one process
- ``stats``: ``stats STORE --by topic`` (the whole command, start-up included) in its default worker
  processes; ``stats-1``: in one process
- ``grep-key``: ``grep STORE --key KEY`` for a key no record has (the whole command), default workers;
  ``grep-key-1``: one process
- ``export``: ``export STORE --to DIR -f parquet``, a dataset directory (one part per file), default workers;
  ``export-1``: one process
- ``info``: the store summary (default worker processes)
- ``repair``: the plan for the store (its files linked into a scratch directory beside an ``abort`` file) and its checkpoint in the last file;
  "read" is the commit-log bytes the recovery walk scanned
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GIB = 1 << 30
MEASURES = ["decode_crc", "verify-1", "verify", "rebuild-cq-1", "rebuild-cq", "rebuild-index-1", "rebuild-index",
            "stats-1", "stats", "grep-key-1", "grep-key", "export-1", "export", "info", "repair"]
# x the decode-with-CRC rate, in one process
TARGETS = {"verify-1": 0.8, "rebuild-cq-1": 0.8, "stats-1": 0.8, "grep-key-1": 0.8, "rebuild-index-1": 0.5}
PARALLEL_TARGET = 1.5                # worker processes (--jobs 2 on two cores) x one process
INFO_TARGET_MBPS = 2000
TARGET_GIB = 4                       # the rate targets hold for stores of this size and up; RSS at every size
RSS_TARGET_MB = 1000


def measure(name: str, store: Path, scratch: Path) -> dict:
    """One measure in this process: seconds, commit-log bytes covered, bytes read by recovery."""
    from rmqtool.store.store import Store

    st = Store.open(store)
    size = sum(f.length for f in st.commitlog.queue)
    read = 0
    started = time.perf_counter()
    if name == "decode_crc":
        from rmqtool.columnar import iter_record_batches
        for _ in iter_record_batches(st, check_crc=True):
            pass
    elif name in ("verify", "verify-1"):
        from rmqtool.ops.verify import verify_store
        findings = list(verify_store(store, deep=True, jobs=1 if name == "verify-1" else None))
        if findings:
            raise SystemExit(f"verify found {len(findings)} problems, first: {findings[0]}")
    elif name.startswith("rebuild-cq"):
        from rmqtool.ops.rebuild import rebuild_consume_queues
        rebuild_consume_queues(st, out=scratch / "cq", jobs=1 if name.endswith("-1") else None)
    elif name.startswith("rebuild-index"):
        from rmqtool.ops.dispatch_plan import DispatchPlan
        from rmqtool.ops.rebuild import rebuild_index
        rebuild_index(st, dry_run=True, plan=DispatchPlan(jobs=1 if name.endswith("-1") else None))
    elif name.startswith(("stats", "grep-key", "export")):
        args = {"stats": ["stats", str(store), "--by", "topic"],
                "grep-key": ["grep", str(store), "--key", "no-such-key", "-f", "jsonl"],
                "export": ["export", str(store), "--to", str(scratch / "dataset"), "-f", "parquet"],
                }[name.removesuffix("-1")]
        status = subprocess.run([sys.executable, "-m", "rmqtool", *args, *["--jobs", "1"] * name.endswith("-1")],
                                stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode
        if status not in (0, 1):                  # grep: 1 = nothing matched
            raise SystemExit(f"{name} exited with {status}")
    elif name == "info":
        from rmqtool.ops.inspect import store_info
        store_info(st)
    elif name == "repair":
        from rmqtool.ops.repair import plan_repair

        def count(n: int) -> None:
            nonlocal read
            read += n

        crashed = scratch / "crashed"           # the store's files, linked, beside an abort file: the
        crashed.mkdir()                          # shared store itself is never written
        for p in store.iterdir():
            (crashed / p.name).symlink_to(p)
        (crashed / "abort").write_bytes(b"")
        plan_repair(Store.open(crashed), progress=count)
    own = resource.getrusage(resource.RUSAGE_SELF)
    return {"seconds": time.perf_counter() - started, "bytes": size, "read": read,
            "own_cpu_seconds": own.ru_utime + own.ru_stime}


def warm(store: Path) -> None:
    """Read the store into the page cache (the outputs of earlier measures may have pushed it out):
    commit-log and index files whole, consume-queue files where they hold data (exactly: read-ahead
    would bring their holes in as 12 GB of zero pages). Every measure starts from a warm cache."""
    from rmqtool.store.filequeue import data_extents, read_exact

    for sub in ("commitlog", "index"):
        for f in sorted((store / sub).iterdir()):
            subprocess.run(["cat", str(f)], stdout=subprocess.DEVNULL, check=True)
    for f in (store / "consumequeue").rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:      # no read-ahead: it would fill the cache with the holes' zeros
                for lo, hi in data_extents(fh.fileno(), 0, f.stat().st_size):
                    read_exact(fh, hi - lo, lo)


def tree_rss_kb(pid: int, pss: bool = True) -> tuple[int, int]:
    """(resident, proportional) KiB of a process and its descendants now (Linux /proc; 0 elsewhere). The
    resident sum counts a page every process of the tree maps (the libraries and data a forked worker
    shares with its parent) once per process; the proportional set size (Pss) splits it among them.
    ``pss=False``: the resident sum only (Pss walks every page table of the process: ~1.6 ms per process
    mapping a 1 GiB commit-log file, where VmRSS is a counter read in ~10 us)."""
    rss = pss_kb = 0
    try:
        with open(f"/proc/{pid}/status") as fh:
            rss = next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
        if pss:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                pss_kb = next((int(line.split()[1]) for line in fh if line.startswith("Pss:")), 0)
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            for child in fh.read().split():
                r, p = tree_rss_kb(int(child), pss)
                rss, pss_kb = rss + r, pss_kb + p
    except OSError:
        pass
    return rss, pss_kb


def run_child(name: str, store: Path, scratch: Path) -> dict:
    """One measure in a fresh process on a warm cache; peak RSS of its process tree; outputs (in ``scratch``,
    which must not exist) written back to disk, untimed."""
    warm(store)
    scratch.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, __file__, "--child", name, "--store", str(store),
                             "--scratch", str(scratch)], stdout=subprocess.PIPE)
    peak = [0, 0]

    def sample() -> None:
        # RSS every 50 ms, PSS every 4th time: read every time, its page-table walks took ~5 ms of CPU per
        # 50 ms from the two cores a measure in worker processes runs on (~0.1 s of its wall time)
        tick = 0
        while proc.returncode is None:
            rss, pss = tree_rss_kb(proc.pid, pss=tick % 4 == 0)
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            tick += 1
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = status
    sampler.join()
    os.sync()                        # no write-back of this measure's outputs during the next one
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"measure {name} failed")
    result = json.loads(out)
    result["peak_rss_mb"] = max(usage.ru_maxrss, peak[0]) / 1024
    result["peak_pss_mb"] = peak[1] / 1024
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime       # with the children it waited for
    return result


def ensure_store(path: Path, gib: int, queues: int) -> Path:
    from rmqtool.ops.generate import generate_store

    if not (path / "commitlog").is_dir():
        print(f"generating {gib} GiB with {queues} queues in {path} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        g = generate_store(path, gib * GIB - (1 << 20), file_size=GIB, topics=queues // 10, queues=10, seed=gib)
        print(f"  {g.messages} messages, {g.files} files, {g.consume_queues} queues, "
              f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("bench-out"), help="stores and scratch space")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4], help="store sizes in GiB")
    ap.add_argument("--queues", type=int, default=2000)
    ap.add_argument("--only", nargs="*", help="measures to run (decode_crc always runs)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.store, args.scratch)))
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=args.dir))      # this run's (runs may share DIR)
    try:
        run_all(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_all(args: argparse.Namespace, scratch: Path) -> None:
    rss: dict[str, dict[int, float]] = {}
    for gib in args.sizes:
        store = ensure_store(args.dir / f"store-{gib}g", gib, args.queues)
        print(f"\nstore {store}: {gib} GiB, {args.queues} queues; load average {os.getloadavg()[0]:.2f}, "
              f"{os.cpu_count()} cores", flush=True)
        header = (f"{'command':<16} {'s':>7} {'MB/s':>7} {'x decode+CRC':>13} {'cpu s':>7} {'MB/cpu-s':>9} "
                  f"{'x cpu-s':>8} {'own cpu':>7} {'x 1 proc':>8} {'peak RSS MB':>12} {'PSS MB':>7} {'read MB':>8}")
        print(header)
        print("-" * len(header))
        base = cpu_base = None
        rates: dict[str, float] = {}
        for name in MEASURES:
            if args.only and name not in args.only and name != "decode_crc":
                continue
            r = run_child(name, store, scratch / f"{gib}g-{name}")
            mbps = r["bytes"] / 1e6 / r["seconds"]
            per_cpu = r["bytes"] / 1e6 / r["cpu_seconds"]
            base, cpu_base = base or mbps, cpu_base or per_cpu
            rates[name] = mbps
            alone = rates.get(f"{name}-1")
            rss.setdefault(name, {})[gib] = r["peak_rss_mb"]
            read = f"{r['read'] / 1e6:8.0f}" if name == "repair" else f"{'-':>8}"
            verdict = ""
            if gib < TARGET_GIB:
                pass                                # rates are judged on the large store only
            elif name in TARGETS:
                verdict = "met" if per_cpu / cpu_base >= TARGETS[name] else f"MISSED (target {TARGETS[name]}x)"
            elif name == "info":
                verdict = "met" if mbps >= INFO_TARGET_MBPS else f"MISSED (target {INFO_TARGET_MBPS} MB/s)"
            elif name == "repair":
                verdict = "met" if r["read"] <= 2 * GIB else "MISSED (target: last two files)"
            if gib >= TARGET_GIB and f"{name}-1" in MEASURES and alone:
                verdict += " met" if mbps / alone >= PARALLEL_TARGET else f" MISSED (target {PARALLEL_TARGET}x 1 proc)"
            if r["peak_rss_mb"] > RSS_TARGET_MB:
                verdict += f" RSS over {RSS_TARGET_MB} MB"
            ratio = f"{mbps / alone:8.2f}" if alone else f"{'-':>8}"
            print(f"{name:<16} {r['seconds']:7.2f} {mbps:7.0f} {mbps / base:13.2f} {r['cpu_seconds']:7.2f} "
                  f"{per_cpu:9.0f} {per_cpu / cpu_base:8.2f} {r['own_cpu_seconds']:7.2f} {ratio} {r['peak_rss_mb']:12.0f} "
                  f"{r['peak_pss_mb']:7.0f} {read} {verdict}", flush=True)
    if len(args.sizes) > 1:
        a, b = args.sizes[0], args.sizes[-1]
        print(f"\npeak RSS MB, {a} GiB vs {b} GiB: " + ", ".join(
            f"{name} {v.get(a, 0):.0f}/{v.get(b, 0):.0f}" for name, v in rss.items()))


if __name__ == "__main__":
    main()
