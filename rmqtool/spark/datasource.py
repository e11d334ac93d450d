"""The ``rocketmq`` PySpark Python Data Source.

    spark.read.format("rocketmq").load("/data/broker-a/store")
    spark.read.format("rocketmq").option("kind", "consumequeue").load(["/data/*/store"])

PySpark (4.0+) finds it by name in any session: it registers the ``DefaultSource`` of every installed
top-level module named ``pyspark_*`` (``pyspark_rocketmq`` here). Options (README, "The rocketmq data
source"): ``kind`` = commitlog (default) | consumequeue (both queue layouts) | batchconsumequeue | index;
``checkCrc`` and ``decompress``; ``mode`` = failfast | permissive; ``includeBlank`` (BLANK padding
records, left out by default); ``since`` / ``until``; ``pruneFiles``; ``pushFilters``. One input partition per store
file that may hold a wanted row; each yields Arrow record batches.

With ``pushFilters`` = true, filters on ``topic``, ``queue_id``, ``store_timestamp`` and
``physical_offset`` (=, IN, <, <=, >, >=) are pushed down where PySpark pushes filters to Python data
sources (4.1+, with ``spark.sql.python.filterPushdown.enabled``): the tasks apply them exactly, and
commit-log files that cannot hold a matching record are not read at all (``df.rdd.getNumPartitions()``
counts the files read). It is off by default: PySpark up to 4.3 keeps the pushed-down read on the
loaded relation, so the unfiltered DataFrame it came from then reads the filtered rows too
(PythonScanBuilder.pushFilters -> PythonDataSourceV2.setReadInfo; later Spark keeps it per scan).
"""

from __future__ import annotations

import datetime as dt
import json
import sys

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from rmqtool.ops import scan

MODES = ("failfast", "permissive")
PUSHED_COLUMNS = ("topic", "queue_id", "store_timestamp", "physical_offset")
COMPARISONS = ("EqualTo", "In", "GreaterThan", "GreaterThanOrEqual", "LessThan", "LessThanOrEqual")


def _flag(options, name: str, default: bool = False) -> bool:
    value = str(options.get(name, options.get(name.lower(), str(default)))).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {name} must be true or false, not {value!r}")
    return value == "true"


def paths_option(options) -> list[str]:
    """`load(path)` gives ``path``; `load([p, q])` gives ``paths`` as a JSON array."""
    paths = []
    if options.get("paths"):
        paths += json.loads(options["paths"])
    if options.get("path"):
        paths.append(options["path"])
    if not paths:
        raise ValueError("rocketmq data source: no path given (use .load(path) or .load([paths]))")
    return paths


def time_option(options, name: str) -> int | None:
    """``since`` / ``until``: milliseconds since the epoch, or ISO-8601 (UTC unless it says otherwise),
    as microseconds."""
    text = options.get(name)
    if text is None:
        return None
    text = str(text).strip()
    try:
        return int(text) * 1000 if text.lstrip("-").isdigit() else _micros(dt.datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(f"option {name} takes milliseconds since the epoch or an ISO-8601 time, "
                         f"not {text!r}") from None


def _micros(value) -> int:
    """A pushed timestamp value in microseconds since the epoch (a naive one is UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)


class RocketMQDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def _choice(self, name: str, choices: tuple[str, ...]) -> str:
        value = str(self.options.get(name, choices[0])).lower()
        if value not in choices:
            raise ValueError(f"option {name} must be one of {', '.join(choices)}, not {value!r}")
        return value

    def schema(self):
        from rmqtool.spark.schema import spark_schema

        return spark_schema(self._choice("kind", scan.KINDS), _flag(self.options, "checkCrc"))

    def reader(self, schema):
        kind = self._choice("kind", scan.KINDS)
        pushed = []
        if time_option(self.options, "since") is not None:
            pushed.append(("GreaterThanOrEqual", "store_timestamp", time_option(self.options, "since")))
        if time_option(self.options, "until") is not None:
            pushed.append(("LessThanOrEqual", "store_timestamp", time_option(self.options, "until")))
        if pushed and kind != "commitlog":
            raise ValueError(f"options since and until select commit-log records: not with kind {kind}")
        pushing = _flag(self.options, "pushFilters") and _planning_with_pushdown()
        cls = PushdownReader if pushing else RocketMQReader
        return cls(paths_option(self.options), kind, _flag(self.options, "checkCrc"),
                   _flag(self.options, "decompress"), self._choice("mode", MODES) == "permissive",
                   _flag(self.options, "includeBlank"), _flag(self.options, "pruneFiles", True), pushed)


def _planning_with_pushdown() -> bool:
    """Whether PySpark is planning this read with filter pushdown. PySpark 4.1+ refuses a reader that
    implements ``pushFilters`` when ``spark.sql.python.filterPushdown.enabled`` is off (its default) and
    does not tell ``reader()`` the setting; it plans with pushdown in its own worker module only."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back
    return False


class FilePartition(InputPartition):
    def __init__(self, file: scan.StoreFile | None):
        super().__init__(file)


class RocketMQReader(DataSourceReader):
    def __init__(self, paths: list[str], kind: str, check_crc: bool, decompress: bool, permissive: bool,
                 include_blank: bool = False, prune_files: bool = True, pushed: list | None = None):
        self.paths, self.kind, self.check_crc, self.decompress = paths, kind, check_crc, decompress
        self.permissive, self.include_blank, self.prune_files = permissive, include_blank, prune_files
        self.pushed: list[tuple[str, str, object]] = list(pushed or ())   # (comparison, column, value)

    def partitions(self):
        files = scan.list_files(self.paths, self.kind)
        if self.kind == "commitlog" and self.prune_files:
            files = [f for f, keep in zip(files, may_hold(files, self.pushed)) if keep]
        # no partition at all is not allowed: one that reads nothing
        return [FilePartition(f) for f in files] or [FilePartition(None)]

    def read(self, partition):
        from rmqtool.spark.schema import file_batches

        if partition.value is None:
            return
        on_damage = (lambda exc: None) if self.permissive else None
        for batch in file_batches(partition.value, self.kind, check_crc=self.check_crc, decompress=self.decompress,
                                  on_damage=on_damage):
            batch = self._keep(batch)
            if batch.num_rows:
                yield batch

    def _keep(self, batch):
        """The rows that pass the pushed filters (and are no BLANK padding, unless asked for)."""
        import pyarrow.compute as pc

        masks = [] if self.include_blank or self.kind != "commitlog" else [pc.equal(batch.column("type"), "message")]
        masks += [_mask(batch, op, column, value) for op, column, value in self.pushed]
        if not masks:
            return batch
        keep = masks[0]
        for mask in masks[1:]:
            keep = pc.and_kleene(keep, mask)
        return batch.filter(keep)


class PushdownReader(RocketMQReader):
    def pushFilters(self, filters):
        names = set(_schema_names(self.kind)) & set(PUSHED_COLUMNS)
        for f in filters:
            attribute = getattr(f, "attribute", ())
            column = attribute[0] if len(attribute) == 1 else None
            if type(f).__name__ in COMPARISONS and column in names and f.value is not None:
                value = f.value
                if column == "store_timestamp":
                    value = [_micros(v) for v in value] if isinstance(value, tuple) else _micros(value)
                self.pushed.append((type(f).__name__, column, value))
            else:
                yield f


def _schema_names(kind: str) -> list[str]:
    from rmqtool.spark.schema import arrow_schema

    return arrow_schema(kind).names


def _mask(batch, op: str, column: str, value):
    import pyarrow as pa
    import pyarrow.compute as pc

    col = batch.column(column)
    if op == "In":
        return pc.is_in(col, value_set=pa.array(list(value), col.type))
    fn = {"EqualTo": pc.equal, "GreaterThan": pc.greater, "GreaterThanOrEqual": pc.greater_equal,
          "LessThan": pc.less, "LessThanOrEqual": pc.less_equal}[op]
    return pc.fill_null(fn(col, pa.scalar(value, col.type)), False)


def _may_match(op: str, value, lo, hi) -> bool:
    """Whether a value in [lo, hi] (None: unbounded) can satisfy ``column <op> value``."""
    if op == "In":
        return any(_may_match("EqualTo", v, lo, hi) for v in value)
    if op == "EqualTo":
        return (lo is None or value >= lo) and (hi is None or value <= hi)
    if op in ("GreaterThan", "GreaterThanOrEqual"):
        return hi is None or hi > value or (op == "GreaterThanOrEqual" and hi == value)
    return lo is None or lo < value or (op == "LessThanOrEqual" and lo == value)


def may_hold(files: list[scan.StoreFile], pushed: list) -> list[bool]:
    """For each commit-log file, whether it may hold a record passing the pushed filters on
    ``physical_offset`` (the file's byte range) and ``store_timestamp``. A file's store times run from
    its first record's to the next file's first record's: the broker stamps records in commit-log order
    under its put lock (CommitLog.asyncPutMessage) and its own time look-ups assume the same
    (ConsumeQueue.getOffsetInQueueByTime); option pruneFiles=false reads every file."""
    offsets = [(op, v) for op, column, v in pushed if column == "physical_offset"]
    times = [(op, v) for op, column, v in pushed if column == "store_timestamp"]
    keep = [all(_may_match(op, v, f.start, f.start + f.size - 1) for op, v in offsets) for f in files]
    if not times:
        return keep
    firsts = [scan.first_store_timestamp(f) if k else None for f, k in zip(files, keep)]
    for i, f in enumerate(files):
        if not keep[i] or firsts[i] is None:
            continue
        nxt = None
        if i + 1 < len(files) and files[i + 1].store == f.store:
            nxt = firsts[i + 1] if keep[i + 1] else scan.first_store_timestamp(files[i + 1])
        lo, hi = firsts[i] * 1000, None if nxt is None else nxt * 1000
        keep[i] = all(_may_match(op, v, lo, hi) for op, v in times)
    return keep
