"""Bulk work on Apache Spark through PySpark: the ``rocketmq`` data source, the session, and the
Spark engine of export / stats / verify / grep. Nothing here imports pyspark at import time.
"""

from __future__ import annotations

import os

ENGINES = ("local", "spark", "auto")
# --engine auto runs Spark above this much commit-log input (bytes), one process below it. Measured
# with tests/bench/bench_spark.py on 2 cores (local[2]): Spark's fixed cost 11-15 s, its export
# 1.7-1.8x the single process, a crossover of 4.3 GB (output in RAM) to 5.9 GB (output on disk).
AUTO_SPARK_BYTES = int(os.environ.get("RMQTOOL_SPARK_AUTO_BYTES", 6 << 30))


def pick_engine(engine: str, input_bytes: int, master: str | None = None) -> str:
    """local or spark: ``auto`` picks Spark for inputs above AUTO_SPARK_BYTES (or any input when a
    cluster master is given), when PySpark is installed."""
    if engine != "auto":
        return engine
    from rmqtool.spark.session import MASTER_ENV

    cluster = (master or os.environ.get(MASTER_ENV) or "local").startswith(("spark://", "yarn", "k8s://"))
    if not cluster and input_bytes < AUTO_SPARK_BYTES:
        return "local"
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "local"
    return "spark"
