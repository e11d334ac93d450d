"""The consume queues a store's commit log implies: every record dispatched in commit-log order (classic,
batch and LMQ units, ``rmqtool.format.dispatch``) and the queue files the broker would hold for them.

``layout_store(store)`` is what a rebuild writes and what verify can compare the queues on disk with.
"""

from __future__ import annotations

from typing import Iterable

from rmqtool import constants as C
from rmqtool.errors import FormatError
from rmqtool.format.batchcq import encode_unit as encode_batch_unit
from rmqtool.format.consumequeue import FILLER_UNIT, encode_unit
from rmqtool.format.dispatch import PlacedQueue, QueueLayout
from rmqtool.store.store import Store


def batch_cq_topics(store: Store) -> set[str]:
    """BatchCQ topics: ``batchconsumequeue/`` directories and ``queue.type=BatchCQ`` in config/topics.json."""
    out = set(store.batch_topics())
    try:
        table = (store.config("topics.json") or {}).get("topicConfigTable") or {}
    except FormatError:
        return out
    for name, conf in table.items():
        attrs = conf.get("attributes") if isinstance(conf, dict) else None
        if isinstance(attrs, dict) and attrs.get("queue.type") == "BatchCQ":
            out.add(name)
    return out


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
