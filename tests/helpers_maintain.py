"""Helpers for the verify/repair/rebuild/write tests: the CLI in a child process, snapshot a store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_process(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI in a child process (for fault injection and lock tests)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "rmqtool", *map(str, args)], capture_output=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}
