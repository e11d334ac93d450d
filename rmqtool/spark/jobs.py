"""export / stats / verify / grep on Spark: one task per commit-log file.

Every task runs the single-process engine's per-file function (``write_part``, ``file_stats``,
``file_hits``, ``check_file``) and the driver merges the results with the same code the
single-process engine uses, so the output is identical. Bytes stay in Arrow inside the tasks: only
small results (partial sums, hits, part metadata, findings) travel back to the driver.
"""

from __future__ import annotations

from typing import Callable, Iterator

from rmqtool.ops import scan
from rmqtool.ops.workers import guard, unguard


def spark_map(spark, fn: Callable, items: list) -> list:
    """``[fn(item) for item in items]`` as one Spark task per item; an RmqError raised by a task is
    raised here with the same one-line message (the first one in item order)."""
    if not items:
        return []
    rdd = spark.sparkContext.parallelize(items, len(items))
    return unguard(rdd.map(lambda item: guard(fn, item)).collect())


def _collecting(fn: Callable) -> Callable:
    """``fn(f, on_damage=...)`` returning (result, damage messages) for a task."""
    def run(f):
        damaged: list[str] = []
        return fn(f, on_damage=lambda exc: damaged.append(str(exc))), damaged
    return run


def stats_spark(spark, files: list[scan.StoreFile], by: str | None,
                on_damage: Callable[[str], None] | None = None, where=None) -> list[dict]:
    from rmqtool.ops.stats import file_stats, merge, stats_rows

    results = spark_map(spark, _collecting(lambda f, on_damage: file_stats(f, by, on_damage, where)), files)
    for _, damaged in results:
        for message in damaged:
            if on_damage:
                on_damage(message)
    return stats_rows(merge([table for table, _ in results], by), by)


def grep_spark(spark, files: list[scan.StoreFile], where, *, decompress: bool = False,
               on_damage: Callable[[str], None] | None = None) -> Iterator:
    from rmqtool.ops.grep import file_hits

    where.compiled()
    results = spark_map(spark, _collecting(
        lambda f, on_damage: file_hits(f, where, decompress=decompress, on_damage=on_damage)), files)
    for table, damaged in results:
        for message in damaged:
            if on_damage:
                on_damage(message)
        yield table


def export_spark(spark, store_paths, to, fmt: str = "parquet", partition_by: tuple[str, ...] = (), **options):
    """The dataset export of ``rmqtool.ops.dataset`` with one Spark task per commit-log file; tasks
    write their parts with pyarrow (Spark's own writer goes through JVM rows and is far slower)."""
    from rmqtool.ops.dataset import export_dataset

    return export_dataset(store_paths, to, fmt, partition_by,
                          runner=lambda fn, items: spark_map(spark, fn, items), **options)


def verify_spark(spark, path, deep: bool = False):
    """verify_store with one task per commit-log file: each walks its file and joins the consume-queue
    units and index entries pointing into it; only findings and per-queue summaries come back."""
    from rmqtool.ops.verify import verify_store

    return verify_store(path, deep=deep, run_files=lambda fn, items: spark_map(spark, fn, items))
