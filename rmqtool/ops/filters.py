"""The one record filter of cat-commitlog, grep, export, stats and query-key --scan.

Filters of different kinds are ANDed; the values of one repeatable filter are ORed (``--topic A
--topic B``: either topic). A key matches a KEYS element or the UNIQ_KEY. Times are store timestamps
in epoch ms, inclusive. ``matches`` checks one decoded message, ``mask`` an Arrow record batch
(pyarrow is imported only there): both give the same answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator

from rmqtool.format.commitlog import Message
from rmqtool.store.commitlog import CommitLog


MASK_COLUMNS = ["type", "topic", "queue_id", "tags", "store_timestamp", "keys", "uniq_key"]   # what mask reads


@dataclass(frozen=True)
class RecordFilter:
    """Which MESSAGE records to keep (an empty tuple or None: any). ``body_regex`` is a Python regular
    expression searched in the body bytes (decompressed when the record is compressed)."""

    topics: tuple[str, ...] = ()
    queue_ids: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    body_regex: str | None = None
    since: int | None = None
    until: int | None = None

    @property
    def is_empty(self) -> bool:
        return self == RecordFilter()

    def compiled(self) -> re.Pattern | None:
        if self.body_regex is None:
            return None
        try:
            return re.compile(self.body_regex.encode("utf-8"))
        except re.error as exc:
            raise ValueError(str(exc)) from None

    def matches(self, msg: Message, offset: int | None = None) -> bool:
        """Does this message (at commit-log ``offset``) pass? The regex searches the body decompressed, as
        the columnar path's does."""
        from rmqtool.ops.scan import body_of

        rx = self.compiled()
        return ((not self.topics or msg.topic in self.topics)
                and (not self.queue_ids or msg.queue_id in self.queue_ids)
                and (self.since is None or msg.store_timestamp >= self.since)
                and (self.until is None or msg.store_timestamp <= self.until)
                and (not self.tags or msg.tags in self.tags)
                and (not self.keys or any(k in self.keys for k in msg.keys) or msg.uniq_key in self.keys)
                and (rx is None or rx.search(body_of(msg.body, msg.sys_flag, offset)) is not None))

    def selective(self) -> tuple[list[str], Callable] | None:
        """A scan's ``select`` (``iter_record_batches``) for this filter where it keeps few records (a key is
        asked for, no body regex): the columns ``mask`` reads and the rows it keeps; else None (every
        record decoded whole)."""
        if not self.keys or self.body_regex is not None:
            return None
        return MASK_COLUMNS, lambda batch: self.mask(batch).to_numpy(zero_copy_only=False)

    def mask(self, batch):
        """A boolean Arrow array: the MESSAGE rows of ``batch`` that pass every filter but the regex."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        mask = pc.equal(batch.column("type"), "message")
        for name, values, kind in (("topic", self.topics, pa.string()), ("queue_id", self.queue_ids, pa.int32()),
                                   ("tags", self.tags, pa.string())):
            if values:
                mask = pc.and_(mask, pc.is_in(batch.column(name), pa.array(values, kind)))
        ts = batch.column("store_timestamp").cast(pa.int64())
        if self.since is not None:
            mask = pc.and_(mask, pc.greater_equal(ts, self.since))
        if self.until is not None:
            mask = pc.and_(mask, pc.less_equal(ts, self.until))
        if self.keys:
            wanted = pa.array(self.keys, pa.string())
            keys = batch.column("keys")
            hit = pc.is_in(pc.list_flatten(keys), wanted)
            has_key = np.zeros(batch.num_rows, bool)
            has_key[pc.filter(pc.list_parent_indices(keys), hit).to_numpy()] = True
            uniq = pc.fill_null(pc.is_in(batch.column("uniq_key"), wanted), False)
            mask = pc.and_(mask, pc.or_(pa.array(has_key), uniq))
        return pc.fill_null(mask, False)


def _body_matches(batch, rx: re.Pattern, decompressed: bool):
    import pyarrow as pa

    from rmqtool.ops import scan

    bodies = batch.column("body").to_pylist()
    if not decompressed:
        bodies = map(scan.body_of, bodies, batch.column("sys_flag").to_pylist(),
                     batch.column("physical_offset").to_pylist())
    return pa.array([rx.search(b) is not None for b in bodies], pa.bool_())


def filter_batch(batch, where: RecordFilter, rx: re.Pattern | None, decompressed: bool):
    """The rows of one batch that pass ``where`` (``rx``: its compiled body regex)."""
    batch = batch.filter(where.mask(batch))
    if rx is not None and batch.num_rows:
        batch = batch.filter(_body_matches(batch, rx, decompressed))
    return batch


def keep_records(batch, where: RecordFilter | None, include_blank: bool = False, decompressed: bool = False):
    """The records a bulk command keeps: the messages that pass ``where`` (with repair's placeholders,
    type ``salvaged_record``, when nothing is filtered); BLANKs only when asked for."""
    import pyarrow.compute as pc

    from rmqtool.columnar.props import strings

    if where is None or where.is_empty:
        if include_blank:
            return batch
        messages = pc.not_equal(batch.column("type"), strings(["blank"])[0])    # (a str would import pandas)
        return batch if pc.all(messages).as_py() else batch.filter(messages)  # (a filter copies every column)
    return filter_batch(batch, where, where.compiled(), decompressed)


def filtered_batches(cl: CommitLog, where: RecordFilter, *, start: int | None = None, count: int | None = None,
                     include_blank: bool = False, check_crc: bool = False, decompress: bool = False,
                     progress: Callable[[int], None] | None = None, on_damage=None) -> Iterator:
    """The one commit-log scan of cat-commitlog, query-key --scan and query-id --scan (and the twin of
    grep's per-file scan): Arrow batches of the records that pass ``where``, from ``start``, at most
    ``count``; ``progress(n)`` is told the bytes scanned; ``on_damage``: as iter_record_batches."""
    from rmqtool.columnar import iter_record_batches
    from rmqtool.ops.scan import BytesCounter, decompress_bodies

    files = cl.queue.files
    counted = BytesCounter(start if start is not None else (files[0].start if files else 0), progress)
    n = 0
    for batch in iter_record_batches(cl, check_crc=check_crc, start=start, batch_rows=16384, on_damage=on_damage,
                                     select=where.selective() if where is not None else None):
        counted(batch)
        if decompress:
            batch = decompress_bodies(batch)
        batch = keep_records(batch, where, include_blank, decompressed=decompress)
        if count is not None:
            batch = batch.slice(0, count - n)
        if batch.num_rows:
            n += batch.num_rows
            yield batch
        if count is not None and n >= count:
            return
