"""Compaction topics on disk (5.x, CompactionStore): per queue a compaction log and its sparse compaction
queue under ``compaction/``, plus ``compaction/position-checkpoint``.

``compactionLog/<topic>/<queueId>/`` and ``compactionCq/<topic>/<queueId>/`` hold one file each per log
file, named by the log file's start offset. Compaction rewrites all log files but the last and the
rewritten files restart at name 0, so the names have a gap before the live last file (CompactionLog.
doCompaction / replaceFiles). A full file ends with a BLANK (8 bytes: size, 0xcbd43194); the last
rewritten file ends in zeros instead (5.3.3's CompactionAppendEndMsgCallback builds the BLANK but never
writes it). On load the log's last file is cut at the end of the queue's last unit
(SparseConsumeQueue.recover, CompactionLog.getMaxPhyOffsetInLog).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator

from rmqtool.errors import FormatError, RmqError, StoreError
from rmqtool import constants as C
from rmqtool.format.batchcq import BatchCqUnit, valid_units
from rmqtool.format.commitlog import Entry
from rmqtool.format.compaction import decode_position_table, decode_sparse_units, lookup_from
from rmqtool.store import layout as L
from rmqtool.store.commitlog import CommitLog, Located
from rmqtool.store.config import load_config
from rmqtool.store.filequeue import FileQueue, QueueFile

LOG_DIR, CQ_DIR, POSITION_CHECKPOINT = L.COMPACTION_LOG, L.COMPACTION_CQ, L.POSITION_CHECKPOINT


def is_compaction_log_dir(path: Path) -> bool:
    """``.../compaction/compactionLog/<topic>/<queueId>``."""
    return path.is_dir() and path.parent.parent.name == LOG_DIR and path.name.isdigit()


class CompactionLog(CommitLog):
    """One queue's compaction log, walked by the commit log's walks: file names may jump (a gap after the
    rewritten files) and a file may end in zeros instead of a BLANK; either way the walk goes on in the
    next file. ``end``: where the last file's data ends (the sparse queue's last unit), None: at its
    first zeros."""

    zero_ends_data = False

    def __init__(self, queue: FileQueue, end: int | None = None):
        super().__init__(queue)
        self.end = end

    @classmethod
    def open(cls, path: Path, file_size: int | None = None) -> "CompactionLog":
        queue = FileQueue.from_dir(Path(path))
        return cls(FileQueue(queue.files, max((f.length for f in queue.files), default=0) or None))

    def data_end(self, f: QueueFile, length: int) -> int:
        """The last file's data ends at the sparse queue's last unit (``end``)."""
        return length if self.end is None or f is not self.queue.files[-1] else min(length, self.end - f.start)


@dataclass(frozen=True)
class CompactionQueue:
    """One queue of a compaction topic: its compaction log and sparse compaction queue."""

    topic: str
    queue_id: int
    log_queue: FileQueue
    cq_queue: FileQueue

    @cached_property
    def files(self) -> list[tuple[QueueFile, list[BatchCqUnit], bool]]:
        """Per sparse-queue file: its units (SparseConsumeQueue.recover's view) and whether it ends
        with END_POSITION."""
        out = []
        for f in self.cq_queue:
            try:
                units, ended = decode_sparse_units(f.read())
            except FormatError as exc:
                raise exc.at(path=str(f.path)) from None
            out.append((f, units, ended))
        return out

    @cached_property
    def units(self) -> list[BatchCqUnit]:
        return [u for _, units, _ in self.files for u in units]

    @cached_property
    def unit_array(self):
        """The units of ``units`` as numpy columns (``format.batchcq.UNIT_FIELDS``), for bulk checks."""
        import numpy as np

        parts = []
        for f in self.cq_queue:
            buf = f.read()
            if len(buf) % C.BCQ_STORE_UNIT_SIZE:
                raise FormatError(f"batch consume-queue file size {len(buf)} is not a multiple of 46",
                                  path=str(f.path))
            parts.append(valid_units(buf))
        return np.concatenate(parts) if parts else valid_units(b"")

    @cached_property
    def log(self) -> CompactionLog:
        size = max((f.length for f in self.log_queue), default=0) or None
        units = self.unit_array
        end = int(units["physical_offset"][-1]) + int(units["size"][-1]) if len(units) else None
        return CompactionLog(FileQueue(self.log_queue.files, size), end)

    @property
    def min_offset(self) -> int:
        """SparseConsumeQueue's min offset: the first retained unit's queue offset."""
        units = self.unit_array
        return int(units["msg_base_offset"][0]) if len(units) else 0

    @property
    def max_offset(self) -> int:
        """getMaxOffsetInQueue: the last unit's queue offset + 1."""
        units = self.unit_array
        return int(units["msg_base_offset"][-1]) + int(units["batch_size"][-1]) if len(units) else 0

    def lookup(self, queue_offset: int) -> BatchCqUnit | None:
        """SparseConsumeQueue.iterateFromOrNext: the unit at or after ``queue_offset``."""
        i = lookup_from(self.units, queue_offset)
        return None if i is None else self.units[i]

    def records(self) -> Iterator[Located]:
        return self.log.iter_entries()

    def consumer_view(self, start: int = 0) -> Iterator[tuple[int, BatchCqUnit, Entry]]:
        """(queue offset, unit, record) as CompactionStore.getMessage returns them to a consumer reading
        from ``start``: every retained unit from the first at or after it, the record read from the log."""
        i = lookup_from(self.units, start)
        for unit in self.units[i:] if i is not None else []:
            yield unit.msg_base_offset, unit, self.log.read_at(unit.physical_offset)


@dataclass(frozen=True)
class Compaction:
    """``compaction/`` of a store: the compaction topics' queues and the position checkpoint."""

    root: Path

    def topics(self) -> list[str]:
        base = self.root / LOG_DIR
        return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []

    def queues(self, topic: str | None = None) -> list[CompactionQueue]:
        out = []
        for t in [topic] if topic is not None else self.topics():
            tdir = self.root / LOG_DIR / t
            if not tdir.is_dir():
                continue
            for qdir in sorted((p for p in tdir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
                cq_dir = self.root / CQ_DIR / t / qdir.name
                cq = FileQueue.from_dir(cq_dir) if cq_dir.is_dir() else FileQueue([])
                out.append(CompactionQueue(t, int(qdir.name), FileQueue.from_dir(qdir), cq))
        return out

    def queue(self, topic: str, queue_id: int) -> CompactionQueue:
        """The queue, or a StoreError naming the queues there are."""
        queues = self.queues(topic)
        found = next((q for q in queues if q.queue_id == queue_id), None)
        if found is None:
            raise StoreError(f"compaction topic {topic!r} has no queue {queue_id} (queues: "
                             f"{', '.join(str(q.queue_id) for q in queues) or 'none'})", path=str(self.root / LOG_DIR))
        return found

    @property
    def checkpoint_path(self) -> Path:
        return self.root / POSITION_CHECKPOINT

    def position_checkpoint(self) -> dict[tuple[str, int], int] | None:
        """CompactionPositionMgr.load (a ConfigManager): the checkpoint, else its .bak; None when neither holds
        anything. A FormatError names the file that does not decode: the broker ignores the failed load and
        starts with no position (its constructor drops load()'s result)."""
        loaded = load_config(self.checkpoint_path, decode_position_table)
        return loaded.value if loaded is not None else None

    def loaded_position(self) -> tuple[dict[tuple[str, int], int], RmqError | None]:
        """What CompactionPositionMgr holds once constructed: the checkpoint's table (empty: none), or an empty
        table and the error when neither file decodes (its constructor drops load()'s result)."""
        try:
            return self.position_checkpoint() or {}, None
        except RmqError as exc:
            return {}, exc
