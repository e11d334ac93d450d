"""What the broker does with a store when it starts, per version: the one written model.

Versions: ``4.9.7`` (tag rocketmq-all-4.9.7) and ``5.3.3`` (rocketmq-all-5.3.3). Each rule names the broker
class and method it mirrors; ``RULES`` is the table the README shows. ``verify`` takes its verdict
levels and predictions from here, ``repair`` its recovery start and ``rebuild-cq``/``rebuild-index
--as-broker`` the dispatch across a bad record.

Verdict levels: ``ERROR`` the broker refuses the store (``DefaultMessageStore.load`` returns false) or
starts and leaves data unreachable that only an offline fix brings back; ``WARNING`` the broker handles
it on start (and the finding says how); nothing else is reported.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import NamedTuple

from rmqtool import constants as C
from rmqtool.errors import FormatError
from rmqtool.format.commitlog import Blank, decode_entry

V4, V5 = "4.9.7", "5.3.3"
VERSIONS = (V4, V5)
_MESSAGE_MAGICS = (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2)


class Rule(NamedTuple):
    key: str
    versions: str
    says: str
    source: str


RULES = [
    # -- load checks: what makes the broker refuse to start ------------------------------------------
    Rule("commitlog_file_size", "both", "a commit-log file whose length is not the configured file size (a "
         "stray file, a truncated one): load fails (refuses to start); every reader and rebuild refuses it too "
         "(rebuild-cq/rebuild-index --read-anyway read what every reader reads, a short file up to its last "
         "whole record, and say so; --as-broker has no result to reproduce), put and import refuse to append",
         "MappedFileQueue.load"),
    Rule("cq_file_size", "both", "a consume-queue file whose length is not the queue's file size: load fails",
         "ConsumeQueue.load -> MappedFileQueue.load"),
    Rule("config_load", "both", "config/*.json (topics, subscription groups, consumer and delay offsets): a "
         "file that is missing, empty or does not decode is replaced by its .bak (the previous content); with no "
         ".bak the table starts empty (topics and offsets lost), and a .bak that does not decode fails the load "
         "(refuses to start)", "ConfigManager.load, ConfigManager.loadBak, BrokerController.initialize"),
    Rule("config_load_rocksdb", V5, "storeType=defaultRocksDB: topics, subscription groups and consumer offsets are "
         "the RocksDB databases config/topics/, subscriptionGroups/ and consumerOffsets/ (families default: key the "
         "name or topic@group in UTF-8, value fastjson; kvDataVersion; forbidden), read in key order with deleted "
         "keys absent; a JSON file beside one with a higher dataVersion counter is merged over it; init() then puts "
         "rmq_sys_wheel_timer into the topic table but never into the database. A database that does not open (a "
         "damaged file, a column family beside those three) or holds a value that does not decode fails the load "
         "(refuses to start); a missing one is created empty", "RocksDBTopicConfigManager.load, "
         "RocksDBSubscriptionGroupManager.load, RocksDBConsumerOffsetManager.load, RocksDBConfigManager.loadData, "
         "loadDataVersion, ConfigRocksDBStorage.postLoad, TopicConfigManager.init"),
    Rule("checkpoint", "both", "the checkpoint is mapped one OS page READ_WRITE at load: a short file is extended "
         "with zeros and the fields it lacks read 0 (after a crash a zero time makes recovery start at the first "
         "file and drop every index file), the next flush writes every field; the broker starts: a warning, and "
         "repair rewrites it from the recovered store", "StoreCheckpoint.<init>, StoreCheckpoint.flush"),
    # -- recovery ------------------------------------------------------------------------------------
    Rule("recover_normal_start", V4, "normal start (no abort file): the commit log is re-checked from the "
         "third-last file only (CRC on); damage in older files is not seen at load", "CommitLog.recoverNormally"),
    Rule("recover_normal_start", V5, "normal start: re-checked from the newest file starting at or before the "
         "consume queues' highest offset (file 0 when there are none)", "CommitLog.recoverNormally"),
    Rule("recover_abnormal_start", "both", "abort file present: from the newest file whose first record is "
         "valid and not after the checkpoint; every record read is dispatched again",
         "CommitLog.recoverAbnormally, isMappedFileMatchedRecover"),
    Rule("recover_cut", "both", "the walk stops at the first record checkMessageAndReturnSize rejects (bad magic, "
         "length, body CRC); the commit log is truncated there and every later file deleted",
         "CommitLog.recoverNormally/recoverAbnormally, MappedFileQueue.truncateDirtyFiles"),
    Rule("blank_size", V4, "an end-of-file BLANK ends its file whatever its TOTALSIZE says (the magic is "
         "checked before the size); recovery goes on in the next file", "CommitLog.checkMessageAndReturnSize"),
    Rule("blank_size", V5, "a record, a BLANK included, whose TOTALSIZE exceeds the bytes left in its file is "
         "rejected before its magic is read (byteBuffer.remaining() < totalSize - 4): recovery stops at an "
         "oversized BLANK and deletes every later file (a smaller size passes and the BLANK ends the file); "
         "repair rewrites such a size to the rest of the file",
         "CommitLog.checkMessageAndReturnSize"),
    Rule("recover_cq", "both", "each consume queue is read from its third-last file to the first invalid unit; "
         "units at or after the recovered commit-log end are dropped (positions only, bytes stay)",
         "ConsumeQueue.recover, ConsumeQueue.truncateDirtyLogicFiles"),
    Rule("recover_bcq", V5, "each batch queue is read from its third-last file to the first unit failing "
         "offset >= 0, size > 0, msgBaseOffset >= 0, batchSize > 0; from the last file back, units whose record "
         "starts at or after the recovered commit-log end are dropped (a last file whose first unit does is "
         "deleted); the max offset is the last kept unit's msgBaseOffset + batchSize; after a crash the "
         "re-read batch records are appended after the last unit's physical offset",
         "BatchConsumeQueue.recover, truncateDirtyLogicFiles, reviseMaxOffsetInQueue, putBatchMessagePositionInfo"),
    Rule("bcq_min_offset", V5, "after load a batch queue's min offset is its first unit's msgBaseOffset, moved past "
         "each unit of its first file whose record lies before the commit log's first offset (to msgBaseOffset + "
         "batchSize), up to the first unit at or after it", "BatchConsumeQueue.correctMinOffset, "
         "ConsumeQueueStore.recoverOffsetTable"),
    Rule("recover_stale_tail", "both", "bytes past the recovered end (a torn record, a stale unit) stay on disk and "
         "are cut again, logically, on every start", "MappedFile.setWrotePosition"),
    # -- dispatch (reput) across a bad record --------------------------------------------------------
    Rule("reput_from", "both", "dispatch starts at the consume queues' highest offset (the commit log's minimum "
         "when there are none)", "DefaultMessageStore.start"),
    Rule("reput_bad_record", "both", "a record with a bad magic code (size -1) makes the master skip the rest of "
         "that file; a record whose length disagrees (size > 0) is skipped by its size",
         "ReputMessageService.doReput"),
    Rule("reput_no_crc", "both", "dispatch does not check body CRCs: a body-damaged record is dispatched like "
         "any other", "ReputMessageService.doReput (checkMessageAndReturnSize with checkCRC false)"),
    Rule("reput_misplaced", "both", "a unit is placed by expectLogicOffset = queueOffset x 20 (a Java long): a "
         "queue with no file gets one file, at that offset rounded down to the file size, blank units before the "
         "unit inside it (fillPreBlank); otherwise it goes into the last file (the next one when that is full): a "
         "unit beyond the queue's end is appended at the end ('[BUG]logic queue order maybe wrong'), one below it "
         "(queue offset not 0) skipped ('Build consume queue repeatedly'). So one record whose stored queue offset "
         "is wrong lands at its queue's end, and at most one file is created for it; first in an empty queue, it "
         "starts the queue at the far offset and every later unit of that queue is skipped. rebuild-cq places "
         "such a unit at its queue's order instead (--as-broker: as the broker) and names it",
         "ConsumeQueue.putMessagePositionInfo, fillPreBlank, MappedFileQueue.getLastMappedFile"),
    Rule("dledger_body", V4, "DLedger store: DLedger's recovery keeps every entry; no body CRC check",
         "DLedgerMmapFileStore.recover, DLedgerCommitLog.recover"),
    Rule("dledger_body", V5, "DLedger store: the body CRC check cuts the consume queues back to the damaged "
         "record, then dispatch adds every entry again (the damaged one included)",
         "DLedgerCommitLog.dledgerRecoverAbnormally, ReputMessageService.doReput"),
    # -- the timer store (timerWheelEnable) -----------------------------------------------------------
    Rule("timer_load", V5, "a timer-log file whose length is not the timer log's file size, or a timer wheel "
         "neither empty nor 7 x 86400 x 2 slots of 32 bytes: the broker refuses to start",
         "TimerMessageStore.load -> TimerLog.load -> MappedFileQueue.load, TimerWheel.<init>"),
    Rule("timer_recover", V5, "the timer log is re-read from the file holding the checkpoint's "
         "lastTimerLogFlushPos minus one file size, each unit setting its slot's lastPos; the first unit whose "
         "size is not 52 or whose magic has bits above 0xF ends it: the timer log is truncated there and every "
         "later file deleted", "TimerMessageStore.recover, recoverAndRevise, TimerWheel.reviseSlot, "
         "MappedFileQueue.truncateDirtyFiles"),
    Rule("timer_read_time", V5, "the dequeue reads from the checkpoint's lastReadTimeMs, moved up to the start's "
         "time (--now) less 7 days and 60 slots (formatTimeMs(now) - (slotsTotal - TIMER_BLANK_SLOTS) x precisionMs) "
         "when older: the messages of the slots before it are never delivered (an error)", "TimerMessageStore.recover"),
    # -- static topics (config/topicQueueMapping.json) -------------------------------------------------
    Rule("static_topic_mapping", V5, "the mapping is loaded as it is (nothing checked against the queues); a "
         "static topic's clients see only its logical queues, each served from the physical queues its items "
         "name on this broker: the messages of a physical queue no item names are never delivered (an error); "
         "an item naming a queue beyond the topic's queue count, or a topic missing from topics.json, makes "
         "sends and pulls of that logical queue fail, two logical queues naming one physical queue are both "
         "served from it, and an item whose logic offset is still -1 (a remap's first step) is skipped by pulls "
         "(warnings: nothing is lost)",
         "TopicQueueMappingManager.decode, buildTopicQueueMappingContext, PullMessageProcessor."
         "rewriteRequestForStaticTopic, TopicQueueMappingUtils.findLogicQueueMappingItem, "
         "AbstractSendMessageProcessor.msgCheck"),
    Rule("timer_chain", V5, "the dequeue walks a slot from lastPos along prevPos and checks nothing: a link to "
         "what is not an earlier unit of that slot loses every unit behind it", "TimerMessageStore.dequeue"),
]


# -- load checks -------------------------------------------------------------------------------------
def refused_files(queue) -> list[tuple[object, str]]:
    """Rule commitlog_file_size: (file, problem) of each file of the commit-log ``queue`` (a FileQueue) whose
    length is not the file size. MappedFileQueue.load returns false at the first such file ("length not
    matched message store config value, please check it manually"), so DefaultMessageStore.load fails and
    the broker does not start (4.9.7 and 5.x alike) until it is moved out (a stray file) or its size restored
    (a truncated last file: repair)."""
    size = queue.file_size
    return [(f, f"file is {f.length} bytes, expected {size}") for f in queue.files if size and f.length != size]


def refusal(problem: str, version: str | None = None) -> str:
    """What a broker (of ``version``) does with a store holding a file of refused_files: it refuses to load."""
    return (f"{problem}: a {version + ' ' if version else ''}broker refuses to load this store (rule "
            "commitlog_file_size, MappedFileQueue.load)")


# -- stepping over a bad record --------------------------------------------------------------------
def _starts_record(buf, at: int, end: int) -> bool:
    """Whether a record (or the zero end of data, or a file-closing BLANK) starts at ``at``."""
    if at == end:
        return True
    if end - at < 8:
        return not any(bytes(buf[at:end]))
    size, magic = struct.unpack_from(">iI", buf, at)
    if size == 0 and magic == 0:                  # the end of data: zeros to the end of the file
        import numpy as np
        return not np.frombuffer(buf, np.uint8, end - at, at).any()
    if magic == C.BLANK_MAGIC_CODE:
        return size == end - at
    if magic not in _MESSAGE_MAGICS or not 0 < size <= end - at:
        return False
    try:
        return not isinstance(decode_entry(buf, at), Blank)
    except FormatError:
        return False


def step_over(buf, pos: int, end: int | None = None) -> int:
    """Where reading goes on after the bad record at ``pos`` (salvage, beyond the broker): past it by its
    size field when that lands on a record start, else at the next position where a record decodes
    (resynchronised on a magic code), else ``end``."""
    end = len(buf) if end is None else end
    size = struct.unpack_from(">i", buf, pos)[0] if end - pos >= 4 else 0
    if 0 < size <= end - pos and _starts_record(buf, pos + size, end):
        return pos + size
    at = pos + 1
    patterns = [struct.pack(">I", m) for m in _MESSAGE_MAGICS]
    view = memoryview(buf)
    while True:
        hits = [h for h in (_find(view, p, at + 4, end) for p in patterns) if h >= 0]
        if not hits:
            return end
        cand = min(hits) - 4
        if _starts_record(buf, cand, end):
            return cand
        at = cand + 1


def _find(view, pattern: bytes, start: int, end: int) -> int:
    """Position of ``pattern`` in view[start:end], or -1 (in 1 MiB chunks: a resync reads little)."""
    chunk = 1 << 20
    while start < end:
        stop = min(end, start + chunk + len(pattern))
        hit = bytes(view[start:stop]).find(pattern)
        if hit >= 0:
            return start + hit
        start += chunk
    return -1


def recovered_tail(path, buf, pos: int, end: int | None = None) -> bool:
    """Whether the bad record at ``pos`` of commit-log file ``path`` ends the data of a store the broker
    already recovered: no abort file beside commitlog/, nothing readable after the record. The broker's
    recovery cut there and left the bytes (MappedFile.setWrotePosition); CommitLog.recoverNormally cuts
    there again on every start, so readers take it as the end of the data."""
    root = path.parent.parent
    if path.parent.name != "commitlog" or (root / "abort").exists():
        return False
    end = len(buf) if end is None else end
    nxt = step_over(buf, pos, end)
    return nxt >= end or (end - nxt >= 8 and struct.unpack_from(">ii", buf, nxt) == (0, 0))


def stale_units_only(stored: bytes, rebuilt: bytes, end: int) -> bool:
    """Whether a consume-queue file differs from its rebuild only past the queue's end as a broker's load
    finds it (rules recover_cq, recover_stale_tail): ConsumeQueue.recover stops at the first unit with
    offset < 0 or size <= 0 and truncateDirtyLogicFiles drops the units from the first whose record starts
    at or after the commit log's ``end``; the bytes stay, and the broker ignores them."""
    stop = stale_tail(stored, end) if len(stored) == len(rebuilt) else None
    return stop is not None and stored[:stop] == rebuilt[:stop] and not rebuilt[stop:].strip(b"\0")


def stale_tail(stored: bytes, end: int) -> int | None:
    """Where the units a broker's load keeps end in a consume-queue file (``stale_units_only``: the first unit
    with offset < 0, size <= 0 or a record at or after ``end``); None where the file is not whole units."""
    import numpy as np

    if len(stored) % C.CQ_STORE_UNIT_SIZE:
        return None
    units = np.frombuffer(stored, [("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
    kept = (units["phy"] >= 0) & (units["size"] > 0) & (units["phy"] < end)
    return (int(np.argmin(kept)) if not kept.all() else len(units)) * C.CQ_STORE_UNIT_SIZE


# -- recovery and dispatch, per version -------------------------------------------------------------
def normal_recovery_start(file_starts: list[int], version: str, cq_max_phy: int) -> int:
    """Index of the first commit-log file the normal-start recovery reads (CommitLog.recoverNormally)."""
    if version == V4:
        return max(0, len(file_starts) - 3)
    for i in range(len(file_starts) - 1, 0, -1):
        if file_starts[i] <= cq_max_phy:
            return i
    return 0


MIN_RECORD_SIZE = C.record_length(0, C.MESSAGE_MAGIC_CODE, 0, 1, 0)     # no body, no property, a 1-byte topic


def expect_logic_offset(queue_offset: int) -> int:
    """Rule reput_misplaced: ``cqOffset * CQ_STORE_UNIT_SIZE`` as the broker's Java long computes it (it wraps)."""
    v = (queue_offset * C.CQ_STORE_UNIT_SIZE) & 0xFFFF_FFFF_FFFF_FFFF
    return v - (1 << 64) if v >> 63 else v


def first_file_start(expect: int, file_size: int) -> int:
    """MappedFileQueue.getLastMappedFile of an empty queue: ``startOffset - startOffset % mappedFileSize``
    (Java's remainder keeps the dividend's sign)."""
    return expect - (abs(expect) % file_size) * (1 if expect >= 0 else -1)


def possible_queue_offset(phy: int, queue_offset: int) -> bool:
    """Whether a record at commit-log offset ``phy`` can hold ``queue_offset``: every earlier message of its
    queue is a record of at least MIN_RECORD_SIZE bytes before it. A stored queue offset beyond that is
    damage (rule reput_misplaced); it bounds what a rebuild writes for one unit."""
    return 0 <= queue_offset <= phy // MIN_RECORD_SIZE + 1


def reput_reads_size(kind: str) -> bool:
    """Whether checkMessageAndReturnSize returns the record's own size for this damage (length mismatch:
    'read total count not equals msg total size'), so the dispatch steps over just that record."""
    return kind == "length_mismatch"


@dataclass
class FileSummary:
    """One commit-log file as the model needs it: its data and its first damaged record."""

    start: int
    records: int                      # valid records before the damage (all when there is none)
    damage: int | None = None         # offset of the first record the broker's check rejects
    kind: str = ""
    records_after: int = 0            # valid records after the damage (salvage walk)
    crc_only: bool = False            # the damage is a body CRC mismatch only
    oversized_blank: int | None = None    # offset of an end-of-file BLANK whose TOTALSIZE exceeds the rest of the file


def recovery_stop(version: str, damage: int | None, oversized_blank: int | None) -> int | None:
    """Where the recovery walk of a ``version`` broker stops in a file (None: it goes on in the next file): at
    the first damaged record, or (rule blank_size) on 5.3.3 at a BLANK whose TOTALSIZE exceeds the rest of the
    file. CommitLog.checkMessageAndReturnSize: 5.3.3 fails ``byteBuffer.remaining() < totalSize - 4`` before it
    reads the magic, so a BLANK of any smaller size still ends the file; 4.9.7 reads the magic first and ends
    the file at a BLANK whatever its size."""
    if damage is not None:
        return damage
    return oversized_blank if version == V5 else None


@dataclass
class Outcome:
    """What starting a broker of ``version`` on the store does to the commit log and its dispatch."""

    version: str
    start_file: int
    cut: int | None = None            # where recovery truncates the commit log (None: at its end)
    deleted_files: int = 0
    lost: int = 0                     # valid messages at or after the cut
    skips: list[tuple[int, str, int]] = field(default_factory=list)     # dispatch skips: (offset, kind, records)
    unnoticed: list[int] = field(default_factory=list)                  # body damage dispatched as is
    already_cut: bool = False         # the queues end before the cut: an earlier start cut here already

    def sentences(self) -> list[tuple[int, str]]:
        """(offset, sentence) for each thing the broker does that loses or misplaces messages."""
        b = f"a {self.version} broker"
        out = []
        if self.cut is not None and self.already_cut and not self.deleted_files:
            if self.lost:
                out.append((self.cut, f"{b}'s recovery stops at {self.cut} as before (the consume queues end "
                                      f"before it): {self.lost} message(s) after it stay unreachable"))
        elif self.cut is not None and (self.lost or self.deleted_files):
            out.append((self.cut, f"{b} will truncate the commit log at {self.cut} and delete {self.deleted_files} "
                                  "file(s)"))
        for at, kind, n in self.skips:
            out.append((at, f"{b}'s dispatch meets the {kind.replace('_', ' ')} at {at} and skips "
                        + ("that record" if reput_reads_size(kind) else f"the rest of its file ({n} message(s) "
                           "get no consume-queue unit or index entry), then appends later units at each queue's "
                           "current position instead of their queue offsets")))
        for at in self.unnoticed:
            out.append((at, f"{b} does not check the body CRC of the record at {at} (outside the files its "
                            "recovery reads): it dispatches it as is"))
        return out


def start_outcome(version: str, files: list[FileSummary], *, abnormal_start: int | None, cq_max_phy: int,
                  min_offset: int) -> Outcome:
    """The commit log after load() and the dispatch after start(), for a broker of ``version``.
    ``abnormal_start``: the file crash recovery starts from (None: a normal start)."""
    starts = [f.start for f in files]
    first = abnormal_start if abnormal_start is not None else normal_recovery_start(starts, version, cq_max_phy)
    out = Outcome(version, first)
    for i in range(first, len(files)):
        f = files[i]
        stop = recovery_stop(version, f.damage, f.oversized_blank)
        if stop is not None:
            out.cut = stop
            out.lost = f.records_after + sum(g.records + g.records_after for g in files[i + 1:])
            out.deleted_files = sum(1 for g in files[i + 1:] if g.start > stop)
            out.already_cut = 0 <= cq_max_phy < stop
            break
    reput_from = max(cq_max_phy, min_offset)
    for f in files[:first]:
        if f.damage is None or f.damage < reput_from:
            continue
        if f.crc_only:
            out.unnoticed.append(f.damage)
        else:
            out.skips.append((f.damage, f.kind, 1 if reput_reads_size(f.kind) else f.records_after))
    return out


def abnormal_recovery_start(store) -> int:
    """Index (among the non-empty commit-log files) of the file crash recovery starts from: the newest
    whose first record is a valid message (CRC checked) stored not after the checkpoint's min timestamp
    (CommitLog.recoverAbnormally, isMappedFileMatchedRecover; file mode), else 0."""
    cp = store.checkpoint()
    files = [f for f in store.commitlog.queue if f.length > 0]
    for i in range(len(files) - 1, -1, -1):
        try:
            entry = decode_entry(files[i].read(), 0, check_crc=True)
        except FormatError:
            continue
        if matched_recover(entry, cp):
            return i
    return 0


def matched_recover(entry, cp) -> bool:
    """Whether crash recovery may start at a file whose first record is ``entry`` (CommitLog and
    DLedgerCommitLog isMappedFileMatchedRecover, file mode): a message stored, not after the checkpoint
    ``cp``'s minTimestamp."""
    return cp is not None and not isinstance(entry, Blank) and 0 != entry.store_timestamp <= cp.min_timestamp


# -- the timer store's recovery (5.x) ----------------------------------------------------------------
TIMER_BLANK_SLOTS = 60          # TimerMessageStore.TIMER_BLANK_SLOTS (TimerState in later 5.x)


def timer_read_start(last_read_ms: int, precision_ms: int, now_ms: int) -> int:
    """Where the dequeue of a broker started at ``now_ms`` begins (rule timer_read_time, TimerMessageStore.recover):
    lastReadTimeMs, or formatTimeMs(now) - slotsTotal x precisionMs + TIMER_BLANK_SLOTS x precisionMs when that is
    later (slotsTotal = TIMER_WHEEL_TTL_DAY x 86400)."""
    from rmqtool.format.timer import TIMER_WHEEL_TTL_DAY

    floor = now_ms // precision_ms * precision_ms - (TIMER_WHEEL_TTL_DAY * 86400 - TIMER_BLANK_SLOTS) * precision_ms
    return max(last_read_ms, floor)


class TimerRecovery(NamedTuple):
    cut: int                  # timer-log offset where the recovery walk stops (the end of the units, or damage)
    damaged: bool             # the walk stops at bytes that are not the zero end of the units
    lost_units: int           # units after the cut (gone with the truncation)
    lost_files: int           # timer-log files after the cut's file (deleted)
    revised: dict[int, int]   # slot time / precisionMs -> its lastPos after the walk


def timer_recovery(files, last_flush_pos: int, precision_ms: int) -> TimerRecovery:
    """What TimerMessageStore.recover does to the timer log (``files``: its QueueFiles in order): the walk of
    recoverAndRevise(lastTimerLogFlushPos - last file's size, checkTimerLog=true) from the newest file
    starting at or before that offset (file 0 when none), a BLANK ending a file, a unit re-linking its slot
    (TimerWheel.reviseSlot with lastPos = the unit), the first bad unit (or fewer bytes than a unit header
    left) ending the walk, where truncateDirtyFiles cuts."""
    from rmqtool.format.timer import BLANK_MAGIC_CODE, UNIT_SIZE, is_unit_ok

    if not files:
        return TimerRecovery(0, False, 0, 0, {})
    begin = max(0, last_flush_pos - files[-1].length)
    first = next((i for i in range(len(files) - 1, -1, -1) if begin >= files[i].start), 0)
    revised: dict[int, int] = {}
    cut, stop_file = files[-1].start + files[-1].length, None
    for i in range(first, len(files)):
        buf, pos = files[i].read(), 0
        while pos < len(buf):
            if len(buf) - pos < 28:                  # the unit's fields read past the buffer: an exception
                break
            size, _, magic, write_ms, delay = struct.unpack_from(">iqiqi", buf, pos)
            if magic == BLANK_MAGIC_CODE:
                pos = len(buf)
                break
            if not is_unit_ok(size, magic):
                break
            revised[(write_ms + delay) // precision_ms] = files[i].start + pos
            pos += UNIT_SIZE
        if pos < len(buf):
            cut, stop_file = files[i].start + pos, i
            break
    if stop_file is None:
        return TimerRecovery(cut, False, 0, 0, revised)
    import numpy as np

    lost, damaged = 0, False
    for j in range(stop_file, len(files)):
        buf = files[j].read()
        start = cut - files[j].start if j == stop_file else 0
        rest = np.frombuffer(buf, np.uint8, len(buf) - start, start)
        damaged = damaged or bool(rest.any())
        units = np.frombuffer(buf, ">i4", (len(rest) // UNIT_SIZE) * UNIT_SIZE // 4, start).reshape(-1, UNIT_SIZE // 4)
        ok = (units[:, 0] == UNIT_SIZE) & ((units[:, 3] | 0xF) == 0xF)
        lost += int(ok[1 if j == stop_file else 0:].sum())
    return TimerRecovery(cut, damaged, lost, len(files) - 1 - stop_file, revised)


# -- verdict levels of verify's findings -----------------------------------------------------------
ERROR, WARNING = "error", "warning"
DAMAGE_KINDS = ("bad_magic", "crc_mismatch", "length_mismatch", "bad_record", "record_crosses_file_end",
                  "bad_delay", "torn_tail", "data_after_end")
LEVELS: dict[str, tuple[str, str]] = {
    # the broker starts; broker_start says what it does, and verify makes it an error when that loses the record
    **{k: (WARNING, "") for k in DAMAGE_KINDS},
    "blank_size_mismatch": (WARNING, "4.9.7 ends the file at a BLANK whatever its size, 5.3.3 unless the size "
                                     "exceeds the rest of the file, where its recovery stops (broker_start says "
                                     "what that costs); repair rewrites the size"),
    "wrong_file_size": (ERROR, "the broker refuses to load the store: MappedFileQueue.load"),
    "empty_last_file": (ERROR, "the broker refuses to load the store: MappedFileQueue.load"),
    "config_fallback": (WARNING, "the broker loads the .bak, the previous content (ConfigManager.loadBak); its "
                                 "next persist writes the file again"),
    "config_empty_table": (ERROR, "the broker starts with an empty table (ConfigManager.loadBak finds no .bak): "
                                  "its topics or offsets are lost; restore the file from a backup"),
    "config_refused": (ERROR, "the broker refuses to start: ConfigManager.loadBak fails, "
                              "BrokerController.initialize returns false"),
    "config_kv_refused": (ERROR, "the broker refuses to start: its RocksDB config manager's load fails (rule "
                                 "config_load_rocksdb)"),
    "config_not_read": (WARNING, "rmqtool does not read this config database: its tables are not checked"),
    "compaction_checkpoint_unread": (WARNING, "CompactionPositionMgr's constructor ignores a failed "
                                              "ConfigManager.load"),
    "abort_file": (WARNING, "crash recovery on start: CommitLog.recoverAbnormally re-dispatches from the "
                            "newest file the checkpoint vouches for"),
    "cq_unit_past_end": (WARNING, "the broker drops it on every load: ConsumeQueue/BatchConsumeQueue."
                                  "truncateDirtyLogicFiles"),
    "cq_stale_unit": (WARNING, "the broker ignores it: ConsumeQueue.recover stops at the first invalid unit"),
    "cq_filler_unit": (WARNING, "consumers step over blank units"),
    "checkpoint_short": (WARNING, "the broker reads zeros past its end and writes every field at its next "
                                  "flush: StoreCheckpoint.<init>; repair rewrites it"),
    "checkpoint_ahead": (WARNING, "the broker uses it only to pick the crash-recovery start file"),
    "dledger_crc_mismatch": (ERROR, "DLedger keeps the entry and the broker serves its damaged body: 4.9.7 checks "
                                    "no body CRC, 5.3.3 cuts the queues back to it on recovery and dispatches it "
                                    "again; that message is lost"),
    "index_past_end_after_crash": (WARNING, "after a crash the broker deletes index files newer than the "
                                            "checkpoint and indexes the recovered records again: IndexService.load"),
    "index_missing_entry": (WARNING, ""),
    "index_bad_slot": (ERROR, "IndexFile.selectPhyOffset takes the slot for empty: query-key misses its keys "
                              "(rebuild-index rebuilds them)"),
    "index_entry_time": (ERROR, "IndexFile.selectPhyOffset matches it against a query's time range: a query-key "
                                "over the record's store time misses it (rebuild-index rebuilds it)"),
    "points_at_damage": (WARNING, "it points at a damaged record: see that record's finding and broker_start"),
    "broker_running": (WARNING, ""),
    "salvaged_record": (WARNING, ""),
    "physical_offset_mismatch": (WARNING, ""),
    "dledger_checkpoint_missing": (WARNING, ""),
    "skipped_file": (WARNING, ""),
    "prop_crc_mismatch": (WARNING, ""),
    "timer_bad_unit": (WARNING, ""),         # the finding says what the timer recovery cuts
    "timer_read_moved": (ERROR, ""),          # the start skips slots: their messages are never delivered
    "timer_slot_revised": (WARNING, "the broker's timer recovery re-links it: TimerWheel.reviseSlot"),
    "static_queue_unmapped": (ERROR, ""),        # rule static_topic_mapping: its messages are never delivered
    "static_mapping_mismatch": (WARNING, ""),    # rule static_topic_mapping: requests fail, nothing is lost
}
_DISPATCHED = "the broker's dispatch adds it on start (DefaultMessageStore.start: reput from the queues' end)"


def level_of(kind: str, missing_from: int | None = None, reput_from: int = 0) -> tuple[str, str]:
    """(level, what the broker does) of a verify finding kind. Records without a unit are a warning when
    the broker's dispatch reaches them (at or after ``reput_from``), else an error."""
    if missing_from is not None:
        return (WARNING, _DISPATCHED) if missing_from >= reput_from else (ERROR, "")
    return LEVELS.get(kind, (ERROR, ""))
