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
from rmqtool.format.dispatch import dispatch, is_lmq, multi_dispatch_targets
from rmqtool.format.dledger import CurrentTerm, encode_currterm
from rmqtool.format.hosts import Host
from rmqtool.format.indexfile import DEFAULT_GEOMETRY, Geometry, IndexWriter
from rmqtool.format.java import hashmap_order
from rmqtool.format.properties import encode_properties
from rmqtool.ops.facts import QueueNames, scan_file
from rmqtool.format.rows import decode_body
from rmqtool.store import layout as L
from rmqtool.store.atomic import Transaction, atomic_write
from rmqtool.ops.findings import ERROR
from rmqtool.store.metadata import batch_cq_topics
from rmqtool.store.dledger import DEFAULT_INDEX_FILE_SIZE, LedgerAppender
from rmqtool.store.index_builder import IndexBuilder, RecordInfo
from rmqtool.store.queue_writer import BcqWriter, CqWriter, safe_topic_dir
from rmqtool.store.store import Store

def _written_end(store: Store) -> int:
    """The commit log's written end, one file at a time; a damaged commit log is refused."""
    queue = store.commitlog.queue
    end = queue.files[0].start if queue.files else 0
    names = QueueNames()
    for f in queue:
        facts = scan_file(f, names)
        if facts.findings:
            bad = facts.findings[0]
            raise UnsafeWrite(f"the commit log is damaged ({bad.kind} at offset {bad.offset}); run repair first",
                              path=bad.path)
        if facts.stop == "blank" or len(facts):
            end = facts.end
    return end


DEFAULT_HOST = Host(bytes([127, 0, 0, 1]), 10911)
_NO_UNIT = (C.TransactionType.PREPARED, C.TransactionType.ROLLBACK)


def init_store(root: Path, *, commitlog_file_size: int = C.DEFAULT_COMMITLOG_FILE_SIZE,
               cq_file_size: int = C.DEFAULT_CQ_FILE_SIZE, geometry: Geometry = DEFAULT_GEOMETRY,
               dledger_self_id: str | None = None,
               dledger_index_file_size: int = DEFAULT_INDEX_FILE_SIZE) -> None:
    """An empty store as a broker leaves it before the first message, plus the sizes in use.

    With ``dledger_self_id`` (enableDLegerCommitLog), the commit log is ``dledger-<id>/data`` and
    ``index`` (files created by the first append) and ``currterm`` of the node that leads term 0.
    """
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise StoreError("directory exists and is not empty", path=str(root))
    if commitlog_file_size < 1024 or cq_file_size <= 0 or cq_file_size % C.CQ_STORE_UNIT_SIZE:
        raise StoreError("commit-log file size must be >= 1024 and the consume-queue size a multiple of 20")
    if dledger_self_id is not None and (dledger_index_file_size <= 0 or dledger_index_file_size % 32
                                        or not dledger_self_id.isidentifier()):
        raise StoreError("the DLedger index file size must be a multiple of 32 and the node id a plain name")
    for sub in (L.CONSUMEQUEUE, L.INDEX, L.CONFIG):
        (root / sub).mkdir(parents=True, exist_ok=True)
    sizes = {"mappedFileSizeCommitLog": commitlog_file_size, "mappedFileSizeConsumeQueue": cq_file_size,
             "maxHashSlotNum": geometry.hash_slot_num, "maxIndexNum": geometry.index_num}
    if dledger_self_id is None:
        (root / L.COMMITLOG).mkdir()
        atomic_write(root / L.commitlog_file(0), bytes(commitlog_file_size))
    else:
        ledger = root / (L.DLEDGER_PREFIX + dledger_self_id)
        for sub in (L.DLEDGER_DATA, L.DLEDGER_INDEX):
            (ledger / sub).mkdir(parents=True)
        atomic_write(ledger / L.DLEDGER_CURRTERM, encode_currterm(CurrentTerm(0, dledger_self_id)).encode())
        sizes["dledgerMappedFileSizeForEntryIndex"] = dledger_index_file_size
    atomic_write(root / L.CHECKPOINT, encode_checkpoint(Checkpoint()))
    atomic_write(root / L.LOCK, b"lock")
    atomic_write(root / L.SIZES_FILE, json.dumps(sizes, indent=1).encode())


class StoreWriter:
    """Open a store for appending; ``append`` messages, then ``commit``."""

    def __init__(self, store: Store, *, cq_file_size: int | None = None, geometry: Geometry | None = None,
                 batch_topics: Iterable[str] = (), bcq_file_size: int | None = None):
        if store.abort_path.exists():
            raise UnsafeWrite("abort file present: the store was not shut down cleanly; run repair first",
                              path=str(store.abort_path))
        self.store = store
        self.file_size = store.commitlog_file_size
        self.ledger = _ledger_appender(store, self.file_size) if store.dledger is not None else None
        self.end = self.ledger.end_pos if self.ledger is not None else _written_end(store)
        self.files: dict[int, bytearray] = {}
        self.touched: set[int] = set()
        self.cq_file_size = store.cq_file_size(cq_file_size)
        self.queues: dict[tuple[str, int], CqWriter] = {}
        self.queue_originals: set[tuple[str, int, int]] = set()
        # BatchCQ topics: the store's batchconsumequeue/ topics, queue.type=BatchCQ in config/topics.json, given
        self.batch_topics = batch_cq_topics(store) | set(batch_topics)
        self.bcq_file_size = store.bcq_file_size(bcq_file_size)
        self.batch_queues: dict[tuple[str, int], BcqWriter] = {}
        self.lmq_next: dict[str, int] = {}       # the broker's LMQ offset table during this session
        refs = store.index_files()
        self.geometry = geometry or store.index_geometry()
        self.index = IndexBuilder(self.geometry, [(r.name, IndexWriter.from_bytes(r.read(), r.geometry))
                                                  for r in refs])
        self.checkpoint = store.checkpoint() or Checkpoint()
        self.count = 0

    def _file(self, start: int) -> bytearray:
        if start not in self.files:
            path = self.store.path(L.commitlog_file(start))
            data = path.read_bytes() if path.exists() else b""
            self.files[start] = bytearray(data[:self.file_size] + bytes(max(self.file_size - len(data), 0)))
        return self.files[start]

    def _queue(self, topic: str, queue_id: int) -> CqWriter:
        key = (topic, queue_id)
        if key not in self.queues:
            safe_topic_dir(topic)
            if self.store.path(L.queue_dir(topic, queue_id)).is_dir():
                self.queues[key] = CqWriter.load(self.store.consume_queue(topic, queue_id), self.cq_file_size)
            else:
                self.queues[key] = CqWriter(self.cq_file_size)
        return self.queues[key]

    def _batch_queue(self, topic: str, queue_id: int) -> BcqWriter:
        key = (topic, queue_id)
        if key not in self.batch_queues:
            safe_topic_dir(topic)
            exists = self.store.path(L.queue_dir(topic, queue_id, batch=True)).is_dir()
            self.batch_queues[key] = BcqWriter.load(
                self.store.batch_consume_queue(topic, queue_id) if exists else None, self.bcq_file_size)
        return self.batch_queues[key]

    def _with_lmq_offsets(self, msg: Message) -> Message:
        """INNER_MULTI_QUEUE_OFFSET as the broker's put adds it to a multi-dispatch message: the next offset
        of each LMQ named (an empty field for other names), properties re-serialized in HashMap order.
        A message that has the offsets (an import) keeps them; either way the LMQs' next offsets advance."""
        props = msg.properties
        names = props.get(C.PROPERTY_INNER_MULTI_DISPATCH)
        if not names or not multi_dispatch_targets(msg.topic, {**props, C.PROPERTY_INNER_MULTI_QUEUE_OFFSET: "0"}):
            return msg
        names_list = names.split(C.MULTI_DISPATCH_QUEUE_SPLITTER)
        if C.PROPERTY_INNER_MULTI_QUEUE_OFFSET not in props:
            offsets = [str(self._lmq_next(n)) if is_lmq(n) else "" for n in names_list]
            props[C.PROPERTY_INNER_MULTI_QUEUE_OFFSET] = C.MULTI_DISPATCH_QUEUE_SPLITTER.join(offsets)
            raw = encode_properties({k: props[k] for k in hashmap_order(list(props))},
                                    trailing_separator=msg.properties_raw.endswith(b"\x02"))
            msg = dataclasses.replace(msg, properties_raw=raw)
        for name, offset in zip(names_list, props[C.PROPERTY_INNER_MULTI_QUEUE_OFFSET].split(",")):
            if is_lmq(name) and offset.isdigit():
                self.lmq_next[name] = max(self._lmq_next(name), int(offset) + 1)
        return msg

    def _lmq_next(self, name: str) -> int:
        if name not in self.lmq_next:
            self.lmq_next[name] = self._queue(name, 0).write_pos // C.CQ_STORE_UNIT_SIZE
        return self.lmq_next[name]

    def append(self, msg: Message) -> Message:
        """Place one message as CommitLog.putMessage / doAppend would; returns it as stored."""
        safe_topic_dir(msg.topic)
        tran = C.transaction_type(msg.sys_flag)
        batch = msg.topic in self.batch_topics
        if batch:
            queue_offset = self._batch_queue(msg.topic, msg.queue_id).next_offset
            msg = with_inner_base(msg, queue_offset)
        else:
            queue = self._queue(msg.topic, msg.queue_id)
            queue_offset = 0 if tran in _NO_UNIT else queue.write_pos // C.CQ_STORE_UNIT_SIZE
            msg = self._with_lmq_offsets(msg)
        stored = dataclasses.replace(msg, queue_offset=queue_offset,
                                     store_timestamp=msg.store_timestamp or int(time.time() * 1000))
        if self.ledger is not None:
            offset = self.ledger.append(stored.total_size, lambda phys: encode_message(
                dataclasses.replace(stored, physical_offset=phys)))
            stored = dataclasses.replace(stored, physical_offset=offset)
            data_len = stored.total_size
            self.end = self.ledger.end_pos
        else:
            stored, data_len = self._append_record(stored)
        keys = ([stored.uniq_key] if stored.uniq_key is not None else []) + stored.keys
        info = RecordInfo(stored.physical_offset, data_len, stored.topic, stored.queue_id, queue_offset,
                          stored.sys_flag, stored.tags_code(), stored.store_timestamp, tuple(keys))
        if info.gets_cq_unit and batch:
            self._batch_queue(msg.topic, msg.queue_id).put(dispatch(stored, batch_cq=True)[0].unit)
            self.checkpoint = self.checkpoint._replace(logics_msg_timestamp=info.store_timestamp)
        elif info.gets_cq_unit:
            queue.put(info.offset, info.size, info.tags_code, info.queue_offset)
            for d in dispatch(stored)[1:]:                # LMQ and other multi-dispatch targets
                safe_topic_dir(d.topic)
                self._queue(d.topic, d.queue_id).put(info.offset, info.size, info.tags_code, d.queue_offset)
            self.checkpoint = self.checkpoint._replace(logics_msg_timestamp=info.store_timestamp)
        self.index.add(info)
        self.checkpoint = self.checkpoint._replace(physic_msg_timestamp=info.store_timestamp)
        self.count += 1
        return stored

    def _append_record(self, stored: Message) -> tuple[Message, int]:
        """Place a record in the commit log (a BLANK and the next file when it does not fit)."""
        size = stored.total_size
        if size + C.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            raise EncodeError(f"a record of {size} bytes does not fit a {self.file_size}-byte commit-log file")
        start = self.end - self.end % self.file_size
        pos = self.end - start
        if pos + size + C.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            buf = self._file(start)
            buf[pos:] = encode_blank(Blank(self.file_size - pos))
            self.touched.add(start)
            start += self.file_size
            pos = 0
        stored = dataclasses.replace(stored, physical_offset=start + pos)
        data = encode_message(stored)
        buf = self._file(start)
        buf[pos:pos + len(data)] = data
        self.touched.add(start)
        self.end = start + pos + len(data)
        return stored, len(data)

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
            txn.write(L.commitlog_file(start), bytes(self.files[start]))
        if self.ledger is not None:
            for rel, data in sorted(self.ledger.files().items()):
                txn.write(L.join(self.store.dledger.dir.name, rel), data)
        for (topic, qid), w in self.queues.items():
            for start, data in w.file_bytes().items():
                rel = L.queue_file(topic, qid, start)
                path = self.store.path(rel)
                if not path.exists() or path.read_bytes() != data:
                    txn.write(rel, data)
        for (topic, qid), bw in self.batch_queues.items():
            for start, data in bw.file_bytes().items():
                rel = L.queue_file(topic, qid, start, batch=True)
                path = self.store.path(rel)
                if not path.exists() or path.read_bytes() != data:
                    txn.write(rel, data)
        for name, w in self.index.files:
            if name in self.index.changed:
                txn.write(L.index_file(name), w.to_bytes())
        if self.index.full_end_timestamp is not None:
            self.checkpoint = self.checkpoint._replace(index_msg_timestamp=self.index.full_end_timestamp)
        if self.store.is_store_root:
            txn.write(L.CHECKPOINT, encode_checkpoint(self.checkpoint))
        return txn




def with_inner_base(msg: Message, queue_offset: int) -> Message:
    """An inner-batch message as the broker stores it: INNER_BASE = its queue offset, the properties
    re-serialized in java.util.HashMap order (BatchConsumeQueue.assignQueueOffset); unchanged when
    INNER_BASE already says so."""
    if not msg.sys_flag & C.SysFlag.INNER_BATCH:
        return msg
    props = msg.properties
    if props.get(C.PROPERTY_INNER_BASE) == str(queue_offset):
        return msg
    props[C.PROPERTY_INNER_BASE] = str(queue_offset)
    raw = encode_properties({k: props[k] for k in hashmap_order(list(props))},
                            trailing_separator=msg.properties_raw.endswith(b"\x02"))
    return dataclasses.replace(msg, properties_raw=raw)


def _ledger_appender(store: Store, data_file_size: int) -> LedgerAppender:
    """The DLedger log opened for appending; refused when the log is damaged."""
    from rmqtool.ops.dledger import check_dledger, walk_ledger

    bad = next((f for f in check_dledger(store) if f.severity == ERROR), None)
    if bad is not None:
        raise UnsafeWrite(f"the DLedger log is damaged ({bad.kind} at offset {bad.offset}); run repair first",
                          path=bad.path)
    cl = store.commitlog
    walk = walk_ledger(cl)
    term = store.dledger.currterm()
    index_size = (store.dledger.index_queue().file_size or store.saved_sizes.get("dledgerMappedFileSizeForEntryIndex")
                  or DEFAULT_INDEX_FILE_SIZE)
    return LedgerAppender(cl, store.dledger, data_file_size=data_file_size, index_file_size=index_size,
                          end_pos=walk.end_pos, last=walk.entries[-1].header if walk.entries else None,
                          term=term.curr_term if term else 0)


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
    """A jsonl row as written by cat-commitlog (see rmqtool.format.rows); None for a BLANK row."""
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
