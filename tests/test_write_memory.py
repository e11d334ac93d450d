"""Issue point: write commands stream their index and queue files, so a store with 2,000 queues and the
default index geometry (5,000,000 slots, 20,000,000 entries: a 420 MB index file) is repaired and rebuilt
in well under 400 MB. Peak RSS is measured by a wrapper process around each command (its children's
ru_maxrss), not by the test process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers_maintain import ROOT

LIMIT_MB = 400
_WRAPPER = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-m", "rmqtool", *sys.argv[1:]], capture_output=True)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak(*args) -> tuple[int, int]:
    """(exit status, peak RSS in MB) of one command."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _WRAPPER, *map(str, args)], capture_output=True, text=True,
                         env=env, timeout=600, check=True).stdout.split()
    return int(out[0]), int(out[1]) // 1024


@pytest.mark.slow
def test_write_commands_stream_at_the_default_index_geometry(tmp_path):
    root = tmp_path / "store"
    status, _ = _peak("generate", root, "--size", "4M", "--file-size", "1M", "--topics", "250", "--queues", "8",
                      "--cq-file-size", "6000")
    assert status == 0 and (root / "consumequeue").is_dir()
    assert sum(1 for _ in (root / "consumequeue").glob("*/*")) >= 1_900          # ~2,000 queues
    index = next((root / "index").iterdir())
    assert index.stat().st_size == 40 + 5_000_000 * 4 + 20_000_000 * 20          # the default geometry
    peaks = {}
    for name, args in (("rebuild-index --dry-run", ("rebuild-index", root, "--dry-run")),
                       ("rebuild-index", ("rebuild-index", root, "--backup", tmp_path / "b1", "--apply")),
                       ("rebuild-cq", ("rebuild-cq", root, "--backup", tmp_path / "b2", "--apply"))):
        status, peaks[name] = _peak(*args)
        assert status == 0, name
    last = sorted((root / "commitlog").iterdir())[-1]          # a torn tail: the last file's first record
    with open(last, "r+b") as fh:                                 # loses its magic, so repair cuts it and
        fh.seek(4)                                                # rebuilds the index file holding its keys
        fh.write(bytes(4))
    status, peaks["repair --apply"] = _peak("repair", root, "--apply", "--backup", tmp_path / "b3")
    assert status == 0
    assert _peak("verify", root)[0] == 0
    assert all(mb < LIMIT_MB for mb in peaks.values()), peaks
