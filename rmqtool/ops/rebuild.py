"""Regenerate consume queues and index files from the commit log, as the broker's dispatch does.

``CqWriter`` is ConsumeQueue.putMessagePositionInfo (duplicate/repeat rules, fillPreBlank, full-size
files; ``CqFileWriter`` streams a new queue to sparse files, ``BcqFileWriter`` a batch queue);
``IndexBuilder`` is IndexService.buildIndex over ``IndexWriter`` (= IndexFile.putKey, one key or a column of
keys). They are shared by rebuild, repair (re-dispatch after truncation) and the writers (put/import).
Records come from ``rmqtool.ops.facts``, one commit-log file at a time.
"""

from __future__ import annotations

import filecmp
import mmap
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from rmqtool import constants as C
from rmqtool.errors import EncodeError, FormatError, StoreError
from rmqtool.format.consumequeue import FILLER_UNIT, UNIT
from rmqtool.format.indexfile import DEFAULT_GEOMETRY, Geometry, IndexWriter, check_geometry
from rmqtool.ops.facts import FileFacts, Progress, QueueNames, scan_file
from rmqtool.store.atomic import BUILD, Transaction
from rmqtool.store.filequeue import release_pages, same_content
from rmqtool.store.store import ConsumeQueue, Store

_FORBIDDEN = set('/\\\x00')


def safe_topic_dir(topic: str, offset: int | None = None) -> str:
    """A topic usable as a consume-queue directory name; anything that could leave the store is refused."""
    if not topic or topic in (".", "..") or _FORBIDDEN & set(topic) or len(topic.encode("utf-8")) > 255:
        raise EncodeError(f"topic {topic!r} cannot be a consume-queue directory name "
                          "(empty, '.', '..', or contains '/', '\\\\' or NUL)", offset=offset)
    return topic


class RecordInfo(NamedTuple):
    """What dispatch needs of one record (the writers' single-record path)."""

    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    tags_code: int
    store_timestamp: int
    index_keys: tuple[str, ...]      # UNIQ_KEY then each KEYS element (IndexService.buildIndex order)

    @property
    def gets_cq_unit(self) -> bool:
        """CommitLogDispatcherBuildConsumeQueue: only NOT and COMMIT transaction types."""
        return C.transaction_type(self.sys_flag) in (C.TransactionType.NOT_TYPE, C.TransactionType.COMMIT)

    @property
    def indexed(self) -> bool:
        return C.transaction_type(self.sys_flag) is not C.TransactionType.ROLLBACK


def valid_facts(store: Store, names: QueueNames, *, start: int | None = None, deep: bool = False,
                keys: bool = False, props: bool = False, progress: Progress | None = None) -> Iterator[FileFacts]:
    """The files' records the broker would dispatch, in order, up to the first invalid record
    (from the file holding ``start``, whose records before it are left out)."""
    files = [f for f in store.commitlog.queue.files if f.length]
    ledger = bool(store.commitlog.entry_header_size)
    if start is not None:
        files = [f for f in files if f.start + f.length > start]
    for f in files:
        facts = scan_file(f, names, deep=deep, keys=keys, props=props, progress=progress, ledger=ledger)
        if start is not None and f.start < start:
            facts = facts.select(facts.columns["offset"] >= start)
        yield facts
        if facts.stop != "blank":
            return


# -- consume queues ---------------------------------------------------------------------------------
class CqWriter:
    """One consume queue in memory: full-size files keyed by start offset, a write position and
    maxPhysicOffset, changed as ConsumeQueue.putMessagePositionInfo / recover / truncate would."""

    def __init__(self, file_size: int, files: dict[int, bytearray] | None = None):
        if file_size <= 0 or file_size % C.CQ_STORE_UNIT_SIZE:
            raise StoreError(f"consume-queue file size {file_size} is not a positive multiple of 20")
        self.file_size = file_size
        self.files: dict[int, bytearray] = files or {}
        self.write_pos = min(self.files) if self.files else 0
        self.max_phy = -1
        self.first_created: int | None = None

    @classmethod
    def load(cls, cq: ConsumeQueue, file_size: int) -> "CqWriter":
        """Existing files, then ConsumeQueue.recover: keep units up to the first invalid one
        (scanning from the third-last file), drop later files and zero the rest."""
        files = {}
        for f in cq.queue:
            data = bytes(f.read())
            whole = min(len(data) - len(data) % C.CQ_STORE_UNIT_SIZE, file_size)
            files[f.start] = bytearray(data[:whole] + bytes(file_size - whole))   # whole units, full size
        w = cls(file_size, files)
        starts = sorted(files)
        if not starts:
            return w
        i = max(0, len(starts) - 3)
        pos = 0
        while True:
            buf = files[starts[i]]
            pos = 0
            for phy, size, _ in UNIT.iter_unpack(buf):
                if not (phy >= 0 and size > 0):
                    break
                pos += C.CQ_STORE_UNIT_SIZE
                w.max_phy = phy + size
            if pos == file_size and i + 1 < len(starts):
                i += 1
                continue
            break
        w._truncate_at(starts[i] + pos)
        return w

    def _truncate_at(self, logical: int) -> None:
        """MappedFileQueue.truncateDirtyFiles, plus zeroing what it leaves behind."""
        for start in sorted(self.files):
            if start + self.file_size > logical:
                if logical >= start:
                    buf = self.files[start]
                    buf[logical - start:] = bytes(self.file_size - (logical - start))
                else:
                    del self.files[start]
        self.write_pos = logical

    def put_many(self, phy: np.ndarray, size: np.ndarray, tags: np.ndarray, queue_offset: np.ndarray) -> None:
        """``put`` for each record in order; a run continuing the queue goes in as whole blocks."""
        if len(phy) and not self.files:                 # the first unit opens the queue (fillPreBlank)
            self.put(int(phy[0]), int(size[0]), int(tags[0]), int(queue_offset[0]))
            phy, size, tags, queue_offset = phy[1:], size[1:], tags[1:], queue_offset[1:]
        n = len(phy)
        if n and phy[0] + size[0] > self.max_phy and queue_offset[0] * C.CQ_STORE_UNIT_SIZE == self.write_pos \
                and (np.diff(queue_offset) == 1).all() and (np.diff(phy + size) > 0).all():
            units = np.empty(n, [("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
            units["phy"], units["size"], units["tags"] = phy, size, tags
            data = units.tobytes()
            while data:
                last = max(self.files)
                if self.write_pos >= last + self.file_size:
                    last += self.file_size
                    self._new_file(last)
                room = last + self.file_size - self.write_pos
                self._append(last, data[:room])
                data = data[room:]
            self.max_phy = int(phy[-1] + size[-1])
            return
        for i in range(n):
            self.put(int(phy[i]), int(size[i]), int(tags[i]), int(queue_offset[i]))

    def _new_file(self, start: int) -> None:
        self.files[start] = bytearray(self.file_size)
        self.write_pos = start

    def put(self, phy: int, size: int, tags_code: int, queue_offset: int) -> None:
        if phy + size <= self.max_phy:
            return                                     # "build consume queue repeatedly"
        expect = queue_offset * C.CQ_STORE_UNIT_SIZE
        last = max(self.files) if self.files else None
        if last is None:
            last = expect - expect % self.file_size
            self._new_file(last)
            self.first_created = last
        elif self.write_pos >= last + self.file_size:
            last += self.file_size
            self._new_file(last)
        if last == self.first_created and queue_offset != 0 and self.write_pos == last:
            filler = UNIT.pack(*FILLER_UNIT)
            while self.write_pos < last + expect % self.file_size:   # fillPreBlank
                self._append(last, filler)
        if queue_offset != 0 and expect < self.write_pos:
            return                                     # repeated
        self.max_phy = phy + size
        self._append(last, UNIT.pack(phy, size, tags_code))

    def _append(self, start: int, units: bytes) -> None:
        pos = self.write_pos - start
        self.files[start][pos:pos + len(units)] = units
        self.write_pos += len(units)

    def truncate_dirty(self, phy_offset: int) -> None:
        """ConsumeQueue.truncateDirtyLogicFiles: drop units whose record starts at or after phy_offset."""
        while self.files:
            last = max(self.files)
            buf = self.files[last]
            first_phy = UNIT.unpack_from(buf, 0)[0]
            if first_phy >= phy_offset:
                del self.files[last]
                self.write_pos = last
                continue
            pos = C.CQ_STORE_UNIT_SIZE
            while pos < self.file_size:
                phy, size, _ = UNIT.unpack_from(buf, pos)
                if not (phy >= 0 and size > 0) or phy >= phy_offset:
                    break
                pos += C.CQ_STORE_UNIT_SIZE
            buf[pos:] = bytes(self.file_size - pos)
            self.write_pos = last + pos
            return

    def file_bytes(self) -> dict[int, bytes]:
        return {start: bytes(buf) for start, buf in sorted(self.files.items())}


class FileStream:
    """Bytes appended to a queue's files under ``directory`` (None: only counted), one small buffer in
    memory. Files are created sparse at full size, as the broker's pre-allocated files are."""

    FLUSH_BYTES = 16 * 1024

    def __init__(self, file_size: int, directory: Path | None):
        self.file_size, self.directory = file_size, directory
        self.start = self.pos = 0              # the current file and the write position (queue bytes)
        self.pending = bytearray()
        self.created = 0

    def new_file(self, start: int) -> None:
        self.flush()
        self.start = self.pos = start
        self.created += 1
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.directory / C.offset_to_file_name(start), "wb") as fh:
                fh.truncate(self.file_size)

    def write(self, data: bytes) -> None:
        """Append at the write position, inside the current file."""
        self.pending += data
        if len(self.pending) >= self.FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.pending and self.directory is not None and self.created:
            with open(self.directory / C.offset_to_file_name(self.start), "r+b") as fh:
                fh.seek(self.pos - self.start)
                fh.write(self.pending)
        self.pos += len(self.pending)
        self.pending = bytearray()


class CqFileWriter(CqWriter):
    """A CqWriter for a new queue whose units stream into files (``FileStream``): memory is one small
    buffer, whatever the queue's size."""

    def __init__(self, file_size: int, directory: Path | None):
        super().__init__(file_size)
        self.stream = FileStream(file_size, directory)

    @property
    def created(self) -> int:
        return self.stream.created

    def _new_file(self, start: int) -> None:
        self.stream.new_file(start)
        self.files = {start: bytearray()}       # the current file's start only; bytes live on disk
        self.write_pos = start

    def _append(self, start: int, units: bytes) -> None:
        self.stream.write(units)
        self.write_pos += len(units)

    def flush(self) -> None:
        self.stream.flush()


BCQ_UNIT = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8"), ("store_time", ">i8"), ("base", ">i8"),
                     ("batch_size", ">i2"), ("compacted", ">i4"), ("reserved", ">i4")])


class BcqFileWriter:
    """BatchConsumeQueue.putBatchMessagePositionInfo for a new queue, streamed: units from queue position
    0, a unit starting at or before the last one's physical offset dropped as a repeat."""

    def __init__(self, file_size: int, directory: Path | None):
        if file_size <= 0 or file_size % C.BCQ_STORE_UNIT_SIZE:
            raise StoreError(f"batch consume-queue file size {file_size} is not a positive multiple of 46")
        self.stream = FileStream(file_size, directory)
        self.last_phy = -1
        self.units = 0

    @property
    def created(self) -> int:
        return self.stream.created

    @property
    def write_pos(self) -> int:
        return self.units * C.CQ_STORE_UNIT_SIZE      # counted like consume-queue units in results

    def put_many(self, phy, size, tags, store_time, base, batch_size) -> None:
        keep = phy > np.maximum.accumulate(np.concatenate([[self.last_phy], phy[:-1]]))
        units = np.zeros(int(keep.sum()), BCQ_UNIT)
        for name, col in (("phy", phy), ("size", size), ("tags", tags), ("store_time", store_time),
                          ("base", base), ("batch_size", batch_size)):
            units[name] = col[keep]
        units["compacted"] = C.BCQ_INVALID_POS
        data = units.tobytes()
        fs = self.stream
        while data:
            if fs.pos + len(fs.pending) == fs.start + fs.file_size or not fs.created:
                fs.new_file(self.units * C.BCQ_STORE_UNIT_SIZE)
            room = fs.start + fs.file_size - fs.pos - len(fs.pending)
            fs.write(data[:room])
            self.units += len(data[:room]) // C.BCQ_STORE_UNIT_SIZE
            data = data[room:]
        if len(phy):
            self.last_phy = max(self.last_phy, int(phy.max()))

    def flush(self) -> None:
        self.stream.flush()


def store_cq_file_size(store: Store, explicit: int | None = None) -> int | None:
    """--cq-file-size, else the size shared by the store's existing consume-queue files."""
    if explicit:
        return explicit
    sizes = [cq.queue.file_size for cq in store.consume_queues() if cq.queue.file_size]
    return max(set(sizes), key=sizes.count) if sizes else None


@dataclass
class RebuildResult:
    topics: list[str] = field(default_factory=list)     # the topics of the records seen
    changes: list[tuple[str, str, str]] = field(default_factory=list)   # dry run: (action, queue dir, detail)
    queues: int = 0
    files: int = 0
    units: int = 0
    target: str = ""
    backup: str | None = None


def rebuild_consume_queues(store: Store, *, topic: str | None = None, out: Path | None = None,
                           cq_file_size: int | None = None, bcq_file_size: int | None = None, dry_run: bool = False,
                           backup: Path | None = None, allow_empty: bool = True,
                           progress: Progress | None = None) -> RebuildResult:
    """Consume queues (all, or one topic's) rebuilt from the commit log as the broker's dispatch writes
    them: classic and LMQ queues under ``consumequeue/``, BatchCQ topics' queues under
    ``batchconsumequeue/``. Into ``out`` (<topic>/<queueId>/ for every kind), counted only (``dry_run``),
    or built beside the store's directories and swapped in. A ``topic`` without records changes nothing
    unless ``allow_empty`` (``result.topics`` then lists the commit log's topics)."""
    from rmqtool.ops.queues import batch_cq_topics

    sizes = (store_cq_file_size(store, cq_file_size) or C.DEFAULT_CQ_FILE_SIZE,
             bcq_file_size or store_bcq_file_size(store))
    batch = batch_cq_topics(store)
    if topic is not None:
        safe_topic_dir(topic)
    kinds = ["batchconsumequeue" if topic in batch else "consumequeue"] if topic is not None else \
        ["consumequeue"] + (["batchconsumequeue"] if batch or (store.root / "batchconsumequeue").is_dir() else [])
    rels = {kind: kind if topic is None else f"{kind}/{topic}" for kind in kinds}
    result = RebuildResult(target=str(out or store.root / rels[kinds[0]]))
    if out is not None and not dry_run:
        out = Path(out)
        if out.exists() and any(out.iterdir()):
            raise StoreError("output directory is not empty", path=str(out))
    built = {kind: store.root / (rel + BUILD) for kind, rel in rels.items()} if out is None and not dry_run else {}
    for path in built.values():
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)

    scratch = Path(tempfile.mkdtemp(prefix="rmqtool-cq-")) if dry_run else None   # a dry run builds here

    def directory(t: str, qid: int, is_batch: bool) -> Path | None:
        if scratch is not None:
            return scratch / ("batchconsumequeue" if is_batch else "consumequeue") / t / str(qid)
        if out is not None:
            return out / t / str(qid)
        base = built["batchconsumequeue" if is_batch else "consumequeue"]
        return base / t / str(qid) if topic is None else base / str(qid)

    try:
        writers, result.topics = dispatch_files(store, directory, sizes, batch, topic=topic, progress=progress)
        if topic is not None and not writers and not allow_empty:
            raise _NoRecords
    except BaseException as exc:                 # leave nothing half-built behind (``out`` was empty)
        made = list(built.values()) + (list(out.iterdir()) if out is not None and out.exists() else [])
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
        if isinstance(exc, _NoRecords):
            return result
        raise
    result.queues, result.files = len(writers), sum(w.created for w in writers.values())
    result.units = sum(w.write_pos // C.CQ_STORE_UNIT_SIZE for w in writers.values())
    if scratch is not None:
        try:
            result.changes = _queue_changes(store, scratch, [rels[kind] for kind in kinds])
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if dry_run or out is not None:
        return result
    txn = Transaction(store.root, backup, label="rebuild-cq")
    for kind, path in built.items():
        txn.replace_dir(rels[kind], path)
    result.backup = str(txn.commit())
    return result


def _queue_changes(store: Store, built: Path, rels: list[str]) -> list[tuple[str, str, str]]:
    """(action, queue directory, detail) for each queue whose rebuilt files differ from the store's."""
    out = []
    for rel in rels:
        mine, theirs = built / rel, store.root / rel
        for q in sorted(_queue_dirs(mine) | _queue_dirs(theirs), key=str):
            a, b = mine / q, theirs / q
            files_a = {p.name for p in a.iterdir()} if a.is_dir() else set()
            files_b = {p.name for p in b.iterdir() if p.is_file()} if b.is_dir() else set()
            if not files_a:
                out.append(("delete_cq", f"{rel}/{q}", "the commit log has no record for this queue"))
            elif files_a != files_b or not all(same_content(a / n, b / n) for n in files_a):
                out.append(("write_cq", f"{rel}/{q}", f"{len(files_a)} file(s) differ from the rebuilt ones"))
    return out


def _queue_dirs(root: Path) -> set[Path]:
    """The directories holding files below ``root``, relative to it (the queues of a tree)."""
    return {p.parent.relative_to(root) for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()


class _NoRecords(Exception):
    """The topic asked for has no records: nothing is rebuilt."""


def store_bcq_file_size(store: Store) -> int:
    """The size shared by the store's batch consume-queue files, else the broker default."""
    sizes = [q.queue.file_size for q in store.batch_consume_queues() if q.queue.file_size]
    return max(set(sizes), key=sizes.count) if sizes else C.DEFAULT_BCQ_FILE_SIZE


Writer = CqFileWriter | BcqFileWriter


def dispatch_files(store: Store, directory, sizes: tuple[int, int], batch_topics: set[str], *,
                   topic: str | None = None,
                   progress: Progress | None = None) -> tuple[dict[tuple[str, int], Writer], list[str]]:
    """The broker's dispatch over the whole commit log, one file's records at a time: each record's
    consume-queue unit (a batch unit on a BatchCQ topic) and its multi-dispatch (LMQ) units, each queue's
    run put as one block. ``directory(topic, queue_id, is_batch)`` says where a queue's files go.
    Returns the writers by queue and the topics of the records seen."""
    names = QueueNames()
    writers: dict[int, Writer] = {}

    def writer(code: int, is_batch: bool, at: int) -> Writer:
        w = writers.get(code)
        if w is None:
            t, qid = names.names[code]
            safe_topic_dir(t, at)
            kind = BcqFileWriter if is_batch else CqFileWriter
            w = writers[code] = kind(sizes[is_batch], directory(t, qid, is_batch))
        return w

    for facts in valid_facts(store, names, props=True, progress=progress):
        cols = facts.columns
        rows = np.flatnonzero(facts.gets_cq_unit())
        on_batch = np.isin(cols["queue"][rows], [c for c, (t, _) in enumerate(names.names) if t in batch_topics])
        queue, rec, offset = _with_multi_dispatch(facts, names, rows[~on_batch])
        for is_batch, (queue, rec, offset) in ((False, (queue, rec, offset)),
                                                (True, _batch_units(facts, rows[on_batch]))):
            if topic is not None:
                keep = np.isin(queue, [c for c, (t, _) in enumerate(names.names) if t == topic])
                queue, rec, offset = queue[keep], rec[keep], offset[keep]
            order = np.lexsort((rec, queue))
            queue, rec, offset = queue[order], rec[order], offset[order]
            codes, first = np.unique(queue, return_index=True)
            for code, lo, hi in zip(codes.tolist(), first.tolist(), first[1:].tolist() + [len(queue)]):
                r = rec[lo:hi]
                w = writer(code, is_batch, int(cols["offset"][r[0]]))
                if is_batch:
                    w.put_many(cols["offset"][r], cols["size"][r], cols["tags_code"][r], cols["store_timestamp"][r],
                               offset[lo:hi] >> 16, offset[lo:hi] & 0xFFFF)
                else:
                    w.put_many(cols["offset"][r], cols["size"][r], cols["tags_code"][r], offset[lo:hi])
    for w in writers.values():
        w.flush()
    return {names.names[c]: w for c, w in writers.items()}, sorted({t for t, _ in names.names})


def _with_multi_dispatch(facts: FileFacts, names: QueueNames,
                         rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(queue, record, queue offset asked for) of the records' own units, plus one per multi-dispatch
    target (INNER_MULTI_DISPATCH / INNER_MULTI_QUEUE_OFFSET, format.dispatch's rules)."""
    from rmqtool.format.dispatch import is_lmq, multi_dispatch_targets

    cols = facts.columns
    queue, rec, offset = [cols["queue"][rows]], [rows], [cols["queue_offset"][rows]]
    targets = facts.props[C.PROPERTY_INNER_MULTI_DISPATCH]
    asked = facts.props[C.PROPERTY_INNER_MULTI_QUEUE_OFFSET]
    extra = []
    for r in rows[targets.is_valid().to_numpy(zero_copy_only=False)[rows]].tolist():
        topic, qid = names.names[int(cols["queue"][r])]
        props = {C.PROPERTY_INNER_MULTI_DISPATCH: targets[r].as_py(),
                 C.PROPERTY_INNER_MULTI_QUEUE_OFFSET: asked[r].as_py() or ""}
        for name, text in multi_dispatch_targets(topic, props):
            if "/" in name:
                continue
            try:
                extra.append((names.code((name, 0 if is_lmq(name) else qid)), r, int(text)))
            except ValueError:
                break                     # Long.parseLong fails: the broker stops there
    if extra:
        e = np.array(extra, np.int64)
        queue.append(e[:, 0]), rec.append(e[:, 1]), offset.append(e[:, 2])
    return np.concatenate(queue), np.concatenate(rec), np.concatenate(offset)


def _batch_units(facts: FileFacts, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(queue, record, msgBaseOffset << 16 | batchSize) of records on BatchCQ topics: INNER_BASE and
    INNER_NUM when both are set (CommitLog.setBatchSizeIfNeeded), else the queue offset and 1."""
    cols = facts.columns
    base = cols["queue_offset"][rows].copy()
    size = np.ones(len(rows), np.int64)
    num, inner = facts.props[C.PROPERTY_INNER_NUM], facts.props[C.PROPERTY_INNER_BASE]
    both = (num.is_valid().to_numpy(zero_copy_only=False) & inner.is_valid().to_numpy(zero_copy_only=False))[rows]
    if both.any():
        picked = pa.array(rows[both])
        try:
            base[both] = inner.take(picked).cast(pa.int64()).to_numpy()
            size[both] = num.take(picked).cast(pa.int64()).to_numpy()
        except pa.ArrowInvalid as exc:
            raise FormatError(f"bad INNER_BASE/INNER_NUM: {exc}", path=str(facts.file.path)) from None
    return cols["queue"][rows], rows, base << 16 | size


# -- index files ------------------------------------------------------------------------------------
def index_file_name(timestamp_ms: int, after: str | None = None) -> str:
    """UtilAll.timeMillisToHumanString in local time (TZ), made later than ``after`` if needed."""
    lt = time.localtime(timestamp_ms / 1000)
    name = time.strftime("%Y%m%d%H%M%S", lt) + f"{timestamp_ms % 1000:03d}"
    if after is not None and name <= after:
        name = str(int(after) + 1).zfill(len(after))
    return name


class IndexBuilder:
    """IndexService.buildIndex: keys into the last file, a new file (named after the record's store
    time) when it is full. ``full_end_timestamp`` is what the broker puts in the checkpoint's
    indexMsgTimestamp when a file fills up (None if none did). With ``directory``, new files are
    sparse files there, written through a map (memory stays small whatever the geometry)."""

    KEYS_PER_PUT = 1 << 19           # keys put as one set of columns (bounds the temporaries)

    def __init__(self, geometry: Geometry, files: list[tuple[str, IndexWriter]] | None = None,
                 directory: Path | None = None):
        check_geometry(geometry)
        self.geometry = geometry
        self.files = files or []
        self.directory = directory
        self.changed: set[str] = set()
        self.full_end_timestamp: int | None = None
        self.released = 0                # entry bytes of the last file already dropped from RSS

    def _last(self, timestamp: int) -> IndexWriter:
        if self.files and not self.files[-1][1].is_full():
            return self.files[-1][1]
        prev = self.files[-1][1] if self.files else None
        name = index_file_name(timestamp, self.files[-1][0] if self.files else None)
        w = IndexWriter(self.geometry, prev.header.end_phy_offset if prev else 0,
                        prev.header.end_timestamp if prev else 0, buf=self._new_buffer(name))
        if prev is not None:
            self.full_end_timestamp = prev.header.end_timestamp
            self._release(prev)
        self.files.append((name, w))
        self.changed.add(name)
        self.released = 0
        return w

    def _new_buffer(self, name: str):
        if self.directory is None:
            return None
        with open(self.directory / name, "w+b") as fh:
            fh.truncate(self.geometry.file_size)
            return mmap.mmap(fh.fileno(), 0)

    def _release(self, w: IndexWriter) -> None:
        if isinstance(w.buf, mmap.mmap):
            w.buf.flush()
            w.buf.close()

    def close(self) -> None:
        if self.files:
            self._release(self.files[-1][1])

    def add(self, r: RecordInfo) -> None:
        w = self._last(r.store_timestamp)
        if r.offset < w.header.end_phy_offset or not r.indexed:
            return
        for key in r.index_keys:
            if not w.put_key(f"{r.topic}#{key}", r.offset, r.store_timestamp):
                w = self._last(r.store_timestamp)
                w.put_key(f"{r.topic}#{key}", r.offset, r.store_timestamp)
            self.changed.add(self.files[-1][0])

    def add_facts(self, facts: FileFacts) -> None:
        """``add`` for every record of a file's facts (with key hashes), a file's worth of keys at a time."""
        cols, n = facts.columns, len(facts)
        if not n:
            return
        offset, ts = cols["offset"], cols["store_timestamp"]
        key_rec = np.repeat(np.arange(n), np.diff(facts.key_offsets))
        indexed = facts.indexed()
        rec = 0                  # the record that calls _last next
        k = 0                    # the next key to put
        while True:
            w = self._last(int(ts[rec]))
            keys = np.flatnonzero(indexed[key_rec[k:]] & (offset[key_rec[k:]] >= w.header.end_phy_offset)) + k
            if not len(keys):
                return
            take = keys[:min(self.geometry.index_num - w.index_count, self.KEYS_PER_PUT)]
            w.put_hashes(facts.key_hashes[take], offset[key_rec[take]], ts[key_rec[take]])
            self.changed.add(self.files[-1][0])
            if self.directory is not None:    # written entries leave RSS (a shared map keeps them in the page cache)
                first = self.geometry.entry_pos(1) // mmap.PAGESIZE * mmap.PAGESIZE
                self.released = release_pages(w.buf, self.geometry.entry_pos(w.index_count), max(self.released, first))
            k = int(take[-1]) + 1
            if k >= len(key_rec):
                rec = int(key_rec[take[-1]]) + 1
                if w.is_full() and rec < n:
                    self._last(int(ts[rec]))        # the next record opens the next file, keys or not
                return
            # when full, the next file is opened by the record of the next key, or the record after the last one
            rec = int(key_rec[k]) if key_rec[k] == key_rec[take[-1]] else int(key_rec[take[-1]]) + 1


def store_index_geometry(store: Store, slots: int | None = None, max_entries: int | None = None) -> Geometry:
    """--slots/--max-entries, else the geometry of the existing index files, else the broker default."""
    if slots or max_entries:
        if not (slots and max_entries):
            raise StoreError("give both --slots and --max-entries")
        return Geometry(slots, max_entries)
    refs = store.index_files()
    return refs[0].geometry if refs else DEFAULT_GEOMETRY


def rebuild_index(store: Store, *, slots: int | None = None, max_entries: int | None = None,
                  dry_run: bool = False, backup: Path | None = None,
                  progress: Progress | None = None) -> tuple[list[tuple[str, int, bool]], Path | None]:
    """All index files rebuilt from the commit log, as (file name, entries, same as the existing file);
    swapped in for ``index/`` unless dry_run. Files are built as sparse files beside ``index/`` (in a
    temporary directory on a dry run)."""
    geometry = store_index_geometry(store, slots, max_entries)
    if dry_run:                           # nothing in the store changes, not even a directory's time
        with tempfile.TemporaryDirectory(prefix="rmqtool-index-") as tmp:
            return _build_index(store, geometry, Path(tmp), progress)[0], None
    built = store.root / ("index" + BUILD)
    if built.exists():
        shutil.rmtree(built)
    built.mkdir(parents=True)
    files, builder = _build_index(store, geometry, built, progress)
    txn = Transaction(store.root, backup, label="rebuild-index")
    txn.replace_dir("index", built)
    cp = store.checkpoint()
    if cp is not None and builder.full_end_timestamp is not None:
        from rmqtool.format.checkpoint import encode_checkpoint
        txn.write("checkpoint", encode_checkpoint(cp._replace(index_msg_timestamp=builder.full_end_timestamp)))
    return files, txn.commit()


def _build_index(store: Store, geometry: Geometry, built: Path,
                 progress: Progress | None) -> tuple[list[tuple[str, int, bool]], IndexBuilder]:
    """Index files for the whole commit log, built in ``built``; each compared with the existing file."""
    builder = IndexBuilder(geometry, directory=built)
    for facts in valid_facts(store, QueueNames(), keys=True, progress=progress):
        builder.add_facts(facts)
    builder.close()
    old = store.index_dir
    return [(name, w.index_count - 1, (old / name).is_file() and filecmp.cmp(old / name, built / name, shallow=False))
            for name, w in builder.files], builder

