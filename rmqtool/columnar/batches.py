"""Columnar bulk decoding: commit-log files to Arrow record batches, without a Python object per field.

``iter_record_batches(source)`` is the scan entry point (export, whole-store cat-commitlog, verify,
rebuild, Spark). It yields the same records, field for field, as ``CommitLog.iter_entries`` with
``rmqtool.format.rows.entry_row`` (schema: ``rmqtool.columnar.schema.record_schema``), in batches of at
most ``batch_rows`` rows, streaming: one mapped file at a time, one window of it at a time.

- BLANK records come as one-row batches of ``type == "blank"`` (their other fields null).
- A DLedger commit log gives the records inside its entries (at entry position + 48, each entry header
  checked as the recovery does) and its BLANKs (magic 0xffffffff) at their own position.
- The walk ends where ``iter_entries`` ends: a zero header (the end of written data), or the last file.
- A damaged record raises the same ``FormatError`` (file path, physical offset, reason) that
  ``iter_entries`` raises, after every record before it was yielded; with ``on_damage`` the error is
  passed to that callback instead, the rest of that file is skipped and the scan goes on with the next file
  (as the per-file scans of stats, grep, a dataset export and Spark do).
"""

from __future__ import annotations

import os
import struct
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from rmqtool import constants as C
from rmqtool.columnar.decode import decode_batch, decode_columns
from rmqtool.columnar.schema import record_schema
from rmqtool.columnar.kernel import Window, scan_window, words
from rmqtool.columnar.props import arrow, strings
from rmqtool.columnar.walk import WINDOW_BYTES, ledger_headers_ok
from rmqtool.errors import FormatError
from rmqtool.format import dledger as D
from rmqtool.format.commitlog import Blank, Entry, Message, decode_entry, peek_header
from rmqtool.format.rows import entry_row
from rmqtool.store.broker_model import recovered_tail
from rmqtool.store.commitlog import CommitLog
from rmqtool.store.dledger import DLedgerCommitLog
from rmqtool.store.filequeue import FileQueue, QueueFile, map_file, populate_pages, release_pages
from rmqtool.store.store import Store

__all__ = ["iter_record_batches", "record_schema", "entries_batch", "open_commitlog", "ledger_file_batches",
           "DEFAULT_BATCH_ROWS", "WINDOW_BYTES"]

DEFAULT_BATCH_ROWS = 128 * 1024
_MESSAGE_MAGICS = (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2)


def open_commitlog(source: str | os.PathLike | Store | CommitLog) -> CommitLog:
    if isinstance(source, CommitLog):
        return source
    if isinstance(source, Store):
        return source.commitlog
    return Store.open(Path(source)).commitlog


def iter_record_batches(source: str | os.PathLike | Store | CommitLog, *, check_crc: bool = False,
                        batch_rows: int = DEFAULT_BATCH_ROWS, start: int | None = None,
                        on_damage: Callable[[FormatError], None] | None = None,
                        columns: Sequence[str] | None = None,
                        select: tuple[Sequence[str], Callable] | None = None,
                        windows: Callable[[np.ndarray, Window, int], bool] | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of a commit log (a store root, commitlog/ directory, single file, Store or
    CommitLog) from ``start`` (default: its first file) to the end of written data: each file to its own
    end of data (``CommitLog.reader_crosses_holes``), a DLedger log to its first zero header.

    ``check_crc`` adds the ``crc_ok`` column (a mismatch is a value, not an error). ``columns`` (of
    ``decode.COLUMNS``): the batches of a window's records hold only these (``decode_columns``: the scan
    copies no bodies), the one-record batches (BLANKs) every column.

    ``select`` (``columns``, ``wanted``): for a filter that keeps few records (a key search). Each window is
    scanned without copies for those columns, ``wanted(batch)`` marks the records to keep (a numpy bool
    array), and only they, with the records between two of them close together, are decoded whole (a
    second scan of their span): the other records give no batch (a caller counting the bytes scanned by
    its batches sees the hits and each file's BLANK), and the caller filters again. A DLedger log is
    decoded whole.

    ``windows(data, window, file_start)``: with ``columns``, each window of a plain commit log (records
    scanned without copies, spans into ``data``) is offered to it first; True: it took the window's records
    itself, and they give no batch (stats sums them from the facts pass).
    """
    cl = open_commitlog(source)
    files = cl.queue.files
    if not files:
        return
    if cl.entry_header_size:             # DLedger: records inside entries
        first, pos = (files[0], 0) if start is None else cl.entry_position(start)
        file_batches = ledger_file_batches
        columns = None if select is not None else columns
    else:
        first, pos = (files[0], 0) if start is None else cl.queue.locate(start)
        file_batches = partial(_file_batches, select=select, windows=windows if columns is not None else None)
    for f in files[files.index(first):]:
        try:
            end_of_data = yield from file_batches(f, pos, check_crc, max(batch_rows, 1), columns)
        except FormatError as exc:
            if on_damage is None:
                raise
            on_damage(exc)                  # the rest of that file is skipped
            end_of_data = False
        if end_of_data and cl.zero_ends_data and not cl.reader_crosses_holes:
            return
        pos = 0


def _file_batches(f: QueueFile, pos: int, check_crc: bool, batch_rows: int,
                  columns: Sequence[str] | None = None,
                  select: tuple[Sequence[str], Callable] | None = None,
                  windows: Callable[[np.ndarray, Window, int], bool] | None = None) -> Iterator[pa.RecordBatch]:
    """Batches of one file from ``pos``; returns True at the end of written data."""
    if f.length == 0:
        return False
    mm, buf, data = _map(f)
    data64 = words(data)
    released = 0
    scratch: dict = {}                  # decode_batch copies what a batch keeps of a window's tables
    if select is not None:
        columns, wanted = select
        whole = partial(_wanted_batches, wanted=wanted, batch_rows=batch_rows, data64=data64, scratch={})
    while True:
        # Batches own copies of their data: drop the mapped pages already decoded (bounded RSS).
        released = release_pages(mm, pos, released)
        populate_pages(mm, pos, WINDOW_BYTES + 65536)
        if _at_file_end(data, pos, C.END_FILE_MIN_BLANK_LENGTH, f):
            return False                      # file end without a BLANK: next file
        size, magic = peek_header(buf, pos)
        if magic in _MESSAGE_MAGICS:
            win = scan_window(data, pos, pos + WINDOW_BYTES, check_crc=check_crc and select is None,
                              items=columns is None, data64=data64, scratch=scratch)
            if select is None:
                if windows is None or not windows(data, win, f.start):
                    yield from _window_batches(data, win, f.start, check_crc, batch_rows, columns)
            else:
                yield from whole(data, win, f.start, check_crc, decode_columns(data, win, f.start, columns))
            if win.bad < 0:
                pos = win.next
                continue
            pos = win.bad                     # a damaged record: decode_entry names the reason
        elif size == 0 and magic == 0:
            return True                       # end of written data
        try:
            entry = _decode_one(buf, f, pos)
        except FormatError:
            if recovered_tail(f.path, buf, pos):
                return True                   # the torn record a recovered store keeps past its end
            raise
        yield entries_batch([(f.start + pos, entry)], check_crc)
        if isinstance(entry, Blank):
            return False
        pos += entry.total_size


def ledger_file_batches(f: QueueFile, pos: int, check_crc: bool, batch_rows: int,
                        columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Batches of one DLedger data file from the entry at ``pos``: the records inside the entries (at
    entry position + 48), then the BLANK row; returns True at the end of written data."""
    if f.length == 0:
        return False
    mm, buf, data = _map(f)
    data64 = words(data)
    cl = DLedgerCommitLog(FileQueue([f]))
    released = 0
    scratch: dict = {}
    while True:
        released = release_pages(mm, pos, released)
        if _at_file_end(data, pos, D.MIN_BLANK_LEN, f):
            return False
        magic, size = struct.unpack_from(">ii", buf, pos)
        if magic == 0 and size == 0:
            return True
        if magic in D.VALID_MAGICS and len(data) - pos > D.HEADER_SIZE + 8 \
                and peek_header(buf, pos + D.HEADER_SIZE)[1] in _MESSAGE_MAGICS:
            win = scan_window(data, pos, pos + WINDOW_BYTES, D.HEADER_SIZE, check_crc=check_crc,
                              items=columns is None, data64=data64, scratch=scratch)
            good = ledger_headers_ok(data, win.starts, win["total"], f.start)
            yield from _window_batches(data, win.head(good), f.start, check_crc, batch_rows, columns)
            if good and good == win.n and win.bad < 0:
                pos = win.next
                continue
            if good:
                pos = (int(win.starts[good]) if good < win.n else win.bad) - D.HEADER_SIZE
        loc = next(cl.entries_at(f, pos))     # a BLANK, or a damaged entry: its error
        yield entries_batch([(loc.offset, loc.entry)], check_crc)
        if isinstance(loc.entry, Blank):
            return False
        pos = loc.offset + loc.entry.total_size - f.start


def _window_batches(data: np.ndarray, win: Window, file_start: int, check_crc: bool,
                    batch_rows: int, columns: Sequence[str] | None) -> Iterator[pa.RecordBatch]:
    for lo in range(0, win.n, batch_rows):
        part = win.slice(lo, min(lo + batch_rows, win.n))
        yield decode_batch(data, part, file_start, check_crc) if columns is None else \
            decode_columns(data, part, file_start, columns)


NEAR = 16                               # wanted records this close (in records) share one second scan


def _wanted_batches(data: np.ndarray, win: Window, file_start: int, check_crc: bool, batch: pa.RecordBatch, *,
                    wanted: Callable, batch_rows: int, data64, scratch: dict) -> Iterator[pa.RecordBatch]:
    """The whole batches of the records ``wanted(batch)`` marks in ``win`` (``batch``: its columns), a scan
    with copies of each run of them (records fewer than ``NEAR`` apart share a run), in file order, at most
    ``batch_rows`` rows a batch.
    ``scratch``: the second scans' own (``win`` holds the first's tables)."""
    rows = np.flatnonzero(wanted(batch))
    if not len(rows):
        return
    ends = np.append(np.flatnonzero(np.diff(rows) >= NEAR), len(rows) - 1)
    firsts = np.insert(ends[:-1] + 1, 0, 0)
    for a, b in zip(rows[firsts].tolist(), rows[ends].tolist()):
        pos, last = int(win.starts[a]), int(win.starts[b])
        while pos <= last:                  # the small-input path may scan a run in more than one go
            run = scan_window(data, pos, last + 1, check_crc=check_crc, items=True, data64=data64, scratch=scratch)
            if not run.n:
                raise RuntimeError(f"a second scan at {file_start + pos} found no record")
            yield from _window_batches(data, run, file_start, check_crc, batch_rows, None)
            pos = run.next


def _at_file_end(data: np.ndarray, pos: int, room: int, f: QueueFile) -> bool:
    """Whether fewer than ``room`` bytes are left; any of them non-zero is a torn write."""
    if len(data) - pos >= room:
        return False
    if data[pos:].any():
        raise FormatError(f"{len(data) - pos} stray bytes at the end of the file", path=str(f.path),
                          offset=f.start + pos)
    return True


def _map(f: QueueFile) -> tuple[object, pa.Buffer, np.ndarray]:
    """A read-only map of a file, as an Arrow buffer and a byte array over the same memory: its first
    ``f.readable`` bytes (a file cut to what is readable, rmqtool.store.readable)."""
    mm = map_file(f.path)
    buf, data = pa.py_buffer(mm), np.frombuffer(mm, np.uint8)
    if f.readable < len(data):
        buf, data = buf.slice(0, f.readable), data[:f.readable]
    return mm, buf, data


def _decode_one(buf, f: QueueFile, pos: int) -> Entry:
    try:
        return decode_entry(buf, pos)
    except FormatError as exc:
        exc.offset = f.start + pos
        raise exc.at(path=str(f.path)) from None


def entries_batch(entries: Iterable[tuple[int, Entry]], check_crc: bool = False) -> pa.RecordBatch:
    """A batch from decoded entries (physical offset, entry): BLANKs and single records."""
    rows = []
    for offset, entry in entries:
        row = entry_row(entry, offset, body_encoding="none", check_crc=check_crc)
        row.pop("body_encoding")
        if isinstance(entry, Message):
            row["body"] = entry.body
            row["properties_raw"] = entry.properties_raw
            row["topic_raw"] = entry.topic_raw
            row["properties"] = list(row["properties"].items())
        rows.append(row)
    schema = record_schema(check_crc)
    if all(isinstance(v, (str, int)) and not isinstance(v, bool) or v is None for row in rows for v in row.values()):
        return _scalar_rows(rows, schema)             # BLANKs: no Python objects through pa.array (pandas)
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def _scalar_rows(rows: list[dict], schema: pa.Schema) -> pa.RecordBatch:
    """A batch of rows whose values are str, int or None, built column by column from buffers."""
    cols = []
    for f in schema:
        values = [row.get(f.name) for row in rows]
        missing = np.array([v is None for v in values])
        if missing.all():
            cols.append(pa.nulls(len(rows), f.type))
        elif pa.types.is_string(f.type):
            cols.append(strings(values))
        else:                   # int32, int64 or timestamp[ms]: built in its width (a cast imports pyarrow.compute)
            cols.append(arrow(np.array([0 if v is None else v for v in values],
                                       np.int32 if f.type == pa.int32() else np.int64), f.type,
                              missing if missing.any() else None))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


