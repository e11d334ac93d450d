"""Append messages as the broker's put path does: next physical offset, BLANK and a new file when the
record does not fit, next queue offset, consume-queue unit, index entries, checkpoint.

``StoreWriter`` plans; the store's writers (``rmqtool.store``) write each file kind in place through one
``PatchTransaction``, so an interrupted put/import leaves the store as it was before the batch or after
it, and the backup holds only the bytes the batch overwrote.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from rmqtool import clock
from rmqtool import constants as C
from rmqtool.errors import EncodeError, FormatError, StoreError, UnsafeWrite
from rmqtool.format.checkpoint import Checkpoint, encode_checkpoint
from rmqtool.format.commitlog import Message, encode_message, reserve_crc32, seal_crc32, stored_crc32, without_crc32
from rmqtool.format.dispatch import dispatch, is_lmq, multi_dispatch_targets
from rmqtool.format.dledger import CurrentTerm, encode_currterm
from rmqtool.format.hosts import Host
from rmqtool.format.indexfile import DEFAULT_GEOMETRY, Geometry
from rmqtool.format.java import hashmap_order, java_string_hash
from rmqtool.format.msgid import encode_uniq_key, month_start_ms
from rmqtool.format.properties import encode_properties
from rmqtool.format.rows import decode_body
from rmqtool.store import layout as L
from rmqtool.store.appender import CommitLogAppender
from rmqtool.store.atomic import PatchTransaction, atomic_write, check_room, preallocate
from rmqtool.store.bounds import PlanSize
from rmqtool.store.broker_model import refusal, refused_files
from rmqtool.ops.findings import ERROR
from rmqtool.store.metadata import batch_cq_topics
from rmqtool.store.dledger import DEFAULT_INDEX_FILE_SIZE, LedgerAppender
from rmqtool.store.index_builder import ContinuedIndexFile, IndexBuilder, RecordInfo, StreamedIndexFile
from rmqtool.store.queue_writer import BcqFileWriter, CqFileWriter, safe_topic_dir
from rmqtool.store.store import Store
from rmqtool.store.output import ScratchDir

def _written_end(store: Store, index_refs: list) -> int:
    """The commit log's end, as the broker's recovery finds it (from the newest index entry's record when
    its header is sound: CommitLog.append_end); a damaged tail is refused."""
    hint = index_refs[-1].header.end_phy_offset if index_refs and index_refs[-1].header.index_count > 1 else None
    try:
        return store.commitlog.append_end(hint)
    except FormatError as exc:
        raise UnsafeWrite(f"the commit log is damaged ({exc.message} at offset {exc.offset}); run repair first",
                          path=exc.path) from None


DEFAULT_HOST = Host(bytes([127, 0, 0, 1]), 10911)
_NO_UNIT = (C.TransactionType.PREPARED, C.TransactionType.ROLLBACK)


def init_store(root: Path, *, commitlog_file_size: int = C.DEFAULT_COMMITLOG_FILE_SIZE,
               cq_file_size: int = C.DEFAULT_CQ_FILE_SIZE, geometry: Geometry = DEFAULT_GEOMETRY,
               dledger_self_id: str | None = None,
               dledger_index_file_size: int = DEFAULT_INDEX_FILE_SIZE) -> PlanSize:
    """An empty store as a broker leaves it before the first message, plus the sizes in use; returns what
    it created (store.bounds.PlanSize).

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
    sizes = {"mappedFileSizeCommitLog": commitlog_file_size, "mappedFileSizeConsumeQueue": cq_file_size,
             "maxHashSlotNum": geometry.hash_slot_num, "maxIndexNum": geometry.index_num}
    files = {L.CHECKPOINT: encode_checkpoint(Checkpoint()), L.LOCK: b"lock"}
    ledger = None if dledger_self_id is None else root / (L.DLEDGER_PREFIX + dledger_self_id)
    if ledger is not None:
        sizes["dledgerMappedFileSizeForEntryIndex"] = dledger_index_file_size
        files[str((ledger / L.DLEDGER_CURRTERM).relative_to(root))] = \
            encode_currterm(CurrentTerm(0, dledger_self_id)).encode()
    files[L.SIZES_FILE] = json.dumps(sizes, indent=1).encode()
    size = PlanSize()
    for rel, data in files.items():
        size.create(rel, len(data))
    if ledger is None:
        size.create(L.commitlog_file(0), 0, commitlog_file_size)
    check_room(root, size.data, size.files + 6, "init")       # and its directories
    for sub in (L.CONSUMEQUEUE, L.INDEX, L.CONFIG):
        (root / sub).mkdir(parents=True, exist_ok=True)
    if ledger is None:
        (root / L.COMMITLOG).mkdir()
        preallocate(root / L.commitlog_file(0), commitlog_file_size)
    else:
        for sub in (L.DLEDGER_DATA, L.DLEDGER_INDEX):
            (ledger / sub).mkdir(parents=True)
    for rel, data in files.items():
        atomic_write(root / rel, data)
    return size


class _Queues:
    """A transaction seen from one queue directory (the queue writers' ``Sink``)."""

    def __init__(self, txn: PatchTransaction, rel_dir: str):
        self.txn, self.rel_dir = txn, rel_dir

    def create(self, name: str, size: int) -> None:
        self.txn.create(L.join(self.rel_dir, name), size)

    def write_at(self, name: str, offset: int, data: bytes) -> None:
        self.txn.write_at(L.join(self.rel_dir, name), offset, data)


class StoreWriter:
    """Open a store for appending; ``append`` messages, then ``commit``. Every byte is written where it
    goes, through one ``PatchTransaction`` (its journal keeps only the pre-images of the ranges touched);
    ``dry_run`` plans the same writes without touching the store."""

    INDEX_FLUSH_RECORDS = 100_000        # the index's private map hands its changes over this often

    def __init__(self, store: Store, *, cq_file_size: int | None = None, geometry: Geometry | None = None,
                 batch_topics: Iterable[str] = (), bcq_file_size: int | None = None, backup: Path | None = None,
                 dry_run: bool = False):
        if store.consumequeue_is_rocksdb:
            from rmqtool.store.rocksdbcq import read_only_error
            raise read_only_error(store.consumequeue_dir)
        if store.abort_path.exists():
            raise UnsafeWrite("abort file present: the store was not shut down cleanly; run repair first",
                              path=str(store.abort_path))
        if store.dledger is None:
            for f, problem in refused_files(store.commitlog.queue)[:1]:   # appended after it, records go astray
                raise UnsafeWrite(refusal(problem) + "; move a stray file out of the commit-log directory (or "
                                  "restore a truncated one with repair) first", path=str(f.path))
        self.store = store
        self.txn = PatchTransaction(store.root, backup, label="put", dry_run=dry_run)
        self.file_size = store.commitlog_file_size
        self.index_refs = store.index_files()
        self.ledger = _ledger_appender(store, self.file_size, self._ledger_sink) if store.dledger is not None else None
        self.commitlog = None if self.ledger is not None else \
            CommitLogAppender(self.file_size, _written_end(store, self.index_refs), self._commitlog_sink)
        self.prop_crc = uses_crc32(store)
        self.cq_file_size, self.bcq_file_size = store.queue_file_sizes(cq_file_size, bcq_file_size)
        self.queues: dict[tuple[str, int], CqFileWriter] = {}
        # BatchCQ topics: the store's batchconsumequeue/ topics, queue.type=BatchCQ in config/topics.json, given
        self.batch_topics = batch_cq_topics(store) | set(batch_topics)
        self.batch_queues: dict[tuple[str, int], BcqFileWriter] = {}
        self.lmq_next: dict[str, int] = {}       # the broker's LMQ offset table during this session
        self.geometry = geometry or store.index_geometry()
        self._scratch = ScratchDir("rmqtool-index-") if dry_run else None
        self.index = self._index_builder()
        self.checkpoint = store.checkpoint() or Checkpoint()
        self.count = 0

    # -- the files, opened as they are needed --------------------------------------------------------
    def _commitlog_sink(self, start: int, pos: int, data: bytes) -> None:
        rel = L.commitlog_file(start)
        self._ensure(rel, self.file_size)
        self.txn.write_at(rel, pos, data)

    def _ledger_sink(self, path: Path, pos: int, data: bytes, size: int) -> None:
        rel = self.store.rel(path)
        self._ensure(rel, size)
        self.txn.write_at(rel, pos, data)

    def _ensure(self, rel: str, size: int) -> None:
        """A file about to be written exists at its full size (pre-allocated sparse, as the broker does)."""
        if rel not in self.txn.sizes and not self.txn.planned(rel):
            path = self.store.path(rel)
            if not path.exists():
                self.txn.create(rel, size)
            elif path.stat().st_size < size:
                self.txn.resize(rel, size)

    def _index_builder(self) -> IndexBuilder:
        """IndexService.buildIndex from the last index file on: earlier files are full and stay as they are;
        the last one is continued through a private map whose changes go through the transaction."""
        refs = self.index_refs
        directory = self._scratch.path if self._scratch is not None else self.store.index_dir
        builder = IndexBuilder(self.geometry, [(r.name, ContinuedIndexFile.open(r)) for r in refs[-1:]], directory,
                               create=None if self._scratch is not None else
                               lambda name, size: self.txn.create(L.index_file(name), size),
                               hand_over=self._hand_over_index)
        builder.changed.clear()
        return builder

    def _queue(self, topic: str, queue_id: int) -> CqFileWriter:
        key = (topic, queue_id)
        if key not in self.queues:
            safe_topic_dir(topic)
            exists = self.store.path(L.queue_dir(topic, queue_id)).is_dir()
            self.queues[key] = CqFileWriter.append_to(self.store.consume_queue(topic, queue_id) if exists else None,
                                                      self.cq_file_size, _Queues(self.txn, L.queue_dir(topic, queue_id)))
        return self.queues[key]

    def _batch_queue(self, topic: str, queue_id: int) -> BcqFileWriter:
        key = (topic, queue_id)
        if key not in self.batch_queues:
            safe_topic_dir(topic)
            rel = L.queue_dir(topic, queue_id, batch=True)
            exists = self.store.path(rel).is_dir()
            self.batch_queues[key] = BcqFileWriter.append_to(
                self.store.batch_consume_queue(topic, queue_id) if exists else None, self.bcq_file_size,
                _Queues(self.txn, rel))
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
        msg = dataclasses.replace(msg, properties_raw=without_crc32(msg.properties_raw))
        tran = C.transaction_type(msg.sys_flag)
        batch = msg.topic in self.batch_topics
        if batch:
            queue_offset = self._batch_queue(msg.topic, msg.queue_id).next_offset
            msg = with_inner_base(msg, queue_offset)
        else:
            queue = self._queue(msg.topic, msg.queue_id)
            queue_offset = 0 if tran in _NO_UNIT else queue.write_pos // C.CQ_STORE_UNIT_SIZE
            msg = self._with_lmq_offsets(msg)
        if self.prop_crc:
            msg = dataclasses.replace(msg, properties_raw=reserve_crc32(msg.properties_raw))
        stored = dataclasses.replace(msg, queue_offset=queue_offset,
                                     store_timestamp=msg.store_timestamp or clock.now_ms())
        if self.ledger is not None:
            offset = self.ledger.append(stored.total_size, lambda phys: self._encode(
                dataclasses.replace(stored, physical_offset=phys)))
            stored = dataclasses.replace(stored, physical_offset=offset)
        else:
            stored = dataclasses.replace(stored, physical_offset=self.commitlog.reserve(stored.total_size))
            self.commitlog.write(self._encode(stored))
        keys = ([stored.uniq_key] if stored.uniq_key is not None else []) + stored.keys
        info = RecordInfo(stored.physical_offset, stored.total_size, stored.topic, stored.queue_id, queue_offset,
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
        if self.count % self.INDEX_FLUSH_RECORDS == 0:
            self._hand_over_index()
        return stored

    def _encode(self, stored: Message) -> bytes:
        """The record's bytes; with the store's whole-record CRC sealed in (see uses_crc32)."""
        data = encode_message(stored)
        return seal_crc32(data) if self.prop_crc else data

    def _hand_over_index(self) -> None:
        """The continued index file's changes into the transaction (then out of this process's memory)."""
        for name, w in self.index.files:
            if isinstance(w, ContinuedIndexFile) and not w.buf.closed:
                for offset, data in w.changes():
                    self.txn.write_at(L.index_file(name), offset, data)
                if not self.txn.dry_run:
                    self.txn.flush()
                    w.forget()

    def _finish(self) -> None:
        """Everything appended so far handed to the transaction: queue buffers, index, checkpoints."""
        for q in list(self.queues.values()) + list(self.batch_queues.values()):
            q.flush()
        self._hand_over_index()
        self.index.close()
        if self.index.full_end_timestamp is not None:
            self.checkpoint = self.checkpoint._replace(index_msg_timestamp=self.index.full_end_timestamp)
        if self.ledger is not None and (text := self.ledger.checkpoint_text()) is not None:
            for path in (self.store.dledger.checkpoint_path,
                         self.store.dledger.checkpoint_path.with_name(self.store.dledger.checkpoint_path.name + ".bak")):
                self.txn.write_at(self.store.rel(path), 0, text)
                self.txn.resize(self.store.rel(path), len(text))
        if self.store.is_store_root and self.count:
            self.txn.write_at(L.CHECKPOINT, 0, encode_checkpoint(self.checkpoint))

    def plan(self) -> list[dict]:
        """The dry run's rows: one per file the appends create or write."""
        self._finish()
        return self.txn.plan_rows()

    def planned(self) -> tuple[list[dict], PlanSize]:
        """A dry run's end: its rows (one per file the appends create or write) and its size (store.bounds)."""
        try:
            rows = self.plan()
            return rows, self.txn.plan_size()
        finally:
            self._close()

    def commit(self) -> Path | None:
        """Make every appended message durable as one transaction; returns its backup directory (None:
        nothing was appended). A failure undoes the whole batch."""
        try:
            self._finish()
            return self.txn.commit() if self.count else None
        except BaseException:
            self.txn.rollback()
            raise
        finally:
            self._close()

    def abort(self) -> None:
        """Undo whatever was written (an import that failed half-way)."""
        self.txn.rollback()
        self._close()

    def _close(self) -> None:
        for _, w in self.index.files:
            if isinstance(w, ContinuedIndexFile):
                w.close()
            elif isinstance(w, StreamedIndexFile):
                w.abandon()                    # closed by _finish; else the change is undone
        if self._scratch is not None:
            self._scratch.remove()
            self._scratch = None


def uses_crc32(store: Store) -> bool:
    """Whether the broker writing this store has enabledAppendPropCRC (5.2+): the first record of its
    newest commit-log file ends with the __CRC32# property. Appended records then get it too."""
    from rmqtool.errors import RmqError

    cl = store.commitlog
    files = [f for f in cl.queue if f.length]
    if not files:
        return False
    try:
        entry = cl.read_at(files[-1].start + cl.entry_header_size)
    except RmqError:
        return False
    return isinstance(entry, Message) and stored_crc32(entry.properties_raw) is not None


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


def _ledger_appender(store: Store, data_file_size: int, sink) -> LedgerAppender:
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
                          term=term.curr_term if term else 0, sink=sink)


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
    now = clock.now_ms()
    return Message(topic=topic, body=body, properties_raw=raw, queue_id=queue_id, flag=flag, sys_flag=sys_flag,
                   born_timestamp=now if born_timestamp is None else born_timestamp, born_host=born_host,
                   store_timestamp=store_timestamp, store_host=store_host, reconsume_times=reconsume_times,
                   prepared_transaction_offset=prepared_transaction_offset, magic_code=magic_code)


# -- a message as a producer sends it and the broker's send path stores it -------------------------------
# MessageClientIDSetter's class-loader hash stands for the producing JVM's class loader: rmqtool's own
# (String.hashCode of "rmqtool"), so that decode-id tells a put message from a producer's.
CLASS_LOADER_HASH = java_string_hash("rmqtool")
_UNIQ_COUNTER = itertools.count()       # MessageClientIDSetter.COUNTER: per process, from 0


@dataclasses.dataclass(frozen=True)
class BrokerStamp:
    """What a store's broker puts into each record it stores, as its newest record shows it: the store host
    (brokerIP1:listenPort), the CLUSTER property (SendMessageProcessor adds brokerClusterName), MSG_REGION and
    TRACE_ON (``region``, ``trace_on``; None: the broker adds neither), whether the properties end with a
    separator (<= 4.9.0 and 5.2+) and the HashMap the broker re-serializes them from
    (MessageDecoder.string2messageProperties: 16 buckets in 4.x, 128 in 5.x)."""

    store_host: Host = DEFAULT_HOST
    cluster: str | None = None
    trailing_separator: bool = False
    map_capacity: int = 16
    region: str | None = None
    trace_on: str | None = None


def newest_records(store: Store) -> list[Message]:
    """The newest records the store tells cheaply: the one its newest index entry names (IndexHeader
    endPhyOffset) and the first of the newest commit-log file that starts with one (the broker creates the
    next file ahead, all zeros); none in an empty store."""
    from rmqtool.errors import RmqError

    cl = store.commitlog

    def message_at(offset: int) -> Message | None:
        try:
            entry = cl.read_at(offset)
        except RmqError:
            return None
        return entry if isinstance(entry, Message) else None

    out = []
    try:
        refs = store.index_files()
    except RmqError:
        refs = []
    if refs and refs[-1].header.index_count > 1 and (m := message_at(refs[-1].header.end_phy_offset)):
        out.append(m)
    for f in reversed(list(cl.queue)):
        if f.length and (m := message_at(f.start + cl.entry_header_size)):
            return out + [m]
    return out


def broker_stamp(store: Store, region: str | None = None, trace_on: bool | None = None) -> BrokerStamp:
    """The store's BrokerStamp from its newest record, one the broker's send path wrote when there is one
    (CLUSTER: the inner messages of a batch keep the client's properties); defaults in an empty store.

    MSG_REGION and TRACE_ON (AbstractSendMessageProcessor.buildMsgContext: BrokerConfig regionId and
    traceOn): ``region`` / ``trace_on`` when given, else the record's; a record without them gets the
    BrokerConfig defaults (DefaultRegion, true) in a 5.x store, whose broker adds them to every message, and
    none in another: a 4.9.7 broker adds them only when a SendMessageHook is registered (none in a stock
    broker; buildMsgContext returns at once without one)."""
    capacity = 128 if store.is_5x else 16
    records = newest_records(store)
    record = next((r for r in records if C.PROPERTY_CLUSTER in r.properties), records[0] if records else None)
    props = record.properties if record is not None else {}
    if region is None and trace_on is None and C.PROPERTY_MSG_REGION not in props and not store.is_5x:
        switch = None
    else:
        region = region if region is not None else props.get(C.PROPERTY_MSG_REGION, C.DEFAULT_TRACE_REGION_ID)
        switch = str(trace_on).lower() if trace_on is not None else props.get(C.PROPERTY_TRACE_SWITCH, "true")
    stamp = BrokerStamp(map_capacity=capacity, region=region if switch is not None else None, trace_on=switch)
    if record is None:
        return stamp
    return dataclasses.replace(stamp, store_host=record.store_host, cluster=props.get(C.PROPERTY_CLUSTER),
                               trailing_separator=without_crc32(record.properties_raw).endswith(C.PROPERTY_SEPARATOR))


def new_uniq_key(ip: bytes) -> str:
    """MessageClientIDSetter.createUniqID in this process for a client at ``ip``: its pid, CLASS_LOADER_HASH,
    the time (rmqtool.clock) since the UTC month start, the process's counter."""
    now = clock.now_ms()
    return encode_uniq_key(ip, os.getpid(), CLASS_LOADER_HASH, now, month_start_ms(now), next(_UNIQ_COUNTER))


def sent_message(topic: bytes, body: bytes, stamp: BrokerStamp, *, queue_id: int = 0, tags: bytes | None = None,
                 keys: Sequence[bytes] = (), properties: Sequence[tuple[bytes, bytes]] = (),
                 born_host: Host | None = None, store_host: Host | None = None) -> Message:
    """A message as a Java producer sends it and the broker stores it, its bytes as given.

    The producer's Message map (a HashMap of 16) takes TAGS, KEYS (joined by a space), the user properties
    and a new UNIQ_KEY (unless one is given: MessageClientIDSetter.setUniqID); the broker re-reads them into
    its own map, adds MSG_REGION and TRACE_ON (the stamp's, over any given) when it does, re-reads them again,
    adds CLUSTER when its records carry one (unless given) and drops WAIT (never added here), and writes them
    in that map's order. The born host is the client's: the store host's address with port 0
    unless given, the address the UNIQ_KEY names.
    """
    store_host = store_host or stamp.store_host
    born_host = born_host or Host(store_host.address, 0)
    items: dict[bytes, bytes] = {}
    if tags:
        items[C.PROPERTY_TAGS.encode()] = tags
    if keys:
        items[C.PROPERTY_KEYS.encode()] = C.KEY_SEPARATOR.encode().join(keys)
    items.update(properties)
    uniq = C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
    if uniq not in items:
        items[uniq] = new_uniq_key(born_host.address).encode()
    names = {name.decode("utf-8", "replace"): name for name in items}     # Java hashes the decoded name
    if len(names) != len(items):
        raise EncodeError("two property names differ only in bytes that are not UTF-8 (the broker reads them as "
                          "one name)")
    order = hashmap_order(list(names), 16)
    for name, value in ((C.PROPERTY_MSG_REGION, stamp.region), (C.PROPERTY_TRACE_SWITCH, stamp.trace_on)):
        if value is not None:        # buildMsgContext: the request's properties re-read, these two put
            items[name.encode()] = value.encode()
            if name not in names:
                names[name] = name.encode()
                order.append(name)
    order = hashmap_order(order, stamp.map_capacity)
    if stamp.cluster and C.PROPERTY_CLUSTER.encode() not in items:
        items[C.PROPERTY_CLUSTER.encode()] = stamp.cluster.encode()
        names[C.PROPERTY_CLUSTER] = C.PROPERTY_CLUSTER.encode()
        order.append(C.PROPERTY_CLUSTER)
    for name, value in items.items():
        if not name or any(sep in name + value for sep in (b"\x01", b"\x02")):
            raise EncodeError(f"property {name!r}: an empty name, or a separator byte (\\x01 or \\x02) in it "
                              "or its value")
    raw = b"\x02".join(names[n] + b"\x01" + items[names[n]] for n in hashmap_order(order, stamp.map_capacity))
    if stamp.trailing_separator and raw:
        raw += b"\x02"
    if len(raw) > C.MAX_PROPERTIES_LEN:
        raise EncodeError(f"properties of {len(raw)} bytes exceed 32767")
    text = safe_topic_dir(topic.decode("utf-8", "replace"))      # the name reput gives its queue directory
    msg = build_message(text, body, queue_id=queue_id, born_host=born_host, store_host=store_host)
    return dataclasses.replace(msg, properties_raw=raw, topic_raw=None if text.encode() == topic else topic)


_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
# The integer fields of a row and their ranges (the broker's int and long fields; queueId is a directory).
_ROW_INTS = {"queue_id": (0, _INT32[1]), "flag": _INT32, "sys_flag": _INT32, "reconsume_times": _INT32,
             "born_timestamp": _INT64, "store_timestamp": _INT64, "prepared_transaction_offset": _INT64}


def _row_int(row: dict[str, Any], name: str) -> int | None:
    value = row.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    lo, hi = _ROW_INTS[name]
    if not lo <= value <= hi:
        raise ValueError(f"{name} {value} is outside {lo}..{hi}")
    return value


def message_from_row(row: dict[str, Any], store_host: Host = DEFAULT_HOST,
                     override_store_host: Host | None = None, stamp: BrokerStamp | None = None) -> Message | None:
    """A jsonl row as written by cat-commitlog (see rmqtool.format.rows); None for a BLANK row. Every field is
    checked (EncodeError): nothing is guessed, truncated or dropped. ``topic_raw`` and ``properties_raw``
    (base64) are the stored bytes when given. A row without a store host gets ``store_host`` (and without a
    born host, that address with port 0); ``override_store_host`` replaces every row's. A row without stored
    property bytes and without MSG_REGION gets the ``stamp``'s MSG_REGION and TRACE_ON when it has them, its
    properties then in the broker's map order (AbstractSendMessageProcessor.buildMsgContext)."""
    if not isinstance(row, dict):
        raise EncodeError(f"not a JSON object: {type(row).__name__}")
    if row.get("type") == "blank":
        return None
    try:
        ints = {name: _row_int(row, name) for name in _ROW_INTS}
        topic, props = row.get("topic"), row.get("properties") or {}
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic must be a non-empty string, got {topic!r}")
        if not isinstance(props, dict) or not all(isinstance(v, str) for v in props.values()):
            raise ValueError("properties must be an object of strings")
        sent = stamp is not None and stamp.region is not None and row.get("properties_raw") is None \
            and C.PROPERTY_MSG_REGION not in props
        if sent:
            props = dict(props, **{C.PROPERTY_MSG_REGION: stamp.region, C.PROPERTY_TRACE_SWITCH: stamp.trace_on})
            props = {k: props[k] for k in hashmap_order(list(props), stamp.map_capacity)}
        body = decode_body(row.get("body"), row.get("body_encoding") or "base64")
        magic = row.get("magic_code")
        msg = build_message(
            topic, body, queue_id=ints["queue_id"] or 0, properties=props,
            flag=ints["flag"] or 0, sys_flag=ints["sys_flag"] or 0,
            born_host=Host.parse(row["born_host"]) if row.get("born_host") else Host(store_host.address, 0),
            store_host=override_store_host or (Host.parse(row["store_host"]) if row.get("store_host") else store_host),
            born_timestamp=ints["born_timestamp"], store_timestamp=ints["store_timestamp"] or 0,
            reconsume_times=ints["reconsume_times"] or 0,
            prepared_transaction_offset=ints["prepared_transaction_offset"] or 0,
            magic_code=int(magic, 16) if magic else None)
        if row.get("properties_raw") is not None:   # the stored bytes: exact even for repeated keys
            msg = dataclasses.replace(msg, properties_raw=base64.b64decode(row["properties_raw"], validate=True))
        elif sent and stamp.trailing_separator or \
                msg.properties_raw and row.get("total_size") == msg.total_size + 1:   # the row's record had a
            msg = dataclasses.replace(msg, properties_raw=msg.properties_raw + b"\x02")   # trailing \x02
        if row.get("topic_raw") is not None:        # a stored topic that is not UTF-8
            msg = dataclasses.replace(msg, topic_raw=base64.b64decode(row["topic_raw"], validate=True))
        return msg
    except (KeyError, TypeError, ValueError, base64.binascii.Error) as exc:
        raise EncodeError(f"bad message row: {type(exc).__name__}: {exc}") from None


def read_rows(lines: Iterable[str]) -> Iterator[tuple[int, dict]]:
    """(line number, row) of each non-empty jsonl line; EncodeError for a line that is not a JSON object."""
    where = getattr(lines, "name", None)
    where = where if isinstance(where, str) else None        # a temporary copy's is its descriptor
    for n, line in enumerate(lines, start=1):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise EncodeError(f"line {n}: not JSON: {exc}", path=where) from None
            if not isinstance(row, dict):
                raise EncodeError(f"line {n}: not a JSON object", path=where)
            yield n, row
