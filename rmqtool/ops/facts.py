"""Record facts of one commit-log file, column by column, as the maintenance commands need them.

``scan_file`` walks a file as CommitLog.checkMessageAndReturnSize does (from position 0 to a BLANK,
the zero end of data or the first invalid record) on the columnar engine, and keeps per record only
what verify, rebuild and repair use: offset, size, queue, queue offset, sys flag, tags code, store
time and, on request, the index key hashes. Where the walk stops, and why, is named by the
record-at-a-time decoder, so findings carry the same kind, offset and message as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from contextlib import closing
from functools import partial
import functools
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from rmqtool import constants as C
from rmqtool.columnar.facts import (DISPATCH_PROPERTIES, QueueTable, WindowFacts, delay_tags_code, split_pairs,
                                    window_facts, window_topic)
from rmqtool.columnar.kernel import MIN_RECORD, Window, load_compiled, plain_path, scan_window, words
from rmqtool.errors import BadMagic, ChecksumMismatch, FormatError, InconsistentLength, RmqError, Truncated
from rmqtool.format.commitlog import Blank, decode_entry, peek_header
from rmqtool.format.java import java_string_hash
from rmqtool.ops.findings import ERROR, WARNING, Finding
from rmqtool.ops.workers import default_jobs, process_imap
from rmqtool.store.broker_model import step_over
from rmqtool.store.filequeue import QueueFile, first_nonzero, map_file, populate_pages, release_pages

if TYPE_CHECKING:
    import pyarrow as pa
# pyarrow (and rmqtool.columnar.props, Arrow arrays of properties) are imported where they are used: a small
# store's verify walks its kernel windows and needs none of them (pyarrow.compute alone costs ~0.1 CPU-s)

Progress = Callable[[int], None]
_MESSAGE_MAGICS = (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2)
_SCHEDULE_HASH = java_string_hash(C.RMQ_SYS_SCHEDULE_TOPIC) & 0xFFFFFFFF
_NEEDS_CQ = np.array([t in (C.TransactionType.NOT_TYPE, C.TransactionType.COMMIT) for t in C.TransactionType])
# bytes walked per kernel window: the facts pass that follows finds the records' topics and properties
# still in the core's cache (2 MiB of L2 here; 16 MiB windows made that pass ~1.8x slower)
WINDOW_BYTES = 2 << 20
_COLUMNS = {"offset": np.int64, "size": np.int32, "queue": np.int32, "queue_offset": np.int64, "sys_flag": np.int32,
            "tags_code": np.int64, "store_timestamp": np.int64}


class QueueNames:
    """(topic, queue id) <-> small integer codes, shared by every file of a scan."""

    def __init__(self):
        self.names: list[tuple[str, int]] = []
        self.codes: dict[tuple[str, int], int] = {}
        self._topics: dict[str, int] = {}          # topic -> number, for the sorted pair keys below
        self._keys = np.empty(0, np.int64)         # (topic number << 32 | queue id) of known codes, sorted
        self._values = np.empty(0, np.int64)
        self.table = QueueTable()                  # the codes the kernel windows' pairs have had

    def code(self, name: tuple[str, int]) -> int:
        c = self.codes.get(name)
        if c is None:
            c = self.codes[name] = len(self.names)
            self.names.append(name)
        return c

    def encode(self, topic: pa.Array, queue_id: np.ndarray) -> np.ndarray:
        import pyarrow.compute as pc

        enc = pc.dictionary_encode(topic)
        return self.encode_indexed(enc.indices.to_numpy(), enc.dictionary.to_pylist(), queue_id)

    def encode_indexed(self, topic_index: np.ndarray, topics: list[str], queue_id: np.ndarray) -> np.ndarray:
        """``encode`` of topics given as indexes into ``topics`` (numbered in order of first appearance)."""
        pair = topic_index.astype(np.int64) << 32 | (queue_id.astype(np.int64) & 0xFFFFFFFF)
        uniq, inverse = np.unique(pair, return_inverse=True)
        return self.pair_codes(uniq, topics)[inverse.reshape(-1)]

    def window_codes(self, data: np.ndarray, win: Window, facts: WindowFacts) -> np.ndarray:
        """The codes of the pairs of a kernel window's facts, numbered as ``pair_codes`` numbers them:
        looked up in ``table``; only pairs new to it are named here (in the order of their pairs)."""
        codes = self.table.lookup(data, win, facts)
        new = np.flatnonzero(codes < 0)
        if len(new):
            new = new[np.argsort(facts.pairs[new])]
            pairs = facts.pairs[new]
            for i, t, q in zip(new.tolist(), *split_pairs(pairs)):
                codes[i] = self.code((window_topic(data, win, facts, t), q))
            self.table.insert(data, win, facts, pairs, codes[new])
        return codes

    def pair_codes(self, pairs: np.ndarray, topics: list[str]) -> np.ndarray:
        """The codes of distinct (topic index << 32 | queue id as uint32) pairs, indexes into ``topics``;
        names new to this scan are numbered in the order of their pairs (as ``encode`` numbers them)."""
        numbers = np.array([self._topics.setdefault(t, len(self._topics)) for t in topics] or [0], np.int64)
        keys = numbers[pairs >> 32] << 32 | (pairs & 0xFFFFFFFF)
        at = np.minimum(np.searchsorted(self._keys, keys), max(len(self._keys) - 1, 0))
        known = self._keys[at] == keys if len(self._keys) else np.zeros(len(keys), bool)
        codes = np.where(known, self._values[at] if len(self._keys) else 0, -1)
        new = np.flatnonzero(~known)
        if len(new):
            new = new[np.argsort(pairs[new])]
            for i, t, q in zip(new.tolist(), *split_pairs(pairs[new])):
                codes[i] = self.code((topics[t], q))
            order = np.argsort(np.concatenate([self._keys, keys[new]]), kind="stable")
            self._keys = np.concatenate([self._keys, keys[new]])[order]
            self._values = np.concatenate([self._values, codes[new]])[order]
        return codes


@dataclass
class FileFacts:
    """The valid records of one file (columns of equal length) and where its walk stopped."""

    file: QueueFile
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    key_offsets: np.ndarray | None = None   # record i's key hashes: key_hashes[key_offsets[i]:key_offsets[i+1]]
    key_hashes: np.ndarray | None = None
    # DISPATCH_PROPERTIES, null where absent: Arrow string arrays, or lists of str | None where the file was
    # scanned as plain Python (a few records: no pyarrow to import); read them with present, value_at, int_values
    props: dict[str, pa.Array | list] = field(default_factory=dict)
    stop: str = "zero"           # "blank", "zero" (end of data), "invalid", "file_end"
    stop_offset: int = 0         # physical offset where the walk stopped (a BLANK's own offset)
    findings: list[Finding] = field(default_factory=list)
    damaged: list[tuple[int, int, str]] = field(default_factory=list)   # salvage: (offset, bytes skipped, kind)
    # queue runs the walking process wrote already (rebuild.place_runs): (queue code, queue offset, units,
    # first unit's physical offset, its end, the last unit's end) per row; in a dry run, compared instead:
    # (row of ``placed``, then queue_writer.compare_run's part) per queue file each run falls in
    placed: np.ndarray | None = None
    compared: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.columns["offset"])

    @property
    def end(self) -> int:
        """Physical offset after the file's valid data (the file's end after a BLANK)."""
        return self.file.start + self.file.length if self.stop == "blank" else self.stop_offset

    @property
    def oversized_blank(self) -> int | None:
        """Offset of the file's end-of-file BLANK when its TOTALSIZE exceeds the rest of the file."""
        return next((f.offset for f in self.findings if f.kind == "blank_size_mismatch" and f.actual > f.expected),
                    None)

    def select(self, keep: np.ndarray) -> "FileFacts":
        """The same file's facts for the records where ``keep`` is true (columns, key hashes, properties)."""
        out = FileFacts(self.file, {k: v[keep] for k, v in self.columns.items()}, stop=self.stop,
                        stop_offset=self.stop_offset, findings=self.findings, damaged=self.damaged)
        if self.key_offsets is not None:
            counts = np.diff(self.key_offsets)
            out.key_hashes = self.key_hashes[np.repeat(keep, counts)]
            out.key_offsets = np.concatenate([[0], np.cumsum(counts[keep])]).astype(np.int64)
        out.props = {k: [v for v, kept in zip(values, keep.tolist()) if kept] for k, values in self.props.items()
                     if isinstance(values, list)}
        if len(out.props) < len(self.props):
            import pyarrow as pa

            mask = pa.Array.from_buffers(pa.bool_(), len(keep), [None, pa.py_buffer(np.packbits(keep, bitorder="little"))])
            out.props.update({k: v.filter(mask) for k, v in self.props.items() if k not in out.props})
        return out

    def gets_cq_unit(self) -> np.ndarray:
        """CommitLogDispatcherBuildConsumeQueue: only NOT and COMMIT transaction types."""
        return _NEEDS_CQ[(self.columns["sys_flag"] >> 2) & 3]

    def indexed(self) -> np.ndarray:
        return ((self.columns["sys_flag"] >> 2) & 3) != C.TransactionType.ROLLBACK >> 2




class _Collector:
    """A file's facts, written batch by batch into columns sized for the most records the file can hold
    (its length over the smallest record): pages never written are never touched, so they cost address
    space but no memory, and nothing is joined or copied at the end."""

    def __init__(self, names: QueueNames, deep: bool, keys: bool, props: bool, progress: Progress | None,
                 length: int):
        self.names, self.deep, self.keys, self.props, self.progress = names, deep, keys, props, progress
        cap = length // MIN_RECORD + 1
        self.n = 0
        self.columns = {k: np.empty(cap, t) for k, t in _COLUMNS.items()}
        self.key_counts = np.empty(cap if keys else 0, np.int64)
        self.key_hashes = np.empty(2 * cap if keys else 0, np.int32)    # grown when records carry more keys
        self.key_n = 0
        self.prop_parts: list[tuple[int, dict[str, pa.Array]]] = []    # (first row, DISPATCH_PROPERTIES' values)

    def add(self, batch: pa.RecordBatch) -> tuple[dict[str, np.ndarray], int]:
        """Keep the leading valid records of a decoded batch; returns their columns and count."""
        cols, ok = _batch_facts(batch, self.names, self.deep)
        batch = batch.slice(0, ok)
        return self._keep({k: v[:ok] for k, v in cols.items()}, _key_hashes(batch) if self.keys else None,
                          _dispatch_properties(batch) if self.props else None), ok

    def add_window(self, data: np.ndarray, win: Window, file_start: int) -> int:
        """``add`` for the records of a kernel window (scanned without items) over the mapped ``data``:
        their facts from one compiled pass (``rmqtool.columnar.facts``), or from the Arrow columns of
        ``decode_facts`` when a topic or a hashed property is not valid UTF-8. Returns the leading valid records."""
        # columnar.decode, imported only here: it makes pyarrow import pandas (~56 MB in every worker)
        wf = window_facts(data, win, self.keys, DISPATCH_PROPERTIES if self.props else ())
        if wf is None:
            from rmqtool.columnar.decode import decode_facts
            return self.add(decode_facts(data, win, file_start, self.deep))[1]
        tags, bad = wf.tags_code, np.zeros(win.n, bool)
        schedule = [t for t in np.flatnonzero(wf.topic_hash == _SCHEDULE_HASH).tolist()
                    if window_topic(data, win, wf, t) == C.RMQ_SYS_SCHEDULE_TOPIC]
        if schedule:                # the DELAY level's deliver time, record by record as the decoder takes it
            rows = np.flatnonzero(wf.topic_index == schedule[0])
            for r, p, n, ts in zip(rows.tolist(), win["props_pos"][rows].tolist(), win["props_len"][rows].tolist(),
                                   win["store_timestamp"][rows].tolist()):
                code = delay_tags_code(bytes(data[p:p + n]), ts)
                tags[r], bad[r] = (0, True) if code is None else (code, False)
        if self.deep:
            bad |= win["crc_ok"] == 0
        ok = int(np.argmax(bad)) if bad.any() else win.n
        # the window's columns as they are (views, cast where they are written: one copy each)
        cols = {"offset": win.starts[:ok] + file_start, "size": win["total"][:ok],
                "queue": self.names.window_codes(data, win, wf)[wf.pair_index[:ok]],
                "queue_offset": win["queue_offset"][:ok], "sys_flag": win["sys_flag"][:ok], "tags_code": tags[:ok],
                "store_timestamp": win["store_timestamp"][:ok]}
        keys = None
        if self.keys:
            counts = wf.key_counts[:ok]
            keys = counts, wf.key_hashes[:int(counts.sum())]
        props = None                # most windows have none of them: nothing is built (finish fills in nulls)
        if self.props and any(win.prop(k)[0][:ok].max(initial=-1) >= 0 for k in DISPATCH_PROPERTIES):
            if plain_path():        # a few records, scanned as plain Python: their values as Python strings
                props = {k: [bytes(data[a:b]).decode() if a >= 0 else None
                             for a, b in zip(*(ends[:ok].tolist() for ends in win.prop(k)))]
                         for k in DISPATCH_PROPERTIES}
            else:
                from rmqtool.columnar.props import property_values

                props = {k: v.slice(0, ok)
                         for k, v in property_values(data, win, {k: k for k in DISPATCH_PROPERTIES}).items()}
        self._keep(cols, keys, props)
        return ok

    def _keep(self, cols: dict[str, np.ndarray], keys, props) -> dict[str, np.ndarray]:
        n, ok = self.n, len(cols["offset"])
        for k, v in cols.items():
            self.columns[k][n:n + ok] = v
        self.n += ok
        if keys is not None:
            counts, hashes = keys
            self.key_counts[n:n + ok] = counts
            if self.key_n + len(hashes) > len(self.key_hashes):
                grown = np.empty(2 * (self.key_n + len(hashes)), np.int32)
                grown[:self.key_n] = self.key_hashes[:self.key_n]
                self.key_hashes = grown
            self.key_hashes[self.key_n:self.key_n + len(hashes)] = hashes
            self.key_n += len(hashes)
        if props is not None:
            self.prop_parts.append((n, props))
        if self.progress and len(cols["size"]):
            self.progress(int(cols["size"].sum()))
        return cols

    def finish(self, facts: FileFacts) -> FileFacts:
        facts.columns = {k: v[:self.n] for k, v in self.columns.items()}
        if self.keys:
            facts.key_offsets = np.zeros(self.n + 1, np.int64)
            np.cumsum(self.key_counts[:self.n], out=facts.key_offsets[1:])
            facts.key_hashes = self.key_hashes[:self.key_n]
        if self.props:
            facts.props = {k: self._property(k) for k in DISPATCH_PROPERTIES}
        return facts

    def _property(self, name: str) -> pa.Array | list:
        """A property's values for every record kept: the parts kept, nulls before, between and after them; a
        list while the process scans as plain Python (the file's few records), else an Arrow array."""
        if plain_path() and all(isinstance(part[name], list) for _, part in self.prop_parts):
            out: list = [None] * self.n
            for row, part in self.prop_parts:
                out[row:row + len(part[name])] = part[name]
            return out
        import pyarrow as pa

        from rmqtool.columnar.props import strings

        pieces, at = [], 0
        for row, part in self.prop_parts:
            values = part[name]
            pieces += [pa.nulls(row - at, pa.string()), strings(values) if isinstance(values, list) else values]
            at = row + len(values)
        pieces.append(pa.nulls(self.n - at, pa.string()))
        return pa.concat_arrays(pieces) if len(pieces) > 1 else pieces[0]


def present(values: pa.Array | list) -> np.ndarray:
    """Whether each value is set (not null), from the validity bitmap: a boolean array's ``to_numpy``
    would make pyarrow import pandas, ~0.2 CPU-s in a process that needs it for nothing else."""
    n = len(values)
    if isinstance(values, list):
        return np.fromiter((v is not None for v in values), bool, n)
    if not values.null_count:
        return np.ones(n, bool)
    if values.null_count == n:
        return np.zeros(n, bool)
    bits = np.unpackbits(np.frombuffer(values.buffers()[0], np.uint8), bitorder="little")
    return bits[values.offset:values.offset + n].astype(bool)


def value_at(values: pa.Array | list, row: int) -> str | None:
    """A dispatch property's value in record ``row`` (FileFacts.props)."""
    return values[row] if isinstance(values, list) else values[row].as_py()


def int_values(values: pa.Array | list, rows: np.ndarray) -> np.ndarray:
    """A dispatch property's values in records ``rows`` (set in each) as int64, as Arrow's cast reads them
    (ArrowInvalid, a ValueError, where one is no integer); a list of plain decimal numbers is read without
    Arrow."""
    if isinstance(values, list):
        picked = [values[r] for r in rows.tolist()]
        if all(v.isascii() and v.isdigit() and len(v) <= 18 for v in picked):
            return np.array([int(v) for v in picked], np.int64)
        from rmqtool.columnar.props import strings
        values = strings(values)
    import pyarrow as pa
    return values.take(pa.array(rows)).cast(pa.int64()).to_numpy()


@functools.cache
def _scalars() -> tuple:
    """("1", "message", DISPATCH_PROPERTIES' names, int64 0) as Arrow values built from buffers: a Python value
    in pa.scalar or a pc.* call imports pandas (0.2 CPU-s)."""
    import pyarrow as pa

    from rmqtool.columnar.props import arrow, strings

    one, message, *keys = strings(["1", "message", *DISPATCH_PROPERTIES])
    return one, message, keys, arrow(np.zeros(1, np.int64), pa.int64())[0]


def message_counts(batch: pa.RecordBatch) -> pa.Array:
    """Messages per record as the 5.x broker counts them (int64): an inner batch (a BatchCQ topic's
    MessageBatch stored as one record with INNER_NUM and INNER_BASE) holds INNER_NUM messages
    (CommitLog.setBatchSizeIfNeeded gives the dispatch that batchSize; the batch queue's offsets and
    AppendMessageResult.msgNum advance by it); any other message 1, a BLANK 0."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from rmqtool.columnar.props import arrow

    one, message, _, zero = _scalars()
    props = _dispatch_properties(batch)
    num, base = props[C.PROPERTY_INNER_NUM], props[C.PROPERTY_INNER_BASE]
    messages = pc.equal(batch.column("type"), message) if "type" in batch.schema.names else None
    if num.null_count == len(num):                  # no inner batch here: one message per MESSAGE record
        return arrow(np.ones(len(num), np.int64), pa.int64()) if messages is None else pc.cast(messages, pa.int64())
    inner = pc.and_kleene(pc.and_(pc.is_valid(num), pc.is_valid(base)), pc.utf8_is_digit(num))   # never null
    counts = pc.cast(pc.if_else(inner, num, one), pa.int64())
    return counts if messages is None else pc.if_else(messages, counts, zero)


def _dispatch_properties(batch: pa.RecordBatch) -> dict[str, pa.Array]:
    import pyarrow as pa
    import pyarrow.compute as pc

    if C.PROPERTY_INNER_NUM in batch.schema.names:            # decode_facts: looked up already
        return {k: batch.column(k) for k in DISPATCH_PROPERTIES}
    props = batch.column("properties")
    # only batches with an INNER_* property look them up (the map's keys: a tenth of the bytes of properties_raw)
    inner = pc.starts_with(props.keys, "INNER_") if isinstance(props, pa.MapArray) else \
        pc.match_substring(batch.column("properties_raw"), "INNER_")
    if not pc.any(inner).as_py():
        return {k: pa.nulls(len(props), pa.string()) for k in DISPATCH_PROPERTIES}
    return {k: pc.map_lookup(props, key, "first") for k, key in zip(DISPATCH_PROPERTIES, _scalars()[2])}


def scan_file(f: QueueFile, names: QueueNames, *, deep: bool = False, keys: bool = False, props: bool = False,
              progress: Progress | None = None, ledger: bool = False, salvage: bool = False) -> FileFacts:
    """Walk one commit-log file from position 0 (see the module docstring); ``ledger``: a DLedger data
    file, whose records sit inside entries. ``keys``: index key hashes; ``props``: DISPATCH_PROPERTIES.
    ``salvage``: go on past a damaged record (``FileFacts.damaged``; ``rmqtool.store.broker_model.step_over``)."""
    got = _Collector(names, deep, keys, props, progress, f.length)
    if ledger:
        return got.finish(_scan_ledger_file(f, got))
    facts = FileFacts(f)
    path = str(f.path)
    mm = map_file(f.path)
    buf = memoryview(mm)
    data = np.frombuffer(mm, np.uint8, min(len(mm), f.readable))     # a file cut to what is readable
    data64 = words(data)
    pos = released = 0
    scratch: dict = {}                 # the kernel's tables, reused: add_window copies what it keeps
    while True:
        released = release_pages(mm, pos, released)
        populate_pages(mm, pos, WINDOW_BYTES + 65536)
        remaining = len(data) - pos
        if remaining < C.END_FILE_MIN_BLANK_LENGTH:
            facts.stop = "file_end"
            if data[pos:].any():
                facts.findings.append(Finding(ERROR, "torn_tail", path, f.start + pos,
                                              f"{remaining} stray bytes at the end of the file"))
            break
        size, magic = peek_header(buf, pos)
        if size == 0 and magic == 0:
            facts.stop = "zero"
            hit = first_nonzero(f.path, pos, f.readable)     # holes not read
            if hit is not None:
                facts.findings.append(Finding(ERROR, "torn_tail", path, f.start + hit,
                                              f"non-zero bytes after the end of written data at {f.start + pos} "
                                              "(a torn or truncated write)", expected=0, actual="non-zero"))
            break
        if magic in _MESSAGE_MAGICS:
            win = scan_window(data, pos, pos + WINDOW_BYTES, check_crc=deep, data64=data64, scratch=scratch)
            if win.n:
                ok = got.add_window(data, win, f.start)
                _physical_offset_warnings(facts, win.starts[:ok], win["stored_physical_offset"][:ok], f.start, path)
                if ok < win.n:                      # CRC mismatch or a bad DELAY: named below
                    pos = int(win.starts[ok])
                elif win.bad < 0:
                    pos = win.next
                    continue
                else:
                    pos = win.bad
            else:
                pos = win.bad
        _stop_at(facts, buf, pos, remaining=len(data) - pos, deep=deep, path=path)
        if salvage and facts.stop == "invalid":
            nxt = step_over(mm, pos)
            facts.damaged.append((f.start + pos, nxt - pos, facts.findings[-1].kind))
            if nxt < len(data):
                pos = nxt
                continue
            pos, facts.stop = nxt, "file_end"
        break
    facts.stop_offset = f.start + pos
    return got.finish(facts)


def warm(f: QueueFile, *, deep: bool = False, keys: bool = False, props: bool = False, ledger: bool = False,
         salvage: bool = False) -> None:
    """Load the compiled scan and facts passes in this process, over the first record of ``f``, before
    worker processes are forked from it: each would load them again from the cache (~0.25 CPU-s apiece)."""
    load_compiled()
    if ledger or f.length < MIN_RECORD:
        return
    mm = map_file(f.path)
    data = np.frombuffer(mm, np.uint8)
    if peek_header(memoryview(mm), 0)[1] in _MESSAGE_MAGICS:
        win = scan_window(data, 0, MIN_RECORD, check_crc=deep, data64=words(data))
        if win.n:
            _Collector(QueueNames(), deep, keys, props, None, f.length).add_window(data, win, f.start)


def scan_files(items: list[tuple[QueueFile, dict[str, Any]]], names: QueueNames, jobs: int | None = None,
               progress: Progress | None = None,
               in_worker: Callable[[FileFacts, QueueNames], FileFacts] | None = None) -> Iterator[FileFacts]:
    """``scan_file(f, names, **options)`` for each (file, options) of ``items``, in order. With several
    ``jobs`` (default: ``workers.default_jobs``) the files are walked in worker processes
    (``workers.process_imap``: the next files while the caller uses the last), each with its own
    QueueNames whose codes are then renumbered here in file order: the same codes, and so the same
    facts, as one walk in one process. ``in_worker(facts, names)``: a step each worker takes on the
    facts it walked, whose result comes back instead (not taken when the files are walked here)."""
    if jobs is None:
        jobs = default_jobs(sum(f.length for f, _ in items), len(items))
    if jobs <= 1 or len(items) <= 1:
        for f, options in items:
            yield scan_file(f, names, progress=progress, **options)
        return
    warm(items[0][0], **items[0][1])
    # a worker's step leaves less to send back (rebuild-cq's placed runs, the index's columns): one file more
    # handed out keeps a worker that is done before the one whose result is due busy, not waiting for this process
    results = process_imap(partial(_scan_apart, in_worker=in_worker), items, jobs, progress,
                           ahead=1 if in_worker is not None else 0)
    with closing(results):                  # the workers stopped when the caller stops early
        for local, facts in results:
            table = np.array([names.code(name) for name in local.names] or [0], np.int32)
            if "queue" in facts.columns:                  # (a worker's step may leave it out)
                facts.columns["queue"] = table[facts.columns["queue"]]
            if facts.placed is not None:                  # (mapped read-only)
                facts.placed = np.column_stack([table[facts.placed[:, 0]], facts.placed[:, 1:]])
            yield facts


def _scan_apart(item: tuple[QueueFile, dict[str, Any]], progress: Progress | None,
                in_worker: Callable[[FileFacts, QueueNames], FileFacts] | None = None) -> tuple[QueueNames, FileFacts]:
    names = QueueNames()
    f, options = item
    facts = scan_file(f, names, progress=progress, **options)
    return names, in_worker(facts, names) if in_worker is not None else facts


def _scan_ledger_file(f: QueueFile, got: _Collector) -> FileFacts:
    """scan_file over the columnar DLedger walk: its batches, a BLANK row, or the damage it raises."""
    from rmqtool.columnar import DEFAULT_BATCH_ROWS, ledger_file_batches

    facts = FileFacts(f, stop="file_end", stop_offset=f.start)
    batches = ledger_file_batches(f, 0, got.deep, DEFAULT_BATCH_ROWS)
    try:
        while True:
            try:
                batch = next(batches)
            except StopIteration as end:
                facts.stop = "zero" if end.value else "file_end"
                break
            offsets = batch.column("physical_offset").to_numpy()
            if batch.column("type")[0].as_py() == "blank":
                facts.stop, facts.stop_offset = "blank", int(offsets[0])
                break
            good, ok = got.add(batch)
            if ok:
                facts.stop_offset = int(good["offset"][-1] + good["size"][-1])
            if ok < len(offsets):
                at = int(offsets[ok])
                facts.stop, facts.stop_offset = "invalid", at
                kind = "crc_mismatch" if got.deep and not batch.column("crc_ok")[ok].as_py() else "bad_delay"
                facts.findings.append(Finding(ERROR, kind, str(f.path), at,
                                              f"{kind.replace('_', ' ')}; a recovery that reads this file stops here"))
                break
    except FormatError as exc:
        facts.stop = "invalid"
        facts.stop_offset = exc.offset if exc.offset is not None else facts.stop_offset
        facts.findings.append(Finding(ERROR, _error_kind(exc, 0, 0), exc.path or str(f.path), facts.stop_offset,
                                      f"{exc.message}; a recovery that reads this file stops here"))
    return facts


def _stop_at(facts: FileFacts, buf, pos: int, *, remaining: int, deep: bool, path: str) -> None:
    """The walk stops at ``pos`` (a BLANK or damage): decode that entry one at a time to say why."""
    f = facts.file
    size, magic = peek_header(buf, pos)
    if magic == C.BLANK_MAGIC_CODE:
        # 4.9.7 ends the file at a BLANK whatever its TOTALSIZE says (CommitLog.checkMessageAndReturnSize checks
        # the magic first); 5.3.x first rejects a TOTALSIZE beyond the rest of the file, so its recovery stops
        # at an oversized BLANK (broker_model "blank_size", recovery_stop). The walk goes on in the next file
        # either way, and repair rewrites a mismatched size (fix_blank_size), which both versions then accept.
        facts.stop = "blank"
        if size != remaining:
            facts.findings.append(Finding(ERROR, "blank_size_mismatch", path, f.start + pos,
                                          f"BLANK total size {'exceeds' if size > remaining else 'is below'} "
                                          "the rest of the file", remaining, size))
        return
    try:
        entry = decode_entry(buf, pos, check_crc=deep)
        if not isinstance(entry, Blank):
            entry.tags_code()                       # a malformed DELAY raises ValueError
    except (FormatError, ValueError) as exc:
        facts.stop = "invalid"
        kind = "bad_delay" if isinstance(exc, ValueError) else _error_kind(exc, size, remaining)
        msg = exc.message if isinstance(exc, RmqError) else f"bad DELAY property: {exc}"
        expected = actual = None
        if isinstance(exc, InconsistentLength):
            expected, actual = exc.computed, exc.declared
        elif isinstance(exc, ChecksumMismatch):
            expected, actual = exc.computed, exc.stored
        elif isinstance(exc, BadMagic):
            actual = f"0x{exc.actual & 0xFFFFFFFF:08x}"
        elif kind == "record_crosses_file_end":
            expected, actual = remaining, size
        facts.findings.append(Finding(ERROR, kind, path, f.start + pos,
                                      f"{msg}; a recovery that reads this file stops here", expected, actual))
        return
    raise FormatError("record decodes one at a time but not in a batch (internal error)", path=path,
                      offset=f.start + pos)


def _error_kind(exc: FormatError, size: int, remaining: int) -> str:
    if isinstance(exc, BadMagic):
        return "bad_magic"
    if isinstance(exc, ChecksumMismatch):
        return "crc_mismatch"
    if isinstance(exc, InconsistentLength):
        return "length_mismatch"
    if isinstance(exc, Truncated) and size > remaining:
        return "record_crosses_file_end"
    return "bad_record"


def _batch_facts(batch: pa.RecordBatch, names: QueueNames, deep: bool) -> tuple[dict[str, np.ndarray], int]:
    """The fact columns of a decoded batch and how many leading records are valid."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = batch.column
    tags_code = col(batch.schema.get_field_index("tags_code"))
    bad = tags_code.is_null()
    if deep:
        bad = pc.or_(bad, pc.invert(col(batch.schema.get_field_index("crc_ok"))))
    bad = bad.to_numpy(zero_copy_only=False)
    ok = int(np.argmax(bad)) if bad.any() else len(bad)
    queue_id = col(batch.schema.get_field_index("queue_id")).to_numpy()
    cols = {
        "offset": col(batch.schema.get_field_index("physical_offset")).to_numpy(),
        "size": col(batch.schema.get_field_index("total_size")).to_numpy().astype(np.int32),
        "queue": names.encode(col(batch.schema.get_field_index("topic")), queue_id).astype(np.int32),
        "queue_offset": col(batch.schema.get_field_index("queue_offset")).to_numpy(),
        "sys_flag": col(batch.schema.get_field_index("sys_flag")).to_numpy().astype(np.int32),
        "tags_code": tags_code.fill_null(0).to_numpy(),
        "store_timestamp": col(batch.schema.get_field_index("store_timestamp")).cast(pa.int64()).to_numpy(),
    }
    return cols, ok


def _physical_offset_warnings(facts: FileFacts, starts: np.ndarray, stored: np.ndarray, file_start: int,
                              path: str) -> None:
    """Records whose PHYSICALOFFSET field (from the header gather) is not their position."""
    stored = stored.astype(np.int64)
    for i in np.flatnonzero(stored != starts + file_start).tolist():
        at = int(starts[i]) + file_start
        facts.findings.append(Finding(WARNING, "physical_offset_mismatch", path, at,
                                      "stored PHYSICALOFFSET differs from the record's position",
                                      at, int(stored[i])))


# -- index key hashes ---------------------------------------------------------------------------------
_MASK = np.uint64(0xFFFFFFFF)


def _key_hashes(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """Per record, IndexFile.indexKeyHashMethod of ``topic#key`` for UNIQ_KEY then each KEYS element
    (IndexService.buildIndex order): (keys per record, flat hashes). String.hashCode composes:
    hash(a + b) = hash(a) * 31^len(b) + hash(b), so each key is hashed once, with no joined strings."""
    import pyarrow as pa
    import pyarrow.compute as pc

    topic = batch.column(batch.schema.get_field_index("topic"))
    uniq = batch.column(batch.schema.get_field_index("uniq_key"))
    keys = batch.column(batch.schema.get_field_index("keys"))
    has_uniq = uniq.is_valid().to_numpy(zero_copy_only=False)
    key_counts = pc.list_value_length(keys).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    counts = has_uniq.astype(np.int64) + key_counts
    # flat (record, key) pairs: the UNIQ_KEYs, then the keys; each placed at its record's slot
    rec_of_key = pc.list_parent_indices(keys).to_numpy(zero_copy_only=False)
    uniq_rows = np.flatnonzero(has_uniq)
    rec = np.concatenate([uniq_rows, rec_of_key])
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    nth = np.arange(len(rec_of_key)) - np.concatenate([[0], np.cumsum(key_counts)[:-1]])[rec_of_key]
    place = np.concatenate([start[uniq_rows], start[rec_of_key] + has_uniq[rec_of_key] + nth])
    raw, length = _raw_hashes(pa.concat_arrays([uniq.filter(pa.array(has_uniq)), pc.list_flatten(keys)]))
    enc = pc.dictionary_encode(topic)
    topic_raw = np.array([java_string_hash(t) & 0xFFFFFFFF for t in enc.dictionary.to_pylist()], np.uint64)
    head = (topic_raw[enc.indices.to_numpy()[rec]] * np.uint64(31) + np.uint64(ord("#"))) & _MASK
    h = np.empty(len(rec), np.int64)
    h[place] = (head * _pow_table(31, int(length.max(initial=0)) + 1)[length] + raw) & _MASK
    h = np.where(h >= 1 << 31, h - (1 << 32), h)
    return counts, np.where(h == -(1 << 31), 0, np.abs(h)).astype(np.int32)


def _raw_hashes(strings: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(String.hashCode as unsigned 32-bit values, length in UTF-16 code units) of every string: Horner's
    rule over strings of one length at a time, a column of characters per step (uint32 wraps as Java's
    int does); strings with non-ASCII characters one at a time."""
    import pyarrow as pa

    n = len(strings)
    if not n:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    strings = strings.cast(pa.large_string())
    offsets = np.frombuffer(strings.buffers()[1], np.int64, n + 1, strings.offset)
    data = strings.buffers()[2]
    chars = np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)
    starts, length = offsets[:-1], np.diff(offsets)
    raw = np.zeros(n, np.uint32)
    order = np.argsort(length, kind="stable")
    by_length = length[order]
    cuts = np.flatnonzero(np.diff(by_length)) + 1
    for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, n].tolist()):
        rows = order[lo:hi]
        at, h = starts[rows], np.zeros(hi - lo, np.uint32)
        for j in range(int(by_length[lo])):
            h = h * np.uint32(31) + chars[at + j]
        raw[rows] = h
    raw = raw.astype(np.uint64)
    high = np.concatenate([[0], np.cumsum(chars[offsets[0]:offsets[-1]] >= 0x80)])
    for i in np.flatnonzero(high[offsets[1:] - offsets[0]] > high[starts - offsets[0]]).tolist():
        text = strings[i].as_py()                    # UTF-16 code units differ from bytes
        raw[i] = java_string_hash(text) & 0xFFFFFFFF
        length[i] = len(text.encode("utf-16-be", "surrogatepass")) // 2
    return raw, length


_POW_CACHE: dict[int, np.ndarray] = {}


def _pow_table(base: int, n: int) -> np.ndarray:
    """base^i mod 2^32 for i < n (uint64), grown by doubling and cached."""
    table = _POW_CACHE.get(base)
    if table is None:
        table = np.ones(1, np.uint64)
    while len(table) < n:
        step = pow(base, len(table), 1 << 32)
        table = np.concatenate([table, table * np.uint64(step) & 0xFFFFFFFF])
    _POW_CACHE[base] = table
    return table[:n]
