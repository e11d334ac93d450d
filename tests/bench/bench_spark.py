"""Benchmark of the Spark engine against the single process (not a pytest test).

    python tests/bench/bench_spark.py [--store DIR] [--files 4] [--file-size 1G] [--master local[2]] [--repeat 2]

Without --store (or when DIR holds no store yet) a store of --files commit-log files of --file-size
bytes is generated first (rmqtool's generator, no index). Then, with the page cache warm:

1. the export command, each engine in a fresh process (as a user runs it): wall-clock seconds;
2. in one process: Spark's fixed start-up cost (session start, first trivial job) and the export job
   alone (first job of the session, then again warm), against the single-process export (best of
   --repeat runs each: the machine is shared);
3. the same for one commit-log file, which gives the per-byte rates and the ``--engine auto`` crossover:
   input size where fixed cost + spark rate = single-process rate.

Every export writes a Parquet dataset (one part per commit-log file) into a scratch directory.
"""

from __future__ import annotations

import argparse
import json
import shutil
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


def timed(fn, repeat: int = 1) -> tuple[float, object]:
    """The best wall-clock time of ``repeat`` runs, and the last result."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - started)
    return best, out


def cli_run(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rmqtool", *args], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--file-size", default="1G")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    file_size = parse_size(args.file_size)
    store = args.store or Path(tempfile.gettempdir()) / f"rmqtool-bench-spark-{args.files}x{args.file_size}" / "store"
    ensure_store(store, args.files, file_size)

    from rmqtool.ops.dataset import export_dataset
    from rmqtool.ops.scan import list_files

    files = list_files([str(store)])
    total = sum(f.size for f in files)
    warm([Path(f.uri) for f in files])
    scratch = Path(tempfile.mkdtemp(prefix="rmqtool-bench-out-"))
    out: dict = {"store": str(store), "files": len(files), "bytes": total, "master": args.master}
    try:
        # 1. the command, one fresh process per engine
        out["cli_local_s"] = cli_run(["export", str(store), "--to", str(scratch / "cli-local"), "--engine", "local"])
        out["cli_spark_s"] = cli_run(["export", str(store), "--to", str(scratch / "cli-spark"), "--engine", "spark",
                                      "--master", args.master])

        # 2. in one process
        out["local_s"], result = timed(lambda: export_dataset([str(store)], scratch / "local", overwrite=True),
                                       args.repeat)
        records = result.records
        from rmqtool.spark.jobs import export_spark
        from rmqtool.spark.session import get_session, stop_session

        out["session_start_s"], spark = timed(lambda: get_session(args.master, progress=False))
        out["first_job_s"], _ = timed(lambda: spark.sparkContext.parallelize(range(2), 2).map(lambda x: x).collect())
        out["spark_cold_s"], r = timed(lambda: export_spark(spark, [str(store)], scratch / "spark-cold"))
        assert r.records == records
        out["spark_warm_s"], _ = timed(lambda: export_spark(spark, [str(store)], scratch / "spark-warm",
                                                            overwrite=True), args.repeat)

        # 3. one file: per-byte rates for the auto crossover
        one = files[:1]
        out["one_file_local_s"], _ = timed(lambda: export_dataset([], scratch / "one-local", files=one,
                                                                  overwrite=True), args.repeat)
        out["one_file_spark_s"], _ = timed(lambda: export_spark(spark, [], scratch / "one-spark", files=one,
                                                                overwrite=True), args.repeat)
        t0 = time.perf_counter()
        stop_session()
        out["stop_s"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

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
    print(json.dumps(out, indent=2))
    print(f"\n{len(files)} files, {mb:.0f} MB, {records} records, master {args.master}")
    print(f"{'':34}{'seconds':>9}{'MB/s':>8}")
    for key, label in [("cli_local_s", "export command, local engine"), ("cli_spark_s", "export command, spark engine"),
                       ("local_s", "export job, one process"), ("spark_cold_s", "export job, spark (1st job)"),
                       ("spark_warm_s", "export job, spark (warm)")]:
        print(f"{label:34}{out[key]:9.2f}{mb / out[key]:8.0f}")
    print(f"spark fixed cost (start {out['session_start_s']:.1f} s + first job {out['first_job_s']:.1f} s"
          f" + stop {out['stop_s']:.1f} s): {fixed:.1f} s")
    print(f"speed-up spark/local: job warm {out['speedup_job_warm']:.2f}x, job cold {out['speedup_job_cold']:.2f}x, "
          f"command {out['speedup_cli']:.2f}x")
    cross = out["auto_crossover_bytes"]
    print("auto crossover: " + (f"{cross / 1e9:.1f} GB" if cross else "none (spark is not faster per byte here)"))


if __name__ == "__main__":
    main()
