"""Commands that read one record start without the bulk machinery: numpy, pyarrow, numba and the
columnar scan kernel are not imported (they take most of a bulk command's start-up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, store_path
from helpers_install import fresh_install

_PROBE = """
import json, runpy, sys
sys.argv = ["rmqtool"] + sys.argv[1:]
try:
    runpy.run_module("rmqtool", run_name="__main__")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "pyarrow", "numba")
               or m.startswith("rmqtool.columnar"))
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


@pytest.mark.parametrize("args", [
    ["cat-commitlog", "{store}", "-n", "1"],
    ["cat-commitlog", "{store}", "-n", "1", "-f", "plain"],
    ["query-id", "{store}", "C0A8000A00002A9F0000000000000000"],
    ["decode-id", "C0A8000A00002A9F0000000000000000"],
    ["checkpoint", "{store}"],
])
def test_one_record_commands_import_no_bulk_modules(args):
    argv = [a.format(store=store_path("dev-sample")) for a in args]
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    probe = json.loads(proc.stderr.strip().splitlines()[-1])
    assert probe["code"] in (0, None) and proc.stdout
    assert probe["heavy"] == []


def test_put_imports_no_bulk_modules(store_copy, tmp_path):
    """A one-message write starts like a one-record read: its commit-log end, queue tail and index slots
    are found without numpy."""
    root = store_copy("dev-sample")
    argv = ["put", str(root), "--topic", "TopicA", "--body", "hi", "--backup", str(tmp_path / "bk"), "--apply"]
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    probe = json.loads(proc.stderr.strip().splitlines()[-1])
    assert probe["code"] in (0, None) and proc.stdout, proc.stderr
    assert probe["heavy"] == []


@pytest.mark.parametrize("args", [
    ["verify", "--check-crc", "{store}"],
    ["stats", "{store}", "--by", "topic"],
    ["info", "{store}"],
    ["export", "{store}", "--to", "{out}/records.parquet"],
    ["cat-commitlog", "{store}", "-f", "jsonl"],
])
def test_small_store_commands_load_no_compiled_code(args, tmp_path):
    """A small store is read without numba: the kernel's small-input path (plain Python) or the
    record-at-a-time decoder; nothing is loaded from the compiled-code cache, nothing is compiled."""
    argv = [a.format(store=store_path("dev-sample"), out=tmp_path) for a in args]
    probe = _PROBE.replace('("numpy", "pyarrow", "numba")', '("numba", "llvmlite", "pandas")')
    proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] in (0, None), proc.stderr
    assert not [m for m in result["heavy"] if not m.startswith("rmqtool.")], result


@pytest.mark.parametrize("name", ["dev-sample", "dev-compaction-5x"])
@pytest.mark.parametrize("args", [["info"], ["verify"], ["verify", "--check-crc"]])
def test_small_store_commands_import_no_pyarrow(args, name):
    """info's and verify's record walks on the small-input path take numpy's buffers, not Arrow's pool (nor
    pyarrow.compute, multiprocessing or numpy.ma: verify's own imports); a few records of compaction topics
    are read one at a time (ops.compaction's small path)."""
    probe = _PROBE.replace('("numpy", "pyarrow", "numba")', '("pyarrow", "numba", "pandas", "multiprocessing")'
                           ' or m == "numpy.ma"')
    proc = subprocess.run([sys.executable, "-c", probe, *args, str(store_path(name))], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] in (0, None) and ("messages" in proc.stdout or args[0] == "verify"), proc.stderr
    assert not [m for m in result["heavy"] if not m.startswith("rmqtool.")], result


@pytest.mark.parametrize("name", ["dev-sample-5x", "dev-timer-5x"])
def test_verify_of_a_5x_store_without_compaction_queues_imports_no_pyarrow(name):
    """A 5.x store has compaction/ (its position-checkpoint) whether or not a topic is compacted: with no
    compaction log, the compaction checks import nothing (verify stays on numpy, as on a 4.9.7 store)."""
    probe = _PROBE.replace('("numpy", "pyarrow", "numba")', '("pyarrow", "numba", "pandas", "multiprocessing")')
    proc = subprocess.run([sys.executable, "-c", probe, "verify", str(store_path(name))], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] in (0, 1, None), proc.stderr
    assert not [m for m in result["heavy"] if not m.startswith("rmqtool.")], result


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x"])
@pytest.mark.parametrize("by", [[], ["--by", "topic"], ["--by", "hour"]])
def test_small_store_stats_imports_no_bulk_modules(name, by):
    """stats of a small store totals its records one by one: no numpy, pyarrow (nor pyarrow.compute), numba
    or columnar kernel (listing its files takes no pyarrow.fs either)."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, "stats", str(store_path(name)), *by, "-f", "jsonl"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] in (0, None) and '"messages"' in proc.stdout, proc.stderr
    assert result["heavy"] == []


@pytest.mark.parametrize("by", [[], ["--by", "topic"], ["--by", "queue"]])
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_bulk_stats_of_several_files_imports_no_group_by(by, jobs):
    """stats over the bulk path of a store of three commit-log files, its windows summed from the facts pass:
    the files' partial sums are merged by numpy (``stats.merge``), in one process or after the workers, so
    neither pyarrow.compute nor Acero is imported."""
    probe = _PROBE.replace('("numpy", "pyarrow", "numba")', '()').replace(
        'or m.startswith("rmqtool.columnar")', 'or m in ("pyarrow.compute", "pyarrow._acero", "pyarrow.acero")').replace(
        "import json, runpy, sys\n", "import json, runpy, sys\nfrom rmqtool.ops import scan\n"
        "scan.FEW_BYTES = -1                 # the bulk path\n")
    store = store_path("dev-sample")
    assert len(list((store / "commitlog").iterdir())) > 1
    proc = subprocess.run([sys.executable, "-c", probe, "stats", str(store), *by, "--jobs", jobs, "-f", "jsonl"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] in (0, None) and '"messages"' in proc.stdout, proc.stderr
    assert result["heavy"] == []


@pytest.mark.parametrize("name", ["dev-sample", "dev-config-5x"])
@pytest.mark.parametrize("args", [["{out}/r.jsonl"], ["{out}/r.csv", "--check-crc"], ["{out}/r.jsonl", "--topic", "TopicA"]])
def test_small_store_text_export_imports_no_bulk_modules(name, args, tmp_path):
    """export of a small store to JSON lines or CSV writes its records one by one: no numpy, pyarrow, numba or
    columnar kernel."""
    argv = ["export", str(store_path(name)), "--to", *(a.format(out=tmp_path) for a in args)]
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] in (0, None) and (tmp_path / os.path.basename(args[0])).stat().st_size, proc.stderr
    assert result["heavy"] == []


@pytest.mark.parametrize("name", ["dev-sample", "dev-config-5x"])
def test_small_store_parquet_export_imports_only_what_parquet_needs(name, tmp_path):
    """export of a small store to Parquet builds one record batch from its records, read one by one: pyarrow
    and pyarrow.parquet, but no pyarrow.compute, pyarrow.dataset, pandas or numba."""
    probe = _PROBE.replace('("numpy", "pyarrow", "numba")', '("numba", "pandas")').replace(
        'or m.startswith("rmqtool.columnar")', 'or m in ("pyarrow.compute", "pyarrow.dataset", "pyarrow.parquet")')
    proc = subprocess.run([sys.executable, "-c", probe, "export", str(store_path(name)), "--to",
                           str(tmp_path / "r.parquet")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] in (0, None) and (tmp_path / "r.parquet").stat().st_size, proc.stderr
    assert result["heavy"] == ["pyarrow.parquet"]


@pytest.mark.parametrize("name", ["dev-config-5x", "dev-batchcq-5x", "dev-lmq-5x"])
@pytest.mark.parametrize("crc", [[], ["--check-crc"]])
def test_verify_of_batch_and_lmq_queues_of_a_small_store_imports_no_pyarrow(name, crc):
    """A small store's batch and LMQ queues are checked against a dispatch whose INNER_* properties are Python
    strings (the records scanned as plain Python): no pyarrow (nor pyarrow.compute) to import."""
    probe = _PROBE.replace('("numpy", "pyarrow", "numba")', '("pyarrow", "numba", "pandas", "multiprocessing")')
    proc = subprocess.run([sys.executable, "-c", probe, "verify", *crc, str(store_path(name))], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] in (0, None), proc.stderr
    assert not [m for m in result["heavy"] if not m.startswith("rmqtool.")], result


@pytest.mark.parametrize("command", ["verify", "info"])
def test_compaction_topics_on_the_columnar_scan_import_no_pandas(command):
    """Beyond a few records, verify and info read compaction topics into Arrow arrays (pyarrow imported on the
    way): pyarrow's first conversion then finds no pandas to import (cli.output.skip_pandas_probe, left to run
    once pyarrow is)."""
    probe = _PROBE.replace('("numpy", "pyarrow", "numba")', '("pyarrow", "pandas")').replace(
        "import json, runpy, sys\n", "import json, runpy, sys\nfrom rmqtool.ops import compaction\n"
        "compaction.FEW_RECORDS = 0                 # the columnar scan\n")
    proc = subprocess.run([sys.executable, "-c", probe, command, str(store_path("dev-compaction-5x"))],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] in (0, None), proc.stderr
    assert "pyarrow.compute" in result["heavy"] and not [m for m in result["heavy"] if m.startswith("pandas")], result


@pytest.mark.parametrize("given", [None, "3"])
def test_the_cli_asks_numpy_for_one_blas_thread(given, monkeypatch):
    """numpy's OpenBLAS starts a thread per core as numpy is imported, and rmqtool does no linear algebra: the
    command line asks for one thread, unless the user set a number."""
    from rmqtool.cli import main

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", given or "")       # (undone after the test either way)
    if given is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    with pytest.raises(SystemExit):
        main(["--version"])
    assert os.environ["OPENBLAS_NUM_THREADS"] == (given or "1")


@pytest.mark.parametrize("args", [
    ["verify", "{path}"], ["verify", "--check-crc", "{path}"], ["stats", "{path}"], ["info", "{path}"],
    ["export", "{path}", "--to", "{out}/records.parquet"], ["export", "{path}", "--to", "{out}/dataset"],
    ["grep", "{path}", "--topic", "TopicA"], ["cat-commitlog", "{path}", "-f", "jsonl"],
])
@pytest.mark.parametrize("what", ["not-a-store", "missing"])
def test_a_path_that_is_no_store_is_refused_before_heavy_imports(args, what, tmp_path):
    """A shell loop over paths that are not all stores pays a start-up per path, not a bulk command's."""
    path = tmp_path / what
    if what == "not-a-store":
        (path / "somedir").mkdir(parents=True)
    argv = [a.format(path=path, out=tmp_path / "out") for a in args]
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = proc.stderr.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["code"] == 4 and lines[0].startswith("rmqtool: error: ") and str(path) in lines[0], proc.stderr
    assert result["heavy"] == []


_RUN_ALL = """
import json, sys, tempfile
from pathlib import Path
from click.testing import CliRunner
from rmqtool.columnar import kernel
if sys.argv[1] == "compiled":
    kernel.load_compiled()
else:
    kernel._PLAIN[0] = 10 ** 9          # every record on the plain path
from rmqtool.ops import compaction
compaction.FEW_RECORDS = 0              # compaction topics on the scan kernel too
from rmqtool.cli import cli
import pyarrow.parquet as pq
out = {}
for store in sys.argv[2:]:
    for args in (["verify", "--check-crc", "-f", "jsonl"], ["stats", "--by", "queue", "-f", "jsonl"],
                 ["info", "-f", "jsonl"], ["export", "--to", "{tmp}/r.parquet"]):
        with tempfile.TemporaryDirectory() as tmp:
            argv = ["--now", "2026-12-01T00:00:00Z"] + [a.format(tmp=tmp) for a in args] + [store]
            r = CliRunner().invoke(cli, argv)
            got = [r.exit_code, r.stdout]
            if args[0] == "export" and Path(tmp, "r.parquet").exists():
                got.append(json.dumps(pq.read_table(Path(tmp, "r.parquet")).to_pylist(), default=repr))
            out[" ".join([store] + args[:1])] = got
print(json.dumps(out))
"""


@pytest.mark.slow
def test_plain_path_matches_compiled_code():
    """The kernel's functions run as plain Python (the small-input path) give what their compiled code
    gives: verify with CRCs, stats, info and a Parquet export of every kind of bundled store."""
    stores = [str(store_path(name)) for name in ("dev-sample", "dev-sample-5x-crash-torn", "dev-lmq-5x",
                                                 "dev-batchcq-5x", "dev-dledger", "dev-compaction-5x",
                                                 "dev-damage-midfile-crc-497", "dev-timer-5x")]
    runs = {}
    for mode in ("plain", "compiled"):
        proc = subprocess.run([sys.executable, "-c", _RUN_ALL, mode, *stores], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[mode] = json.loads(proc.stdout)
    assert runs["plain"].keys() == runs["compiled"].keys()
    for key, got in runs["plain"].items():
        assert got == runs["compiled"][key], key
    assert any(code == 1 for code, *_ in runs["plain"].values())       # the damaged store's CRC errors too


def _cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    """User + sys CPU seconds of one command run to its end (its output discarded)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr.decode()[-1000:]
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


@pytest.mark.slow
def test_first_command_after_a_fresh_install_compiles_nothing(tmp_path):
    """After a non-editable install into a new venv, with an empty compiled-code cache, the first
    `verify --check-crc` of the bundled store costs at most 6 times `--version` (CPU seconds, median of
    three fresh caches; CPU time, not wall: the machine may be shared), and it leaves no compiled code. The
    install pins Spark's Python workers to its interpreter."""
    rmqtool = fresh_install(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    where = subprocess.run([rmqtool.parent / "python", "-c", "import rmqtool; print(rmqtool.__file__)"],
                           env=env, capture_output=True, text=True, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    where = where.stdout
    assert where.startswith(str(tmp_path / "venv")), where
    # the wheel installs rmqtool-pyspark.pth: importing PySpark pins Spark's Python workers to this venv
    pinned = subprocess.run([rmqtool.parent / "python", "-c",
                             "import os, pyspark; print(os.environ['PYSPARK_DRIVER_PYTHON'])"],
                            env={k: v for k, v in env.items() if not k.startswith("PYSPARK")},
                            capture_output=True, text=True, cwd=tmp_path)
    assert pinned.stdout.strip() == str(rmqtool.parent / "python"), pinned.stderr
    store = str(store_path("dev-sample"))
    _cpu_seconds([rmqtool, "--version"], env)           # the interpreter and click read from disk once
    version, first = [], []
    for k in range(3):
        cache = tmp_path / f"numba-cache-{k}"
        cache.mkdir()
        run_env = {**env, "NUMBA_CACHE_DIR": str(cache)}
        version.append(_cpu_seconds([rmqtool, "--version"], run_env))
        first.append(_cpu_seconds([rmqtool, "verify", "--check-crc", store], run_env))
        assert not any(cache.rglob("*.nbi")), "compiled code was cached: the first run compiled"
    ratio = sorted(first)[1] / sorted(version)[1]
    assert ratio <= 6, (first, version)
