"""Timer messages as rows: the pending ones as the broker's dequeue will see them, and raw units and slots.

``pending_rows`` visits every slot at or after the checkpoint's lastReadTimeMs in time order and walks
it from lastPos along prevPos, as ``TimerMessageStore.dequeue`` does; each unit is resolved to its
commit-log record. States: ``delete-marker`` (DELETE: a recall; with ROLL too, magic 7, a recall on its way
to its slot, which the dequeue re-puts as a delete again), ``cancelled-by-delete`` (its REAL_TOPIC+UNIQ_KEY is
recalled in the same slot), ``pending(roll: re-enqueued at slot time)`` (ROLL: the slot is an intermediate
stop), ``pending``; ``message-missing`` when the record cannot be read.

5.x TimerMessageStore.dequeue puts a unit with DELETE and not ROLL on the delete stack (its TIMER_DEL_UNIQKEY
joins the slot's delete list); every other unit, magic 7 included, goes to the normal stack, where
TimerDequeueGetMessageService drops it if its own key is on the delete list and otherwise hands it to
TimerDequeuePutMessageService, which re-puts a ROLL unit with its properties (TIMER_DEL_UNIQKEY kept), so
the enqueue writes it again with DELETE: a rolled recall stays a delete marker, never a pending message.
"""

from __future__ import annotations

from typing import Iterator

from rmqtool import clock
from rmqtool import constants as C
from rmqtool.errors import FormatError, StoreError
from rmqtool.format.commitlog import Message
from rmqtool.format.timer import (SLOT_SIZE, TIMER_WHEEL_TTL_DAY, UNIT_SIZE, TimerBlank, TimerSlot, TimerUnit,
                                  decode_timerlog_entry, magic_flags)
from rmqtool.format.rows import real_queue_id
from rmqtool.ops.findings import ERROR, WARNING, Finding
from rmqtool.store.store import Store
from rmqtool.store.timer import TimerStore

PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
STATE_ROLL = "pending(roll: re-enqueued at slot time)"

PENDING_FIELDS = ["slot_timestamp", "real_topic", "real_queue_id", "uniq_key", "deliver_timestamp",
                  "roll_times", "state", "timerlog_offset", "magic", "physical_offset", "size"]
UNIT_FIELDS = ["timerlog_offset", "type", "size", "prev_pos", "magic", "magic_flags", "curr_write_timestamp",
               "delayed_time", "delayed_timestamp", "offset_py", "size_py", "real_topic_hash", "reserved"]
SLOT_FIELDS = ["slot", "byte_offset", "slot_timestamp", "first_pos", "last_pos", "num", "magic", "in_place"]


def open_timer_store(store: Store, precision_ms: int | None = None) -> TimerStore:
    ts = TimerStore.open(store.root, precision_ms) if store.is_store_root else None
    if ts is None:
        raise StoreError("no timer store (timerlog/ or timerwheel): the broker ran without timerWheelEnable",
                         path=str(store.root))
    return ts


def unit_row(offset: int, entry: TimerUnit | TimerBlank) -> dict:
    if isinstance(entry, TimerBlank):
        return {**dict.fromkeys(UNIT_FIELDS), "timerlog_offset": offset, "type": "blank", "size": entry.size}
    return {"timerlog_offset": offset, "type": "unit", "size": entry.size, "prev_pos": entry.prev_pos,
            "magic": entry.magic, "magic_flags": magic_flags(entry.magic),
            "curr_write_timestamp": entry.curr_write_time_ms, "delayed_time": entry.delayed_time,
            "delayed_timestamp": entry.delayed_time_ms, "offset_py": entry.offset_py, "size_py": entry.size_py,
            "real_topic_hash": entry.real_topic_hash, "reserved": entry.reserved}


def slot_rows(ts: TimerStore) -> Iterator[dict]:
    """Every non-empty slot; ``in_place`` is TimerWheel.getSlot's test (the stored time maps here)."""
    for index, slot in ts.iter_slots():
        yield {"slot": index, "byte_offset": index * SLOT_SIZE, "slot_timestamp": slot.time_ms(ts.precision_ms),
               "first_pos": slot.first_pos, "last_pos": slot.last_pos, "num": slot.num, "magic": slot.magic,
               "in_place": slot.ticks % ts.slot_count == index}


def pending_slots(ts: TimerStore, from_ms: int) -> list[TimerSlot]:
    """Slots holding a time at or after ``from_ms`` (in their own place), in time order."""
    slots = [slot for index, slot in ts.iter_slots()
             if slot.ticks % ts.slot_count == index and slot.time_ms(ts.precision_ms) >= from_ms]
    return sorted(slots, key=lambda s: s.ticks)


def walk_slot(ts: TimerStore, slot: TimerSlot, problems: list[str]) -> Iterator[tuple[int, TimerUnit]]:
    """The slot's units from lastPos along prevPos (each link must point back: units are appended)."""
    pos = slot.last_pos
    while pos != -1:
        try:
            unit = ts.read_unit(pos)
        except FormatError as exc:
            problems.append(f"slot {slot.time_ms(ts.precision_ms)}: {exc}")
            return
        yield pos, unit
        if unit.prev_pos >= pos:
            problems.append(f"slot {slot.time_ms(ts.precision_ms)}: timer-log unit at {pos} links forward "
                            f"to {unit.prev_pos}")
            return
        pos = unit.prev_pos


def pending_rows(store: Store, ts: TimerStore, problems: list[str], from_ms: int | None = None) -> Iterator[dict]:
    """Rows of the timer messages still to be dequeued (from ``from_ms``, default lastReadTimeMs)."""
    if from_ms is None:
        cp = ts.checkpoint()
        from_ms = cp.last_read_time_ms if cp is not None else 0
    for slot in pending_slots(ts, from_ms):
        resolved = [(pos, unit, _message(store, unit)) for pos, unit in walk_slot(ts, slot, problems)]
        deletes = {m.properties.get(PROPERTY_TIMER_DEL_UNIQKEY) for _, u, m in resolved
                   if m is not None and u.is_delete and not u.is_roll}
        for pos, unit, msg in resolved:
            yield _pending_row(slot.time_ms(ts.precision_ms), pos, unit, msg, deletes)


def _message(store: Store, unit: TimerUnit) -> Message | None:
    """TimerMessageStore.getMessageByCommitOffset: the record at offsetPy, None when it is not there."""
    try:
        msg = store.commitlog.read_at(unit.offset_py)
    except (FormatError, StoreError):
        return None
    return msg if isinstance(msg, Message) and msg.total_size == unit.size_py else None


def _pending_row(slot_ms: int, pos: int, unit: TimerUnit, msg: Message | None, deletes: set) -> dict:
    row = {"slot_timestamp": slot_ms, "real_topic": None, "real_queue_id": None, "uniq_key": None,
           "deliver_timestamp": None, "roll_times": None, "state": "message-missing", "timerlog_offset": pos,
           "magic": unit.magic, "physical_offset": unit.offset_py, "size": unit.size_py}
    if msg is None:
        return row
    props = msg.properties
    real_topic = props.get(C.PROPERTY_REAL_TOPIC)
    uniq_key = props.get(C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    cancelled = uniq_key is not None and f"{real_topic}+{uniq_key}" in deletes
    if unit.is_delete and not (unit.is_roll and cancelled):
        state = "delete-marker"
    elif cancelled:
        state = "cancelled-by-delete"
    else:
        state = STATE_ROLL if unit.is_roll else "pending"
    row.update(real_topic=real_topic, real_queue_id=real_queue_id(props.get(C.PROPERTY_REAL_QUEUE_ID)),
               uniq_key=uniq_key, deliver_timestamp=_int(props.get(PROPERTY_TIMER_OUT_MS)),
               roll_times=_int(props.get(PROPERTY_TIMER_ROLL_TIMES)) or 0, state=state)
    return row


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# -- verify: the timer store as a 5.x broker's load, recovery and dequeue see it ----------------------
WHEEL_LENGTH = TIMER_WHEEL_TTL_DAY * 86400 * 2 * SLOT_SIZE      # TimerWheel: slotsTotal * 2 slots


def read_start(ts: TimerStore, now_ms: int) -> tuple[int, int]:
    """(lastReadTimeMs, where the dequeue of a 5.3.3 broker started at ``now_ms`` begins): broker_model
    timer_read_start."""
    from rmqtool.store.broker_model import timer_read_start

    cp = ts.checkpoint()
    last_read = cp.last_read_time_ms if cp else 0
    return last_read, timer_read_start(last_read, ts.precision_ms, now_ms)


def timer_findings(store: Store) -> Iterator[Finding]:
    """The broker model's timer rules (rmqtool.store.broker_model: timer_load, timer_recover, timer_read_time,
    timer_chain): files the load refuses, the unit where the recovery truncates the timer log, slots it re-links,
    the slots a broker started now (rmqtool.clock) skips, and chains of the slots it dequeues that it cannot
    follow. Findings whose verdict the start time decided name it."""
    from rmqtool.store.broker_model import timer_recovery

    ts = TimerStore.open(store.root) if store.is_store_root else None
    if ts is None:
        return
    refused = False
    for f, problem in ts.timerlog.problems():
        refused = True
        yield Finding(ERROR, "timer_file_size", str(f.path), None, f"{problem}: TimerLog.load refuses the timer "
                      "log (MappedFileQueue.load)", ts.timerlog.file_size, f.length)
    size = ts.wheel_path.stat().st_size if ts.wheel_path.is_file() else 0
    if size not in (0, WHEEL_LENGTH):
        refused = True
        yield Finding(ERROR, "timer_wheel_size", str(ts.wheel_path), None, "timer wheel length is not 7 x 86400 x 2 "
                      "slots of 32 bytes: TimerWheel's constructor throws, the broker does not start", WHEEL_LENGTH, size)
    if refused:
        return
    cp = ts.checkpoint()
    rec = timer_recovery(list(ts.timerlog), cp.last_timer_log_flush_pos if cp else 0, ts.precision_ms)
    if rec.damaged:
        f, _ = ts.timerlog.locate(rec.cut)
        yield Finding(WARNING, "timer_bad_unit", str(f.path), rec.cut,
                      f"not a timer-log unit: a 5.3.3 broker's timer recovery truncates the timer log here and deletes "
                      f"{rec.lost_files} later file(s): {rec.lost_units} unit(s) after it are lost "
                      "(TimerMessageStore.recoverAndRevise)")
    now_ms = clock.now_ms()
    last_read, from_ms = read_start(ts, now_ms)
    at = f" (a start at {clock.said(now_ms)} reads from {from_ms} on)" if from_ms > last_read else ""
    skipped = [slot for index, slot in ts.iter_slots() if slot.ticks % ts.slot_count == index
               and last_read <= slot.time_ms(ts.precision_ms) < from_ms]
    if skipped:
        yield Finding(ERROR, "timer_read_moved", str(ts.wheel_path), None,
                      f"lastReadTimeMs {last_read} is more than 7 days before the start: a 5.3.3 broker started at "
                      f"{clock.said(now_ms)} reads from {from_ms} on (TimerMessageStore.recover), so the "
                      f"{sum(s.num for s in skipped)} message(s) of the {len(skipped)} slot(s) before it are never "
                      "delivered", from_ms, last_read)
    for index, slot in ts.iter_slots():
        if slot.ticks % ts.slot_count != index or slot.time_ms(ts.precision_ms) < from_ms:
            continue                     # not this slot's time, or dequeued already (or skipped)
        last = rec.revised.get(slot.ticks, slot.last_pos)
        if last != slot.last_pos and not (rec.damaged and slot.last_pos >= rec.cut):    # (else part of the cut)
            yield Finding(WARNING, "timer_slot_revised", str(ts.wheel_path), index * SLOT_SIZE,
                          f"slot {slot.time_ms(ts.precision_ms)}: lastPos {slot.last_pos} is not its last unit "
                          f"{last}{at}", last, slot.last_pos)
        yield from _chain_findings(ts, slot, index, last, rec, at)


def _chain_findings(ts: TimerStore, slot: TimerSlot, index: int, pos: int, rec, at: str) -> Iterator[Finding]:
    """The slot's chain from ``pos`` along prevPos, as TimerMessageStore.dequeue follows it: every link must
    reach an earlier unit of this slot's time; the first that does not is the finding (``at``: the start time
    that chose the slot, when it did)."""
    where, what = (str(ts.wheel_path), index * SLOT_SIZE), "lastPos"
    when = slot.time_ms(ts.precision_ms)
    later = None
    while pos != -1:
        if rec.damaged and pos >= rec.cut:
            return                       # gone with the recovery's cut (timer_bad_unit counts it)
        why = ""
        if later is not None and pos >= later:
            why = "not an earlier unit"
        else:
            try:
                f, at = ts.timerlog.locate(pos)
                unit = decode_timerlog_entry(f.read(), at) if at % UNIT_SIZE == 0 and pos < rec.cut else None
            except (StoreError, FormatError):
                unit = None
            if not isinstance(unit, TimerUnit):
                why = "where no timer-log unit starts"
            elif unit.delayed_time_ms // ts.precision_ms != slot.ticks:
                why = f"a unit of slot {unit.delayed_time_ms // ts.precision_ms * ts.precision_ms}"
        if why:
            yield Finding(ERROR, "timer_bad_chain", where[0], where[1],
                          f"slot {when}: {what} links to {pos}, {why}: the dequeue (TimerMessageStore.dequeue) "
                          f"follows it unchecked, the slot's units behind it are never delivered{at}", actual=pos)
            return
        where, what, later = (str(f.path), pos), f"the prevPos of the unit at {pos}", pos
        pos = unit.prev_pos
