"""grep: the records matching topic / key / tag / body-regex / store-time filters, across many stores.

``file_hits`` filters one commit-log file's batches (vectorised, then the regex over the survivors'
bodies, decompressed when compressed) into an Arrow table; ``hit_rows`` turns tables into the
documented record rows. Both engines run these same functions, file by file, in (store, offset) order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqtool.ops import scan
from rmqtool.ops.rows import RECORD_FIELDS, encode_body

LOCATION_FIELDS = ["store", "commitlog_file"]


@dataclass(frozen=True)
class GrepFilter:
    """Which MESSAGE records match (empty tuple / None = any). Times: store timestamps in epoch ms,
    inclusive. ``body_regex`` is a Python regular expression searched in the (decompressed) body bytes."""

    topics: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    body_regex: str | None = None
    since: int | None = None
    until: int | None = None

    def compiled(self) -> re.Pattern | None:
        if self.body_regex is None:
            return None
        try:
            return re.compile(self.body_regex.encode("utf-8"))
        except re.error as exc:
            raise ValueError(str(exc)) from None


def _mask(batch: pa.RecordBatch, where: GrepFilter) -> pa.Array:
    mask = pc.equal(batch.column("type"), "message")
    if where.topics:
        mask = pc.and_(mask, pc.is_in(batch.column("topic"), pa.array(where.topics, pa.string())))
    if where.tags:
        mask = pc.and_(mask, pc.is_in(batch.column("tags"), pa.array(where.tags, pa.string())))
    ts = batch.column("store_timestamp").cast(pa.int64())
    if where.since is not None:
        mask = pc.and_(mask, pc.greater_equal(ts, where.since))
    if where.until is not None:
        mask = pc.and_(mask, pc.less_equal(ts, where.until))
    if where.keys:
        keys = batch.column("keys")
        hit = pc.is_in(pc.list_flatten(keys), pa.array(where.keys, pa.string()))
        parents = pc.filter(pc.list_parent_indices(keys), hit).to_numpy()
        has_key = np.zeros(batch.num_rows, bool)
        has_key[parents] = True
        mask = pc.and_(mask, pa.array(has_key))
    return pc.fill_null(mask, False)


def _body_matches(batch: pa.RecordBatch, rx: re.Pattern, decompressed: bool) -> pa.Array:
    bodies = batch.column("body").to_pylist()
    if not decompressed:
        bodies = map(scan.body_of, bodies, batch.column("sys_flag").to_pylist(),
                     batch.column("physical_offset").to_pylist())
    return pa.array([rx.search(b) is not None for b in bodies], pa.bool_())


def file_hits(f: scan.StoreFile, where: GrepFilter, *, decompress: bool = False,
              on_damage: Callable[[Exception], None] | None = None) -> pa.Table | None:
    """The matching records of one commit-log file, with ``store`` and ``commitlog_file`` (None: none)."""
    rx = where.compiled()
    parts = []
    for batch in scan.record_batches(f, decompress=decompress, on_damage=on_damage):
        batch = batch.filter(_mask(batch, where))
        if rx is not None and batch.num_rows:
            batch = batch.filter(_body_matches(batch, rx, decompress))
        if batch.num_rows:
            parts.append(batch)
    if not parts:
        return None
    table = pa.Table.from_batches(parts)
    return table.append_column("store", pa.repeat(f.store, table.num_rows)) \
                .append_column("commitlog_file", pa.repeat(f.uri, table.num_rows))


def hit_rows(tables: list[pa.Table | None], body_encoding: str = "base64") -> Iterator[dict]:
    """Record rows (rmqtool.ops.rows names, timestamps in epoch ms) plus store and commitlog_file."""
    for table in tables:
        if table is None:
            continue
        for name in ("born_timestamp", "store_timestamp"):
            i = table.schema.get_field_index(name)
            table = table.set_column(i, name, table.column(i).cast(pa.int64()))
        extra = ["crc_ok"] if "crc_ok" in table.schema.names else []
        for row in table.to_pylist():
            row["properties"] = dict(row["properties"]) if row["properties"] is not None else None
            row["body"] = encode_body(row["body"], body_encoding)
            row["body_encoding"] = None if body_encoding == "none" else body_encoding
            yield {k: row[k] for k in RECORD_FIELDS + extra + LOCATION_FIELDS}


def grep_local(files: list[scan.StoreFile], where: GrepFilter, *, decompress: bool = False,
               on_damage: Callable[[Exception], None] | None = None) -> Iterator[pa.Table | None]:
    """The single-process engine: hits file by file (streamed)."""
    where.compiled()
    for f in files:
        yield file_hits(f, where, decompress=decompress, on_damage=on_damage)
