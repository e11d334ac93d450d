"""Benchmark of the Spark engine against the single process (not a pytest test).

    python tests/bench/bench_spark.py [--store DIR] [--files 4] [--file-size 1G] [--master local[2]]
                                      [--repeat 3] [--out DIR]

Without --store (or when DIR holds no store yet) a store of --files commit-log files of --file-size
bytes is generated first (rmqtool's generator, no index). Then, with the page cache warm:

1. the export command, each engine in a fresh process (as a user runs it): wall-clock seconds;
2. in one process: Spark's fixed start-up cost (session start, first trivial job, stop) and the export
   job (first job of the session, then warm), against the single-process export;
3. the same for one commit-log file, which gives the per-byte rates and the ``--engine auto`` crossover:
   input size where fixed cost + spark rate = single-process rate.

Every export writes a Parquet dataset (one part per commit-log file) into --out, by default a directory
in /dev/shm (RAM), so that the engines are measured and not the disk's write-back: each output is
removed after its run. The engines' runs alternate and each measure is the median of --repeat runs
(the best is printed beside it), so that a busy neighbour on a shared machine skews both alike.
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


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def ensure_store(store: Path, files: int, file_size: int) -> None:
    if (store / "commitlog").is_dir():
        return
    from rmqtool.ops.generate import generate_store

    print(f"generating {files} x {file_size} bytes into {store} ...", file=sys.stderr)
    generate_store(store, files * file_size - (64 << 10), file_size=file_size, index=False)


def warm(paths: list[Path]) -> None:
    buf = bytearray(8 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def scratch_dir(requested: Path | None, need: int) -> Path:
    if requested:
        requested.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="rmqtool-bench-out-", dir=requested))
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > need:
        return Path(tempfile.mkdtemp(prefix="rmqtool-bench-out-", dir=shm))
    return Path(tempfile.mkdtemp(prefix="rmqtool-bench-out-"))


class Runs:
    """Wall-clock seconds of named runs; every run writes into a fresh directory removed afterwards."""

    def __init__(self, scratch: Path):
        self.scratch, self.seconds = scratch, {}

    def run(self, name: str, fn):
        out = self.scratch / name
        started = time.perf_counter()
        result = fn(out)
        self.seconds.setdefault(name, []).append(time.perf_counter() - started)
        shutil.rmtree(out, ignore_errors=True)
        os.sync()
        return result

    def median(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def best(self, name: str) -> float:
        return min(self.seconds[name])


def cli(args: list[str]):
    def run(out: Path) -> None:
        subprocess.run([sys.executable, "-m", "rmqtool", *args, "--to", str(out)], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--file-size", default="1G")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="where the outputs go (default: /dev/shm)")
    args = ap.parse_args()
    file_size = parse_size(args.file_size)
    store = args.store or Path(tempfile.gettempdir()) / f"rmqtool-bench-spark-{args.files}x{args.file_size}" / "store"
    ensure_store(store, args.files, file_size)

    from rmqtool.ops.dataset import export_dataset
    from rmqtool.ops.scan import list_files

    files = list_files([str(store)])
    total = sum(f.size for f in files)
    warm([Path(f.uri) for f in files])
    scratch = scratch_dir(args.out, total)
    runs = Runs(scratch)
    out: dict = {"store": str(store), "files": len(files), "bytes": total, "master": args.master,
                 "out": str(scratch), "repeat": args.repeat, "cpus": os.cpu_count(),
                 "loadavg_before": os.getloadavg()[0]}
    try:
        # 1. the command, one fresh process per run, engines alternating
        for _ in range(args.repeat):
            runs.run("cli_local", cli(["export", str(store), "--engine", "local"]))
            runs.run("cli_spark", cli(["export", str(store), "--engine", "spark", "--master", args.master]))

        # 2. in one process
        from rmqtool.spark.jobs import export_spark
        from rmqtool.spark.session import get_session, stop_session

        t0 = time.perf_counter()
        spark = get_session(args.master, progress=False)
        out["session_start_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        spark.sparkContext.parallelize(range(2), 2).map(lambda x: x).collect()
        out["first_job_s"] = time.perf_counter() - t0
        records = runs.run("spark_cold", lambda o: export_spark(spark, [str(store)], o)).records
        for _ in range(args.repeat):
            assert runs.run("local", lambda o: export_dataset([str(store)], o)).records == records
            assert runs.run("spark_warm", lambda o: export_spark(spark, [str(store)], o)).records == records

        # 3. one file: per-byte rates for the auto crossover
        one = files[:1]
        for _ in range(args.repeat):
            runs.run("one_file_local", lambda o: export_dataset([], o, files=one))
            runs.run("one_file_spark", lambda o: export_spark(spark, [], o, files=one))
        t0 = time.perf_counter()
        stop_session()
        out["stop_s"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    for name in runs.seconds:
        out[f"{name}_s"] = runs.median(name)
        out[f"{name}_best_s"] = runs.best(name)
        out[f"{name}_all_s"] = [round(s, 2) for s in runs.seconds[name]]
    mb = total / 1e6
    fixed = out["session_start_s"] + out["first_job_s"] + out["stop_s"]
    local_rate = out["local_s"] / total                      # seconds per byte, one process
    spark_rate = out["spark_warm_s"] / total                 # seconds per byte, warm session
    out["records"] = records
    out["spark_fixed_s"] = fixed
    out["speedup_job_warm"] = out["local_s"] / out["spark_warm_s"]
    out["speedup_job_cold"] = out["local_s"] / out["spark_cold_s"]
    out["speedup_cli"] = out["cli_local_s"] / out["cli_spark_s"]
    out["auto_crossover_bytes"] = (fixed / (local_rate - spark_rate)) if local_rate > spark_rate else None
    out["loadavg_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    print(f"\n{len(files)} files, {mb:.0f} MB, {records} records, master {args.master}, "
          f"median of {args.repeat} (best), outputs in {scratch.parent}")
    print(f"{'':34}{'seconds':>9}{'best':>8}{'MB/s':>8}")
    for key, label in [("cli_local", "export command, local engine"), ("cli_spark", "export command, spark engine"),
                       ("local", "export job, one process"), ("spark_cold", "export job, spark (1st job)"),
                       ("spark_warm", "export job, spark (warm)"), ("one_file_local", "one file, one process"),
                       ("one_file_spark", "one file, spark (warm)")]:
        size = files[0].size / 1e6 if key.startswith("one_file") else mb
        print(f"{label:34}{out[key + '_s']:9.2f}{out[key + '_best_s']:8.2f}{size / out[key + '_s']:8.0f}")
    print(f"spark fixed cost (start {out['session_start_s']:.1f} s + first job {out['first_job_s']:.1f} s"
          f" + stop {out['stop_s']:.1f} s): {fixed:.1f} s")
    print(f"speed-up spark/local: job warm {out['speedup_job_warm']:.2f}x, job cold {out['speedup_job_cold']:.2f}x, "
          f"command {out['speedup_cli']:.2f}x")
    cross = out["auto_crossover_bytes"]
    print("auto crossover: " + (f"{cross / 1e9:.1f} GB" if cross else "none (spark is not faster per byte here)"))


if __name__ == "__main__":
    main()
