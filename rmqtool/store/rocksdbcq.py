"""The RocksDB consume queue (5.2+, storeType=defaultRocksDB): ``consumequeue/`` is one RocksDB database
(RocksDBConsumeQueueStore / ConsumeQueueRocksDBStorage) instead of ``<topic>/<queueId>/`` files.

Read only, through rocksdict (the ``rocksdb`` extra), so that no byte or file of the store changes: the
database is opened read-only in a private directory of symbolic links to its files, where RocksDB's own
info log and rocksdict's config file go (a read-only open still writes those beside the database). Never
written: a database written by another RocksDB build may not open in the broker's.
"""

from __future__ import annotations

import os
import re
import weakref
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator

from rmqtool.errors import FormatError, StoreError, first_line
from rmqtool.format.consumequeue import CqUnit
from rmqtool.format.rocksdbcq import (CHECKPOINT_TOPIC, OffsetEntry, RocksCqUnit, decode_offset, decode_unit,
                                      queue_prefix)
from rmqtool.store.output import ScratchDir

OFFSET_FAMILY = "offset"
EXTRA_HINT = "reading {what} needs the rocksdb extra: pip install 'rmqtool[rocksdb]'"


def is_rocksdb_dir(path: Path) -> bool:
    """A RocksDB database directory: CURRENT with MANIFEST-* (and OPTIONS-*) files beside it."""
    if not (path / "CURRENT").is_file():
        return False
    names = os.listdir(path)
    return any(n.startswith("MANIFEST-") for n in names) or any(n.startswith("OPTIONS-") for n in names)


_OPEN: "weakref.WeakSet[RocksDbConsumeQueues]" = weakref.WeakSet()


def close_all() -> None:
    """Close every database still open (a command's end: an error's traceback may keep its store alive)."""
    for db in list(_OPEN):
        db.close()


class RocksDbConsumeQueues:
    """The database, open read-only until this object is collected. The ``offset`` family (two entries per
    queue) is read at once; one queue's units by a prefix scan, every unit (``units``) on demand."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offsets: dict[tuple[str, str, int], OffsetEntry] = {}
        self.checkpoint_offset: int | None = None  # CHECKPOINT_TOPIC/max/0: the highest dispatched commit-log offset
        self._db, families, shadow = open_read_only(self.path, "the RocksDB consume queue")
        db = self._db
        self._closed = weakref.finalize(self, close_read_only, db, shadow)
        _OPEN.add(self)
        if OFFSET_FAMILY not in families:
            self._closed()
            raise StoreError(f"the RocksDB database has no {OFFSET_FAMILY!r} column family (families: "
                             f"{', '.join(families)}): not a RocksDB consume queue", path=str(path))
        offset_cf = db.get_column_family(OFFSET_FAMILY)
        for key, value in offset_cf.items():
            e = _decoded(decode_offset, key, value, self.path)
            if e.topic == CHECKPOINT_TOPIC:
                self.checkpoint_offset = e.physical_offset
            else:
                self.offsets[(e.topic, e.kind, e.queue_id)] = e
        # family -> (point deletes, range deletes) still in the SST files
        self.deletions = {"default": _deletions(db), OFFSET_FAMILY: _deletions(offset_cf)}

    @classmethod
    def read(cls, path: Path) -> "RocksDbConsumeQueues":
        return cls(path)

    def close(self) -> None:
        """Close the database now (else when this object is collected, or by ``close_all``)."""
        self._closed()

    @cached_property
    def units(self) -> dict[tuple[str, int], list[RocksCqUnit]]:
        """Every unit, by queue, in key (= queue offset) order: one walk of the ``default`` family."""
        out: dict[tuple[str, int], list[RocksCqUnit]] = {}
        for key, value in self._db.items():
            u = _decoded(decode_unit, key, value, self.path)
            out.setdefault((u.topic, u.queue_id), []).append(u)
        return out

    def queue_units(self, topic: str, queue_id: int) -> list[RocksCqUnit]:
        """One queue's units by a prefix scan (its keys are contiguous)."""
        if "units" in self.__dict__:
            return self.units.get((topic, queue_id), [])
        prefix, out = queue_prefix(topic, queue_id), []
        for key, value in self._db.items(from_key=prefix):
            if not key.startswith(prefix):
                break
            out.append(_decoded(decode_unit, key, value, self.path))
        return out

    def topics(self) -> list[str]:
        """Topics with a ``max`` entry (every queue the broker dispatched to and did not delete)."""
        return sorted({t for t, _, _ in self.offsets})

    def queue_ids(self, topic: str) -> list[int]:
        return sorted({q for t, _, q in self.offsets if t == topic})

    def queue(self, topic: str, queue_id: int) -> "RocksDbConsumeQueue":
        return RocksDbConsumeQueue(topic, queue_id, self)

    def existing_queue(self, topic: str, queue_id: int) -> "RocksDbConsumeQueue":
        """The queue, or a StoreError naming the topics or queues there are."""
        topics = self.topics()
        if topic not in topics:
            raise StoreError(f"unknown topic {topic!r} (the RocksDB consume queue has {len(topics)} topics: "
                             f"{', '.join(topics[:10]) or 'none'})", path=str(self.path))
        if queue_id not in self.queue_ids(topic):
            raise StoreError(f"topic {topic!r} has no queue {queue_id} (queues: "
                             f"{', '.join(map(str, self.queue_ids(topic)))})", path=str(self.path))
        return self.queue(topic, queue_id)


def open_read_only(path: Path, what: str):
    """(db, column family names, shadow directory) of the RocksDB database at ``path``, opened read-only with
    every column family, in raw mode, from a private directory of symbolic links to its files (LOCK left
    out), so that nothing is written beside the database; ``close_read_only(db, shadow)`` releases both."""
    try:
        from rocksdict import AccessType, Options, Rdict
    except ImportError:
        raise StoreError(EXTRA_HINT.format(what=what), path=str(path)) from None
    shadow = ScratchDir("rmqtool-rocksdb-")
    try:
        for name in os.listdir(path):
            if name != "LOCK":
                _link(os.path.abspath(os.path.join(path, name)), shadow.path / name)
        families = Rdict.list_cf(str(shadow.path), Options(raw_mode=True))
        db = Rdict(str(shadow.path), options=Options(raw_mode=True),
                   column_families={name: Options(raw_mode=True) for name in families if name != "default"},
                   access_type=AccessType.read_only())
    except OSError:
        shadow.remove(strict=False)
        raise
    except Exception as exc:        # rocksdict raises plain Exception for RocksDB errors
        shadow.remove(strict=False)
        raise StoreError(f"cannot open {what}: {first_line(exc).replace(str(shadow.path), str(path))}",
                         path=str(path)) from None
    return db, families, shadow


def _link(target: str, link: Path) -> None:
    try:
        os.symlink(target, link)
    except OSError as exc:     # named by the link that could not be made (a full temporary directory), not the store
        raise OSError(exc.errno, exc.strerror, str(link)) from None


def close_read_only(db, shadow: ScratchDir) -> None:
    db.close()
    shadow.remove(strict=False)


def _decoded(decode, key: bytes, value: bytes, path: Path):
    try:
        return decode(key, value)
    except FormatError as exc:
        raise exc.at(path=str(path)) from None


def _deletions(db) -> tuple[int, int]:
    """(point deletes, range deletes) still in the SST files: table properties count both as deletions."""
    text = db.property_value("rocksdb.aggregated-table-properties") or ""
    found = dict(re.findall(r"# (deletions|range deletions)=(\d+)", text))
    ranges = int(found.get("range deletions", 0))
    return int(found.get("deletions", 0)) - ranges, ranges


@dataclass(frozen=True)
class RocksDbConsumeQueue:
    """One queue of the database, with the file queue's reading interface (store.ConsumeQueue)."""

    topic: str
    queue_id: int
    db: RocksDbConsumeQueues

    @cached_property
    def units(self) -> list[RocksCqUnit]:
        return self.db.queue_units(self.topic, self.queue_id)

    def entry(self, kind: str) -> OffsetEntry | None:
        return self.db.offsets.get((self.topic, kind, self.queue_id))

    def iter_units(self, start: int = 0, commitlog_end: int | None = None) -> Iterator[tuple[int, CqUnit]]:
        for u in self.units:
            if commitlog_end is not None and u.physical_offset >= commitlog_end:
                return
            if u.queue_offset >= start:
                yield u.queue_offset, CqUnit(u.physical_offset, u.size, u.tags_code)

    def extent(self, commitlog_end: int | None = None) -> tuple[int, int]:
        offsets = [q for q, _ in self.iter_units(0, commitlog_end)]
        return (offsets[0], len(offsets)) if offsets else (0, 0)

    @property
    def min_offset(self) -> int:
        """RocksDBConsumeQueueOffsetTable.getMinCqOffset: the ``min`` entry, else the oldest unit."""
        low = self.entry("min")
        return low.queue_offset if low is not None else (self.units[0].queue_offset if self.units else 0)

    @property
    def max_offset(self) -> int:
        """getMaxOffsetInQueue: the ``max`` entry's queue offset + 1 (0 without one)."""
        high = self.entry("max")
        return high.queue_offset + 1 if high is not None else 0


def read_only_error(path: Path) -> StoreError:
    return StoreError("consumequeue/ is a RocksDB database (storeType=defaultRocksDB): rmqtool reads it but never "
                      "writes into it (a database written by another RocksDB build may not open in the broker's); "
                      "rebuild-cq --out DIR writes classic file queues elsewhere", path=str(path))
