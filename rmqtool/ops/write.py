"""Append messages as the broker's put path does: next physical offset, BLANK and a new file when the
record does not fit, next queue offset, consume-queue unit, index entries, checkpoint.

``StoreWriter`` keeps the touched files in memory and ``commit()`` swaps them in as one transaction,
so an interrupted put/import leaves the store as it was before the batch or after it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from rmqtool import constants as C
from rmqtool.errors import EncodeError, StoreError, UnsafeWrite
from rmqtool.format.checkpoint import Checkpoint, encode_checkpoint
from rmqtool.format.commitlog import Blank, Message, encode_blank, encode_message
from rmqtool.format.hosts import Host
from rmqtool.format.indexfile import DEFAULT_GEOMETRY, Geometry, IndexWriter
from rmqtool.format.properties import encode_properties
from rmqtool.ops.rebuild import CqWriter, IndexBuilder, safe_topic_dir
from rmqtool.ops.rows import decode_body
from rmqtool.ops.verify import RecordInfo, data_end, scan_commitlog
from rmqtool.store.atomic import Transaction, atomic_write
from rmqtool.store.config import read_config
from rmqtool.store.store import Store

GEOMETRY_FILE = "config/rmqtool.json"     # sizes chosen at init (the broker keeps them in its own config)
DEFAULT_HOST = Host(bytes([127, 0, 0, 1]), 10911)
_NO_UNIT = (C.TransactionType.PREPARED, C.TransactionType.ROLLBACK)


def init_store(root: Path, *, commitlog_file_size: int = C.DEFAULT_COMMITLOG_FILE_SIZE,
               cq_file_size: int = C.DEFAULT_CQ_FILE_SIZE, geometry: Geometry = DEFAULT_GEOMETRY) -> None:
    """An empty store as a broker leaves it before the first message, plus the sizes in use."""
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise StoreError("directory exists and is not empty", path=str(root))
    if commitlog_file_size < 1024 or cq_file_size <= 0 or cq_file_size % C.CQ_STORE_UNIT_SIZE:
        raise StoreError("commit-log file size must be >= 1024 and the consume-queue size a multiple of 20")
    for sub in ("commitlog", "consumequeue", "index", "config"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    atomic_write(root / "commitlog" / C.offset_to_file_name(0), bytes(commitlog_file_size))
    atomic_write(root / "checkpoint", encode_checkpoint(Checkpoint()))
    atomic_write(root / "lock", b"lock")
    atomic_write(root / GEOMETRY_FILE, json.dumps({
        "mappedFileSizeCommitLog": commitlog_file_size, "mappedFileSizeConsumeQueue": cq_file_size,
        "maxHashSlotNum": geometry.hash_slot_num, "maxIndexNum": geometry.index_num}, indent=1).encode())


class StoreWriter:
    """Open a store for appending; ``append`` messages, then ``commit``."""

    def __init__(self, store: Store, *, cq_file_size: int | None = None, geometry: Geometry | None = None):
        if store.abort_path.exists():
            raise UnsafeWrite("abort file present: the store was not shut down cleanly; run repair first",
                              path=str(store.abort_path))
        self.store = store
        root = store.root
        saved = read_config(root / GEOMETRY_FILE) if (root / GEOMETRY_FILE).is_file() else {}
        queue = store.commitlog.queue
        self.file_size = queue.file_size or saved.get("mappedFileSizeCommitLog") or C.DEFAULT_COMMITLOG_FILE_SIZE
        scans = scan_commitlog(store)
        bad = next((f for s in scans for f in s.findings), None)
        if bad is not None:
            raise UnsafeWrite(f"the commit log is damaged ({bad.kind} at offset {bad.offset}); run repair first",
                              path=bad.path)
        self.end = data_end(scans) if scans else 0
        self.files: dict[int, bytearray] = {}
        self.touched: set[int] = set()
        self.cq_file_size = (cq_file_size or next((cq.queue.file_size for cq in store.consume_queues()
                                                   if cq.queue.file_size), None)
                             or saved.get("mappedFileSizeConsumeQueue") or C.DEFAULT_CQ_FILE_SIZE)
        self.queues: dict[tuple[str, int], CqWriter] = {}
        self.queue_originals: set[tuple[str, int, int]] = set()
        refs = store.index_files()
        self.geometry = geometry or (refs[0].geometry if refs else None) or (
            Geometry(saved["maxHashSlotNum"], saved["maxIndexNum"]) if "maxHashSlotNum" in saved else DEFAULT_GEOMETRY)
        self.index = IndexBuilder(self.geometry, [(r.name, IndexWriter.from_bytes(r.read(), r.geometry))
                                                  for r in refs])
        self.checkpoint = store.checkpoint() or Checkpoint()
        self.count = 0

    def _file(self, start: int) -> bytearray:
        if start not in self.files:
            path = self.store.root / "commitlog" / C.offset_to_file_name(start)
            data = path.read_bytes() if path.exists() else b""
            self.files[start] = bytearray(data[:self.file_size] + bytes(max(self.file_size - len(data), 0)))
        return self.files[start]

    def _queue(self, topic: str, queue_id: int) -> CqWriter:
        key = (topic, queue_id)
        if key not in self.queues:
            safe_topic_dir(topic)
            qdir = self.store.consumequeue_dir / topic / str(queue_id)
            if qdir.is_dir():
                self.queues[key] = CqWriter.load(self.store.consume_queue(topic, queue_id), self.cq_file_size)
            else:
                self.queues[key] = CqWriter(self.cq_file_size)
        return self.queues[key]

    def append(self, msg: Message) -> Message:
        """Place one message as CommitLog.putMessage / doAppend would; returns it as stored."""
        safe_topic_dir(msg.topic)
        size = msg.total_size
        if size + C.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            raise EncodeError(f"a record of {size} bytes does not fit a {self.file_size}-byte commit-log file")
        start = self.end - self.end % self.file_size
        pos = self.end - start
        if pos + size + C.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            buf = self._file(start)
            blank = encode_blank(Blank(self.file_size - pos))
            buf[pos:] = blank
            self.touched.add(start)
            start += self.file_size
            pos = 0
        tran = C.transaction_type(msg.sys_flag)
        queue = self._queue(msg.topic, msg.queue_id)
        queue_offset = 0 if tran in _NO_UNIT else queue.write_pos // C.CQ_STORE_UNIT_SIZE
        stored = dataclasses.replace(msg, queue_offset=queue_offset, physical_offset=start + pos,
                          store_timestamp=msg.store_timestamp or int(time.time() * 1000))
        data = encode_message(stored)
        buf = self._file(start)
        buf[pos:pos + len(data)] = data
        self.touched.add(start)
        self.end = start + pos + len(data)
        keys = ([stored.uniq_key] if stored.uniq_key is not None else []) + stored.keys
        info = RecordInfo(stored.physical_offset, len(data), stored.topic, stored.queue_id, queue_offset,
                          stored.sys_flag, stored.tags_code(), stored.store_timestamp, tuple(keys))
        if info.gets_cq_unit:
            queue.put(info.offset, info.size, info.tags_code, info.queue_offset)
            self.checkpoint = self.checkpoint._replace(logics_msg_timestamp=info.store_timestamp)
        self.index.add(info)
        self.checkpoint = self.checkpoint._replace(physic_msg_timestamp=info.store_timestamp)
        self.count += 1
        return stored

    def commit(self, backup: Path | None = None) -> Path | None:
        """Swap every appended message in as one transaction; returns its backup directory."""
        result = self.transaction(backup).commit()
        self.touched.clear()
        self.index.changed.clear()
        return result

    def transaction(self, backup: Path | None = None) -> Transaction:
        """The files to write for the messages appended so far (``commit`` applies them)."""
        txn = Transaction(self.store.root, backup, label="put")
        for start in sorted(self.touched):
            txn.write(f"commitlog/{C.offset_to_file_name(start)}", bytes(self.files[start]))
        for (topic, qid), w in self.queues.items():
            for start, data in w.file_bytes().items():
                path = self.store.consumequeue_dir / topic / str(qid) / C.offset_to_file_name(start)
                if not path.exists() or path.read_bytes() != data:
                    txn.write(str(path.relative_to(self.store.root)), data)
        for name, w in self.index.files:
            if name in self.index.changed:
                txn.write(f"index/{name}", w.to_bytes())
        if self.index.full_end_timestamp is not None:
            self.checkpoint = self.checkpoint._replace(index_msg_timestamp=self.index.full_end_timestamp)
        if self.store.is_store_root:
            txn.write("checkpoint", encode_checkpoint(self.checkpoint))
        return txn


def build_message(topic: str, body: bytes, *, queue_id: int = 0, tags: str | None = None,
                  keys: str | None = None, properties: dict[str, str] | None = None, flag: int = 0,
                  born_host: Host = DEFAULT_HOST, store_host: Host = DEFAULT_HOST,
                  born_timestamp: int | None = None, store_timestamp: int = 0, sys_flag: int = 0,
                  reconsume_times: int = 0, prepared_transaction_offset: int = 0,
                  magic_code: int | None = None, trailing_separator: bool = False) -> Message:
    """A message as a client would send it: properties in the given order, with a trailing separator
    as <= 4.9.0 and 5.2+ brokers write them, or without (4.9.1-5.1.4)."""
    props: dict[str, str] = {}
    if tags:
        props[C.PROPERTY_TAGS] = tags
    if keys:
        props[C.PROPERTY_KEYS] = keys
    props.update(properties or {})
    for name, text in props.items():
        if any(c in name + text for c in "\x01\x02"):
            raise EncodeError(f"property {name!r} contains a separator character (\\x01 or \\x02)")
    raw = encode_properties(props, trailing_separator)
    if len(raw) > C.MAX_PROPERTIES_LEN:
        raise EncodeError(f"properties of {len(raw)} bytes exceed 32767")
    v6_bits = int(C.SysFlag.BORNHOST_V6 | C.SysFlag.STOREHOSTADDRESS_V6)
    sys_flag = (int(sys_flag) & ~v6_bits) | (int(C.SysFlag.BORNHOST_V6) if born_host.ipv6 else 0) \
        | (int(C.SysFlag.STOREHOSTADDRESS_V6) if store_host.ipv6 else 0)
    now = int(time.time() * 1000)
    return Message(topic=topic, body=body, properties_raw=raw, queue_id=queue_id, flag=flag, sys_flag=sys_flag,
                   born_timestamp=now if born_timestamp is None else born_timestamp, born_host=born_host,
                   store_timestamp=store_timestamp, store_host=store_host, reconsume_times=reconsume_times,
                   prepared_transaction_offset=prepared_transaction_offset, magic_code=magic_code)


def message_from_row(row: dict[str, Any]) -> Message | None:
    """A jsonl row as written by cat-commitlog (see rmqtool.ops.rows); None for a BLANK row."""
    if row.get("type") == "blank":
        return None
    try:
        body = decode_body(row.get("body"), row.get("body_encoding") or "base64")
        magic = row.get("magic_code")
        msg = build_message(
            row["topic"], body, queue_id=int(row.get("queue_id") or 0), properties=row.get("properties") or {},
            flag=int(row.get("flag") or 0), sys_flag=int(row.get("sys_flag") or 0),
            born_host=Host.parse(row["born_host"]) if row.get("born_host") else DEFAULT_HOST,
            store_host=Host.parse(row["store_host"]) if row.get("store_host") else DEFAULT_HOST,
            born_timestamp=row.get("born_timestamp"), store_timestamp=int(row.get("store_timestamp") or 0),
            reconsume_times=int(row.get("reconsume_times") or 0),
            prepared_transaction_offset=int(row.get("prepared_transaction_offset") or 0),
            magic_code=int(magic, 16) if magic else None)
        if row.get("properties_raw") is not None:   # the stored bytes: exact even for repeated keys
            msg = dataclasses.replace(msg, properties_raw=base64.b64decode(row["properties_raw"]))
        elif msg.properties_raw and row.get("total_size") == msg.total_size + 1:   # the row's record had a
            msg = dataclasses.replace(msg, properties_raw=msg.properties_raw + b"\x02")   # trailing \x02
        return msg
    except (KeyError, TypeError, ValueError, base64.binascii.Error) as exc:
        raise EncodeError(f"bad message row: {type(exc).__name__}: {exc}") from None


def read_rows(lines: Iterable[str]) -> Iterator[tuple[int, dict]]:
    for n, line in enumerate(lines, start=1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except ValueError as exc:
                raise EncodeError(f"line {n}: not JSON: {exc}") from None
