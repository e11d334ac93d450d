"""Export commit-log records to Parquet, JSON lines or CSV.

``export_local`` is the local engine: the columnar decoder streams each commit-log file's record batches
into pyarrow's Parquet writer, or into JSON lines or CSV rendered a batch at a time (``columnar.text``), in
this process or, a part per file, in worker processes (the lines of every record written in place, other
parts joined in order). A small commit log (``scan.FEW_BYTES``) is read record by record instead, with the
same bytes written: the start-up of the kernel and pyarrow.compute (and for JSON lines and CSV, of numpy
and pyarrow) would cost more than the records. The output appears atomically (a temporary file renamed at
the end, written under the output's lock: ``store.output.staged``); an existing file is replaced only when
asked. Parquet has one schema whatever the shape (one file or a dataset directory) and the engine:
``export_schema`` (the native types of ``rmqtool.columnar.schema``, timestamps as ``timestamp[ms, tz=UTC]``,
then ``store`` and ``commitlog_file``). JSON lines and CSV carry exactly the fields and values of
``cat-commitlog``'s rows.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from rmqtool.errors import FormatError, StoreError
from rmqtool.format.rows import csv_cell, dumps

if TYPE_CHECKING:
    from rmqtool.format.commitlog import Entry
    from rmqtool.ops.scan import StoreFile

FORMATS = ("parquet", "jsonl", "csv")
ENGINES = ("local",)
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
             ".csv": "csv"}
# Snappy, as Spark, pandas and DuckDB write by default (uncompressed files are ~1.8x larger; LZ4 and zstd cost
# more CPU than Snappy here). Dictionary encoding pays off for repetitive columns only (never for bodies).
# Integer columns in about commit-log order or of a small range take Parquet's delta encoding (read by
# Spark 3.3+, DuckDB, pandas): a few bits a value instead of 4 or 8 bytes for Snappy to squeeze, ~0.07 CPU-s
# less per GiB and a file ~3 % smaller. Min/max statistics only where they can prune a scan: not over bodies,
# properties, ids (a quarter of the writing), nor over type, magic code and hosts, which every row group of
# an interleaved commit log holds all of. Row groups of 64 Ki records (~30 MB): twice that held ~150 MB more
# in Arrow's pool and cost ~0.15 CPU-s more per GiB in faulted-in pages, for no smaller file. README:
# "Parquet files".
PARQUET_COMPRESSION = "snappy"
_FILE_COLUMNS = ("store", "commitlog_file")
PARQUET_DICTIONARY_COLUMNS = ["type", "magic_code", "topic", "born_host", "store_host", "tags", *_FILE_COLUMNS]
PARQUET_DELTA_COLUMNS = ["physical_offset", "total_size", "queue_id", "flag", "queue_offset", "sys_flag",
                         "born_timestamp", "store_timestamp", "reconsume_times", "prepared_transaction_offset",
                         "real_queue_id", "body_length"]
PARQUET_NO_STATISTICS = {"body", "properties_raw", "topic_raw", "properties", "keys", "uniq_key", "msg_id", "type",
                         "magic_code", "born_host", "store_host"}
ROW_GROUP_ROWS = 64 * 1024


@dataclass
class ExportResult:
    path: Path
    format: str
    records: int = 0
    messages: int = 0
    input_bytes: int = 0          # commit-log bytes covered (record sizes summed)
    seconds: float = 0.0
    damaged: list[FormatError] = field(default_factory=list)
    skipped: list = field(default_factory=list)     # rmqtool.store.readable.Skipped: what --read-anyway skipped
    undecodable: list[FormatError] = field(default_factory=list)   # kind trace: trace bodies skipped


def export_schema(check_crc: bool = False):
    """The Parquet schema of every export: the record schema with its timestamps in UTC, then the store
    (as named on the command line) and the commit-log file each record was read from."""
    import pyarrow as pa

    from rmqtool.columnar import record_schema

    fields = [f.with_type(pa.timestamp("ms", "UTC")) if pa.types.is_timestamp(f.type) else f
              for f in record_schema(check_crc)]
    return pa.schema(fields + [pa.field("store", pa.string()), pa.field("commitlog_file", pa.string())])


def export_batch(batch, schema, store: str, commitlog_file):
    """``batch`` in the export ``schema``, or in ``file_schema(schema)``: ``commitlog_file`` is one path
    for every row, or a dictionary array (``_file_column``)."""
    import pyarrow as pa

    if isinstance(commitlog_file, str):
        commitlog_file = _repeated(commitlog_file, batch.num_rows)
    columns = batch.columns + [_repeated(store, batch.num_rows), commitlog_file]
    return pa.RecordBatch.from_arrays([col if col.type == fld.type else
                                       col.view(fld.type) if _same_timestamps(col.type, fld.type) else
                                       col.cast(fld.type) for col, fld in zip(columns, schema)], schema=schema)


def _same_timestamps(a, b) -> bool:
    """Timestamps of one unit (a time zone only added): a view of the same values, where a cast would import
    pyarrow.compute."""
    import pyarrow as pa
    return pa.types.is_timestamp(a) and pa.types.is_timestamp(b) and a.unit == b.unit


def file_schema(schema):
    """``schema`` with ``store`` and ``commitlog_file`` dictionary-encoded: a few values for every row, which
    Arrow's Parquet writer takes as they are (dense, it would hash every row's path back into a dictionary)."""
    import pyarrow as pa
    return pa.schema([f.with_type(pa.dictionary(pa.int32(), pa.string())) if f.name in _FILE_COLUMNS else f
                      for f in schema])


def _repeated(value: str, n: int):
    import numpy as np
    import pyarrow as pa

    from rmqtool.columnar.props import arrow, strings
    return pa.DictionaryArray.from_arrays(arrow(np.zeros(n, np.int32), pa.int32()), strings([value]))


def _file_column(batch, starts, uris):
    """The commit-log file of each record, from its physical offset (a dictionary array over ``uris``)."""
    import numpy as np
    import pyarrow as pa

    from rmqtool.columnar.props import arrow, strings

    offsets = batch.column("physical_offset")           # over its buffer: to_numpy would import pandas
    offsets = np.frombuffer(offsets.buffers()[1], np.int64, len(offsets), offsets.offset * 8)
    which = np.searchsorted(starts, offsets, "right") - 1
    return pa.DictionaryArray.from_arrays(arrow(which.astype(np.int32), pa.int32()), strings(uris))


def format_for(path: str | os.PathLike, fmt: str | None) -> str:
    """The --format value, or the one the output's extension names."""
    if fmt:
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        raise StoreError(f"cannot tell the format from the extension {suffix or '(none)'!r}; "
                         f"use --format {'|'.join(FORMATS)}", path=str(path))
    return _SUFFIXES[suffix]


def export(store_paths: Sequence[str | os.PathLike], to: str | os.PathLike, fmt: str | None = None,
           engine: str = "local", **options) -> ExportResult:
    """Dispatch to an engine (only ``local`` here)."""
    if engine not in ENGINES:
        raise StoreError(f"unknown export engine {engine!r} (choose from {', '.join(ENGINES)})")
    return export_local(store_paths, to, format_for(to, fmt), **options)


def _output_file(to: str | os.PathLike, fmt: str, overwrite: bool) -> Path:
    """The one-file output ``to``, refused when its format is unknown, it exists (unless ``overwrite``) or it
    is a directory or another file that is not a regular one."""
    to = Path(to)
    if fmt not in FORMATS:
        raise StoreError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})", path=str(to))
    if to.exists() and not overwrite:
        raise StoreError("output exists (use --force to replace it)", path=str(to))
    if to.is_dir():
        raise StoreError("output is a directory", path=str(to))
    if to.exists() and not to.is_file():         # a device, a FIFO: the file renamed into place would replace it
        raise StoreError("output is not a regular file (export writes a new file and renames it into place)",
                         path=str(to))
    return to


def export_local(store_paths: Sequence[str | os.PathLike], to: str | os.PathLike, fmt: str, *,
                 check_crc: bool = False, body_encoding: str = "base64", read_anyway: bool = False,
                 overwrite: bool = False, batch_rows: int | None = None, where=None, include_blank: bool = False,
                 commitlog_records: bool = False, progress: Callable[[int], None] | None = None,
                 jobs: int | None = None) -> ExportResult:
    """Decode every store's commit log in order into one output file.

    Each commit-log file (and compaction log) is a part: with several ``jobs`` (default:
    ``workers.default_jobs``) the parts are decoded and written in worker processes, JSON lines and CSV of
    every record straight to their place in the output (``_write_text_in_place``), other exports apart and
    joined here in order (``_write_parts``), else written here one after another; either way a Parquet row
    group ends at each part's end, so the output does not depend on ``jobs``.

    Only MESSAGE records that pass ``where`` (a ``RecordFilter``) are written; BLANK padding records
    too with ``include_blank`` and no filter. ``progress(n)`` is told the commit-log bytes scanned.
    A compaction topic that ``where`` names is written as its consumers see it, from its compaction logs
    after the store's other records (``compaction.consumer_view_split``), unless ``commitlog_records``.

    A store the broker refuses to load (rmqtool.store.readable) is refused before anything is written, and
    a damaged record raises its FormatError (no output is left behind), unless ``read_anyway``: then what is
    readable is exported (a damaged record skips the rest of its file), and ``result.skipped`` and
    ``result.damaged`` say what was not.
    """
    from rmqtool.ops import scan
    from rmqtool.ops.compaction import consumer_view_split
    from rmqtool.store.output import staged
    from rmqtool.store.readable import commitlog_view
    from rmqtool.store.store import Store

    to = _output_file(to, fmt, overwrite)
    result = ExportResult(to, fmt)
    commitlogs = []
    for store in store_paths:                 # every store judged before a byte is written
        cl, skipped = commitlog_view(Store.open(Path(store)).commitlog, read_anyway)
        commitlogs.append(cl)
        result.skipped += skipped
    started = time.perf_counter()
    with staged(to, overwrite) as tmp:       # under its lock; an error leaves nothing
        total = sum(f.length for cl in commitlogs for f in cl.queue.files)
        if total <= scan.FEW_BYTES and (jobs or 1) == 1 and \
                (commitlog_records or not any(consumer_view_split([str(s)], where)[2] for s in store_paths)):
            try:                            # the record-at-a-time decoder: no kernel (text: nor numpy and pyarrow)
                counts = _few_parquet(store_paths, commitlogs, tmp, where, check_crc, include_blank) \
                    if fmt == "parquet" else \
                    _few_text(commitlogs, tmp, fmt, where, check_crc, body_encoding, include_blank)
            except (FormatError, StoreError, OSError, ValueError, scan.Irregular) as exc:
                if isinstance(exc, OSError) and exc.filename == str(tmp):
                    raise                            # writing the output failed
                # else the bulk path: its output, its warnings and exit status
            else:
                os.replace(tmp, to)
                if progress:
                    progress(total)
                result.records, result.messages, result.input_bytes = counts
                result.seconds = time.perf_counter() - started
                return result
        from rmqtool.columnar import DEFAULT_BATCH_ROWS, record_schema
        from rmqtool.ops.scan import list_files

        schema = export_schema(check_crc) if fmt == "parquet" else record_schema(check_crc)
        options = _PartOptions(fmt, schema, check_crc, body_encoding, read_anyway, include_blank,
                               batch_rows or DEFAULT_BATCH_ROWS)
        parts = []                  # every commit-log file of every store, then its compaction logs: one part each
        first = None                # a commit-log file to warm up with
        for store, cl in zip(store_paths, commitlogs):
            files = list_files([store])
            starts, uris = [f.start for f in files], [f.uri for f in files]
            store_name = files[0].store if files else str(store)
            read_cl, cl_where, logs = (True, where, []) if commitlog_records else \
                consumer_view_split([str(store)], where)
            if read_cl:
                first = first or next(iter(files), None)
                parts += [_Part(store_name, cl_where, (type(cl), f, cl.queue.file_size), starts, uris)
                          for f in cl.queue.files]
            parts += [_Part(store_name, where, f) for f in logs]
        from rmqtool.ops.workers import default_jobs

        # the text of every record is written in place (_write_text_in_place); a filtered text export's parts are
        # copied after their workers end, the last one alone (~1.2 CPU-s per GB of JSON lines here): by default it
        # takes workers where each has two files at least, so the copy of the last part overlaps the others' work
        in_place = options.fmt != "parquet" and (where is None or where.is_empty)
        per_worker = 1 if options.fmt == "parquet" or in_place else 2
        jobs = default_jobs(total, len(parts) // per_worker) if jobs is None else jobs
        # Python's cyclic garbage collector is paused for the bulk loop, which makes no reference cycles of its
        # own: each collection walks every object of the process (numba's ~100 K), ~0.07 CPU-s per GiB in all
        collecting = gc.isenabled()
        gc.disable()
        try:
            if jobs <= 1 or len(parts) <= 1:
                done = _write_here(parts, options, tmp, progress)
            elif in_place:
                done = _write_text_in_place(parts, options, tmp, jobs, progress, first)
            else:
                done = _write_parts(parts, options, tmp, jobs, progress, first)
            for records, messages, input_bytes, damaged in done:
                result.records += records
                result.messages += messages
                result.input_bytes += input_bytes
                result.damaged += damaged
            os.replace(tmp, to)
        finally:
            if collecting:
                gc.enable()
    result.seconds = time.perf_counter() - started
    return result


@dataclass(frozen=True)
class _PartOptions:
    fmt: str
    schema: object
    check_crc: bool
    body_encoding: str
    read_anyway: bool
    include_blank: bool
    batch_rows: int


@dataclass(frozen=True)
class _Part:
    """One commit-log file of a store (its commit log's class, the file, the file size) or one of its
    compaction logs (a ``scan.StoreFile``), the filter for it, and the store's commit-log files (the
    ``commitlog_file`` column)."""
    store: str
    where: object
    source: object
    starts: list = field(default_factory=list)
    uris: list = field(default_factory=list)


def _part_batches(part: _Part, options: _PartOptions, counts: list, progress) -> Iterator:
    """The batches ``export_local`` writes of ``part``, ready for its writer; ``counts`` gets [records,
    messages, input bytes, the damage skipped]."""
    from rmqtool.columnar import iter_record_batches
    from rmqtool.ops.filters import keep_records
    from rmqtool.ops.scan import BytesCounter, record_batches
    from rmqtool.store.filequeue import FileQueue

    on_damage = counts[3].append if options.read_anyway else None
    parquet = options.fmt == "parquet"
    batch_schema = file_schema(options.schema) if parquet else options.schema
    if isinstance(part.source, tuple):
        kind, f, file_size = part.source
        counted = BytesCounter(f.start, progress)
        batches = iter_record_batches(kind(FileQueue([f], file_size)), check_crc=options.check_crc,
                                      on_damage=on_damage, batch_rows=options.batch_rows)
    else:
        counted, batches = None, record_batches(part.source, check_crc=options.check_crc, on_damage=on_damage)
    for batch in batches:
        if counted is not None:
            counted(batch)
        counts[2] += total_bytes(batch)
        batch = keep_records(batch, part.where, options.include_blank)
        if not batch.num_rows:
            continue
        counts[0] += batch.num_rows
        counts[1] += message_total(batch)
        if parquet:
            column = _file_column(batch, part.starts, part.uris) if counted is not None else part.source.uri
            batch = export_batch(batch, batch_schema, part.store, column)
        yield batch
    if counted is not None:
        counted.finish(f.length)


def _write_here(parts: list[_Part], options: _PartOptions, tmp: Path, progress) -> list:
    """Every part into ``tmp`` in this process, a Parquet row group ending at each part's end."""
    write_out = writer(options.fmt, tmp, options.schema, options.body_encoding)
    done = []
    try:
        for part in parts:
            counts = [0, 0, 0, []]
            for batch in _part_batches(part, options, counts, progress):
                write_out(batch)
            write_out(PART_END)
            done.append(counts)
        write_out(None)
    except BaseException:
        write_out(None, abort=True)
        raise
    return done


def _write_apart(item: tuple[int, _Part], progress, *, options: _PartOptions, directory: str) -> tuple:
    """A worker's part: its file written beside the output (None: no record), and its counts (the damage as
    ``workers.error_info``)."""
    from rmqtool.ops.workers import error_info

    index, part = item
    counts = [0, 0, 0, []]
    path, write_out = None, None
    try:
        for batch in _part_batches(part, options, counts, progress):
            if write_out is None:
                path = os.path.join(directory, f"part-{index:05d}")
                write_out = writer(options.fmt, path, options.schema, options.body_encoding)
            write_out(batch)
    except BaseException:
        if write_out is not None:
            write_out(None, abort=True)
        raise
    if write_out is not None:
        write_out(None)
    counts[3] = [error_info(exc) for exc in counts[3]]
    return path, counts


def _write_parts(parts: list[_Part], options: _PartOptions, tmp: Path, jobs: int, progress,
                 first: StoreFile | None) -> list:
    """The parts written in ``jobs`` worker processes, each to a file beside the output, joined in order as
    they come (``workers.process_imap``: at most ``jobs + 1`` part files at a time) into ``tmp``: the first
    part with a record becomes it, the others' bytes are appended (``store.joined.JoinedFile``). JSON lines
    and CSV: the bytes of ``_write_here`` (a part's CSV header line dropped but the first's); Parquet: its row
    groups, one footer listing them all (``parquet_parts.Stitcher``). ``first``: a commit-log file whose first
    batch is decoded here before the workers start (``_warm``)."""
    import shutil
    import tempfile

    from rmqtool.ops.parquet_parts import MAGIC, Stitcher, footer_of
    from rmqtool.ops.workers import process_imap, rebuild_error
    from rmqtool.store.joined import JoinedFile

    directory = tempfile.mkdtemp(prefix=f"{tmp.name}.parts-", dir=tmp.parent)
    parquet = options.fmt == "parquet"
    done, out, results = [], JoinedFile(tmp), None
    try:
        if parquet:
            empty = os.path.join(directory, "empty")
            writer("parquet", empty, options.schema, options.body_encoding)(None)
            stitched = Stitcher(footer_of(empty)[1])
        _warm(first, options)
        skip = len(MAGIC) if parquet else len(_csv_header(options.schema)) if options.fmt == "csv" else 0
        results = process_imap(partial(_write_apart, options=options, directory=directory), list(enumerate(parts)),
                               jobs, progress, ahead=1)
        for path, counts in results:
            counts[3] = [rebuild_error(info) for info in counts[3]]
            done.append(counts)
            if path is None:
                continue
            start = skip if out.size else 0         # the first part: the output's start
            end = stitched.add(path, out.size - start) if parquet else os.path.getsize(path)
            out.add(path, start, end)
        if not out.size:                    # not a record: an empty file (Parquet: its footer)
            os.replace(empty, tmp) if parquet else open(tmp, "wb").close()
        elif parquet:
            out.write(stitched.tail())
    finally:
        try:
            out.close()                 # (a write error of its last bytes is the export's error)
        finally:
            if results is not None:
                results.close()         # the workers stopped before their directory goes
            shutil.rmtree(directory, ignore_errors=True)
    return done


def _write_text_in_place(parts: list[_Part], options: _PartOptions, tmp: Path, jobs: int, progress,
                         first: StoreFile | None) -> list:
    """JSON lines or CSV of every record from ``jobs`` processes, each part's lines written straight to their
    place in ``tmp``: first the length of every part but the last is counted (``_measure``: the same batches
    and lines, counted, not rendered), then each part is written from the offset the lengths before it give
    (``_write_at``), the CSV header by the first part with a record. Nothing is copied, and the disk needs
    room for the output alone. ``first``: as ``_write_parts``'. ``progress`` is told the count as the first
    fifth of the bytes, the writing as the rest (``_two_steps``)."""

    from rmqtool.ops.workers import process_map, rebuild_error

    _warm(first, options)
    sizes = [p.source[1].length for p in parts]        # (commit-log files only: no filter, no compaction logs)
    counting, writing = _two_steps(progress, sum(sizes[:-1]), sum(sizes))
    lengths = process_map(partial(_measure, options=options), parts[:-1], jobs, counting) + [None]
    header = len(_csv_header(options.schema)) if options.fmt == "csv" else 0
    places, at = [], 0
    for length in lengths:
        places.append((at, header))     # where the part begins, and the header it begins with (if a record)
        if length:
            at, header = at + header + length, 0
    open(tmp, "wb").close()
    done = process_map(partial(_write_at, options=options, path=str(tmp)), list(zip(parts, places, lengths)),
                       jobs, writing)
    for counts in done:
        counts[3] = [rebuild_error(info) for info in counts[3]]
    return done


def _two_steps(progress: Callable[[int], None] | None, counted: int, total: int) -> tuple:
    """``progress`` split between two passes, the first over ``counted`` bytes, the second over ``total``:
    the first's bytes as the first fifth of ``total`` (counting costs about a quarter of writing), the
    second's as the rest, the bytes told summing to ``total`` exactly."""
    if progress is None:
        return None, None
    seen, told = [0, 0], [0]

    def tell(step: int, n: int) -> None:
        seen[step] += n
        now = (seen[0] * total + 4 * seen[1] * counted) // (5 * counted) if counted else seen[1]
        if now > told[0]:
            progress(now - told[0])
            told[0] = now
    return partial(tell, 0), partial(tell, 1)


def _measure(part: _Part, progress, *, options: _PartOptions) -> int:
    """The bytes of ``part``'s lines (no CSV header)."""
    from rmqtool.columnar.text import text_length

    style = _style(options.fmt)
    return sum(text_length(batch, options.body_encoding, style)
               for batch in _part_batches(part, options, [0, 0, 0, []], progress))


def _write_at(item: tuple, progress, *, options: _PartOptions, path: str) -> list:
    """A part (``_Part``, (offset, header bytes), its measured length or None) written into the file at
    ``path`` from that offset, the header first if it has a record; its counts, the damage as
    ``workers.error_info``. Lines of another length than measured (the commit-log file changed in
    between) stop the export."""
    from rmqtool.ops.workers import error_info
    from rmqtool.store.joined import Allocating, open_at

    part, (offset, header), length = item
    counts: list = [0, 0, 0, []]
    with open_at(path, offset) as raw:
        out = Allocating(raw, None if length is None else offset + (header + length if length else 0))
        write_out = writer(options.fmt, out, options.schema, options.body_encoding, name=path, header=header > 0)
        for batch in _part_batches(part, options, counts, progress):
            write_out(batch)
        written = out.tell() - offset
        write_out(None)
    counted = header + length if length else 0
    if length is not None and written != counted:
        source = part.source[1].path if isinstance(part.source, tuple) else part.source.uri
        raise StoreError(f"changed while it was exported: its lines came to {written} bytes, {counted} when "
                         "counted; export again", path=str(source))
    counts[3] = [error_info(exc) for exc in counts[3]]
    return counts


def _warm(first: StoreFile | None, options: _PartOptions) -> None:
    """The first batch of ``first`` decoded (and a text export's line writer loaded) here, before the workers
    are forked from this process (``scan.warm``)."""
    from rmqtool.ops.scan import warm

    if first is not None:
        warm(first, None if options.fmt == "parquet" else partial(
            warm_text, fmt=options.fmt, check_crc=options.check_crc, body_encoding=options.body_encoding),
            check_crc=options.check_crc)


def warm_text(batch, *, fmt: str, check_crc: bool, body_encoding: str) -> None:
    """A row of ``batch`` through the ``fmt`` (jsonl, csv) writer into memory: its compiled line writer
    loaded (see ``scan.warm``)."""
    import pyarrow as pa

    from rmqtool.columnar import record_schema

    out = writer(fmt, pa.BufferOutputStream(), record_schema(check_crc), body_encoding)
    out(batch.slice(0, 1))
    out(None)


def _csv_header(schema) -> bytes:
    import pyarrow as pa

    from rmqtool.columnar.text import export_csv_header
    return export_csv_header(pa.RecordBatch.from_pylist([], schema)).encode()


def _few_entries(commitlogs: list, where, include_blank: bool, counts: list[int]) -> Iterator[tuple[int, Entry]]:
    """The (physical offset, record) ``export_local`` writes of small commit logs, record by record (the
    record-at-a-time decoder, as cat-commitlog's small path), with the bulk path's rules; ``counts`` gets its
    [records, messages, input bytes]. Raises on damage and on a record the bulk path might count otherwise
    (``scan.Irregular``)."""
    from rmqtool.format.rows import row_type
    from rmqtool.ops import scan

    filtered = where is not None and not where.is_empty
    for cl in commitlogs:
        for loc in cl.iter_entries(include_blank=True, reader=True):
            entry, kind = loc.entry, row_type(loc.entry)
            counts[2] += entry.total_size
            if kind == "blank":
                if filtered or not include_blank:
                    continue
            elif filtered:                      # on fields of the row (and the body decompressed, as the Arrow path)
                if kind != "message" or not where.matches(entry, loc.offset):
                    continue                    # (repair's placeholder: no message of any filter)
            if kind != "blank":
                count = scan.record_messages(entry.properties_raw, entry.properties)
                counts[1] += count if kind == "message" else 0
            counts[0] += 1
            yield loc.offset, entry


def _few_text(commitlogs: list, tmp: Path, fmt: str, where, check_crc: bool, body_encoding: str,
              include_blank: bool) -> list[int]:
    """``export_local``'s JSON lines or CSV of small commit logs from ``_few_entries``' records (rows.entry_row,
    as cat-commitlog prints them): the bulk path's bytes and counts. Raises as ``_few_entries``, leaving no
    ``tmp``."""
    from rmqtool.format.rows import entry_row
    from rmqtool.store.atomic import named

    counts, lines = [0, 0, 0], []         # a few MB at most: written at once, its errors naming ``tmp``
    try:
        for offset, entry in _few_entries(commitlogs, where, include_blank, counts):
            row = entry_row(entry, offset, body_encoding=body_encoding, check_crc=check_crc)
            if fmt == "csv" and counts[0] == 1:
                lines.append(_export_csv_line(row))
            lines.append(dumps(row) + "\n" if fmt == "jsonl" else _export_csv_line(row.values()))
        with named(tmp), open(tmp, "wb") as out:
            out.write("".join(lines).encode())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return counts


def _few_parquet(store_paths, commitlogs: list, tmp: Path, where, check_crc: bool, include_blank: bool) -> list[int]:
    """``export_local``'s Parquet of small commit logs: ``_few_entries``' records of each store as one record
    batch (``columnar.entries_batch``: the columnar decoder's values) into the bulk path's writer, without the
    kernel's scan or pyarrow.compute: the bulk path's bytes and counts. Raises as ``_few_entries``, leaving no
    ``tmp``."""
    import numpy as np

    from rmqtool.columnar.batches import entries_batch
    from rmqtool.ops.scan import list_files

    counts = [0, 0, 0]
    schema = export_schema(check_crc)
    batch_schema = file_schema(schema)
    write_out = writer("parquet", tmp, schema, "base64")
    try:
        for store, cl in zip(store_paths, commitlogs):
            files = list_files([store])
            entries = list(_few_entries([cl], where, include_blank, counts))
            if entries:
                batch = entries_batch(entries, check_crc)
                column = _file_column(batch, [f.start for f in files], [f.uri for f in files])
                batch = export_batch(batch, batch_schema, files[0].store if files else str(store), column)
                ends = np.flatnonzero(np.diff(column.indices.to_numpy())) + 1       # a row group per file
                for rows in np.split(np.arange(batch.num_rows), ends):
                    write_out(batch.slice(rows[0], len(rows)))
                    write_out(PART_END)
        write_out(None)
    except BaseException:
        write_out(None, abort=True)
        tmp.unlink(missing_ok=True)
        raise
    return counts


def _export_csv_line(cells) -> str:
    """A line of export's CSV (pyarrow's CSV writer's): strings, maps and lists quoted, numbers and booleans
    bare, None empty."""
    return ",".join('"' + csv_cell(c).replace('"', '""') + '"' if isinstance(c, (str, dict, list)) else
                    str(csv_cell(c)) for c in cells) + "\n"


def export_trace(store_paths: Sequence[str | os.PathLike], to: str | os.PathLike, fmt: str, *,
                 trace_topic: str | None = None, read_anyway: bool = False, overwrite: bool = False,
                 progress: Callable[[int], None] | None = None) -> ExportResult:
    """Every message-trace context of the stores into one file, in one process: the rows of ``rmqtool trace``
    (ops.trace.context_row, every field: JSON lines as ``trace -f jsonl`` prints them, CSV cells as ``trace -f
    csv`` writes them, Parquet in ``ops.trace.trace_schema``). ``result.records`` counts the rows, ``result.messages`` the trace records.
    The commit-log files are read as the data source's kind trace reads them; a store the broker refuses to
    load, damage and a trace body that does not decode are refused (nothing written) unless ``read_anyway``:
    then ``result.skipped``, ``result.damaged`` and ``result.undecodable`` say what was left out."""
    import csv

    from rmqtool.ops.scan import list_files, readable_files
    from rmqtool.ops.trace import TRACE_FIELDS, file_trace_rows, store_trace_topics, trace_schema
    from rmqtool.store.atomic import named
    from rmqtool.store.output import staged

    to = _output_file(to, fmt, overwrite)
    files, skipped = readable_files(list_files([str(p) for p in store_paths], "trace"), read_anyway)
    topics = store_trace_topics((f.store for f in files), trace_topic)
    result = ExportResult(to, fmt, skipped=skipped)
    names = [name for name, _ in TRACE_FIELDS]
    started = time.perf_counter()
    with staged(to, overwrite) as tmp:       # under its lock; an error leaves nothing
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = trace_schema()
            with named(tmp):
                out = pq.ParquetWriter(tmp, schema, compression=PARQUET_COMPRESSION)

            def write(rows: list[dict]) -> None:
                out.write_table(pa.Table.from_pylist(rows, schema=schema))
        else:
            out = open(tmp, "w", encoding="utf-8", newline="")
            cells = csv.writer(out, lineterminator="\n")
            if fmt == "csv":
                cells.writerow(names)

            def write(rows: list[dict]) -> None:
                if fmt == "jsonl":
                    out.write("".join(dumps(row) + "\n" for row in rows))
                else:               # as rmqtool trace -f csv: no value empty, booleans true / false
                    cells.writerows([[csv_cell(row[name]) for name in names] for row in rows])
        try:
            for f in files:
                for rows in file_trace_rows(f, topics[f.store],
                                            on_damage=result.damaged.append if read_anyway else None,
                                            on_undecodable=result.undecodable.append if read_anyway else None,
                                            progress=progress):
                    result.messages += 1
                    result.records += len(rows)
                    if rows:
                        with named(tmp):
                            write(rows)
                result.input_bytes += f.size
            with named(tmp):
                close_parquet(out) if fmt == "parquet" else out.close()
            os.replace(tmp, to)
        except BaseException:
            with contextlib.suppress(OSError):
                close_parquet(out) if fmt == "parquet" else out.close()
            raise
    result.seconds = time.perf_counter() - started
    return result


def message_total(batch) -> int:
    """Messages as the broker counts them (an inner batch record holds INNER_NUM: facts.message_counts)."""
    import pyarrow.compute as pc

    from rmqtool.ops.facts import message_counts
    return pc.sum(message_counts(batch)).as_py() or 0


def total_bytes(batch) -> int:
    """The commit-log bytes of a batch's records."""
    import pyarrow.compute as pc
    return pc.sum(batch.column("total_size")).as_py() or 0


def parquet_options(names: Sequence[str]) -> dict:
    """pyarrow's Parquet writer options for the columns ``names`` (every export shape writes with them)."""
    return {"compression": PARQUET_COMPRESSION,
            "use_dictionary": [c for c in PARQUET_DICTIONARY_COLUMNS if c in names],
            "column_encoding": {c: "DELTA_BINARY_PACKED" for c in PARQUET_DELTA_COLUMNS if c in names},
            "write_statistics": [c for c in names if c not in PARQUET_NO_STATISTICS]}


def close_parquet(pw) -> None:
    """Close a pyarrow ParquetWriter: one whose close failed (a write error) is not closed again when it is
    collected (its __del__ would, and print the error again as an ignored exception)."""
    try:
        pw.close()
    finally:
        pw.is_open = False


PART_END = object()         # write(PART_END): a Parquet row group ends here


def writer(fmt: str, out, schema, body_encoding: str, name: str | None = None, header: bool = True) -> Callable:
    """A write(batch) function over a path or an open binary stream ``out``; write(None) closes it,
    write(PART_END) ends a Parquet row group. Parquet takes batches in ``file_schema(schema)``; CSV begins
    with its header line unless not ``header``. An OSError it raises names the path (a stream's: ``name``),
    where the error names no file."""
    from rmqtool.store.atomic import named

    where = out if isinstance(out, (str, os.PathLike)) else name
    if where is None:
        return _writer(fmt, out, schema, body_encoding, header)
    with named(where):
        write = _writer(fmt, out, schema, body_encoding, header)

    def write_named(batch, abort: bool = False) -> None:
        with named(where):
            write(batch, abort)
    return write_named


def _writer(fmt: str, out, schema, body_encoding: str, header: bool = True) -> Callable:
    if fmt == "parquet":
        import base64

        import pyarrow as pa
        import pyarrow.parquet as pq
        pw = pq.ParquetWriter(out, file_schema(schema), **parquet_options(schema.names))
        # the Arrow schema readers restore is the export schema: store and commitlog_file read back as strings
        pw.add_key_value_metadata({"ARROW:schema": base64.b64encode(schema.serialize().to_pybytes())})

        pending: list = []          # batches are cache-sized: gather ~ROW_GROUP_ROWS rows per row group

        def write_parquet(batch, abort: bool = False) -> None:
            if batch is not None and batch is not PART_END:
                pending.append(batch)
                if sum(b.num_rows for b in pending) < ROW_GROUP_ROWS:
                    return
            if pending and not abort:
                pw.write_table(pa.Table.from_batches(pending))
            pending.clear()
            if batch is None:
                close_parquet(pw)
                if not isinstance(out, (str, os.PathLike)):
                    out.close()
        return write_parquet

    from rmqtool.columnar.text import export_csv_header, text_chunks
    if isinstance(out, (str, os.PathLike)):
        from rmqtool.store.joined import Allocating
        out = Allocating(open(out, "wb"))
    started = not header

    def write_text(batch, abort: bool = False) -> None:
        nonlocal started
        if batch is None:
            out.close()
            return
        if batch is PART_END:
            return
        if fmt == "csv" and not started:
            out.write(export_csv_header(batch).encode())
        started = True
        for chunk in text_chunks(batch, body_encoding, _style(fmt)):
            out.write(chunk)
    return write_text


def _style(fmt: str) -> str:
    """``columnar.text``'s line style of a text export format."""
    return "json" if fmt == "jsonl" else "export_csv"
