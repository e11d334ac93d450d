"""A broker store directory: commitlog/, consumequeue/<topic>/<queueId>/, consumequeue_ext/, index/,
checkpoint, abort, lock, config/. Also accepts a bare commit-log directory or file.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator

from rmqtool import constants as C
from rmqtool.errors import FormatError, StoreError, StoreWarning
from rmqtool.format.batchcq import BatchCqUnit, find_unit
from rmqtool.format.batchcq import decode_units as decode_batch_units
from rmqtool.format.checkpoint import Checkpoint, decode_checkpoint_mapped
from rmqtool.format.consumequeue import CqUnit, decode_written_units, valid_prefix
from rmqtool.format.indexfile import (DEFAULT_GEOMETRY, Geometry, IndexHeader, decode_header, infer_geometry, is_time_matched,
                                      select_phy_offsets)
from rmqtool.format.javaprops import parse_java_properties
from rmqtool.store.commitlog import CommitLog
from rmqtool.store.compaction import Compaction, CompactionLog, is_compaction_log_dir
from rmqtool.store.config import read_config
from rmqtool.store.dledger import DLedgerCommitLog, DLedgerFiles, find_dledger_dir, is_dledger_queue
from rmqtool.store import layout as L
from rmqtool.store.atomic import JOURNAL
from rmqtool.store.filequeue import FileQueue, QueueFile, list_dir, map_file
from rmqtool.store.rocksdbcq import RocksDbConsumeQueues, is_rocksdb_dir
from rmqtool.store.recognition import is_index_name, recognize


@dataclass(frozen=True)
class ConsumeQueue:
    topic: str
    queue_id: int
    queue: FileQueue

    def iter_units(self, start: int = 0, commitlog_end: int | None = None) -> Iterator[tuple[int, CqUnit]]:
        """(queue offset, unit) from queue offset ``start`` up to the first unit failing recovery's test.

        With ``commitlog_end``, also stop at the first unit starting at or beyond it: the broker drops such
        dirty units on load (truncateDirtyLogicFiles), though truncation leaves their bytes on disk.
        """
        size = self.queue.file_size
        for f in self.queue:
            buf = f.read()
            try:
                units = decode_written_units(buf)
            except FormatError as exc:
                raise exc.at(path=str(f.path)) from None
            first = f.start // C.CQ_STORE_UNIT_SIZE
            for i, unit in enumerate(units):
                if commitlog_end is not None and unit.physical_offset >= commitlog_end:
                    return
                if first + i >= start:
                    yield first + i, unit
            if len(units) * C.CQ_STORE_UNIT_SIZE < len(buf) or (size and len(buf) < size):
                return

    def extent(self, commitlog_end: int | None = None) -> tuple[int, int]:
        """(first queue offset, number of units) that ``iter_units`` yields from 0, counted as columns."""
        size = self.queue.file_size
        first, count = 0, 0
        for f in self.queue:
            buf = f.read()
            n = len(buf) // C.CQ_STORE_UNIT_SIZE
            valid, _ = valid_prefix(buf, commitlog_end)
            if not count:
                first = f.start // C.CQ_STORE_UNIT_SIZE
            count += valid
            if valid < n or (size and n * C.CQ_STORE_UNIT_SIZE < size):
                break
        return (first, count) if count else (0, 0)


def queue_of_path(path: str | os.PathLike) -> tuple[Path, str, str, int] | None:
    """(store root, kind, topic, queue id) of a queue file or directory,
    ``<root>/<kind>/<topic>/<queueId>[/<file>]`` with kind ``consumequeue`` or ``batchconsumequeue``, or
    ``<root>/compaction/compactionCq/<topic>/<queueId>[/<file>]`` (kind ``compactionCq``); None for another
    path."""
    path = Path(path)
    qdir = path.parent if path.is_file() else path
    kind_dir = qdir.parent.parent
    if not qdir.name.isdigit():
        return None
    if kind_dir.name in (L.CONSUMEQUEUE, L.BATCHCONSUMEQUEUE):
        return kind_dir.parent, kind_dir.name, qdir.parent.name, int(qdir.name)
    if kind_dir.name == L.COMPACTION_CQ and kind_dir.parent.name == L.COMPACTION:
        return kind_dir.parent.parent, kind_dir.name, qdir.parent.name, int(qdir.name)
    return None


@dataclass(frozen=True)
class BatchConsumeQueue:
    """``batchconsumequeue/<topic>/<queueId>/``: 46-byte units, one per batch (5.x, queue.type=BatchCQ)."""

    topic: str
    queue_id: int
    queue: FileQueue

    def iter_units(self) -> Iterator[tuple[QueueFile, int, BatchCqUnit]]:
        """(file, byte position, unit) in queue order up to the first unit failing recovery's test."""
        size = self.queue.file_size
        for f in self.queue:
            try:
                units = decode_batch_units(f.read())
            except FormatError as exc:
                raise exc.at(path=str(f.path)) from None
            for i, unit in enumerate(units):
                if not unit.is_valid:
                    return
                yield f, i * C.BCQ_STORE_UNIT_SIZE, unit
            if size and len(units) * C.BCQ_STORE_UNIT_SIZE < size:
                return

    def units(self) -> list[BatchCqUnit]:
        return [u for _, _, u in self.iter_units()]

    def lookup(self, queue_offset: int, units: list[BatchCqUnit] | None = None) -> BatchCqUnit | None:
        """The unit holding message ``queue_offset`` (getCqUnitAndStoreTime); None: none."""
        units = self.units() if units is None else units
        i = find_unit(units, queue_offset)
        return None if i is None else units[i]

    def offsets(self, commitlog_min: int = 0) -> tuple[int, int]:
        """(min, max) message offset as the broker's load leaves them: the end of the last unit, and the first
        unit's msgBaseOffset moved past each unit of the first file whose record lies before ``commitlog_min``
        (the commit log's first offset: BatchConsumeQueue.reviseMinOffsetInQueue, then correctMinOffset, which
        ConsumeQueueStore.recoverOffsetTable calls with the commit log's min offset; 5.x)."""
        units = list(self.iter_units())
        if not units:
            return 0, 0
        low = units[0][2].msg_base_offset
        for f, _, unit in units:
            if f is not units[0][0] or unit.physical_offset >= commitlog_min:
                break
            low = unit.next_offset
        return low, units[-1][2].next_offset


@dataclass(frozen=True)
class IndexFileRef:
    path: Path
    geometry: Geometry
    header: IndexHeader

    @property
    def name(self) -> str:
        return self.path.name

    def read(self, random_access: bool = False):
        return map_file(self.path, random_access)


MULTI_PATH_SPLITTER = ";"       # MessageStoreConfig.MULTI_PATH_SPLITTER of storePathCommitLog
# The commit-log directories of one store (``DIR;DIR``), for the store whose root they name (set by the CLI's
# --store-path-commitlog; the environment carries it to worker processes and Spark executors).
STORE_PATH_COMMITLOG_ENV = "RMQTOOL_STORE_PATH_COMMITLOG"


class Store:
    def __init__(self, root: Path, commitlog_path: Path | None = None, commitlog_dirs: tuple[Path, ...] = ()):
        self.root = Path(root)
        self._commitlog_path = commitlog_path or self.root / L.COMMITLOG
        self._root_given = commitlog_path is None or commitlog_path == self.root / L.COMMITLOG
        self.commitlog_dirs = commitlog_dirs      # a commit log over several directories (multi-path)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "Store":
        """A store root, or just a commit log: its directory or one of its files; or a 5.x commit log over
        several directories, named as the broker's storePathCommitLog names them (see open_multi_path).
        A store with the journal of an unfinished change is opened with a StoreWarning."""
        store = cls._open(Path(path))
        journal = store.pending_change
        if journal is not None:
            warnings.warn(StoreWarning(f"{journal}: an earlier change was interrupted; `rmqtool repair` (or any "
                                       "write command) finishes or undoes it, `rmqtool restore` puts its backup "
                                       "back"), stacklevel=2)
        return store

    @property
    def pending_change(self) -> Path | None:
        """The journal of an interrupted change (None: none)."""
        journal = self.path(JOURNAL)
        return journal if self.is_store_root and journal.exists() else None

    @classmethod
    def _open(cls, path: Path) -> "Store":
        if MULTI_PATH_SPLITTER in str(path):
            return cls.open_multi_path(str(path))
        named = os.environ.get(STORE_PATH_COMMITLOG_ENV)
        if named:
            multi = cls.open_multi_path(named)
            if multi.is_store_root and Path(path).resolve() == multi.root.resolve():
                return multi
        what = recognize(path)
        if what == "root":
            return cls(path)
        return cls(path.parent if what == "file" else path, commitlog_path=path)   # the commit log alone

    @classmethod
    def open_multi_path(cls, paths: str) -> "Store":
        """``DIR;DIR;...``: the directories of one commit log, as storePathCommitLog lists them (5.x
        MultiPathMappedFileQueue.load reads every file of every directory as one queue; tryCreateMappedFile
        puts file number i in the i-th of the sorted directories, modulo their count). An element that is
        a store root (a directory with commitlog/, consumequeue/, index/ or checkpoint) gives the store's
        root, its commitlog/ joining the rest; else the root is the first directory's parent when that is
        a store root (the broker's default storePathCommitLog is <storePathRootDir>/commitlog)."""
        parts = [Path(p.strip()) for p in paths.split(MULTI_PATH_SPLITTER) if p.strip()]
        root: Path | None = None
        dirs: list[Path] = []
        for p in parts:
            if not p.is_dir():
                raise StoreError("no such directory (storePathCommitLog element)", path=str(p))
            if _is_root(p) and root is None:
                root = p
                if (p / L.COMMITLOG).is_dir():
                    dirs.append(p / L.COMMITLOG)
            else:
                dirs.append(p)
        if not dirs:
            raise StoreError("no commit-log directory among the paths", path=paths)
        if root is None and _is_root(dirs[0].parent):
            root = dirs[0].parent
        if root is None:
            return cls(dirs[0], commitlog_path=dirs[0], commitlog_dirs=tuple(dirs))
        return cls(root, commitlog_dirs=tuple(dirs))

    @property
    def is_store_root(self) -> bool:
        return self._root_given

    def path(self, rel: str) -> Path:
        """A path below the store root (``rel`` from ``rmqtool.store.layout``)."""
        return self.root / rel

    def rel(self, path: Path) -> str:
        """``path`` relative to the store root, as the layout spells it."""
        return Path(path).relative_to(self.root).as_posix()

    # -- sizes, geometry and version --------------------------------------------------------------
    @cached_property
    def saved_sizes(self) -> dict:
        """The sizes chosen at ``init`` (``config/rmqtool.json``; empty when absent)."""
        path = self.path(L.SIZES_FILE)
        sizes = (read_config(path) or {}) if self.is_store_root and path.is_file() else {}
        if not isinstance(sizes, dict):
            raise StoreError("not a JSON object of sizes", path=str(path))
        for key, value in sizes.items():        # each a Java int the broker takes as a size or count
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 2**31 - 1:
                raise StoreError(f"{key} {value!r} is not a size (an int in 1..2147483647)", path=str(path))
        return sizes

    @property
    def commitlog_file_size(self) -> int:
        """mappedFileSizeCommitLog: the files' size, else the size chosen at init, else the default."""
        return (self.commitlog.queue.file_size or self.saved_sizes.get("mappedFileSizeCommitLog")
                or C.DEFAULT_COMMITLOG_FILE_SIZE)

    def cq_file_size(self, explicit: int | None = None) -> int:
        """mappedFileSizeConsumeQueue: ``explicit``, else the size most consume-queue files share, else
        the size chosen at init, else the default."""
        sizes = [] if explicit else [cq.queue.file_size for cq in self.consume_queues() if cq.queue.file_size]
        return (explicit or (max(set(sizes), key=sizes.count) if sizes else None)
                or self.saved_sizes.get("mappedFileSizeConsumeQueue") or C.DEFAULT_CQ_FILE_SIZE)

    def queue_file_sizes(self, cq: int | None = None, bcq: int | None = None) -> tuple[int, int]:
        """``cq_file_size(cq)`` and ``bcq_file_size(bcq)`` for a write, each refused unless a positive multiple
        of its unit (a damaged file can make up most of a small store's queue files)."""
        sizes = (self.cq_file_size(cq), self.bcq_file_size(bcq))
        for size, unit, rel, given in ((sizes[0], C.CQ_STORE_UNIT_SIZE, L.CONSUMEQUEUE, cq),
                                       (sizes[1], C.BCQ_STORE_UNIT_SIZE, L.BATCHCONSUMEQUEUE, bcq)):
            if size <= 0 or size % unit:
                raise StoreError(f"file size {size} ({'given' if given else 'what most files here share'}) is not "
                                 f"a positive multiple of {unit}", path=str(self.root / rel))
        return sizes

    @property
    def cq_file_size_known(self) -> bool:
        """Whether a consume-queue file or the sizes chosen at init tell mappedFileSizeConsumeQueue."""
        return any(cq.queue.file_size for cq in self.consume_queues()) or \
            "mappedFileSizeConsumeQueue" in self.saved_sizes

    @property
    def index_geometry_known(self) -> bool:
        """Whether an index file or the sizes chosen at init tell maxHashSlotNum and maxIndexNum."""
        return bool(self.index_files()) or {"maxHashSlotNum", "maxIndexNum"} <= set(self.saved_sizes)

    def bcq_file_size(self, explicit: int | None = None) -> int:
        """mapperFileSizeBatchConsumeQueue, found as ``cq_file_size`` is."""
        sizes = [] if explicit else [q.queue.file_size for q in self.batch_consume_queues() if q.queue.file_size]
        return (explicit or (max(set(sizes), key=sizes.count) if sizes else None)
                or self.saved_sizes.get("mapperFileSizeBatchConsumeQueue") or C.DEFAULT_BCQ_FILE_SIZE)

    def index_geometry(self, slots: int | None = None, max_entries: int | None = None) -> Geometry:
        """maxHashSlotNum / maxIndexNum: both given, else the index files', else the sizes chosen at
        init, else the broker default."""
        if slots or max_entries:
            if not (slots and max_entries):
                raise StoreError("give both --slots and --max-entries")
            return Geometry(slots, max_entries)
        refs = self.index_files()
        if refs:
            return refs[0].geometry
        saved = self.saved_sizes
        if "maxHashSlotNum" in saved and "maxIndexNum" in saved:
            return Geometry(saved["maxHashSlotNum"], saved["maxIndexNum"])
        return DEFAULT_GEOMETRY

    @cached_property
    def broker_version(self) -> str | None:
        """"5.x" or "4.x" as the store's files tell it, None when they do not (evidence, not proof).

        5.x only: abort.bak (the 5.x restart renames abort), a PID in abort, compaction/, a checkpoint
        with masterFlushedOffset or confirmPhyOffset (StoreCheckpoint's 4th and 5th longs, 5.x only).
        4.x: config/delayOffset.json and none of those."""
        if not self.is_store_root:
            return None
        abort, cp = self.abort_path, self.checkpoint()
        if (self.path(L.ABORT_BAK).exists() or self.path(L.COMPACTION).is_dir()
                or (abort.is_file() and abort.stat().st_size > 0)
                or bool(cp and (cp.confirm_phy_offset or cp.master_flushed_offset))):
            return "5.x"
        return "4.x" if self.path(L.config_file("delayOffset.json")).is_file() else None

    @property
    def is_5x(self) -> bool:
        return self.broker_version == "5.x"

    @cached_property
    def dledger(self) -> DLedgerFiles | None:
        """The DLedger directory of a store with enableDLegerCommitLog (None: a classic commit log)."""
        found = find_dledger_dir(self.root) if self.is_store_root else None
        return DLedgerFiles(found) if found is not None else None

    @cached_property
    def commitlog(self) -> CommitLog:
        """The commit log: ``commitlog/``, or the DLedger data files (records at entry position + 48).

        A bare directory or file is read as DLedger data when its first entry header says so.
        """
        if self.dledger is not None:
            old = self._commitlog_path
            if old.is_dir() and any(f.length for f in FileQueue.from_dir(old)):
                raise StoreError("both commitlog/ and a DLedger log hold data (a store converted to DLedger); "
                                 "reading it is not supported", path=str(self.root))
            return DLedgerCommitLog.open(self.dledger.data_dir)
        if self.commitlog_dirs:
            return CommitLog(FileQueue([f for d in self.commitlog_dirs for f in FileQueue.from_dir(d)]))
        if not self._commitlog_path.exists():
            return CommitLog(FileQueue([]))
        if is_compaction_log_dir(self._commitlog_path):
            return CompactionLog.open(self._commitlog_path)
        cl = CommitLog.open(self._commitlog_path)
        return DLedgerCommitLog(cl.queue) if is_dledger_queue(cl.queue) else cl

    # -- consume queues ---------------------------------------------------------------------------
    @property
    def consumequeue_dir(self) -> Path:
        return self.root / L.CONSUMEQUEUE

    def topics(self) -> list[str]:
        """Topics with a consume queue: directories, or the RocksDB consume queue's topics."""
        if self.consumequeue_is_rocksdb:
            return self.rocksdb_consumequeue.topics()
        return self._topic_dirs(self.consumequeue_dir)

    @property
    def consumequeue_is_rocksdb(self) -> bool:
        """consumequeue/ is a RocksDB database (5.2+, storeType=defaultRocksDB), not <topic>/<queueId>/ files:
        read through ``rocksdb_consumequeue``, never written."""
        return self.is_store_root and is_rocksdb_dir(self.consumequeue_dir)

    @cached_property
    def rocksdb_consumequeue(self) -> RocksDbConsumeQueues | None:
        return RocksDbConsumeQueues.read(self.consumequeue_dir) if self.consumequeue_is_rocksdb else None

    def consume_queues(self, topic: str | None = None) -> list[ConsumeQueue]:
        return [ConsumeQueue(t, qid, FileQueue.from_dir(qdir))
                for t, qid, qdir in self._queue_dirs(self.consumequeue_dir, topic, self.topics)]

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        return ConsumeQueue(topic, queue_id, self._queue_files(self.consumequeue_dir, topic, queue_id,
                                                              "consume queue"))

    def consume_queue_ext(self, topic: str, queue_id: int) -> FileQueue | None:
        """The ConsumeQueueExt files of a queue (only with enableConsumeQueueExt), or None."""
        qdir = self.path(L.join(L.CONSUMEQUEUE_EXT, topic, queue_id))
        return FileQueue.from_dir(qdir) if self.is_store_root and qdir.is_dir() else None

    # -- batch consume queues (BatchCQ topics) -------------------------------------------------------
    @property
    def batch_consumequeue_dir(self) -> Path:
        return self.root / L.BATCHCONSUMEQUEUE

    def batch_topics(self) -> list[str]:
        return self._topic_dirs(self.batch_consumequeue_dir)

    def batch_consume_queues(self, topic: str | None = None) -> list[BatchConsumeQueue]:
        return [BatchConsumeQueue(t, qid, FileQueue.from_dir(qdir))
                for t, qid, qdir in self._queue_dirs(self.batch_consumequeue_dir, topic, self.batch_topics)]

    def batch_consume_queue(self, topic: str, queue_id: int) -> BatchConsumeQueue:
        return BatchConsumeQueue(topic, queue_id, self._queue_files(self.batch_consumequeue_dir, topic, queue_id,
                                                                    "batch consume queue"))

    # -- the <kind>/<topic>/<queueId>/ layout both queue kinds share -------------------------------------
    def _topic_dirs(self, base: Path) -> list[str]:
        if not self.is_store_root:
            return []
        return sorted(e.name for e in list_dir(base) or () if e.is_dir())

    @staticmethod
    def _queue_dirs(base: Path, topic: str | None, topics) -> Iterator[tuple[str, int, Path]]:
        """(topic, queue id, directory) of ``topic`` or every topic, queues in numeric order."""
        for t in ([topic] if topic is not None else topics()):
            tdir = base / t
            queues = sorted((int(e.name), e.name) for e in list_dir(tdir) or () if e.name.isdigit() and e.is_dir())
            for qid, name in queues:
                yield t, qid, tdir / name

    @staticmethod
    def _queue_files(base: Path, topic: str, queue_id: int, kind: str) -> FileQueue:
        qdir = base / topic / str(queue_id)
        if not qdir.is_dir():
            raise StoreError(f"no {kind} {topic}/{queue_id}", path=str(qdir))
        return FileQueue.from_dir(qdir)

    # -- compaction topics (5.x cleanup.policy=COMPACTION) -----------------------------------------------
    @cached_property
    def compaction(self) -> Compaction | None:
        """``compaction/``: compaction logs, sparse compaction queues, position-checkpoint (None: absent)."""
        path = self.path(L.COMPACTION)
        return Compaction(path) if self.is_store_root and path.is_dir() else None

    # -- index ------------------------------------------------------------------------------------
    @property
    def index_dir(self) -> Path:
        return self.root / L.INDEX

    def index_files(self) -> list[IndexFileRef]:
        """Index files in name order (= creation order); geometry inferred once, from the fullest file."""
        d = self.index_dir
        if not self.is_store_root or not d.is_dir():
            return []
        paths = sorted((p for p in d.iterdir() if p.is_file() and is_index_name(p.name)), key=lambda p: p.name)
        return index_refs(paths)

    # -- single files -----------------------------------------------------------------------------
    def checkpoint(self) -> Checkpoint | None:
        """The checkpoint as the broker reads it (a short file padded with zeros: decode_checkpoint_mapped)."""
        path = self.root / L.CHECKPOINT
        if not self.is_store_root or not path.is_file():
            return None
        return decode_checkpoint_mapped(path.read_bytes())

    def checkpoint_length(self) -> int | None:
        """Bytes of the checkpoint file (None: there is none); the broker reads zeros past them."""
        path = self.root / L.CHECKPOINT
        return path.stat().st_size if self.is_store_root and path.is_file() else None

    @property
    def abort_path(self) -> Path:
        return self.root / L.ABORT

    @property
    def lock_path(self) -> Path:
        return self.root / L.LOCK

    def config(self, name: str):
        path = self.path(L.config_file(name))
        return read_config(path) if path.is_file() else None

    def broker_properties(self) -> dict[str, str] | None:
        """config/broker.properties (BrokerPathConfigHelper's default brokerConfigPath, which lies in the
        store when the broker ran without -c and with the default storePathRootDir), or None."""
        path = self.path(L.config_file(L.BROKER_PROPERTIES))
        if not self.is_store_root or not path.is_file():
            return None
        return parse_java_properties(path.read_bytes().decode("latin-1"))


def _is_root(p: Path) -> bool:
    return any((p / d).is_dir() for d in (L.COMMITLOG, L.CONSUMEQUEUE, L.INDEX)) or (p / L.CHECKPOINT).is_file()


def index_refs(paths: list[Path], geometry: Geometry | None = None) -> list[IndexFileRef]:
    """Headers and geometry of index files; all files of a store share one geometry."""
    bufs = [(p, map_file(p, random_access=True)) for p in paths]          # headers only
    for p, buf in bufs:
        if len(buf) < C.INDEX_HEADER_SIZE:
            raise FormatError(f"index file of {len(buf)} bytes is smaller than its 40-byte header", path=str(p))
    if geometry is None and bufs:        # from the fullest file whose chains are consistent (a damaged
        error = None                     # file is then checked, and its damage named, with its siblings')
        for p, buf in sorted(bufs, key=lambda pb: -decode_header(pb[1]).index_count):
            if error is not None and decode_header(buf).index_count <= 1:
                break                    # an empty file fits every geometry
            try:
                geometry = infer_geometry(buf)
                break
            except FormatError as exc:
                error = error or exc.at(path=str(p))
        if geometry is None:
            raise error
    out = []
    for p, buf in bufs:
        if geometry is not None and len(buf) != geometry.file_size:
            raise FormatError(f"index file is {len(buf)} bytes; its siblings' geometry {tuple(geometry)} "
                              f"needs {geometry.file_size}", path=str(p))
        out.append(IndexFileRef(p, geometry, decode_header(buf)))
    return out


def query_index(refs: list[IndexFileRef], topic: str, key: str, max_num: int = C.INDEX_MAX_MSGS_NUM_BATCH,
                begin: int = 0, end: int = 2**63 - 1) -> list[tuple[int, IndexFileRef]]:
    """IndexService.queryOffset: newest file first, hash-only matches, at most ``max_num`` hits.

    Returns (physical offset, index file) pairs in the broker's order. The broker caps ``max_num`` at
    maxMsgsNumBatch (64); callers pass that cap themselves.
    """
    index_key = f"{topic}#{key}"
    out: list[tuple[int, IndexFileRef]] = []
    for ref in reversed(refs):
        if is_time_matched(ref.header, begin, end):
            hits = select_phy_offsets(ref.read(random_access=True), ref.geometry, index_key, begin, end,
                                      max_num - len(out), ref.header)
            out.extend((phy, ref) for phy in hits)
        if ref.header.begin_timestamp < begin or len(out) >= max_num:
            break
    return out
