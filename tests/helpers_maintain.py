"""Helpers for the verify/repair/rebuild/write tests: the CLI in a child process, snapshot a store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_process(*args: str, env: dict | None = None, timeout: float = 60,
                closed_stdout: bool = False) -> subprocess.CompletedProcess:
    """The CLI in a child process (for fault injection and lock tests). ``closed_stdout``: its stdout is a
    pipe nobody reads (every write fails with EPIPE, as after ``| head -1`` or ``| grep -q`` exits)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    command = [sys.executable, "-m", "rmqtool", *map(str, args)]
    if not closed_stdout:
        return subprocess.run(command, capture_output=True, env=full_env, timeout=timeout, cwd=ROOT)
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(command, stdout=write, stderr=subprocess.PIPE, env=full_env, timeout=timeout, cwd=ROOT)
    finally:
        os.close(write)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}
