"""Commands that read one record start without the bulk machinery: numpy, pyarrow, numba and the
columnar scan kernel are not imported (they take most of a bulk command's start-up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, store_path

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
