"""A fresh, non-editable install of this tree, offline (the first-run test and tests/bench/bench_startup.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fresh_install(tmp: Path) -> Path:
    """A new venv with rmqtool installed from a wheel of this tree (not editable; its dependencies taken
    from the running environment's site-packages, offline): its ``rmqtool`` script."""
    wheels, venv = tmp / "wheels", tmp / "venv"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--ignore-installed", "-q", *map(str, wheels.glob("*.whl"))], check=True, capture_output=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return venv / "bin" / "rmqtool"
