"""Look-ups by physical offset, key and message ID. They return values; the CLI renders them.

Only the format and store layers are used here (no pyarrow, no pyspark), so look-ups start fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from rmqtool import constants as C
from rmqtool.errors import FormatError, RmqError
from rmqtool.format.batchcq import BatchCqUnit
from rmqtool.format.commitlog import Blank, Message
from rmqtool.format.consumequeue import decode_written_units
from rmqtool.format.dispatch import dispatch, is_lmq
from rmqtool.format.msgid import decode_message_id, decode_uniq_key
from rmqtool.store.commitlog import CommitLog
from rmqtool.store.metadata import known_topics
from rmqtool.store.store import Store, query_index

LONG_MAX = 2**63 - 1
INDEX_TIME_SLACK_MS = 999       # an index entry's time is its record's store time to the second (see lookup_key)


# -- record boundaries ------------------------------------------------------------------------------
def nearest_boundaries(commitlog: CommitLog, offset: int) -> tuple[int | None, int | None]:
    """The record boundaries at or before and at or after ``offset``, walking from the start of its file.

    (offset, offset) when it is a boundary; the written end counts as one, and is the boundary before
    an offset beyond it (with None after).
    """
    f, _ = commitlog.queue.locate(offset)
    before: int | None = None
    end = f.start
    for loc in commitlog.iter_entries(f.start):
        if loc.offset >= offset:
            return (loc.offset if loc.offset == offset else before), loc.offset
        before = loc.offset
        end = loc.offset + loc.entry.total_size
    if end == offset:
        return offset, offset       # the written end: a valid place to start (nothing follows)
    return (before, end) if end > offset else (end, None)


# -- index look-ups ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class IndexHit:
    """One offset of IndexService.queryOffset, with the record read there (None if unreadable)."""

    topic: str
    key: str
    physical_offset: int
    index_file: str
    record: Message | None

    @property
    def matches(self) -> bool:
        """Does the record really carry this topic and key (KEYS element or UNIQ_KEY)?"""
        r = self.record
        return r is not None and r.topic == self.topic and (self.key in r.keys or r.uniq_key == self.key)

    def row(self) -> dict:
        return {"topic": self.topic, "key": self.key, "physical_offset": self.physical_offset,
                "store_timestamp": self.record.store_timestamp if self.record else None,
                "index_file": self.index_file}


@dataclass
class KeyLookup:
    hits: list[IndexHit]                      # the broker's raw list, in its order (newest first)
    records: list[tuple[int, Message]] = field(default_factory=list)   # matching, each offset once
    collisions: list[int] = field(default_factory=list)                # hits whose record lacks the key
    via_queue: bool = False                   # found by reading an LMQ consume queue (LMQs are not indexed)


def lookup_key(store: Store, topic: str, key: str, *, max_num: int = C.INDEX_MAX_MSGS_NUM_BATCH,
               begin: int = 0, end: int = LONG_MAX, lmq_scan: bool = True) -> KeyLookup:
    """IndexService.queryOffset over every index file, then each hit read and checked against the key.

    ``hits`` is the broker's answer for [begin, end]. ``records`` are the matching records *stored* in
    [begin, end]: IndexFile.selectPhyOffset compares ``beginTimestamp + timeDiff * 1000`` of the file's
    header, and IndexFile.putKey stores timeDiff in whole seconds (truncated; 0 when a record's store time
    is before the header's), so the index's time of an entry can be up to 999 ms off its record's. The
    index is asked with the window widened by that much and each record kept by its own store time.

    The broker indexes a multi-dispatched record under its own topic only; for an ``%LMQ%`` name with no
    index hit (and ``lmq_scan``), the LMQ's consume queue is read instead: its records carrying the key.
    """
    cl = store.commitlog
    refs = store.index_files()
    raw = query_index(refs, topic, key, max_num, begin, end)
    hits = [IndexHit(topic, key, phy, ref.name, _read_message(cl, phy)) for phy, ref in raw]
    result = KeyLookup(hits)
    wide_begin, wide_end = max(begin - INDEX_TIME_SLACK_MS, 0), min(end, LONG_MAX - INDEX_TIME_SLACK_MS) + \
        INDEX_TIME_SLACK_MS
    if (wide_begin, wide_end) != (begin, end):
        hits = [IndexHit(topic, key, phy, ref.name, _read_message(cl, phy))
                for phy, ref in query_index(refs, topic, key, max_num, wide_begin, wide_end)]
    seen: set[int] = set()
    for hit in hits:
        if not hit.matches:
            result.collisions.append(hit.physical_offset)
        elif not begin <= hit.record.store_timestamp <= end:
            continue
        elif hit.physical_offset not in seen:
            seen.add(hit.physical_offset)
            result.records.append((hit.physical_offset, hit.record))
    if not result.records and lmq_scan and is_lmq(topic):
        result.via_queue = True
        for cq in store.consume_queues(topic):
            for _, unit in cq.iter_units():
                msg = _read_message(cl, unit.physical_offset)
                if (msg is not None and (key in msg.keys or msg.uniq_key == key)
                        and begin <= msg.store_timestamp <= end and unit.physical_offset not in seen):
                    seen.add(unit.physical_offset)
                    result.records.append((unit.physical_offset, msg))
    return result


def _read_message(cl: CommitLog, offset: int) -> Message | None:
    try:
        entry = cl.read_at(offset)
    except RmqError:
        return None
    return None if isinstance(entry, Blank) else entry


# -- message IDs ------------------------------------------------------------------------------------
@dataclass
class IdLookup:
    kind: str                                 # "offsetMsgId", "UNIQ_KEY" or "" (nothing found)
    records: list[tuple[int, Message]]
    notes: list[str] = field(default_factory=list)
    searched: list[str] = field(default_factory=list)   # the topics a UNIQ_KEY was looked up under


def lookup_id(store: Store, msg_id: str, *, kind: str = "auto", topics: Iterable[str] | None = None,
              scan: bool = False, max_num: int = C.INDEX_MAX_MSGS_NUM_BATCH,
              progress: Callable[[int], None] | None = None, on_damage=None) -> IdLookup:
    """Find records by an offsetMsgId or a UNIQ_KEY (both are 32 or 56 hex characters).

    ``auto`` takes the ID as an offsetMsgId when the record at its decoded offset has exactly that
    msgId, else as a UNIQ_KEY: looked up in the index under every topic the store knows (known_topics) or
    ``topics``,
    and with ``scan`` by reading the whole commit log when the index has nothing (``progress(n)`` is told
    the bytes scanned; ``on_damage``: as iter_record_batches, default: a damaged record raises).
    """
    msg_id = msg_id.strip().upper()
    notes: list[str] = []
    near: tuple[int, Message] | None = None
    if kind in ("auto", "msg-id"):
        host, offset = decode_message_id(msg_id)
        found = _read_message(store.commitlog, offset)
        if found is not None and found.msg_id == msg_id:
            return IdLookup("offsetMsgId", [(offset, found)])
        if found is not None and found.physical_offset == offset:
            near = (offset, found)
            notes.append(f"the record at offset {offset} was stored by {found.store_host}, "
                         f"not by {host} as the offsetMsgId says")
    searched: list[str] = []
    if kind in ("auto", "uniq-key"):
        decode_uniq_key(msg_id)
        searched = known_topics(store) if topics is None else list(topics)
        records = find_uniq_key(store, msg_id, topics=searched, scan=scan, max_num=max_num, progress=progress,
                                on_damage=on_damage)
        if records:
            return IdLookup("UNIQ_KEY", records)
    if near is not None:
        return IdLookup("offsetMsgId", [near], notes, searched)
    return IdLookup("", [], notes, searched)


def find_uniq_key(store: Store, uniq_key: str, *, topics: Iterable[str] | None = None, scan: bool = False,
                  max_num: int = C.INDEX_MAX_MSGS_NUM_BATCH, progress: Callable[[int], None] | None = None,
                  on_damage=None) -> list[tuple[int, Message]]:
    """Records whose UNIQ_KEY is ``uniq_key``, in commit-log order (retries and scheduled copies share it),
    looked up under ``topics`` (default: every topic the store knows)."""
    found: dict[int, Message] = {}
    for topic in (known_topics(store) if topics is None else topics):
        for offset, msg in lookup_key(store, topic, uniq_key, max_num=max_num, lmq_scan=False).records:
            if msg.uniq_key == uniq_key:
                found[offset] = msg
    if not found and scan:
        from rmqtool.ops.filters import RecordFilter, filtered_batches

        for batch in filtered_batches(store.commitlog, RecordFilter(keys=(uniq_key,)), progress=progress,
                                      on_damage=on_damage):
            for offset in batch.column("physical_offset").to_pylist():
                msg = _read_message(store.commitlog, offset)
                if msg is not None and msg.uniq_key == uniq_key:
                    found[offset] = msg
    return sorted(found.items(), key=lambda item: item[0])


def describe_id(msg_id: str, born_timestamp: int | None = None) -> dict:
    """Both readings of a 32/56 hex-character ID: as an offsetMsgId and as a UNIQ_KEY (its time anchored on
    ``born_timestamp``, else on the month of now: rmqtool.clock)."""
    from rmqtool import clock

    msg_id = msg_id.strip().upper()
    host, offset = decode_message_id(msg_id)
    uniq = decode_uniq_key(msg_id)
    return {
        "id": msg_id,
        "store_host": str(host),
        "physical_offset": offset,
        "client_ip": uniq.ip,
        "pid": uniq.pid,
        "class_loader_hash": uniq.class_loader_hash,
        "time_diff": uniq.time_diff,
        "counter": uniq.counter,
        "created_timestamp": uniq.timestamp(born_timestamp, clock.now_ms()),
    }


# -- consume-queue checks ---------------------------------------------------------------------------
def unit_problems(cl: CommitLog, topic: str, queue_id: int, queue_offset: int, unit) -> list[str]:
    """How a consume-queue unit disagrees with the record it points at (empty when it agrees).

    A unit in another queue than the record's own (an LMQ or other multi-dispatch target) must be one the
    record dispatches to; the broker appends such units at the queue's end, so the unit may sit below the
    offset the record asks for (after a record whose targets it skipped), never above it.
    """
    entry, problem = _record_at(cl, unit.physical_offset)
    if problem:
        return [problem]
    out = []
    if entry.total_size != unit.size:
        out.append(f"size {unit.size} != record size {entry.total_size}")
    target = None
    if entry.topic != topic:
        target = next((d for d in _dispatches(entry, unit.physical_offset)[1:]
                       if (d.topic, d.queue_id) == (topic, queue_id)), None)
    if target is not None:
        if queue_offset > target.queue_offset:
            out.append(f"record asks for queue offset {target.queue_offset} in {topic}")
    else:
        if entry.topic != topic:
            out.append(f"record topic is {entry.topic!r}")
        if entry.queue_id != queue_id:
            out.append(f"record queue id is {entry.queue_id}")
        if entry.queue_offset != queue_offset:
            out.append(f"record queue offset is {entry.queue_offset}")
    if not unit.has_ext_address:
        try:
            expected = entry.tags_code()
        except ValueError:
            expected = None
        if expected != unit.tags_code:
            out.append(f"tagsCode {unit.tags_code} != {expected} computed from the record")
    return out


def _record_at(cl: CommitLog, offset: int) -> tuple[Message | None, str | None]:
    """The message a unit points at, or why there is none."""
    try:
        entry = cl.read_at(offset)
    except RmqError as exc:
        return None, f"no record at offset {offset}: {exc.message}"
    if isinstance(entry, Blank):
        return None, f"offset {offset} is a BLANK record"
    return entry, None


def _dispatches(entry: Message, offset: int, batch_cq: bool = False) -> list:
    try:
        return dispatch(entry, offset, batch_cq=batch_cq)
    except FormatError:
        return []


def batch_unit_problems(cl: CommitLog, topic: str, queue_id: int, unit: BatchCqUnit) -> list[str]:
    """How a batch consume-queue unit disagrees with the record it points at (empty when it agrees)."""
    entry, problem = _record_at(cl, unit.physical_offset)
    if problem:
        return [problem]
    if entry.topic != topic or entry.queue_id != queue_id:
        return [f"record is in {entry.topic}/{entry.queue_id}"]
    want = _dispatches(entry, unit.physical_offset, batch_cq=True)
    if not want:
        return ["the record gets no consume-queue unit (a prepared or rolled-back transaction, or bad fields)"]
    names = ("size", "tagsCode", "storeTime", "msgBaseOffset", "batchSize")
    return [f"{name} {have} != {expected} from the record"
            for name, have, expected in zip(names, unit[1:6], want[0].unit[1:6]) if have != expected]


def dirty_tail_start(cq, cl: CommitLog) -> int | None:
    """The queue offset where the trailing units whose record is missing begin (None: no such tail).

    After a crash, a consume queue can hold units for records the commit log lost; the broker drops them
    on load (truncateDirtyLogicFiles). Found from the tail backwards, reading one record per unit.
    """
    cut = None
    for f in reversed(cq.queue.files):
        try:
            units = decode_written_units(f.read())
        except FormatError as exc:
            raise exc.at(path=str(f.path)) from None
        first = f.start // C.CQ_STORE_UNIT_SIZE
        for i in range(len(units) - 1, -1, -1):
            record = None if units[i].is_filler else _read_message(cl, units[i].physical_offset)
            if units[i].is_filler or (record is not None and record.total_size == units[i].size):
                return cut
            cut = first + i
    return cut
