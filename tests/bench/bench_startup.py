"""Start-up benchmark: whole commands on a bundled store as same-run ratios (not a pytest test).

    python tests/bench/bench_startup.py [--store DIR ...] [--repeat 5] [--no-install] [--no-spark] [--demo]

1. warm start-up, on each store (default: the bundled dev-sample, dev-sample-5x and dev-config-5x): each
   read command against ``rmqtool --version``, run in turn (version, command, version, ...), the median of
   the pairwise wall-time ratios (target <= 2.5x) and of the CPU-time (user + sys) ratios, which a shared
   machine's load disturbs less; --version and --help themselves (target <= 0.15 s); a path that is not a
   store (refused before the bulk modules load);
2. the first run after a fresh non-editable install (a wheel of this tree into a new venv whose
   dependencies are this environment's site-packages): ``verify --check-crc`` with an empty
   NUMBA_CACHE_DIR against ``--version`` of that install (target <= 6x);
3. ``export --engine spark`` of the store against a bare local Spark session that runs one trivial job
   and stops, in turn (target <= 1.3x);
4. with --demo, ``make demo`` in the venv of this interpreter, as installed (target <= 30 s).

The machine's load average is printed before and after: on a shared machine quote the ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from helpers_install import fresh_install  # noqa: E402  (after the path)
BARE_SPARK = ("from pyspark.sql import SparkSession\n"
              "s = SparkSession.builder.master('local[*]').config('spark.ui.enabled', 'false').getOrCreate()\n"
              "s.range(1).count()\ns.stop()")


def run(argv: list[str], env: dict[str, str] | None = None, ok=(0, 1)) -> tuple[float, float]:
    """(wall seconds, user + sys CPU seconds) of one command, its output discarded."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(map(str, argv))}: exit {proc.returncode}: {proc.stderr.decode()[-400:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def paired(a: list[str], b: list[str], repeat: int, env=None, ok=(0, 1), prepare=None) -> dict[str, float]:
    """a and b in turn, ``repeat`` times after one warm-up each: medians and the median ratio a/b."""
    runs = []
    for k in range(repeat + 1):
        if prepare:
            prepare()
        ta = run(a, env, ok)
        tb = run(b, env, ok)
        if k:
            runs.append((ta, tb))
    return {"wall": statistics.median(ta[0] for ta, _ in runs), "cpu": statistics.median(ta[1] for ta, _ in runs),
            "base": statistics.median(tb[0] for _, tb in runs),
            "ratio": statistics.median(ta[0] / tb[0] for ta, tb in runs),
            "cpu_ratio": statistics.median(ta[1] / tb[1] for ta, tb in runs)}


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs"


def startup(rmqtool: list[str], store: str, repeat: int, env: dict[str, str]) -> None:
    out = tempfile.mkdtemp()
    commands = {
        "verify": ["verify", store], "verify --check-crc": ["verify", "--check-crc", store],
        "stats": ["stats", store], "info": ["info", store],
        "export (Parquet)": ["export", store, "--to", f"{out}/r.parquet", "--force"],
        "export (JSONL)": ["export", store, "--to", f"{out}/r.jsonl", "--force"],
        "query-key": ["query-key", store, "TopicA", "key-1"], "cat-cq": ["cat-cq", store, "TopicA", "0"],
        "cat-commitlog -f jsonl": ["cat-commitlog", store, "-f", "jsonl"],
        "verify NOT-A-STORE": ["verify", out],
    }
    version = rmqtool + ["--version"]
    print(f"\n1. warm start-up on {store}, median of {repeat} (wall; target: command <= 2.5x --version)")
    for name in ("--version", "--help"):
        runs = [run(rmqtool + [name], env) for _ in range(repeat + 1)][1:]
        print(f"   {name:24} {statistics.median(w for w, _ in runs):6.3f} s, "
              f"{statistics.median(c for _, c in runs):.3f} CPU-s   (target <= 0.15 s)")
    print(f"   {'command':24} {'wall':>7} {'CPU':>7} {'x --version':>12} {'CPU x':>6}")
    for name, args in commands.items():
        r = paired(rmqtool + args, version, repeat, env, ok=(0, 1, 4))
        verdict = "met" if r["ratio"] <= 2.5 and r["cpu_ratio"] <= 2.5 else \
            "met (CPU)" if r["cpu_ratio"] <= 2.5 else "met (wall)" if r["ratio"] <= 2.5 else "MISSED"
        print(f"   {name:24} {r['wall']:6.3f}s {r['cpu']:6.3f}s {r['ratio']:11.2f}x {r['cpu_ratio']:5.2f}x  {verdict}",
              flush=True)


def first_run(store: str, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rmqtool = str(fresh_install(Path(tmp)))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
        caches = iter(range(1000))

        def empty_cache():
            env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(dir=tmp, prefix=f"cache-{next(caches)}-")
        r = paired([rmqtool, "verify", "--check-crc", store], [rmqtool, "--version"], repeat, env,
                   prepare=empty_cache)
        print(f"\n2. first run after a fresh non-editable install, empty NUMBA_CACHE_DIR each time (median of {repeat})")
        print(f"   verify --check-crc {r['wall']:.3f} s wall, {r['cpu']:.3f} CPU-s; --version {r['base']:.3f} s: "
              f"{r['ratio']:.2f}x (CPU {r['cpu_ratio']:.2f}x)  target <= 6x: {'met' if r['ratio'] <= 6 else 'MISSED'}")


def spark(rmqtool: list[str], store: str, repeat: int, env: dict[str, str]) -> None:
    out = tempfile.mkdtemp()
    r = paired(rmqtool + ["export", store, "--to", f"{out}/spark", "--engine", "spark", "--force"],
               [sys.executable, "-c", BARE_SPARK], repeat, env)
    print(f"\n3. export --engine spark of {store} against a bare local session + one trivial job (median of {repeat})")
    print(f"   export {r['wall']:.2f} s; bare session {r['base']:.2f} s: {r['ratio']:.2f}x  target <= 1.3x: "
          f"{'met' if r['ratio'] <= 1.3 else 'MISSED'}")


def demo() -> None:
    venv = Path(sys.executable).parent.parent
    started = time.perf_counter()
    # -o: the venv as it is (make demo would otherwise reinstall into it when pyproject.toml is newer)
    proc = subprocess.run(["make", "-s", "-o", f"{venv}/bin/rmqtool", "demo", f"VENV={venv}"], cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    wall = time.perf_counter() - started
    print(f"\n4. make demo (installed in {venv}): exit {proc.returncode}, {wall:.1f} s  target <= 30 s: "
          f"{'met' if wall <= 30 and proc.returncode == 0 else 'MISSED'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", action="append", help="a store to start on (repeatable; default: the bundled "
                    "dev-sample, dev-sample-5x and dev-config-5x)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-install", action="store_true", help="skip the fresh-install first run")
    ap.add_argument("--no-spark", action="store_true", help="skip the Spark comparison")
    ap.add_argument("--demo", action="store_true", help="also time make demo")
    opts = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    rmqtool = [str(Path(sys.executable).parent / "rmqtool")]
    stores = opts.store or [str(ROOT / "fixtures" / name / "store")
                            for name in ("dev-sample", "dev-sample-5x", "dev-config-5x")]
    print(load())
    for store in stores:
        startup(rmqtool, store, opts.repeat, env)
    if not opts.no_install:
        first_run(stores[0], opts.repeat)
    if not opts.no_spark:
        spark(rmqtool, stores[0], max(opts.repeat // 2, 2), env)
    if opts.demo:
        demo()
    print(load())


if __name__ == "__main__":
    main()
