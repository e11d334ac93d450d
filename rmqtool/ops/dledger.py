"""DLedger checks and recovery plan: pure functions over a store (nothing is written here).

``check_dledger(store)`` walks the entries as DLedgerMmapFileStore.recover does (magic, size, position,
index chain +1, non-decreasing term) and also checks the record inside each entry, the index units
against the entries, the ``checkpoint`` / ``currterm`` files and (``deep``) body CRCs; it returns
``Finding``s. ``plan_dledger_recovery(store)`` says what DLedger's recovery and the broker's abnormal
load keep: the last entry, the files and index units to cut or rewrite, the ledger checkpoint written
afterwards, the RocketMQ index files dropped and, for a 5.x broker, where index entries are rebuilt from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rmqtool.errors import FormatError
from rmqtool.format import dledger as D
from rmqtool.format.commitlog import Blank, decode_entry
from rmqtool.ops.findings import ERROR, WARNING, Finding
from rmqtool.store.broker_model import matched_recover
from rmqtool.store.dledger import DLedgerCommitLog, LedgerEntry
from rmqtool.store.filequeue import QueueFile
from rmqtool.store.store import Store


@dataclass
class LedgerWalk:
    """The entries DLedger's recovery accepts, and where and why it stops."""

    entries: list[LedgerEntry] = field(default_factory=list)   # BLANKs not included
    end_pos: int = 0                  # the write position after the last accepted entry
    stop_pos: int | None = None       # the first rejected entry (None: the walk reached the end of data)
    findings: list[Finding] = field(default_factory=list)


def walk_ledger(cl: DLedgerCommitLog) -> LedgerWalk:
    """Entries in order until the end of data or the first entry the recovery rejects."""
    walk = LedgerWalk(end_pos=cl.min_offset)
    prev: D.EntryHeader | None = None
    ledger = cl.iter_ledger()
    while True:
        try:
            le = next(ledger)
        except StopIteration:
            return walk
        except FormatError as exc:
            return _stop(walk, exc.offset, "dledger_bad_entry", exc.path, exc.message)
        if le.blank is not None:
            walk.end_pos = le.pos + le.blank.total_size     # the log goes on in the next file
            continue
        h, path = le.header, str(le.file.path)
        try:
            D.check_header(h, le.pos, le.file.length - (le.pos - le.file.start))
        except FormatError as exc:
            return _stop(walk, le.pos, "dledger_bad_entry", path, exc.message)
        if prev is not None and h.index != prev.index + 1:
            return _stop(walk, le.pos, "dledger_index_chain", path,
                         f"entry index {h.index} does not follow {prev.index}", prev.index + 1, h.index)
        if prev is not None and h.term < prev.term:
            return _stop(walk, le.pos, "dledger_term_order", path,
                         f"entry term {h.term} is below the previous term {prev.term}", prev.term, h.term)
        walk.entries.append(le)
        walk.end_pos = le.pos + h.size
        prev = h


def _stop(walk: LedgerWalk, pos, kind: str, path, message: str, expected=None, actual=None) -> LedgerWalk:
    walk.stop_pos = pos
    walk.findings.append(Finding(ERROR, kind, path, pos, f"{message}; DLedger's recovery truncates the log here",
                                 expected, actual))
    return walk


def check_dledger(store: Store, *, deep: bool = False) -> list[Finding]:
    """Every DLedger problem of a store (empty for a classic store or a sound DLedger log)."""
    cl = store.commitlog
    if not isinstance(cl, DLedgerCommitLog) or store.dledger is None:
        return []
    walk = walk_ledger(cl)
    out = list(walk.findings)
    out += _record_findings(walk, 0 if deep else _recovery_crc_from(store, walk))
    out += _stray_bytes(cl, walk)
    out += index_findings(store, walk)
    out += _text_findings(store, walk)
    return out


def _recovery_crc_from(store: Store, walk: LedgerWalk) -> int | None:
    """Where a 5.x broker's crash recovery starts checking body CRCs (checkCRCOnRecover, default true):
    DLedgerCommitLog.dledgerRecoverAbnormally walks from the newest data file whose first record was stored
    by the checkpoint's minTimestamp (isMmapFileMatchedRecover, file mode), else the first. None without an
    abort file: dledgerRecoverNormally reads no record."""
    if not store.abort_path.exists() or not walk.entries:
        return None
    cp = store.checkpoint()
    firsts = {}
    for le in walk.entries:
        firsts.setdefault(le.file.start, le)
    for start, le in sorted(firsts.items(), reverse=True):
        buf = le.buf if le.buf is not None else le.file.read()
        at = le.pos - le.file.start + D.HEADER_SIZE
        try:
            msg = decode_entry(memoryview(buf)[at:at + le.header.body_size], 0)
        except FormatError:
            continue
        if matched_recover(msg, cp):
            return start
    return walk.entries[0].file.start


def _record_findings(walk: LedgerWalk, crc_from: int | None) -> list[Finding]:
    """The RocketMQ record inside each entry (what DLedgerCommitLog.checkMessageAndReturnSize reads), body
    CRCs checked in the files from ``crc_from`` on."""
    out = []
    for le in walk.entries:
        buf = le.buf if le.buf is not None else le.file.read()
        at = le.pos - le.file.start + D.HEADER_SIZE
        path = str(le.file.path)
        try:
            msg = decode_entry(memoryview(buf)[at:at + le.header.body_size], 0,
                               check_crc=crc_from is not None and le.file.start >= crc_from)
        except FormatError as exc:
            kind = "dledger_crc_mismatch" if "CRC" in exc.message else "dledger_record_invalid"
            out.append(Finding(ERROR, kind, path, le.pos + D.HEADER_SIZE, exc.message))
            continue
        if isinstance(msg, Blank) or msg.total_size != le.header.body_size:
            out.append(Finding(ERROR, "dledger_record_invalid", path, le.pos + D.HEADER_SIZE,
                               "entry body is not one record", le.header.body_size, getattr(msg, "total_size", None)))
        elif msg.physical_offset != le.pos + D.HEADER_SIZE:
            out.append(Finding(WARNING, "dledger_physical_offset_mismatch", path, le.pos + D.HEADER_SIZE,
                               "stored PHYSICALOFFSET is not entry position + 48", le.pos + D.HEADER_SIZE,
                               msg.physical_offset))
    return out


def _stray_bytes(cl: DLedgerCommitLog, walk: LedgerWalk) -> list[Finding]:
    """Non-zero bytes after the end of data (a torn entry left behind, or data after a rejected entry)."""
    if walk.stop_pos is not None:
        return []
    try:
        f, pos = cl.queue.locate(walk.end_pos)
    except Exception:   # the end is the end of the last file
        return []
    buf = f.read()
    tail = bytes(buf[pos:])
    if not any(tail):
        return []
    first = pos + next(i for i, b in enumerate(tail) if b)
    return [Finding(ERROR, "dledger_torn_tail", str(f.path), f.start + first,
                    f"non-zero bytes after the end of the log at {walk.end_pos}", 0, "non-zero")]


def index_findings(store: Store, walk: LedgerWalk) -> list[Finding]:
    """Index units against the accepted entries: each entry's unit at slot ``index``, nothing after."""
    files = store.dledger
    by_slot: dict[int, tuple[QueueFile, D.IndexUnit]] = {}
    out = []
    try:
        for slot, f, unit in files.iter_index_units():
            by_slot[slot] = (f, unit)
    except FormatError as exc:
        out.append(Finding(ERROR, "dledger_index_bad_file", exc.path, exc.offset, exc.message))
    for le in walk.entries:
        want = D.IndexUnit(le.header.magic, le.pos, le.header.size, le.header.index, le.header.term)
        found = by_slot.pop(le.header.index, None)
        if found is None:
            out.append(Finding(ERROR, "dledger_index_missing", str(files.index_dir),
                               le.header.index * D.INDEX_UNIT_SIZE, f"no index unit for entry {le.header.index}",
                               tuple(want), None))
        elif found[1] != want:
            f, unit = found
            out.append(Finding(ERROR, "dledger_index_mismatch", str(f.path),
                               le.header.index * D.INDEX_UNIT_SIZE - f.start,
                               f"index unit of entry {le.header.index} disagrees with the entry", tuple(want),
                               tuple(unit)))
    first = walk.entries[0].header.index if walk.entries else 0
    for slot, (f, unit) in sorted(by_slot.items()):
        if slot >= first:
            out.append(Finding(ERROR, "dledger_index_past_end", str(f.path), slot * D.INDEX_UNIT_SIZE - f.start,
                               f"index unit {slot} has no entry "
                               f"(the log ends at entry {first + len(walk.entries) - 1})",
                               None, tuple(unit)))
    return out


def _text_findings(store: Store, walk: LedgerWalk) -> list[Finding]:
    files = store.dledger
    out = []
    try:
        cp, term = files.checkpoint(), files.currterm()
    except FormatError as exc:
        return [Finding(ERROR, "dledger_bad_text_file", exc.path, None, exc.message)]
    end = walk.entries[-1].header if walk.entries else None
    if end is not None and cp is None:
        out.append(Finding(WARNING, "dledger_checkpoint_missing", str(files.checkpoint_path), None,
                           "no DLedger checkpoint: DLedger did not shut down cleanly (it writes one at shutdown)",
                           f"endIndex={end.index}", None))
    elif end is not None and (cp.end_index != end.index or cp.committed_index > cp.end_index):
        out.append(Finding(WARNING, "dledger_checkpoint_stale", str(files.checkpoint_path), None,
                           "DLedger checkpoint does not describe the log's end", f"endIndex={end.index}",
                           f"endIndex={cp.end_index} committedIndex={cp.committed_index}"))
    if term is None and end is not None:
        out.append(Finding(WARNING, "dledger_currterm_missing", str(files.currterm_path), None, "no currterm file"))
    elif term is not None and end is not None and end.term > term.curr_term:
        out.append(Finding(ERROR, "dledger_term_ahead", str(files.currterm_path), None,
                           "the last entry's term is above currTerm", end.term, term.curr_term))
    return out


# -- recovery --------------------------------------------------------------------------------------------
@dataclass
class DLedgerRecoveryPlan:
    """What the broker's restart after a crash leaves of a DLedger store (positions are absolute)."""

    end_index: int                    # the last entry kept (-1: none)
    end_term: int
    end_pos: int                      # the write position: the commit log's max physical offset
    data_cut: list[tuple[Path, int]] = field(default_factory=list)     # (data file, bytes kept) with data beyond
    data_delete: list[Path] = field(default_factory=list)              # data files wholly beyond end_pos
    index_cut: list[tuple[Path, int]] = field(default_factory=list)    # (index file, bytes kept)
    index_delete: list[Path] = field(default_factory=list)
    index_rewrite: list[tuple[int, D.IndexUnit]] = field(default_factory=list)   # (slot, unit) to (re)write
    ledger_checkpoint: D.LedgerCheckpoint | None = None                # the checkpoint DLedger persists afterwards
    rocketmq_index_delete: list[Path] = field(default_factory=list)    # index/ files newer than the checkpoint
    reindex_from: int | None = None   # 5.x: records from here are indexed again; 4.9.x: None (never re-indexed)
    findings: list[Finding] = field(default_factory=list)


def plan_dledger_recovery(store: Store, *, broker_5x: bool | None = None) -> DLedgerRecoveryPlan:
    """DLedgerMmapFileStore.recover plus the broker's abnormal load, for a DLedger store.

    The log keeps every entry the recovery walk accepts (``walk_ledger``); data and index files are cut
    there; index units that are missing or disagree are rewritten; DLedger then persists
    committedIndex = endIndex = the last entry (a single-node group commits everything it has).
    With the abort file present, IndexService.load drops index files whose end timestamp is after the
    checkpoint's indexMsgTimestamp. A 5.x broker (``broker_5x``, default: judged from the store's files)
    re-indexes the records from the first dropped file's begin offset; 4.9.x re-dispatches nothing when
    the consume queues already reach the end of the log, so those keys stay unindexed.
    """
    cl = store.commitlog
    if not isinstance(cl, DLedgerCommitLog) or store.dledger is None:
        raise FormatError("not a DLedger store", path=str(store.root))
    walk = walk_ledger(cl)
    last = walk.entries[-1].header if walk.entries else None
    plan = DLedgerRecoveryPlan(last.index if last else -1, last.term if last else -1, walk.end_pos,
                               findings=list(walk.findings))
    for f in cl.queue:
        if f.start > walk.end_pos:
            plan.data_delete.append(f.path)
        elif walk.end_pos < f.start + f.length and any(f.read()[walk.end_pos - f.start:]):
            plan.data_cut.append((f.path, walk.end_pos - f.start))
    index_end = (plan.end_index + 1) * D.INDEX_UNIT_SIZE
    for f in store.dledger.index_queue():
        if f.start > index_end:
            plan.index_delete.append(f.path)
        elif index_end < f.start + f.length and any(f.read()[index_end - f.start:]):
            plan.index_cut.append((f.path, index_end - f.start))
    units = {}
    try:
        units = {slot: unit for slot, _, unit in store.dledger.iter_index_units(skip_short=True)}
    except FormatError as exc:
        plan.findings.append(Finding(ERROR, "dledger_index_bad_file", exc.path, exc.offset, exc.message))
    for le in walk.entries:
        want = D.IndexUnit(le.header.magic, le.pos, le.header.size, le.header.index, le.header.term)
        if units.get(le.header.index) != want:
            plan.index_rewrite.append((le.header.index, want))
    if last is not None:
        plan.ledger_checkpoint = D.LedgerCheckpoint(last.index, last.index)
    cp = store.checkpoint()
    if store.abort_path.exists() and cp is not None:
        dropped = [ref for ref in store.index_files() if ref.header.end_timestamp > cp.index_msg_timestamp]
        plan.rocketmq_index_delete = [ref.path for ref in dropped]
        if dropped and (store.is_5x if broker_5x is None else broker_5x):
            plan.reindex_from = dropped[0].header.begin_phy_offset
    return plan
