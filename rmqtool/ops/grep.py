"""grep: the records matching a RecordFilter (topic / queue / tag / key / body regex / store time),
across many stores.

``file_hits`` filters one commit-log file's batches (vectorised, then the regex over the survivors'
bodies, decompressed when compressed) into an Arrow table, with each record's message count as the
broker counts it; ``hit_rows`` turns tables into the
documented record rows. Both engines run these same functions, file by file, in (store, offset) order.
"""

from __future__ import annotations

import base64
from functools import partial
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from rmqtool.ops import scan
from rmqtool.ops.filters import RecordFilter, filter_batch
from rmqtool.format.rows import RECORD_FIELDS, body_field

LOCATION_FIELDS = ["store", "commitlog_file"]


def file_hits(f: scan.StoreFile, where: RecordFilter, *, decompress: bool = False,
              on_damage: Callable[[Exception], None] | None = None,
              progress: Callable[[int], None] | None = None) -> pa.Table | None:
    """The matching records of one commit-log file, with ``store`` and ``commitlog_file`` (None: none)."""
    parts = list(file_hit_batches(f, where, decompress=decompress, on_damage=on_damage, progress=progress))
    return pa.Table.from_batches(parts) if parts else None


def file_hit_batches(f: scan.StoreFile, where: RecordFilter, *, decompress: bool = False,
                     on_damage: Callable[[Exception], None] | None = None,
                     progress: Callable[[int], None] | None = None) -> Iterator[pa.RecordBatch]:
    """file_hits batch by batch, as they are decoded; ``messages``: how many messages the broker counts in
    each record (an inner batch's INNER_NUM, facts.message_counts: as stats and export count them)."""
    from rmqtool.ops.facts import message_counts

    rx = where.compiled()
    for batch in scan.record_batches(f, decompress=decompress, on_damage=on_damage, progress=progress,
                                     select=where.selective()):
        batch = filter_batch(batch, where, rx, decompress)
        if batch.num_rows:
            yield batch.append_column("messages", message_counts(batch)) \
                       .append_column("store", pa.repeat(f.store, batch.num_rows)) \
                       .append_column("commitlog_file", pa.repeat(f.uri, batch.num_rows))


def hit_rows(tables: Iterable[pa.Table | pa.RecordBatch | None], body_encoding: str = "base64") -> Iterator[dict]:
    """Record rows (rmqtool.format.rows names, timestamps in epoch ms), plus store and commitlog_file when
    the tables carry them; BLANK rows as ``entry_row`` gives them."""
    for table in tables:
        if table is None:
            continue
        for name in ("born_timestamp", "store_timestamp"):
            i = table.schema.get_field_index(name)
            table = table.set_column(i, name, table.column(i).cast(pa.int64()))
        fields = row_fields(table.schema)
        for row in table.to_pylist():
            if row["type"] == "blank":
                yield {k: row[k] if k in BLANK_FIELDS else None for k in fields}
                continue
            row["properties"] = dict(row["properties"]) if row["properties"] is not None else None
            for name in ("properties_raw", "topic_raw"):
                raw = row[name]
                row[name] = None if raw is None else base64.b64encode(raw).decode("ascii")
            row["body"], row["body_encoding"] = body_field(row["body"], body_encoding)
            yield {k: row[k] for k in fields}


BLANK_FIELDS = {"type", "physical_offset", "total_size", "magic_code", "messages", "store", "commitlog_file"}


def row_fields(schema: pa.Schema) -> list[str]:
    """The fields of ``hit_rows``'s rows for batches of this schema, in order."""
    return RECORD_FIELDS + [n for n in ["crc_ok", "messages"] + LOCATION_FIELDS if n in schema.names]


def grep_local(files: list[scan.StoreFile], where: RecordFilter, *, decompress: bool = False,
               on_damage: Callable[[Exception], None] | None = None,
               progress: Callable[[int], None] | None = None, jobs: int | None = None) -> Iterator[pa.RecordBatch]:
    """The local engine: hits batch by batch in file order. In one process (``jobs`` 1; default
    ``workers.default_jobs``) as they are decoded; else each file's hits from a worker process, the next
    files decoded while the caller writes these (``workers.process_imap``: at most ``jobs`` files' hits
    wait), ``on_damage`` told of a file's damage before its hits."""
    from rmqtool.ops.workers import default_jobs, process_imap

    where.compiled()
    jobs = default_jobs(sum(f.size for f in files), len(files)) if jobs is None else jobs
    if jobs <= 1 or len(files) <= 1:
        for f in files:
            yield from file_hit_batches(f, where, decompress=decompress, on_damage=on_damage, progress=progress)
        return
    scan.warm(files[0], lambda b: filter_batch(b.slice(0, 1), where, where.compiled(), decompress),
              decompress=decompress)
    for hits, damage in process_imap(partial(_file_hits_apart, where=where, decompress=decompress), files, jobs,
                                     progress):
        for warning in damage:
            if on_damage:
                on_damage(warning)
        if hits is not None:
            yield from hits.to_batches()


def _file_hits_apart(f: scan.StoreFile, progress: Callable[[int], None] | None, *, where: RecordFilter,
                     decompress: bool) -> tuple[pa.Table | None, list[str]]:
    """``file_hits`` in a worker: (its hits, the damage it skipped, as text)."""
    damage: list[str] = []
    return file_hits(f, where, decompress=decompress, on_damage=lambda exc: damage.append(str(exc)),
                     progress=progress), damage
