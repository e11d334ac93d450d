"""The interpreter of Spark's driver-side Python workers: the one rmqtool is installed in.

Spark (4.x) looks up and plans Python data sources in workers its JVM starts with
``$PYSPARK_DRIVER_PYTHON``, else ``$PYSPARK_PYTHON``, else the ``python3`` on PATH
(``PythonUtils.createPythonFunction``); a script run without an activated virtualenv (cron:
``.venv/bin/python job.py``) would get an interpreter without rmqtool and Spark's bare
``DATA_SOURCE_NOT_FOUND``. The install's ``rmqtool-pyspark.pth`` calls :func:`watch` at interpreter start, so
the first ``import pyspark`` of any program of this environment pins those workers to its interpreter,
unless the user chose one. Nothing else is touched, and a program that never imports PySpark is not changed.
"""

from __future__ import annotations

import os
import sys

def pin_workers() -> None:
    """Spark's Python workers run with this interpreter when neither variable names one."""
    if not (os.environ.get("PYSPARK_DRIVER_PYTHON") or os.environ.get("PYSPARK_PYTHON")):
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


class _OnPySpark:
    """A meta-path finder that finds nothing: it pins the workers when ``pyspark`` is first imported."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "pyspark":
            if cls in sys.meta_path:
                sys.meta_path.remove(cls)
            pin_workers()
        return None


def watch() -> None:
    if "pyspark" in sys.modules:
        pin_workers()
    elif _OnPySpark not in sys.meta_path:
        sys.meta_path.insert(0, _OnPySpark)
