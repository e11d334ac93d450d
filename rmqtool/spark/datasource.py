"""The ``rocketmq`` PySpark Python Data Source.

    spark.read.format("rocketmq").load("/data/broker-a/store")
    spark.read.format("rocketmq").option("kind", "consumequeue").load(["/data/*/store"])

PySpark (4.0+) finds it by name in any session: it registers the ``DefaultSource`` of every installed
top-level module named ``pyspark_*`` (``pyspark_rocketmq`` here). Options (README, "The rocketmq data
source"): ``kind`` = commitlog (default) | consumequeue (every queue layout, a RocksDB consume queue
included) | batchconsumequeue | index | compactionlog (compaction topics as their consumers see them) | compactioncq
| trace (message-trace contexts, the rows of ``rmqtool trace``, from the records of the trace topic: ``traceTopic``,
else each store's msgTraceTopicName in config/broker.properties, else RMQ_SYS_TRACE_TOPIC);
``checkCrc`` and ``decompress``; ``mode`` = failfast | permissive; ``includeBlank`` (BLANK padding
records, left out by default); ``since`` / ``until`` / ``topics``; ``pruneFiles``; ``pushFilters``. One
input partition per store file that may hold a wanted row (``may_hold``: by byte range, time range and
the topics' consume queues); each yields Arrow record batches.

With ``pushFilters`` = true, filters on ``topic``, ``queue_id``, ``store_timestamp`` and
``physical_offset`` (=, IN, <, <=, >, >=) are pushed down where PySpark pushes filters to Python data
sources (4.1+, with ``spark.sql.python.filterPushdown.enabled``): the tasks apply them exactly, and
commit-log files that cannot hold a matching record are not read at all (``df.rdd.getNumPartitions()``
counts the files read). It is off by default, and the options ``since`` / ``until`` / ``topics`` prune
the same way without it: PySpark up to 4.3 keeps the read planned with the pushed filters (read function
and partitions) on the provider every scan of the loaded DataFrame shares (PythonScanBuilder.pushFilters
-> PythonDataSourceV2.setReadInfo; PythonDataSourceV2.getOrCreateReadInfo hands it to each later
PythonBatch), so ``df.count()`` after ``df.where(...).count()`` reads the filtered files. Handing every
filter back to Spark would not help (the files left out are in the partitions), and nothing a task sees
tells the scans apart; a later Spark keeps the read info per scan (PythonScanBuilder.readInfo).
"""

from __future__ import annotations

import datetime as dt
import json
import sys

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from rmqtool import constants as C
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
        if self.options.get("topics"):
            names = tuple(n.strip() for n in str(self.options["topics"]).split(",") if n.strip())
            pushed.append(("In", "topic", names))
        if pushed and kind != "commitlog":
            raise ValueError(f"options since, until and topics select commit-log records: not with kind {kind}")
        pushing = _flag(self.options, "pushFilters") and _planning_with_pushdown()
        cls = PushdownReader if pushing else RocketMQReader
        trace_topic = self.options.get("traceTopic", self.options.get("tracetopic"))
        if trace_topic is not None and kind != "trace":
            raise ValueError(f"option traceTopic names the topic of kind trace: not with kind {kind}")
        return cls(paths_option(self.options), kind, _flag(self.options, "checkCrc"),
                   _flag(self.options, "decompress"), self._choice("mode", MODES) == "permissive",
                   _flag(self.options, "includeBlank"), _flag(self.options, "pruneFiles", True), pushed,
                   trace_topic)


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
    def __init__(self, file: scan.StoreFile | None, trace_topic: str | None = None):
        super().__init__(file)
        self.trace_topic = trace_topic          # kind trace: the topic of the file's store


class RocketMQReader(DataSourceReader):
    def __init__(self, paths: list[str], kind: str, check_crc: bool, decompress: bool, permissive: bool,
                 include_blank: bool = False, prune_files: bool = True, pushed: list | None = None,
                 trace_topic: str | None = None):
        self.paths, self.kind, self.check_crc, self.decompress = paths, kind, check_crc, decompress
        self.trace_topic = trace_topic
        self.permissive, self.include_blank, self.prune_files = permissive, include_blank, prune_files
        self.pushed: list[tuple[str, str, object]] = list(pushed or ())   # (comparison, column, value)

    def partitions(self):
        files = scan.list_files(self.paths, self.kind)
        if self.kind in ("commitlog", "trace"):     # a store the broker refuses to load: failfast raises
            files, skipped = scan.readable_files(files, read_anyway=self.permissive)
            if skipped:
                from rmqtool.store.readable import skipped_line
                print(f"rmqtool: warning: rocketmq data source (mode permissive): {skipped_line(skipped)}",
                      file=sys.stderr)
        if self.kind == "commitlog" and self.prune_files:
            files = [f for f, keep in zip(files, may_hold(files, self.pushed)) if keep]
        if self.kind == "trace":
            from rmqtool.ops.trace import store_trace_topics

            topics = store_trace_topics((f.store for f in files), self.trace_topic)
            if self.prune_files:            # the files the trace topic's consume queues point into
                keep = {}
                for topic in set(topics.values()):
                    group = [f for f in files if topics[f.store] == topic]
                    keep.update(zip((f.uri for f in group), topic_may_hold(group, {topic})))
                files = [f for f in files if keep[f.uri]]
            return [FilePartition(f, topics[f.store]) for f in files] or [FilePartition(None)]
        # no partition at all is not allowed: one that reads nothing
        return [FilePartition(f) for f in files] or [FilePartition(None)]

    def read(self, partition):
        from rmqtool.spark.schema import file_batches

        if partition.value is None:
            return
        # mode permissive: a damaged record ends its file; kind trace: a body that does not decode is left out
        on_damage = (lambda exc: None) if self.permissive else None
        for batch in file_batches(partition.value, self.kind, check_crc=self.check_crc, decompress=self.decompress,
                                  on_damage=on_damage, trace_topic=partition.trace_topic):
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
    ``physical_offset`` (the file's byte range), ``topic`` (``topic_may_hold``) and ``store_timestamp``. A
    file's store times run from its first record's to the next file's first record's: the broker stamps
    records in commit-log order under its put lock (CommitLog.asyncPutMessage) and its own time look-ups
    assume the same (ConsumeQueue.getOffsetInQueueByTime); option pruneFiles=false reads every file."""
    offsets = [(op, v) for op, column, v in pushed if column == "physical_offset"]
    times = [(op, v) for op, column, v in pushed if column == "store_timestamp"]
    keep = [all(_may_match(op, v, f.start, f.start + f.size - 1) for op, v in offsets) for f in files]
    for op, column, v in pushed:
        if column == "topic" and op in ("EqualTo", "In"):
            keep = [k and t for k, t in zip(keep, topic_may_hold(files, set(v) if op == "In" else {v}))]
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


def topic_may_hold(files: list[scan.StoreFile], topics: set[str]) -> list[bool]:
    """For each commit-log file, whether it may hold a record of one of ``topics``, by the topics' consume
    queues: the files their units point into, and every file past the dispatched end (the furthest unit
    end of any queue; ReputMessageService dispatches in commit-log order, so every record before it has
    its unit: CommitLogDispatcherBuildConsumeQueue, all but the prepared / rollback transaction types,
    which 4.3+ brokers no longer write). Every file of a store is kept when that cannot be known: the
    store crashed or a broker runs (``abort``), a topic has no queue directory (none written, or 5.x
    RocksDB queues), a queue's files have a gap, or the path is no store root."""
    import numpy as np

    keep = [True] * len(files)
    by_store: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        by_store.setdefault(f.store, []).append(i)
    for store, indexes in by_store.items():
        known = _topic_offsets(store, topics)
        if known is None:
            continue
        offsets, dispatched = known
        starts = np.array([files[i].start for i in indexes], np.int64)
        holding = set((np.searchsorted(starts, offsets, side="right") - 1).tolist())
        for j, i in enumerate(indexes):
            keep[i] = j in holding or files[i].start + files[i].size > dispatched
    return keep


def _topic_offsets(store: str, topics: set[str]):
    """(physical offsets of every unit of ``topics``, dispatched end) of a store, or None when unknown."""
    import numpy as np
    from pyarrow import fs

    from rmqtool.errors import StoreError
    from rmqtool.store import layout as L

    fsys, path = scan.filesystem(store)
    if fsys.get_file_info(f"{path.rstrip('/')}/{L.ABORT}").type != fs.FileType.NotFound:
        return None
    try:
        queue_files = scan.list_files([store], "consumequeue")
    except StoreError:
        return None
    queues: dict[tuple, list[scan.StoreFile]] = {}
    for f in queue_files:
        queues.setdefault((f.kind, f.topic, f.queue_id), []).append(f)
    if not topics <= {topic for _, topic, _ in queues}:
        return None
    offsets, dispatched = [], 0
    for (kind, topic, _), qfiles in queues.items():
        if topic not in topics:
            if kind == "consumequeue":
                dispatched = max(dispatched, _queue_end(qfiles))
            continue
        if any(b.start != a.start + a.size for a, b in zip(qfiles, qfiles[1:])):
            return None                         # a missing file: units of the topic may be gone
        for i, f in enumerate(qfiles):
            phys, ends, full, holed = _units(f, kind)
            if holed or (not full and i + 1 < len(qfiles)):
                return None                     # a hole (a lost page after a crash): units may be missing
            offsets.append(phys)
            if len(phys):
                dispatched = max(dispatched, int(ends[-1]))
    return (np.concatenate(offsets) if offsets else np.zeros(0, np.int64)), dispatched


def _units(f: scan.StoreFile, kind: str):
    """(physical offsets, ends) of a (batch) consume-queue file's units up to the first that fails
    recovery's test (as ``cq_batch`` / ``bcq_batch`` read them), whether that is every unit of the file,
    and whether a valid unit follows a failing one (a hole)."""
    import numpy as np

    from rmqtool.spark.schema import BCQ_DTYPE, CQ_DTYPE

    buf = scan.read_bytes(f)
    dtype = BCQ_DTYPE if kind == "batchconsumequeue" else CQ_DTYPE
    units = np.frombuffer(buf, dtype, count=len(buf) // dtype.itemsize)
    valid = (units["physical_offset"] >= 0) & (units["size"] > 0)
    if kind == "batchconsumequeue":
        valid &= (units["msg_base_offset"] >= 0) & (units["batch_size"] > 0)
    bad = np.flatnonzero(~valid)
    n = int(bad[0]) if len(bad) else len(units)
    phys = units["physical_offset"][:n].astype(np.int64)
    return phys, phys + units["size"][:n].astype(np.int64), n == len(units), bool(valid[n:].any())


def _queue_end(qfiles: list[scan.StoreFile]) -> int:
    """The end (physical offset + size) of a consume queue's last unit, found by bisecting its last written
    file (units up to the first that fails recovery's test, as ``cq_batch`` reads them; 0: none)."""
    import struct

    unit = C.CQ_STORE_UNIT_SIZE
    for f in reversed(qfiles):
        fsys, path = scan.filesystem(f.uri)
        with fsys.open_input_file(path) as fh:
            def at(i: int):
                phys, size = struct.unpack(">qi", bytes(fh.read_at(12, i * unit)))
                return phys + size if phys >= 0 and size > 0 else None
            lo, hi = 0, f.size // unit                 # units [0, lo) valid, [hi, ...) not
            while lo < hi:
                mid = (lo + hi) // 2
                if at(mid) is None:
                    hi = mid
                else:
                    lo = mid + 1
            if lo:
                return at(lo - 1)
    return 0
