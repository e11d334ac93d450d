"""A synthetic but realistic store, written through the project's own encoders: commit-log files with
a BLANK at each file end (the broker's rolling rule), matching consume queues, index files and a
checkpoint. For benchmarks and tests; deterministic for a seed.
"""

from __future__ import annotations

import datetime as dt
import os
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from rmqtool import constants as C
from rmqtool.errors import StoreError
from rmqtool.format.checkpoint import Checkpoint, encode_checkpoint
from rmqtool.format.commitlog import Blank, Message, encode_blank, encode_message
from rmqtool.format.consumequeue import CqUnit, encode_unit
from rmqtool.format.hosts import Host
from rmqtool.format.indexfile import DEFAULT_GEOMETRY, Geometry, IndexWriter
from rmqtool.format.java import java_string_hash
from rmqtool.format.properties import encode_properties

STORE_HOST = Host(bytes([192, 168, 0, 10]), 10911)
START_TIMESTAMP = 1_767_225_600_000          # 2026-01-01T00:00:00Z


class CommitLogAppender:
    """Appends encoded records to commit-log files of ``file_size`` bytes, rolling like the broker:
    a record is written only if 8 bytes remain after it; otherwise a BLANK fills the file."""

    def __init__(self, directory: Path, file_size: int = C.DEFAULT_COMMITLOG_FILE_SIZE):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.file_size = file_size
        self.file_start = 0
        self.position = 0                      # inside the current file
        self._out = open(self.directory / C.offset_to_file_name(0), "wb")

    def reserve(self, size: int) -> int:
        """The physical offset at which a record of ``size`` bytes will be written."""
        if size + C.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            raise ValueError(f"a record of {size} bytes does not fit a {self.file_size}-byte file")
        if size + C.END_FILE_MIN_BLANK_LENGTH > self.file_size - self.position:
            self._out.write(encode_blank(Blank(self.file_size - self.position)))
            self._out.close()
            self.file_start += self.file_size
            self.position = 0
            self._out = open(self.directory / C.offset_to_file_name(self.file_start), "wb")
        return self.file_start + self.position

    def write(self, record: bytes) -> None:
        self._out.write(record)
        self.position += len(record)

    def close(self) -> int:
        """Pad the last file to its full size with zeros (as the broker pre-allocates it); returns
        the written end."""
        self._out.truncate(self.file_size)
        self._out.close()
        return self.file_start + self.position


@dataclass
class Generated:
    root: Path
    messages: int
    commitlog_bytes: int          # the written end
    files: int
    consume_queues: int
    index_files: int


def generate_store(root: str | os.PathLike, size: int, *, file_size: int = C.DEFAULT_COMMITLOG_FILE_SIZE,
                   topics: int = 16, queues: int = 8, body_min: int = 200, body_max: int = 500,
                   cq_file_size: int = C.DEFAULT_CQ_FILE_SIZE, index: bool = True,
                   index_geometry: Geometry = DEFAULT_GEOMETRY, seed: int = 0) -> Generated:
    """Write a store of about ``size`` commit-log bytes under ``root`` (which must not hold a store)."""
    root = Path(root)
    if (root / "commitlog").exists():
        raise StoreError("already holds a commit log", path=str(root))
    rnd = random.Random(seed)
    topic_names = [f"Topic-{i:02d}" for i in range(topics)]
    tags = [f"Tag{c}" for c in "ABCDE"]
    tag_codes = {t: java_string_hash(t) for t in tags}
    born_hosts = [Host(bytes([10, 0, i // 4, i % 4 + 2]), 30000 + 7 * i) for i in range(8)]
    pool = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789 ,.:{}\"") for _ in range(1 << 16)) * 4
    appender = CommitLogAppender(root / "commitlog", file_size)
    cq: dict[tuple[str, int], bytearray] = defaultdict(bytearray)
    indexer = _Indexer(root / "index", index_geometry) if index else None
    now = START_TIMESTAMP
    count = 0
    while appender.file_start + appender.position < size:
        topic = rnd.choice(topic_names)
        queue_id = rnd.randrange(queues)
        tag = rnd.choice(tags)
        born = rnd.choice(born_hosts)
        now += rnd.randrange(3)
        props = {}
        if rnd.random() < 0.6:
            props[C.PROPERTY_KEYS] = " ".join(f"order-{rnd.randrange(10**9)}" for _ in range(rnd.randint(1, 2)))
        props[C.PROPERTY_TAGS] = tag
        # UNIQ_KEY: client IP, pid, class-loader hash, ms since the month start, counter
        uniq = f"{born.address.hex().upper()}{4242:04X}{0x5E1A2B3C:08X}{now - START_TIMESTAMP:08X}{count & 0xFFFF:04X}"
        props[C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
        props[C.PROPERTY_CLUSTER] = "DefaultCluster"
        raw = encode_properties(props)
        body_len = rnd.randint(body_min, body_max)
        at = rnd.randrange(len(pool) - body_len)
        body = pool[at:at + body_len].encode("ascii")
        queue_unit = cq[(topic, queue_id)]
        size_ = C.record_length(0, C.MESSAGE_MAGIC_CODE, len(body), len(topic), len(raw))
        offset = appender.reserve(size_)
        msg = Message(topic=topic, body=body, properties_raw=raw, queue_id=queue_id,
                      queue_offset=len(queue_unit) // C.CQ_STORE_UNIT_SIZE, physical_offset=offset,
                      born_timestamp=now - rnd.randrange(50), born_host=born,
                      store_timestamp=now, store_host=STORE_HOST)
        appender.write(encode_message(msg))
        queue_unit += encode_unit(CqUnit(offset, size_, tag_codes[tag]))
        if indexer:
            for key in [uniq] + props.get(C.PROPERTY_KEYS, "").split(C.KEY_SEPARATOR):
                if key:
                    indexer.put(f"{topic}#{key}", offset, now)
        count += 1
    end = appender.close()
    for (topic, queue_id), units in cq.items():
        _write_queue(root / "consumequeue" / topic / str(queue_id), units, cq_file_size)
    index_files = indexer.close() if indexer else 0
    (root / "checkpoint").write_bytes(encode_checkpoint(Checkpoint(now, now, now if indexer else 0)))
    return Generated(root, count, end, appender.file_start // file_size + 1, len(cq), index_files)


def _write_queue(directory: Path, units: bytearray, file_size: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(units), file_size):
        write_sparse(directory / C.offset_to_file_name(start), units[start:start + file_size], file_size)


def write_sparse(path: Path, data, size: int, block: int = 1 << 16) -> None:
    """``data`` padded with zeros to ``size`` bytes; all-zero blocks stay holes, as in the broker's
    pre-allocated files."""
    view = memoryview(data)
    with open(path, "wb") as fh:
        for pos in range(0, len(view), block):
            chunk = view[pos:pos + block]
            if any(chunk.cast("Q")) if len(chunk) % 8 == 0 else any(chunk):
                fh.seek(pos)
                fh.write(chunk)
        fh.truncate(size)


class _Indexer:
    """IndexService.buildIndex over fresh files: a new file (named by its first store time, UTC) when
    one is full, constructed with the previous file's end offset and timestamp."""

    def __init__(self, directory: Path, geometry: Geometry):
        self.directory = directory
        self.geometry = geometry
        self.writer: IndexWriter | None = None
        self.name = ""
        self.files = 0

    def put(self, key: str, offset: int, timestamp: int) -> None:
        if self.writer is None or not self.writer.put_key(key, offset, timestamp):
            prev = self.writer.header if self.writer else None
            self._flush()
            self.writer = IndexWriter(self.geometry, prev.end_phy_offset if prev else 0,
                                      prev.end_timestamp if prev else 0)
            stamp = dt.datetime.fromtimestamp(timestamp / 1000, dt.timezone.utc)
            name = stamp.strftime("%Y%m%d%H%M%S") + f"{stamp.microsecond // 1000:03d}"
            self.name = name if name > self.name else str(int(self.name) + 1)   # names must stay unique
            self.writer.put_key(key, offset, timestamp)

    def _flush(self) -> None:
        if self.writer is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_sparse(self.directory / self.name, self.writer.buf, self.geometry.file_size)
            self.files += 1

    def close(self) -> int:
        self._flush()
        return self.files
