"""export to a dataset directory: one part per commit-log file, optionally Hive-partitioned.

Each commit-log file is decoded and written by ``write_part`` on its own (a task on Spark, or in turn
in one process), so both engines write the same rows. Parquet parts hold the record schema
(``rmqtool.ops.export.export_schema``, the schema of a one-file export); JSON-lines parts hold exactly the
rows of ``cat-commitlog``. ``--partition-by topic,date`` writes Parquet ``topic=<t>/date=<YYYY-MM-DD>/``
directories as ``pyarrow.dataset.write_dataset`` lays them out (values URI-escaped, as pyarrow and Spark
read them; partition columns live in the path only; BLANK padding records, which have neither, are left
out). The directory appears atomically: parts go to a hidden sibling renamed at the end (locally, under the
output's lock: ``store.output.staged``). ``to`` may be a URI (``s3://``, ``hdfs://``, ...): parts are
written through ``pyarrow.fs``, which a cluster's executors need (a local path is local to each of
them). On object stores, which cannot rename a directory, the last step copies the parts into place
and is not atomic.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterable, Sequence
from urllib.parse import quote

from rmqtool.errors import StoreError, first_line
from rmqtool.ops import scan
from rmqtool.store.atomic import named

DATASET_FORMATS = ("parquet", "jsonl")
PARTITION_KEYS = ("topic", "date")
_SUFFIX = {"parquet": "parquet", "jsonl": "jsonl"}
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_OPEN_PARTS = 256            # partition files open at once, per part


@dataclass
class PartResult:
    records: int = 0
    messages: int = 0
    input_bytes: int = 0
    files: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)


@dataclass
class DatasetResult:
    path: str
    format: str
    records: int = 0
    messages: int = 0
    input_bytes: int = 0
    parts: int = 0
    seconds: float = 0.0
    damaged: list[str] = field(default_factory=list)
    skipped: list = field(default_factory=list)     # rmqtool.store.readable.Skipped: what read_anyway skipped


def parse_partition_by(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in keys if k not in PARTITION_KEYS]
    if bad or len(set(keys)) != len(keys):
        raise ValueError(f"--partition-by takes {' and/or '.join(PARTITION_KEYS)}, comma-separated "
                         f"(got {text!r})")
    return keys


def write_part(f: scan.StoreFile, index: int, out_dir: str, fmt: str, partition_by: tuple[str, ...] = (), *,
               check_crc: bool = False, body_encoding: str = "base64", read_anyway: bool = False,
               where=None, include_blank: bool = False, progress: Callable[[int], None] | None = None) -> PartResult:
    """Decode one commit-log file and write its part file(s) under ``out_dir``: the messages that pass
    ``where`` (a ``RecordFilter``), and BLANK padding too with ``include_blank`` (never when partitioned)."""
    from rmqtool.columnar import record_schema
    from rmqtool.ops.export import export_batch, export_schema, file_schema, message_total, total_bytes, writer
    from rmqtool.ops.filters import keep_records

    result = PartResult()
    schema = export_schema(check_crc) if fmt == "parquet" else record_schema(check_crc)
    # a part file takes store and commitlog_file as dictionaries; Hive partitions' files dense strings
    batch_schema = file_schema(schema) if fmt == "parquet" and not partition_by else schema
    damaged = (lambda exc: result.damaged.append(str(exc))) if read_anyway else None

    def batches():
        for batch in scan.record_batches(f, check_crc=check_crc, on_damage=damaged, progress=progress):
            result.input_bytes += total_bytes(batch)
            # BLANK padding has no topic or date: left out of partitioned datasets
            batch = keep_records(batch, where, include_blank and not partition_by)
            if not batch.num_rows:
                continue
            result.records += batch.num_rows
            result.messages += message_total(batch)
            yield export_batch(batch, batch_schema, f.store, f.uri) if fmt == "parquet" else batch

    fsys, root = scan.filesystem(out_dir)
    name = f"part-{index:05d}-{f.name}"
    if partition_by:
        _write_partitioned(batches(), schema, fsys, root, name, partition_by, result.files)
        return result
    out = None
    try:
        for batch in batches():
            if out is None:
                path = posixpath.join(root, f"{name}.{_SUFFIX[fmt]}")
                with named(path):
                    stream = fsys.open_output_stream(path)
                out = writer(fmt, stream, schema, body_encoding, name=path)
                result.files.append(path)
            out(batch)
    except BaseException:
        if out is not None:
            out(None, abort=True)
        raise
    if out is not None:
        out(None)
    return result


def _write_partitioned(batches: Iterable, schema, fsys, root: str, name: str, keys: tuple[str, ...],
                       files: list[str]) -> None:
    """Hive partitions, as ``pyarrow.dataset.write_dataset`` lays them out: ``key=value`` directories (values
    URI-escaped, nulls as ``__HIVE_DEFAULT_PARTITION__``), the keys kept in the path only, rows in their
    commit-log order, ``<name>-<i>.parquet`` in each. Written here, in this thread: write_dataset's own
    threads can outlive it and abort the interpreter at exit ("terminate called without an active exception").
    At most ``_OPEN_PARTS`` files are open at once (the least recently written is closed; its partition's
    next rows start file i+1), and the rows waiting for a row group stay under ``ROW_GROUP_ROWS`` in all."""
    from collections import OrderedDict

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from rmqtool.ops.export import ROW_GROUP_ROWS, close_parquet, parquet_options

    kept = pa.schema([f for f in schema if f.name not in keys], metadata=schema.metadata)
    options = parquet_options(kept.names)
    open_parts: OrderedDict[str, tuple] = OrderedDict()       # partition → (ParquetWriter, its stream)
    counters: dict[str, int] = {}
    pending: dict[str, list] = {}
    waiting = 0

    def key_values(batch) -> list:
        columns = {"topic": batch.column("topic")}
        if "date" in keys:
            columns["date"] = pc.strftime(batch.column("store_timestamp"), format="%Y-%m-%d")
        return [columns[k] for k in keys]

    def directory(values: tuple) -> str:
        return "/".join(f"{k}={_HIVE_NULL if v is None else quote(v, safe='')}" for k, v in zip(keys, values))

    def close(writer, stream) -> None:
        with named(root):
            close_parquet(writer)
            stream.close()

    def close_all() -> OSError | None:
        """Close every open file, even after one fails; the first error."""
        failed = None
        for out in open_parts.values():
            try:
                close(*out)
            except OSError as exc:
                failed = failed or exc
        return failed

    def flush(part: str) -> None:
        with named(root):
            write(part)

    def write(part: str) -> None:
        batches = pending.pop(part, None)
        if not batches:
            return
        out = open_parts.pop(part, None)
        if out is None:
            if len(open_parts) >= _OPEN_PARTS:
                close(*open_parts.popitem(last=False)[1])
            i = counters.get(part, 0)
            counters[part] = i + 1
            fsys.create_dir(posixpath.join(root, part), recursive=True)
            path = posixpath.join(root, part, f"{name}-{i}.parquet")
            stream = fsys.open_output_stream(path)
            out = (pq.ParquetWriter(stream, kept, **options), stream)
            files.append(path)
        open_parts[part] = out                    # most recently written last
        out[0].write_table(pa.Table.from_batches(batches, kept))

    try:
        for batch in batches:
            values = key_values(batch)
            combined = pc.binary_join_element_wise(*[pc.fill_null(v, "") for v in values], "\x00") \
                if len(values) > 1 else pc.fill_null(values[0], "")
            codes = pc.dictionary_encode(combined).indices.to_numpy(zero_copy_only=False)
            order = np.argsort(codes, kind="stable")
            bounds = np.flatnonzero(np.diff(codes[order])) + 1
            rows = batch.select(kept.names)
            for run in np.split(order, bounds):
                first = int(run[0])
                part = directory(tuple(v[first].as_py() for v in values))
                pending.setdefault(part, []).append(rows.take(pa.array(run)))
                waiting += len(run)
            if waiting >= ROW_GROUP_ROWS:
                for part in list(pending):
                    flush(part)
                waiting = 0
        for part in list(pending):
            flush(part)
    except BaseException:
        close_all()                             # the first error is the one to report
        raise
    failed = close_all()
    if failed is not None:
        raise failed


def _file_type(fsys, path: str, uri: str):
    try:
        return fsys.get_file_info(path).type
    except OSError as exc:
        raise StoreError(f"cannot reach the output: {first_line(exc)}", path=uri) from None


def _remove(fsys, path: str) -> None:
    from pyarrow import fs

    with contextlib.suppress(FileNotFoundError):
        if fsys.get_file_info(path).type == fs.FileType.Directory:
            fsys.delete_dir(path)


def _move_dir(fsys, src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` (atomic on local disks and HDFS); object stores cannot rename a
    directory, so there its files are copied into place and ``src`` removed."""
    from pyarrow import fs

    try:
        fsys.move(src, dst)
    except (OSError, NotImplementedError):   # pyarrow: ArrowNotImplementedError / OSError on S3 and GCS
        fs.copy_files(src, dst, source_filesystem=fsys, destination_filesystem=fsys)
        fsys.delete_dir(src)


def _replace_local(src: str, dst: str) -> None:
    """Rename the directory ``src`` to ``dst``; one already at ``dst`` is renamed aside first and removed
    once ``src`` is in its place (put back if that fails)."""
    import shutil

    aside = f"{src}.old"
    if not os.path.isdir(dst):
        os.rename(src, dst)
        return
    os.rename(dst, aside)
    try:
        os.rename(src, dst)
    except BaseException:
        os.rename(aside, dst)
        raise
    shutil.rmtree(aside, ignore_errors=True)


Runner = Callable[[Callable, list], list]


def _write_item(item: tuple[int, scan.StoreFile], progress: Callable[[int], None] | None, **options) -> PartResult:
    """``write_part`` of (index, file), in a worker process or a Spark task."""
    return write_part(item[1], item[0], progress=progress, **options)


def export_dataset(store_paths: Sequence[str], to: str | os.PathLike, fmt: str = "parquet",
                   partition_by: tuple[str, ...] = (), *, check_crc: bool = False, body_encoding: str = "base64",
                   read_anyway: bool = False, overwrite: bool = False, runner: Runner | None = None,
                   files: Iterable[scan.StoreFile] | None = None, where=None, include_blank: bool = False,
                   progress: Callable[[int], None] | None = None, jobs: int | None = None) -> DatasetResult:
    """Write every commit-log file of the stores as parts of the dataset directory ``to``.

    ``runner(fn, items)`` applies ``fn`` to each item (as Spark tasks) and returns the results in order;
    without one the parts are written here, in ``jobs`` processes (default: ``workers.default_jobs``).
    ``progress(n)`` is told the bytes scanned. A store the broker refuses to load (rmqtool.store.readable)
    is refused and a damaged record fails the export (no output left) unless ``read_anyway``: then what is
    readable is written, and ``result.skipped`` and ``result.damaged`` say what was not. ``files``: the
    commit-log files, as ``scan.readable_files`` gives them.
    """
    if fmt not in DATASET_FORMATS:
        raise StoreError(f"a dataset directory holds {' or '.join(DATASET_FORMATS)} parts, not {fmt}", path=str(to))
    if partition_by and fmt != "parquet":
        raise StoreError(f"--partition-by writes Parquet (Hive partitions), not {fmt}", path=str(to))
    from pyarrow import fs

    from rmqtool.store.output import staged as staged_output

    to = os.fspath(to)
    fsys, target = scan.filesystem(to)
    kind = _file_type(fsys, target, to)
    if kind != fs.FileType.NotFound and not overwrite:
        raise StoreError("output exists (use --force to replace it)", path=to)
    if kind not in (fs.FileType.NotFound, fs.FileType.Directory):
        raise StoreError("output exists and is not a directory", path=to)
    result = DatasetResult(to, fmt)
    if files is None:
        files, result.skipped = scan.readable_files(scan.list_files(list(store_paths)), read_anyway)
    files = list(files)
    started = time.perf_counter()
    local = "://" not in to
    # a local directory is written under its lock, beside it (rmqtool.store.output.staged); a URI's, beside it
    if local:
        with named(to):
            os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)     # as a URI's parents are made
    with staged_output(target, overwrite) if local else contextlib.nullcontext() as tmp:
        staged = str(tmp) if local else \
            posixpath.join(posixpath.dirname(target), f".{posixpath.basename(target)}.tmp-{os.getpid()}")
        out_dir = staged if local else scan.uri_of(to, staged)
        try:
            with named(staged):
                _remove(fsys, staged)
                fsys.create_dir(staged, recursive=True)
            task = partial(_write_item, out_dir=out_dir, fmt=fmt, partition_by=partition_by, check_crc=check_crc,
                           body_encoding=body_encoding, read_anyway=read_anyway, where=where,
                           include_blank=include_blank)
            if runner is None:
                from rmqtool.ops.export import warm_text
                from rmqtool.ops.workers import default_jobs, process_map
                jobs = default_jobs(sum(f.size for f in files), len(files)) if jobs is None else jobs
                if jobs > 1 and len(files) > 1:
                    text = partial(warm_text, fmt=fmt, check_crc=check_crc, body_encoding=body_encoding)
                    scan.warm(files[0], None if fmt == "parquet" else text, check_crc=check_crc)
                parts = process_map(task, list(enumerate(files)), jobs, progress)
            else:
                parts = runner(lambda item: task(item, None), list(enumerate(files)))
            for part in parts:
                result.records += part.records
                result.messages += part.messages
                result.input_bytes += part.input_bytes
                result.parts += len(part.files)
                result.damaged += part.damaged
            with named(target):
                if local:
                    _replace_local(staged, target)
                else:
                    _remove(fsys, target)
                    _move_dir(fsys, staged, target)
        except BaseException:
            with contextlib.suppress(OSError):     # best effort: the first error is the one to report
                _remove(fsys, staged)
            raise
    result.seconds = time.perf_counter() - started
    return result
