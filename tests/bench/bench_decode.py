"""Benchmark of the columnar decoder and export against the machine's limits (not a pytest test).

    python tests/bench/bench_decode.py [--store DIR] [--repeat N] [--naive-mb 128] [--cat-mb 128]

Without --store (or when DIR does not hold a store yet) a store with one full 1 GiB commit-log file is
generated first (rmqtool's generator, no index; about two minutes). Every measure runs in its own
process on the first commit-log file; the table gives MB/s (10^6 bytes of commit log per second),
records/s, the ratio to reading the file from page cache, the CPU seconds of the measure and MB per CPU
second (robust when other jobs share the cores), and the process's peak RSS. The naive
record-at-a-time decoder runs over the first --naive-mb MB only (its rate does not depend on size), and
``cat-commitlog FILE -n N -f FORMAT > /dev/null`` (the whole command, start-up included, its modules
compiled to bytecode once as an installed tool's are) over the records of the first --cat-mb MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GIB = 1 << 30
PYCACHE = Path(tempfile.gettempdir()) / "rmqtool-bench-pycache"    # compiled once, as an installed tool is
MEASURES = [
    ("read", "read the file from page cache (8 MiB readinto)"),
    ("walk", "record-boundary walk only"),
    ("decode", "columnar decode, no CRC"),
    ("decode_crc", "columnar decode with CRC"),
    ("naive", "record-at-a-time decoder (iter_entries + entry_row)"),
    ("parquet", "export to Parquet"),
    ("jsonl", "export to JSON lines"),
    ("csv", "export to CSV"),
    ("cat_jsonl", "cat-commitlog -f jsonl > /dev/null"),
    ("cat_csv", "cat-commitlog -f csv > /dev/null"),
    ("cat_plain", "cat-commitlog -f plain > /dev/null"),
    ("cat_table", "cat-commitlog -f table > /dev/null"),
]
TARGETS = {"decode": 1500, "decode_crc": 1000, "parquet": 500, "jsonl": 250, "csv": 400, "cat_jsonl": 150,
           "cat_csv": 100, "cat_plain": 50, "cat_table": 50}


def measure(name: str, path: Path, scratch: Path, naive_bytes: int) -> dict:
    """Run one measure in this process: (seconds, records, commit-log bytes covered)."""
    import numpy as np
    import pyarrow as pa

    from rmqtool.columnar import WINDOW_BYTES, iter_record_batches
    from rmqtool.columnar.kernel import scan_window

    size = path.stat().st_size
    records = 0
    started = time.perf_counter()
    cpu = _cpu()
    if name == "read":
        buf = bytearray(8 << 20)
        with open(path, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    elif name == "walk":
        data = np.frombuffer(pa.memory_map(str(path)).read_buffer(), np.uint8)
        pos = 0
        while pos + 8 <= size:
            win = scan_window(data, pos, pos + WINDOW_BYTES)
            records += win.n
            if not win.n:
                break
            pos = win.next
        size = pos
    elif name in ("decode", "decode_crc"):
        size = 0
        for batch in iter_record_batches(path, check_crc=name == "decode_crc"):
            records += batch.num_rows
            size += _covered(batch)
    elif name == "naive":
        from rmqtool.format.rows import entry_row
        from rmqtool.store.commitlog import CommitLog
        end = 0
        for loc in CommitLog.open(path).iter_entries():
            entry_row(loc.entry, loc.offset, check_crc=True)
            records += 1
            end = loc.offset + loc.entry.total_size
            if end >= naive_bytes:
                break
        size = end
    elif name.startswith("cat_"):
        for batch in iter_record_batches(path):           # untimed: how many records make naive_bytes
            records += batch.num_rows
            size = int(batch.column("physical_offset")[-1].as_py() + batch.column("total_size")[-1].as_py())
            if size >= naive_bytes:
                break
        started, cpu = time.perf_counter(), _cpu()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(PYCACHE), "COLUMNS": "200"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run([sys.executable, "-m", "rmqtool", "cat-commitlog", str(path), "-n", str(records),
                        "-f", name[4:]], stdout=subprocess.DEVNULL, check=True, env=env, cwd=ROOT)
    else:
        from rmqtool.ops.export import export_local
        out = scratch / f"bench-out.{name}"
        result = export_local([path], out, name, overwrite=True)
        records, size = result.records, result.input_bytes
        seconds, cpu = time.perf_counter() - started, _cpu() - cpu
        out.unlink()                      # not timed: removing a GB-sized output takes seconds here
        return {"seconds": seconds, "cpu_seconds": cpu, "records": records, "bytes": size}
    return {"seconds": time.perf_counter() - started, "cpu_seconds": _cpu() - cpu, "records": records, "bytes": size}


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the machine is shared: wall time is not
    all ours)."""
    import resource
    return time.process_time() + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])


def _covered(batch) -> int:
    import pyarrow.compute as pc
    return pc.sum(batch.column("total_size")).as_py() or 0


def run_child(name: str, path: Path, scratch: Path, naive_bytes: int, cat_bytes: int) -> dict:
    """One measure in a fresh process; peak RSS from wait4."""
    cmd = [sys.executable, __file__, "--child", name, "--file", str(path), "--scratch", str(scratch),
           "--naive-mb", str((cat_bytes if name.startswith("cat_") else naive_bytes) // 1_000_000)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"measure {name} failed with status {proc.returncode}")
    result = json.loads(out)
    result["peak_rss_mb"] = usage.ru_maxrss / 1024
    return result


def ensure_store(store: Path) -> Path:
    from rmqtool.ops.generate import generate_store
    commitlog = store / "commitlog"
    if not commitlog.is_dir():
        print(f"generating a 1 GiB commit log in {store} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        g = generate_store(store, GIB, index=False, seed=1)
        print(f"  {g.messages} messages, {g.files} files, {time.perf_counter() - started:.0f} s",
              file=sys.stderr, flush=True)
    first = min(p for p in commitlog.iterdir() if p.name.isdigit())
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, help="store to use (generated there when missing)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measure; the fastest counts")
    ap.add_argument("--naive-mb", type=int, default=128, help="MB decoded by the naive decoder")
    ap.add_argument("--cat-mb", type=int, default=128, help="MB printed by the cat-commitlog measures")
    ap.add_argument("--only", nargs="*", help="measure names to run (default: all)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    naive_bytes = args.naive_mb * 1_000_000
    if args.child:
        print(json.dumps(measure(args.child, args.file, args.scratch, naive_bytes)))
        return
    with tempfile.TemporaryDirectory(prefix="rmqtool-bench-") as tmp:
        store = args.store or Path(tmp) / "store"
        path = ensure_store(store)
        scratch = Path(tmp)
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)   # warm the page cache
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "rmqtool")], check=True,
                       env={**os.environ, "PYTHONPYCACHEPREFIX": str(PYCACHE)})     # rmqtool's modules, once
        print(f"file: {path} ({path.stat().st_size} bytes); load average {os.getloadavg()[0]:.2f}; "
              f"{os.cpu_count()} cores", flush=True)
        header = (f"{'measure':<54} {'s':>7} {'MB/s':>8} {'records/s':>11} {'x read':>7} {'cpu s':>7} "
                  f"{'MB/cpu-s':>9} {'peak RSS MB':>11}")
        print(header)
        print("-" * len(header))
        base = None
        results = {}
        for name, label in MEASURES:
            if args.only and name not in args.only and name != "read":
                continue
            runs = [run_child(name, path, scratch, naive_bytes, args.cat_mb * 1_000_000)
                    for _ in range(max(args.repeat, 1))]
            r = min(runs, key=lambda x: x["seconds"])
            r["peak_rss_mb"] = max(x["peak_rss_mb"] for x in runs)
            mbps = r["bytes"] / 1e6 / r["seconds"]
            base = base or mbps
            results[name] = mbps
            rps = f"{r['records'] / r['seconds']:,.0f}" if r["records"] else "-"
            print(f"{label:<54} {r['seconds']:7.2f} {mbps:8.0f} {rps:>11} {mbps / base:7.3f} {r['cpu_seconds']:7.2f} "
                  f"{r['bytes'] / 1e6 / r['cpu_seconds']:9.0f} {r['peak_rss_mb']:11.0f}", flush=True)
        if "decode" in results and "naive" in results:
            print(f"\ncolumnar decode with CRC / naive: {results.get('decode_crc', 0) / results['naive']:.1f}x; "
                  f"without CRC / naive: {results['decode'] / results['naive']:.1f}x")
        for name, target in TARGETS.items():
            if name in results:
                verdict = "met" if results[name] >= target else "MISSED"
                print(f"target {name} >= {target} MB/s: {verdict} ({results[name]:.0f})")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
