"""Helpers for the verify/repair/rebuild/write tests: run the CLI, snapshot a store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from rmqtool.cli import cli

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, input: bytes | None = None):
    """The CLI in-process (stdout and stderr kept apart)."""
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)


def run_process(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI in a child process (for fault injection and lock tests)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "rmqtool", *map(str, args)], capture_output=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}
