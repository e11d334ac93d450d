"""An independent model of queue placement for tests: the units dispatch() gives, placed record after
record as the broker's queues place them, and the files they make. The library's writers
(rmqtool.ops.rebuild) are checked against the broker's files directly; this model checks dispatch()."""

from __future__ import annotations

from typing import Iterable, Union

from rmqtool import constants as C
from rmqtool.errors import FormatError
from rmqtool.format.batchcq import BatchCqUnit
from rmqtool.format.batchcq import encode_unit as encode_batch_unit
from rmqtool.format.commitlog import Message
from rmqtool.format.consumequeue import FILLER_UNIT, CqUnit, encode_unit
from rmqtool.format.dispatch import Dispatch, dispatch
from rmqtool.store.metadata import batch_cq_topics
from rmqtool.store.store import Store

Unit = Union[CqUnit, BatchCqUnit]


class PlacedQueue:
    """The units of one queue as dispatch leaves them: ``first`` is the queue offset of ``units[0]``."""

    def __init__(self, first: int, batch: bool):
        self.first = first
        self.batch = batch
        self.units: list[Unit] = []

    @property
    def end(self) -> int:
        return self.first + len(self.units)


class QueueLayout:
    """Consume queues built by dispatching records in commit-log order, as the broker builds them."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, int], PlacedQueue] = {}

    def add(self, d: Dispatch) -> int | None:
        """Place one unit; returns its position (queue offset; for a batch queue the unit's index), or
        None when the queue drops it as a repeat: a consume queue when the unit ends at or before the
        queue's max physical offset or asks for an offset below its end, a batch queue when the unit
        starts at or before its last unit."""
        q = self.queues.get((d.topic, d.queue_id))
        if q is None:
            # A consume queue's first file starts where its first unit asks (fillPreBlank fills before it).
            q = self.queues[(d.topic, d.queue_id)] = PlacedQueue(0 if d.is_batch else d.queue_offset, d.is_batch)
        last = q.units[-1] if q.units else None
        if last is not None:
            if d.is_batch:
                repeat = d.unit.physical_offset <= last.physical_offset
            else:
                repeat = (d.unit.physical_offset + d.unit.size <= last.physical_offset + last.size
                          or 0 < d.queue_offset < q.end)
            if repeat:
                return None
        q.units.append(d.unit)
        return q.end - 1

    def add_record(self, msg: Message, physical_offset: int | None = None, *,
                   batch_cq: bool = False) -> list[int | None]:
        return [self.add(d) for d in dispatch(msg, physical_offset, batch_cq=batch_cq)]


def layout_store(store: Store, *, batch_topics: Iterable[str] | None = None) -> QueueLayout:
    """Every record of the commit log dispatched in order (a damaged record raises its FormatError)."""
    batch = batch_cq_topics(store) if batch_topics is None else set(batch_topics)
    layout = QueueLayout()
    for loc in store.commitlog.iter_entries(include_blank=False):
        layout.add_record(loc.entry, loc.offset, batch_cq=loc.entry.topic in batch)
    return layout


def queue_file_bytes(placed: PlacedQueue, file_size: int) -> dict[int, bytes]:
    """The files of one placed queue, full size, by start offset. A consume queue whose first unit asks
    for offset N > 0 starts with the file holding N, filled before it with filler units (fillPreBlank)."""
    unit_size = C.BCQ_STORE_UNIT_SIZE if placed.batch else C.CQ_STORE_UNIT_SIZE
    if file_size <= 0 or file_size % unit_size:
        raise FormatError(f"queue file size {file_size} is not a positive multiple of {unit_size}")
    encode = encode_batch_unit if placed.batch else encode_unit
    per_file = file_size // unit_size
    first_file = placed.first // per_file * per_file
    slots = [FILLER_UNIT] * (placed.first - first_file) + placed.units
    out = {}
    for i in range(0, len(slots), per_file):
        data = b"".join(encode(u) for u in slots[i:i + per_file])
        out[(first_file + i) * unit_size] = data + bytes(file_size - len(data))
    return out
