"""Compaction topics (5.x, cleanup.policy=COMPACTION): the sparse compaction queue and position-checkpoint.

Each queue of such a topic keeps a compaction log (``compactionLog/<topic>/<queueId>/``): its keyed records
copied from the commit log byte for byte except the PHYSICALOFFSET field (byte 28), which holds the record's
offset in the compaction log (CompactionLog.asyncPutMessage). Its sparse compaction queue
(``compactionCq/...``, SparseConsumeQueue) has BatchConsumeQueue's 46-byte units (format/batchcq.py): the
compaction-log offset, size, tagsCode, storeTime, msgBaseOffset = the queue offset, batchSize 1,
compactedOffset -1. A full file ends with an END_POSITION unit (BatchConsumeQueue.putEndPositionInfo).
The compaction key is the whole KEYS string (``MessageExt.getKeys()``, CompactionLog.compaction).
"""

from __future__ import annotations

import json
import re
from typing import Sequence

from rmqtool import constants as C
from rmqtool.errors import FormatError
from rmqtool.format.batchcq import BatchCqUnit, decode_units

# BatchConsumeQueue.putEndPositionInfo: offset -1, size 0, ..., batchSize 0, compactedOffset -1.
END_POSITION = BatchCqUnit(-1, 0, 0, 0, 0, 0, C.BCQ_INVALID_POS, 0)


def is_end_position(unit: BatchCqUnit) -> bool:
    return unit.physical_offset == -1 and unit.batch_size == 0


def decode_sparse_units(buf) -> tuple[list[BatchCqUnit], bool]:
    """The units of one sparse-queue file up to its END_POSITION or its first invalid (zero) unit, as
    SparseConsumeQueue.recover reads them; and whether the file ends with END_POSITION."""
    out = []
    for unit in decode_units(buf):
        if is_end_position(unit):
            return out, True
        if not unit.is_valid:
            break
        out.append(unit)
    return out, False


def lookup_from(units: Sequence[BatchCqUnit], queue_offset: int) -> int | None:
    """Index of the first unit at or after ``queue_offset`` (SparseConsumeQueue.iterateFromOrNext: retained
    offsets have holes; a removed offset answers with the next retained unit); None: past the end."""
    lo, hi = 0, len(units)
    while lo < hi:
        mid = (lo + hi) // 2
        if units[mid].next_offset <= queue_offset:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < len(units) else None


def decode_position_checkpoint(text: str) -> dict[tuple[str, int], int]:
    """``compaction/position-checkpoint`` (CompactionPositionMgr as fastjson writes it):
    {"empty":..., "queueOffsetMap":{"<topic>_<queueId>": queue offset compacted up to}}."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise FormatError(f"not a compaction position checkpoint: {exc}") from None
    return decode_position_table(doc)


def decode_position_table(doc) -> dict[tuple[str, int], int]:
    """The parsed JSON of a position checkpoint (decode_position_checkpoint) as its table."""
    try:
        table = doc.get("queueOffsetMap") or {}
        out = {}
        for key, value in table.items():
            topic, _, qid = key.rpartition("_")
            if not topic or not re.fullmatch(r"-?\d+", qid) or not isinstance(value, int):
                raise ValueError(f"bad entry {key!r}: {value!r}")
            out[(topic, int(qid))] = value
        return out
    except (ValueError, AttributeError) as exc:
        raise FormatError(f"not a compaction position checkpoint: {exc}") from None


def encode_position_checkpoint(offsets: dict[tuple[str, int], int]) -> str:
    """The text CompactionPositionMgr.persist writes (fastjson, pretty format, keys in its map's order)."""
    lines = ",\n".join(f'\t\t"{topic}_{qid}":{value}' for (topic, qid), value in offsets.items())
    body = f"{{\n{lines}\n\t}}" if offsets else "{}"
    return f'{{\n\t"empty":{"true" if not offsets else "false"},\n\t"queueOffsetMap":{body}\n}}'
