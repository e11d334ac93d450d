"""Regenerate consume queues and index files from the commit log, as the broker's dispatch does.

``CqWriter`` is ConsumeQueue.putMessagePositionInfo (duplicate/repeat rules, fillPreBlank, full-size
files); ``IndexBuilder`` is IndexService.buildIndex over ``IndexWriter`` (= IndexFile.putKey). Both are
shared by rebuild, repair (re-dispatch after truncation) and the writers (put/import).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from rmqtool import constants as C
from rmqtool.errors import EncodeError, StoreError
from rmqtool.format.consumequeue import FILLER_UNIT, UNIT
from rmqtool.format.indexfile import DEFAULT_GEOMETRY, Geometry, IndexWriter, check_geometry
from rmqtool.ops.verify import Progress, RecordInfo, scan_commitlog
from rmqtool.store.atomic import BUILD, Transaction
from rmqtool.store.store import ConsumeQueue, Store

_FORBIDDEN = set('/\\\x00')


def safe_topic_dir(topic: str, offset: int | None = None) -> str:
    """A topic usable as a consume-queue directory name; anything that could leave the store is refused."""
    if not topic or topic in (".", "..") or _FORBIDDEN & set(topic) or len(topic.encode("utf-8")) > 255:
        raise EncodeError(f"topic {topic!r} cannot be a consume-queue directory name "
                          "(empty, '.', '..', or contains '/', '\\\\' or NUL)", offset=offset)
    return topic


def valid_records(store: Store, progress: Progress | None = None) -> Iterator[RecordInfo]:
    """Records the broker would dispatch: in order, up to the first invalid record."""
    for scan in scan_commitlog(store, progress=progress):
        yield from scan.records
        if scan.stop != "blank":
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

    def put(self, phy: int, size: int, tags_code: int, queue_offset: int) -> None:
        if phy + size <= self.max_phy:
            return                                     # "build consume queue repeatedly"
        expect = queue_offset * C.CQ_STORE_UNIT_SIZE
        last = max(self.files) if self.files else None
        if last is None:
            last = expect - expect % self.file_size
            self.files[last] = bytearray(self.file_size)
            self.first_created = last
            self.write_pos = last
        elif self.write_pos >= last + self.file_size:
            last += self.file_size
            self.files[last] = bytearray(self.file_size)
            self.write_pos = last
        if last == self.first_created and queue_offset != 0 and self.write_pos == last:
            filler = UNIT.pack(*FILLER_UNIT)
            while self.write_pos < last + expect % self.file_size:   # fillPreBlank
                self._append(last, filler)
        if queue_offset != 0 and expect < self.write_pos:
            return                                     # repeated
        self.max_phy = phy + size
        self._append(last, UNIT.pack(phy, size, tags_code))

    def _append(self, start: int, unit: bytes) -> None:
        pos = self.write_pos - start
        self.files[start][pos:pos + C.CQ_STORE_UNIT_SIZE] = unit
        self.write_pos += C.CQ_STORE_UNIT_SIZE

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


def dispatch_to_queues(records: Iterable[RecordInfo], queues: dict[tuple[str, int], CqWriter],
                       file_size: int) -> None:
    """CommitLogDispatcherBuildConsumeQueue over records (creating queues as needed)."""
    for r in records:
        if not r.gets_cq_unit:
            continue
        key = (r.topic, r.queue_id)
        w = queues.get(key)
        if w is None:
            safe_topic_dir(r.topic, r.offset)
            w = queues[key] = CqWriter(file_size)
        w.put(r.offset, r.size, r.tags_code, r.queue_offset)


def store_cq_file_size(store: Store, explicit: int | None = None) -> int | None:
    """--cq-file-size, else the size shared by the store's existing consume-queue files."""
    if explicit:
        return explicit
    sizes = [cq.queue.file_size for cq in store.consume_queues() if cq.queue.file_size]
    return max(set(sizes), key=sizes.count) if sizes else None


def write_queue_tree(root: Path, queues: dict[tuple[str, int], CqWriter]) -> int:
    """Write consume-queue files under ``root``/<topic>/<queueId>/; returns the number of files."""
    n = 0
    for (topic, qid), w in sorted(queues.items()):
        qdir = root / safe_topic_dir(topic) / str(qid)
        qdir.mkdir(parents=True, exist_ok=True)
        for start, data in w.file_bytes().items():
            (qdir / C.offset_to_file_name(start)).write_bytes(data)
            n += 1
    return n


@dataclass
class RebuildResult:
    queues: int = 0
    files: int = 0
    units: int = 0
    target: str = ""
    backup: str | None = None


def rebuild_consume_queues(store: Store, *, topic: str | None = None, out: Path | None = None,
                           cq_file_size: int | None = None, dry_run: bool = False, backup: Path | None = None,
                           progress: Progress | None = None) -> RebuildResult:
    file_size = store_cq_file_size(store, cq_file_size) or C.DEFAULT_CQ_FILE_SIZE
    if topic is not None:
        safe_topic_dir(topic)
    records = (r for r in valid_records(store, progress) if topic is None or r.topic == topic)
    queues: dict[tuple[str, int], CqWriter] = {}
    dispatch_to_queues(records, queues, file_size)
    result = RebuildResult(queues=len(queues), units=sum(w.write_pos // 20 for w in queues.values()))
    result.files = sum(len(w.files) for w in queues.values())
    rel = "consumequeue" if topic is None else f"consumequeue/{topic}"
    if dry_run:
        result.target = str(out or store.root / rel)
        return result
    if out is not None:
        out = Path(out)
        if out.exists() and any(out.iterdir()):
            raise StoreError("output directory is not empty", path=str(out))
        result.target = str(out)
        write_queue_tree(out, queues)
        return result
    built = store.root / (rel + BUILD)
    if built.exists():
        shutil.rmtree(built)
    built.mkdir(parents=True)
    _write_built(built, queues, topic)
    txn = Transaction(store.root, backup, label="rebuild-cq")
    txn.replace_dir(rel, built)
    result.backup = str(txn.commit())
    result.target = str(store.root / rel)
    return result


def _write_built(built: Path, queues: dict[tuple[str, int], CqWriter], topic: str | None) -> None:
    if topic is None:
        write_queue_tree(built, queues)
        return
    for (_, qid), w in sorted(queues.items()):
        qdir = built / str(qid)
        qdir.mkdir(parents=True, exist_ok=True)
        for start, data in w.file_bytes().items():
            (qdir / C.offset_to_file_name(start)).write_bytes(data)


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
    indexMsgTimestamp when a file fills up (None if none did)."""

    def __init__(self, geometry: Geometry, files: list[tuple[str, IndexWriter]] | None = None):
        check_geometry(geometry)
        self.geometry = geometry
        self.files = files or []
        self.changed: set[str] = set()
        self.full_end_timestamp: int | None = None

    def _last(self, timestamp: int) -> IndexWriter:
        if self.files and not self.files[-1][1].is_full():
            return self.files[-1][1]
        prev = self.files[-1][1] if self.files else None
        name = index_file_name(timestamp, self.files[-1][0] if self.files else None)
        w = IndexWriter(self.geometry, prev.header.end_phy_offset if prev else 0,
                        prev.header.end_timestamp if prev else 0)
        if prev is not None:
            self.full_end_timestamp = prev.header.end_timestamp
        self.files.append((name, w))
        self.changed.add(name)
        return w

    def add(self, r: RecordInfo) -> None:
        w = self._last(r.store_timestamp)
        if r.offset < w.header.end_phy_offset or not r.indexed:
            return
        for key in r.index_keys:
            if not w.put_key(f"{r.topic}#{key}", r.offset, r.store_timestamp):
                w = self._last(r.store_timestamp)
                w.put_key(f"{r.topic}#{key}", r.offset, r.store_timestamp)
            self.changed.add(self.files[-1][0])


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
                  progress: Progress | None = None) -> tuple[list[tuple[str, bytes]], Path | None]:
    """All index files rebuilt from the commit log; swapped in for ``index/`` unless dry_run."""
    geometry = store_index_geometry(store, slots, max_entries)
    builder = IndexBuilder(geometry)
    for r in valid_records(store, progress):
        builder.add(r)
    files = [(name, w.to_bytes()) for name, w in builder.files]
    if dry_run:
        return files, None
    built = store.root / ("index" + BUILD)
    if built.exists():
        shutil.rmtree(built)
    built.mkdir(parents=True)
    for name, data in files:
        (built / name).write_bytes(data)
    txn = Transaction(store.root, backup, label="rebuild-index")
    txn.replace_dir("index", built)
    cp = store.checkpoint()
    if cp is not None and builder.full_end_timestamp is not None:
        from rmqtool.format.checkpoint import encode_checkpoint
        txn.write("checkpoint", encode_checkpoint(cp._replace(index_msg_timestamp=builder.full_end_timestamp)))
    return files, txn.commit()
