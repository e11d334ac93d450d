"""A synthetic but realistic store, written through the project's own encoders: commit-log files with
a BLANK at each file end (the broker's rolling rule), matching consume queues, index files and a
checkpoint. For benchmarks and tests; deterministic for a seed.
"""

from __future__ import annotations

import os
import random
from typing import Callable
from dataclasses import dataclass
from pathlib import Path

from rmqtool import constants as C
from rmqtool.errors import StoreError
from rmqtool.format.checkpoint import Checkpoint, encode_checkpoint
from rmqtool.format.commitlog import Message, encode_message
from rmqtool.format.hosts import Host
from rmqtool.format.indexfile import DEFAULT_GEOMETRY, Geometry
from rmqtool.format.java import java_string_hash
from rmqtool.format.properties import encode_properties
from rmqtool.store import layout as L
from rmqtool.store.appender import CommitLogAppender, FileSink
from rmqtool.store.index_builder import IndexBuilder, RecordInfo
from rmqtool.store.queue_writer import CqFileWriter

STORE_HOST = Host(bytes([192, 168, 0, 10]), 10911)
START_TIMESTAMP = 1_767_225_600_000          # 2026-01-01T00:00:00Z


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
                   index_geometry: Geometry = DEFAULT_GEOMETRY, seed: int = 0,
                   progress: Callable[[int], None] | None = None) -> Generated:
    """Write a store of about ``size`` commit-log bytes under ``root`` (which must not hold a store);
    ``progress(n)`` is told the commit-log bytes written, every MiB and at the end."""
    root = Path(root)
    if (root / L.COMMITLOG).exists():
        raise StoreError("already holds a commit log", path=str(root))
    rnd = random.Random(seed)
    topic_names = [f"Topic-{i:02d}" for i in range(topics)]
    tags = [f"Tag{c}" for c in "ABCDE"]
    tag_codes = {t: java_string_hash(t) for t in tags}
    born_hosts = [Host(bytes([10, 0, i // 4, i % 4 + 2]), 30000 + 7 * i) for i in range(8)]
    pool = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789 ,.:{}\"") for _ in range(1 << 16)) * 4
    sink = FileSink(root / L.COMMITLOG, file_size)
    appender = CommitLogAppender(file_size, 0, sink)
    sink(0, 0, b"")                                       # the first file exists even when empty
    cq: dict[tuple[str, int], CqFileWriter] = {}
    if index:
        (root / L.INDEX).mkdir(parents=True, exist_ok=True)
    indexer = IndexBuilder(index_geometry, directory=root / L.INDEX) if index else None
    now = START_TIMESTAMP
    count = told = 0
    while appender.end < size:
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
        queue = cq.get((topic, queue_id))
        if queue is None:
            queue = cq[(topic, queue_id)] = CqFileWriter(cq_file_size, root / L.queue_dir(topic, queue_id))
        size_ = C.record_length(0, C.MESSAGE_MAGIC_CODE, len(body), len(topic), len(raw))
        offset = appender.reserve(size_)
        queue_offset = queue.write_pos // C.CQ_STORE_UNIT_SIZE
        msg = Message(topic=topic, body=body, properties_raw=raw, queue_id=queue_id,
                      queue_offset=queue_offset, physical_offset=offset,
                      born_timestamp=now - rnd.randrange(50), born_host=born,
                      store_timestamp=now, store_host=STORE_HOST)
        appender.write(encode_message(msg))
        queue.put(offset, size_, tag_codes[tag], queue_offset)
        if indexer:
            keys = [uniq] + [k for k in props.get(C.PROPERTY_KEYS, "").split(C.KEY_SEPARATOR) if k]
            indexer.add(RecordInfo(offset, size_, topic, queue_id, queue_offset, 0, tag_codes[tag], now, tuple(keys)))
        count += 1
        if progress and appender.end - told >= 1 << 20:
            progress(appender.end - told)
            told = appender.end
    sink.close()
    for queue in cq.values():
        queue.flush()
    if indexer:
        indexer.close()
    (root / L.CHECKPOINT).write_bytes(encode_checkpoint(Checkpoint(now, now, now if indexer else 0)))
    if progress:
        progress(appender.end - told)
    return Generated(root, count, appender.end, appender.end // file_size + 1, len(cq),
                     len(indexer.files) if indexer else 0)


def generate_new_store(directory: str | os.PathLike, size: int, **options) -> Generated:
    """``generate_store`` into a new directory (or an empty one), which appears whole or not at all: the store
    is written under a hidden name beside it and renamed into place (``store.output.staged``: an error or a
    kill leaves nothing there; a write error names ``directory``)."""
    import dataclasses

    from rmqtool.store.atomic import named
    from rmqtool.store.output import staged

    target = Path(directory)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise StoreError("exists and is not an empty directory (generate writes a new one)", path=str(target))
    with named(target):
        target.parent.mkdir(parents=True, exist_ok=True)
    with staged(target) as tmp:
        g = generate_store(tmp, size, **options)
        os.replace(tmp, target)
    return dataclasses.replace(g, root=target)
