"""Memory stays flat in the number of queues: whole-store commands on a store with 2,000 queues of
full-size (6,000,000-byte) consume-queue files, each in its own process, measured by peak RSS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rmqtool.format.indexfile import Geometry
from rmqtool.ops.generate import generate_store

pytestmark = pytest.mark.slow

LIMIT = 400 * 1024 * 1024
QUEUES = 2000


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wide") / "store"
    generate_store(root, 4 << 20, file_size=1 << 20, topics=QUEUES // 10, queues=10,
                   cq_file_size=6_000_000, index_geometry=Geometry(50_000, 200_000))
    return root


def peak_rss(*args: str) -> tuple[int, subprocess.CompletedProcess]:
    """Run ``rmqtool ARGS`` in a child of a fresh interpreter; (child's peak RSS in bytes, result)."""
    probe = ("import json, resource, subprocess, sys; "
             "r = subprocess.run([sys.executable, '-m', 'rmqtool', *sys.argv[1:]], capture_output=True, text=True); "
             "print(json.dumps([resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode, r.stdout, r.stderr]))")
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True, timeout=600)
    rss_kb, code, stdout, stderr = json.loads(out.stdout)
    return rss_kb * 1024, subprocess.CompletedProcess(args, code, stdout, stderr)


def allocated(root: Path) -> tuple[int, int]:
    """(bytes allocated on disk, apparent size) of every file under root."""
    files = [p.stat() for p in root.rglob("*") if p.is_file()]
    return sum(s.st_blocks * 512 for s in files), sum(s.st_size for s in files)


def test_the_store_has_full_size_queues(wide_store):
    queues = [d for d in (wide_store / "consumequeue").glob("*/*")]
    assert len(queues) > QUEUES * 0.9
    assert all(p.stat().st_size == 6_000_000 for p in (wide_store / "consumequeue").rglob("0000*"))


@pytest.mark.parametrize("command", [["verify", "--check-crc"], ["info"], ["rebuild-cq", "--apply"],
                                     ["rebuild-index", "--apply"]])
def test_whole_store_commands_stay_under_400_mb(wide_store, command):
    rss, result = peak_rss(command[0], str(wide_store), *command[1:], "-f", "jsonl")
    assert result.returncode == 0, result.stderr
    assert rss < LIMIT, f"{command}: peak RSS {rss / 2**20:.0f} MiB"


def test_rebuilt_queues_are_sparse(wide_store):
    rss, result = peak_rss("rebuild-cq", str(wide_store), "--apply")
    assert result.returncode == 0, result.stderr
    used, apparent = allocated(wide_store / "consumequeue")
    files = len(list((wide_store / "consumequeue").rglob("0000*")))
    assert apparent == files * 6_000_000
    assert used <= files * 16 * 1024, f"{used} bytes allocated for {files} files"


def test_repair_of_an_aborted_store_stays_under_400_mb(wide_store, tmp_path):
    (wide_store / "abort").write_bytes(b"")
    try:
        rss, result = peak_rss("repair", str(wide_store), "--apply", "--backup", str(tmp_path / "backup"))
    finally:
        (wide_store / "abort").unlink(missing_ok=True)
    assert result.returncode == 0, result.stderr
    assert rss < LIMIT, f"repair: peak RSS {rss / 2**20:.0f} MiB"
    assert not (wide_store / "abort").exists()


def test_generated_queue_files_are_sparse(tmp_path):
    generate_store(tmp_path / "s", 1 << 20, file_size=1 << 20, topics=20, queues=10, cq_file_size=6_000_000)
    used, apparent = allocated(tmp_path / "s" / "consumequeue")
    assert apparent >= 190 * 6_000_000 and used < apparent / 100
