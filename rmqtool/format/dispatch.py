"""What the broker's dispatch writes for one commit-log record: its consume-queue unit, or its batch
consume-queue unit on a BatchCQ topic, plus one unit per LMQ queue it names (multi-dispatch).

``dispatch(msg, batch_cq=...)`` is pure: the units with the queue offsets the record asks for. The
queues place them as ``rmqtool.ops.rebuild``'s writers do: a consume queue appends at its end
(ConsumeQueue.putMessagePositionInfo), so a unit that asks for a later offset still lands at the end,
and one that asks for an offset below it is dropped as a repeat.
"""

from __future__ import annotations

from typing import NamedTuple, Union

from rmqtool import constants as C
from rmqtool.errors import FormatError
from rmqtool.format.batchcq import BatchCqUnit
from rmqtool.format.commitlog import Message
from rmqtool.format.consumequeue import CqUnit

Unit = Union[CqUnit, BatchCqUnit]


class Dispatch(NamedTuple):
    topic: str
    queue_id: int
    queue_offset: int          # the offset asked for (for a batch unit: its msgBaseOffset)
    unit: Unit

    @property
    def is_batch(self) -> bool:
        return isinstance(self.unit, BatchCqUnit)


def java_split(text: str, sep: str) -> list[str]:
    """String.split(sep) for a one-character separator: trailing empty strings are dropped."""
    parts = text.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def is_lmq(name: str) -> bool:
    return name.startswith(C.LMQ_PREFIX)


def multi_dispatch_targets(topic: str, props: dict[str, str]) -> list[tuple[str, str]]:
    """(queue name, queue offset text) pairs of INNER_MULTI_DISPATCH / INNER_MULTI_QUEUE_OFFSET as the
    broker pairs them. Empty when the record is not multi-dispatched, and when the two lists differ in
    length after Java's split, which drops trailing empty fields: a non-LMQ name last in the list gets
    an empty offset, so such a record is dispatched to none of its LMQ queues (as the 5.3.3 broker does).
    """
    names = props.get(C.PROPERTY_INNER_MULTI_DISPATCH, "")
    offsets = props.get(C.PROPERTY_INNER_MULTI_QUEUE_OFFSET, "")
    if (not names.strip() or not offsets.strip() or topic.startswith(C.RETRY_GROUP_TOPIC_PREFIX)
            or topic.startswith("rmq_sys_") or topic == C.RMQ_SYS_SCHEDULE_TOPIC):
        return []
    names_list = java_split(names, C.MULTI_DISPATCH_QUEUE_SPLITTER)
    offsets_list = java_split(offsets, C.MULTI_DISPATCH_QUEUE_SPLITTER)
    return list(zip(names_list, offsets_list)) if len(names_list) == len(offsets_list) else []


def batch_fields(msg: Message, props: dict[str, str] | None = None) -> tuple[int, int]:
    """(msgBaseOffset, batchSize) of the dispatch: INNER_BASE / INNER_NUM when both are set
    (CommitLog.setBatchSizeIfNeeded), else the record's queue offset and 1."""
    props = msg.properties if props is None else props
    if C.PROPERTY_INNER_NUM in props and C.PROPERTY_INNER_BASE in props:
        try:
            return int(props[C.PROPERTY_INNER_BASE]), int(props[C.PROPERTY_INNER_NUM])
        except ValueError:
            raise FormatError(f"bad INNER_BASE/INNER_NUM {props[C.PROPERTY_INNER_BASE]!r}/"
                              f"{props[C.PROPERTY_INNER_NUM]!r}", offset=msg.physical_offset) from None
    return msg.queue_offset, 1


def dispatch(msg: Message, physical_offset: int | None = None, *, batch_cq: bool = False,
             enable_lmq: bool = True) -> list[Dispatch]:
    """The units the broker writes for ``msg`` (at ``physical_offset``, default: its PHYSICALOFFSET field).

    Prepared and rolled-back transaction records get none. On a BatchCQ topic (``batch_cq``) the record
    gets one batch unit covering its INNER_NUM messages; otherwise one unit in its queue and one per
    multi-dispatch target (an LMQ name goes to queue 0 with ``enable_lmq``, other names to the record's
    queue id; names with '/' are skipped; an offset that is not a number ends the list, as the broker's
    Long.parseLong does).
    """
    if msg.transaction_type not in (C.TransactionType.NOT_TYPE, C.TransactionType.COMMIT):
        return []
    phys = msg.physical_offset if physical_offset is None else physical_offset
    props = msg.properties
    try:
        tags_code = msg.tags_code()
    except ValueError:
        raise FormatError(f"malformed DELAY property {props.get(C.PROPERTY_DELAY_TIME_LEVEL)!r}",
                          offset=phys) from None
    if batch_cq:
        base, size = batch_fields(msg, props)
        unit = BatchCqUnit(phys, msg.total_size, tags_code, msg.store_timestamp, base, size)
        return [Dispatch(msg.topic, msg.queue_id, base, unit)]
    unit = CqUnit(phys, msg.total_size, tags_code)
    out = [Dispatch(msg.topic, msg.queue_id, msg.queue_offset, unit)]
    for name, offset in multi_dispatch_targets(msg.topic, props):
        if "/" in name:
            continue
        try:
            queue_offset = int(offset)
        except ValueError:
            break
        out.append(Dispatch(name, 0 if enable_lmq and is_lmq(name) else msg.queue_id, queue_offset, unit))
    return out
