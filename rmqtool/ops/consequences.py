"""What starting a broker on a damaged store costs, counted per version: the numbers behind verify's verdict.

``start_outcome`` (rmqtool.store.broker_model) says what a broker of each version does on start (its recovery's
cut, its dispatch skipping the rest of a file at a bad record, a body it serves unchecked). This module counts
what that does to the messages, against the correct state (every readable record at its queue offset, the
damaged record included when its fields still decode): messages lost, consume-queue units missing or at another
queue offset, index entries and keys whose look-up loses a message, commit-log files deleted. A damaged record
counts as lost (a truncation drops it, a skip leaves it without a unit, an unchecked body serves it corrupted),
unless it is the torn tail: the last thing in the log after a crash, or what a recovered store already ends at.

Runs only when a prediction names damage (a second walk over the commit log, records stepped over as salvage
does); a healthy store never pays for it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from rmqtool import constants as C
from rmqtool.errors import FormatError
from rmqtool.format.commitlog import Message, decode_entry
from rmqtool.format.consumequeue import UNIT
from rmqtool.format.java import index_key_hash
from rmqtool.ops.facts import QueueNames, scan_file
from rmqtool.store.broker_model import Outcome, recovered_tail, reput_reads_size
from rmqtool.store.queue_writer import CqWriter
from rmqtool.store.store import Store

_MAGICS = (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2)
_WITH_UNIT = (C.TransactionType.NOT_TYPE, C.TransactionType.COMMIT)


@dataclass
class Loss:
    """What a start of a ``version`` broker costs (fields verify's broker_start findings carry)."""

    version: str
    messages_lost: int = 0            # damaged, truncated away, or left without a unit by the dispatch
    units_missing: int = 0            # queue offsets with no unit afterwards
    units_misplaced: int = 0          # queue offsets holding another unit (a shifted one, a blank)
    index_entries_missing: int = 0    # index entries (UNIQ_KEY and KEYS) of the lost messages
    index_keys_missing: int = 0       # distinct index keys (topic#key) whose look-up loses a message
    files_deleted: int = 0            # commit-log files the recovery deletes

    @property
    def harmful(self) -> bool:
        return bool(self.messages_lost or self.units_missing or self.units_misplaced)

    def fields(self) -> dict:
        return asdict(self)

    def said(self) -> str:
        """'N message(s) lost, M unit(s) missing, ...', the non-zero counts."""
        parts = [f"{self.messages_lost} message(s) lost", f"{self.units_missing} unit(s) missing",
                 f"{self.units_misplaced} unit(s) at another queue offset",
                 f"{self.index_keys_missing} index key(s) losing a message",
                 f"{self.files_deleted} file(s) deleted"]
        return ", ".join(p for p in parts if not p.startswith("0 "))


@dataclass
class _Damaged:
    offset: int
    size: int                     # bytes the salvage walk stepped over
    message: Message | None       # its fields, when they still decode (the body CRC or the magic damaged)
    lost: bool                    # not the torn tail


class _Records:
    """Every readable record of the commit log (damaged ones stepped over), as columns."""

    def __init__(self, store: Store):
        names = QueueNames()
        self.files = [f for f in store.commitlog.queue if f.length]
        facts = [scan_file(f, names, deep=True, keys=True, salvage=True) for f in self.files]
        self.names = names.names
        cols = {k: np.concatenate([fa.columns[k] for fa in facts]) if facts else np.empty(0, np.int64)
                for k in ("offset", "size", "queue", "queue_offset", "tags_code")}
        self.offset, self.size, self.queue = cols["offset"], cols["size"], cols["queue"]
        self.queue_offset, self.tags = cols["queue_offset"], cols["tags_code"]
        self.unit = np.concatenate([fa.gets_cq_unit() for fa in facts]) if facts else np.empty(0, bool)
        self.keys = np.concatenate([np.diff(fa.key_offsets) for fa in facts]) if facts else np.empty(0, np.int64)
        self.key_hashes = np.concatenate([fa.key_hashes for fa in facts]) if facts else np.empty(0, np.int32)
        self.key_starts = np.concatenate([[0], np.cumsum(self.keys)]).astype(np.int64)
        abnormal = store.abort_path.exists()
        last = int(self.offset[-1]) if len(self.offset) else -1
        self.damaged = [_Damaged(at, size, _lenient(f, at), _lost(f, at, last, abnormal))
                        for f, fa in zip(self.files, facts) for at, size, _ in fa.damaged]

    def hashes(self, rows: np.ndarray) -> np.ndarray:
        """The index key hashes of the records at ``rows``."""
        counts = self.keys[rows]
        before = np.cumsum(counts) - counts                 # each row's first key among the ones gathered
        idx = np.repeat(self.key_starts[rows] - before, counts) + np.arange(int(counts.sum()))
        return self.key_hashes[idx]


def _lenient(f, at: int) -> Message | None:
    """The damaged record at ``at`` decoded without its body CRC, or with its magic code restored, when every
    other field is consistent (its size and its stored physical offset)."""
    buf = f.read()
    pos = at - f.start
    for magic in (None, *_MAGICS):
        data = buf if magic is None else bytearray(buf[pos:pos + min(len(buf) - pos, 1 << 24)])
        if magic is not None:
            data[4:8] = magic.to_bytes(4, "big")
        try:
            entry = decode_entry(data, pos if magic is None else 0, check_crc=False)
        except FormatError:
            continue
        if isinstance(entry, Message) and entry.physical_offset == at:
            return entry
    return None


def _lost(f, at: int, last_readable: int, abnormal: bool) -> bool:
    """Whether the damaged record at ``at`` counts as lost: not the torn tail (nothing readable after it and
    either a crash or a store whose recovery already ends there)."""
    if at < last_readable:
        return True
    return not (abnormal or recovered_tail(f.path, f.read(), at - f.start))


def _hash_keys(msg: Message) -> list[int]:
    keys = ([msg.uniq_key] if msg.uniq_key else []) + list(msg.keys)
    return [index_key_hash(f"{msg.topic}#{k}") for k in keys]


def losses(store: Store, outcomes: list[Outcome], reput_from: int, cq_file_size: int) -> tuple[list[Loss], set[int]]:
    """A Loss per outcome (one per broker version), and the offsets of the damaged records that count as lost."""
    recs = _Records(store)
    names = {n: c for c, n in enumerate(recs.names)}
    return [_loss(recs, names, o, reput_from, cq_file_size) for o in outcomes], \
        {d.offset for d in recs.damaged if d.lost}


def _loss(recs: _Records, names: dict, out: Outcome, reput_from: int, cq_file_size: int) -> Loss:
    loss = Loss(out.version, files_deleted=out.deleted_files)
    n = len(recs.offset)
    lost = np.zeros(n, bool)                         # readable records the start loses
    if out.cut is not None:
        lost |= recs.offset >= out.cut
    skipped = np.zeros(n, bool)                      # records the dispatch leaves without a unit
    for at, kind, _ in out.skips:
        if not reput_reads_size(kind):
            f = next(f for f in reversed(recs.files) if f.start <= at)
            skipped |= (recs.offset > at) & (recs.offset < f.start + f.length)
    lost |= skipped
    damaged = [d for d in recs.damaged if d.lost]
    # the messages a consumer could read (those with a unit; the damaged record counted whatever its type)
    loss.messages_lost = int((lost & recs.unit).sum()) + len(damaged)

    # units: the correct state against the broker's
    gone = lost & recs.unit
    loss.units_missing = int((gone & ~skipped).sum())
    for d in damaged:
        m = d.message
        if m is not None and m.transaction_type in _WITH_UNIT and \
                out.cut is not None and d.offset >= out.cut:
            loss.units_missing += 1
    if skipped.any():
        missing, misplaced = _dispatched(recs, names, out, skipped, damaged, reput_from, cq_file_size)
        loss.units_missing += missing
        loss.units_misplaced += misplaced

    # index: the entries of the lost records and of the damaged records the start drops (a body the dispatch
    # takes unchecked keeps its entries and its unit, and is served corrupted)
    dropped = [d for d in damaged if d.message is not None and (out.cut is not None and d.offset >= out.cut
                                                                or any(d.offset == at for at, _, _ in out.skips))]
    flat = np.concatenate([recs.hashes(np.flatnonzero(lost))]
                          + [np.array(_hash_keys(d.message), np.int32) for d in dropped])
    loss.index_entries_missing = len(flat)
    loss.index_keys_missing = len(np.unique(flat))
    return loss


def _dispatched(recs: _Records, names: dict, out: Outcome, skipped: np.ndarray, damaged: list[_Damaged],
                reput_from: int, cq_file_size: int) -> tuple[int, int]:
    """(units missing, units at another queue offset) of the queues the dispatch skips records of: each such
    queue built as ConsumeQueue.putMessagePositionInfo builds it (CqWriter: units before the dispatch start as
    they are, then the dispatched records appended at the queue's position), compared with every record at its
    queue offset."""
    bad = {d.offset: d.message for d in damaged if d.message is not None and d.message.transaction_type in _WITH_UNIT}
    skip_at = {at for at, _, _ in out.skips}
    touched = set(recs.queue[skipped & recs.unit].tolist())
    touched |= {names[(m.topic, m.queue_id)] for at, m in bad.items()
                if at in skip_at and (m.topic, m.queue_id) in names}
    missing = misplaced = 0
    keep = recs.unit & ~skipped
    if out.cut is not None:
        keep &= recs.offset < out.cut
    for code in sorted(touched):
        mine = recs.queue == code
        want = {int(q): int(p) for q, p in zip(recs.queue_offset[mine & recs.unit], recs.offset[mine & recs.unit])}
        topic, qid = recs.names[code]
        want.update({m.queue_offset: at for at, m in bad.items() if (m.topic, m.queue_id) == (topic, qid)})
        w = CqWriter(cq_file_size)
        rows = np.flatnonzero(mine & keep)
        before = rows[recs.offset[rows] < reput_from]
        if len(before):               # already in the queue, at their offsets
            w.fill_gaps = True
            w.skipped_before = lambda phy: phy        # the broker wrote them: a last unit's gap is kept
            w.put_many(recs.offset[before], recs.size[before], recs.tags[before], recs.queue_offset[before])
            w.finish()
            w.fill_gaps = False
        for r in rows[recs.offset[rows] >= reput_from].tolist():
            w.put(int(recs.offset[r]), int(recs.size[r]), int(recs.tags[r]), int(recs.queue_offset[r]))
        have = {}
        for start, buf in w.files.items():
            written = bytes(buf[:max(0, min(len(buf), w.write_pos - start))])
            for i, (phy, size, _) in enumerate(UNIT.iter_unpack(written)):
                have[start // C.CQ_STORE_UNIT_SIZE + i] = phy if size != C.CQ_FILLER_SIZE else -1
        missing += sum(1 for q in want if q not in have)
        misplaced += sum(1 for q, p in want.items() if q in have and have[q] != p)
    return missing, misplaced
