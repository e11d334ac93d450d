"""verify: every problem of a store with its file and byte offset.

The commit-log part works file by file (``scan_commitlog_file``) so that files can be checked in
parallel; ``verify_store`` then cross-checks consume queues, index files, the checkpoint and the
abort/lock/journal files against the records found.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple

from rmqtool import constants as C
from rmqtool.errors import BadMagic, ChecksumMismatch, FormatError, InconsistentLength, RmqError, Truncated
from rmqtool.format.commitlog import Blank, decode_entry, peek_header
from rmqtool.format.consumequeue import FILLER_UNIT, UNIT
from rmqtool.format.indexfile import ENTRY
from rmqtool.format.java import index_key_hash
from rmqtool.ops.findings import ERROR, WARNING, Finding
from rmqtool.store.atomic import pending_journal
from rmqtool.store.filequeue import QueueFile
from rmqtool.store.lock import lock_is_held
from rmqtool.store.store import Store

Progress = Callable[[int], None]


class RecordInfo(NamedTuple):
    """What the cross-checks need of a valid record."""

    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    tags_code: int
    store_timestamp: int
    index_keys: tuple[str, ...]      # UNIQ_KEY then each KEYS element (IndexService.buildIndex order)

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def gets_cq_unit(self) -> bool:
        """CommitLogDispatcherBuildConsumeQueue: only NOT and COMMIT transaction types."""
        return C.transaction_type(self.sys_flag) in (C.TransactionType.NOT_TYPE, C.TransactionType.COMMIT)

    @property
    def indexed(self) -> bool:
        return C.transaction_type(self.sys_flag) is not C.TransactionType.ROLLBACK


@dataclass
class FileScan:
    """One commit-log file walked as CommitLog.checkMessageAndReturnSize would."""

    file: QueueFile
    records: list[RecordInfo] = field(default_factory=list)
    stop: str = "zero"           # "blank", "zero" (end of data), "invalid", "file_end"
    stop_offset: int = 0         # physical offset where the walk stopped (a BLANK's own offset)
    findings: list[Finding] = field(default_factory=list)


def _record_info(msg, offset: int) -> RecordInfo:
    keys = ([msg.uniq_key] if msg.uniq_key is not None else []) + msg.keys
    return RecordInfo(offset, msg.total_size, msg.topic, msg.queue_id, msg.queue_offset, msg.sys_flag,
                      msg.tags_code(), msg.store_timestamp, tuple(keys))


def _error_kind(exc: FormatError, size: int, remaining: int) -> str:
    if isinstance(exc, BadMagic):
        return "bad_magic"
    if isinstance(exc, ChecksumMismatch):
        return "crc_mismatch"
    if isinstance(exc, InconsistentLength):
        return "length_mismatch"
    if isinstance(exc, Truncated) and size > remaining:
        return "record_crosses_file_end"
    return "bad_record"


def scan_commitlog_file(f: QueueFile, *, deep: bool = False, progress: Progress | None = None) -> FileScan:
    """Walk one file from position 0; stop at a BLANK, the zero tail or the first invalid record."""
    buf = f.read()
    scan = FileScan(f)
    path = str(f.path)
    pos = 0
    while True:
        remaining = len(buf) - pos
        if remaining < C.END_FILE_MIN_BLANK_LENGTH:
            scan.stop = "file_end"
            if any(buf[pos:]):
                scan.findings.append(Finding(ERROR, "torn_tail", path, f.start + pos,
                                             f"{remaining} stray bytes at the end of the file"))
            break
        size, magic = peek_header(buf, pos)
        if size == 0 and magic == 0:
            scan.stop = "zero"
            nonzero = _first_nonzero(buf, pos)
            if nonzero is not None:
                scan.findings.append(Finding(ERROR, "torn_tail", path, f.start + nonzero,
                                             f"non-zero bytes after the end of written data at {f.start + pos} "
                                             "(a torn or truncated write)", expected=0, actual="non-zero"))
            break
        try:
            entry = decode_entry(buf, pos, check_crc=deep)
            if not isinstance(entry, Blank):
                info = _record_info(entry, f.start + pos)
        except (FormatError, ValueError) as exc:
            scan.stop = "invalid"
            kind = "bad_delay" if isinstance(exc, ValueError) else _error_kind(exc, size, remaining)
            msg = exc.message if isinstance(exc, RmqError) else f"bad DELAY property: {exc}"
            expected = actual = None
            if isinstance(exc, InconsistentLength):
                expected, actual = exc.computed, exc.declared
            elif isinstance(exc, ChecksumMismatch):
                expected, actual = exc.computed, exc.stored
            elif isinstance(exc, BadMagic):
                actual = f"0x{exc.actual & 0xFFFFFFFF:08x}"
            elif kind == "record_crosses_file_end":
                expected, actual = remaining, size
            scan.findings.append(Finding(ERROR, kind, path, f.start + pos,
                                         f"{msg}; recovery truncates the commit log here", expected, actual))
            break
        if isinstance(entry, Blank):
            scan.stop = "blank"
            if size != remaining:
                scan.findings.append(Finding(ERROR, "blank_size_mismatch", path, f.start + pos,
                                             "BLANK total size is not the rest of the file", remaining, size))
            break
        if entry.physical_offset != f.start + pos:
            scan.findings.append(Finding(WARNING, "physical_offset_mismatch", path, f.start + pos,
                                         "stored PHYSICALOFFSET differs from the record's position",
                                         f.start + pos, entry.physical_offset))
        scan.records.append(info)
        pos += size
        if progress:
            progress(size)
    scan.stop_offset = f.start + pos
    return scan


def _first_nonzero(buf, pos: int) -> int | None:
    step = 1 << 16
    while pos < len(buf):
        chunk = bytes(buf[pos:pos + step])
        if any(chunk):
            return pos + next(i for i, b in enumerate(chunk) if b)
        pos += step
    return None


def scan_commitlog(store: Store, *, deep: bool = False, progress: Progress | None = None) -> list[FileScan]:
    return [scan_commitlog_file(f, deep=deep, progress=progress) for f in store.commitlog.queue]


def data_end(scans: list[FileScan]) -> int:
    """Physical offset after the last valid entry of the commit log (as a full scan finds it)."""
    end = scans[0].file.start if scans else 0
    for s in scans:
        if s.stop == "blank":
            end = s.file.start + s.file.length
        elif s.records:
            end = s.stop_offset
    return end


def verify_store(path, deep: bool = False, progress: Progress | None = None,
                 scan_files: Callable[[list[QueueFile], bool], list[FileScan]] | None = None) -> Iterator[Finding]:
    """Every finding of the store at ``path``. ``scan_files(files, deep)`` may scan the commit-log
    files elsewhere (e.g. as Spark tasks) with ``scan_commitlog_file``."""
    store = Store.open(path)
    root = store.root
    if pending_journal(root):
        yield Finding(ERROR, "interrupted_write", str(pending_journal(root)), None,
                      "an rmqtool change was interrupted; any rmqtool write command completes it")
    if store.abort_path.exists():
        yield Finding(ERROR, "abort_file", str(store.abort_path), None,
                      "abort file present: the broker did not shut down cleanly (run repair)")
    if lock_is_held(store.lock_path):
        yield Finding(WARNING, "broker_running", str(store.lock_path), None,
                      "the lock file is held by another process: a broker may be running")
    queue = store.commitlog.queue
    for f, problem in queue.problems():
        kind = "empty_last_file" if "empty" in problem else \
            "missing_file" if "missing" in problem else "wrong_file_size"
        yield Finding(ERROR, kind, str(f.path) if f else None, f.start if f else None, problem,
                      queue.file_size, f.length if f else None)
    scans = scan_files(list(queue), deep) if scan_files else scan_commitlog(store, deep=deep, progress=progress)
    yield from _commitlog_sequence(scans)
    records = {r.offset: r for s in scans for r in s.records}
    end = data_end(scans)
    yield from _verify_consume_queues(store, records, end, queue.min_offset)
    yield from _verify_index(store, records, queue.min_offset)
    yield from _verify_checkpoint(store, records, end)


def _commitlog_sequence(scans: list[FileScan]) -> Iterator[Finding]:
    """Per-file findings, plus files that end early while later files hold data."""
    last_data = max((i for i, s in enumerate(scans) if s.records or s.stop == "blank"), default=-1)
    for i, s in enumerate(scans):
        yield from s.findings
        if i < last_data and s.stop != "blank":
            yield Finding(ERROR, "data_after_end", str(scans[i + 1].file.path), scans[i + 1].file.start,
                          f"later files hold records, but the walk stops at {s.stop_offset} "
                          "(recovery would drop everything after it)")


def _verify_consume_queues(store: Store, records: dict[int, RecordInfo], end: int,
                           min_offset: int) -> Iterator[Finding]:
    expected: dict[tuple[str, int], set[int]] = {}
    for r in records.values():
        if r.gets_cq_unit:
            expected.setdefault((r.topic, r.queue_id), set()).add(r.offset)
    seen_queues = set()
    for cq in store.consume_queues():
        seen_queues.add((cq.topic, cq.queue_id))
        qdir = store.consumequeue_dir / cq.topic / str(cq.queue_id)
        for f, problem in cq.queue.problems():
            yield Finding(ERROR, "cq_file_size" if "bytes" in problem else "missing_file",
                          str(f.path) if f else str(qdir), None, problem, cq.queue.file_size, f.length if f else None)
        covered: set[int] = set()
        prev_phy = -1
        ended = False
        real_seen = False
        for f in cq.queue:
            buf = f.read()
            if len(buf) % C.CQ_STORE_UNIT_SIZE:
                yield Finding(ERROR, "cq_file_size", str(f.path), len(buf) - len(buf) % C.CQ_STORE_UNIT_SIZE,
                              f"consume-queue file size {len(buf)} is not a multiple of 20",
                              len(buf) - len(buf) % C.CQ_STORE_UNIT_SIZE, len(buf))
            base = f.start // C.CQ_STORE_UNIT_SIZE
            for i, (phy, size, tags) in enumerate(UNIT.iter_unpack(buf[:len(buf) - len(buf) % 20])):
                where = (str(f.path), i * C.CQ_STORE_UNIT_SIZE)
                if ended:
                    if phy or size or tags:
                        yield Finding(ERROR, "cq_stale_unit", *where,
                                      "unit after the end of the queue (recovery ignores it)")
                        break
                    continue
                if not (phy >= 0 and size > 0):
                    ended = True
                    if phy or size or tags:
                        yield Finding(ERROR, "cq_bad_unit", *where, "invalid unit ends the queue here",
                                      actual=[phy, size, tags])
                    continue
                if (phy, size, tags) == tuple(FILLER_UNIT):
                    if real_seen:
                        yield Finding(ERROR, "cq_order", *where, "filler unit after real units")
                    continue
                real_seen = True
                q = base + i
                if phy < min_offset:
                    continue      # points into deleted commit log: expired, not damage
                if phy + size > end:
                    yield Finding(ERROR, "cq_unit_past_end", *where,
                                  f"queue offset {q} points past the written end {end}", end, phy + size)
                    continue
                if phy <= prev_phy:
                    yield Finding(ERROR, "cq_order", *where, f"queue offset {q}: physical offsets go backwards",
                                  f"> {prev_phy}", phy)
                prev_phy = phy
                r = records.get(phy)
                if r is None:
                    yield Finding(ERROR, "cq_unit_no_record", *where,
                                  f"queue offset {q} points at {phy}, where no record starts", actual=phy)
                    continue
                covered.add(phy)
                for name, exp, act in (("size", r.size, size), ("topic", r.topic, cq.topic),
                                       ("queue_id", r.queue_id, cq.queue_id), ("queue_offset", r.queue_offset, q),
                                       ("tags_code", r.tags_code, tags)):
                    if exp != act:
                        yield Finding(ERROR, f"cq_{name}_mismatch", *where,
                                      f"queue offset {q} -> record {phy}: {name} differs", exp, act)
        missing = sorted(expected.get((cq.topic, cq.queue_id), set()) - covered)
        first_unit = min(covered, default=None)
        missing = [m for m in missing if first_unit is None or m > first_unit or not covered]
        if missing:
            r = records[missing[0]]
            yield Finding(ERROR, "cq_missing_unit", str(qdir), r.offset,
                          f"{len(missing)} record(s) have no unit; first: queue offset {r.queue_offset} "
                          f"at {r.offset}", r.queue_offset, None)
    for (topic, qid), offsets in sorted(expected.items()):
        if (topic, qid) not in seen_queues:
            yield Finding(ERROR, "cq_missing_queue", str(store.consumequeue_dir / topic / str(qid)), min(offsets),
                          f"{len(offsets)} record(s) of {topic}/{qid} but no consume queue")


def _verify_index(store: Store, records: dict[int, RecordInfo], min_offset: int) -> Iterator[Finding]:
    try:
        refs = store.index_files()
    except FormatError as exc:
        yield Finding(ERROR, "index_file_size", exc.path, None, exc.message)
        return
    for ref in refs:
        buf = ref.read()
        g, h, path = ref.geometry, ref.header, str(ref.path)
        count = max(h.index_count, 1)
        if count > g.index_num:
            yield Finding(ERROR, "index_header_mismatch", path, 36, "indexCount beyond capacity",
                          g.index_num, h.index_count)
            continue
        start = g.entry_pos(1)
        entries = list(ENTRY.iter_unpack(buf[start:g.entry_pos(count)]))
        if any(buf[g.entry_pos(count):g.file_size]):
            yield Finding(ERROR, "index_stale_entries", path, g.entry_pos(count),
                          f"non-zero bytes after entry {count - 1} (indexCount {h.index_count})")
        slots = struct.unpack_from(f">{g.hash_slot_num}i", buf, C.INDEX_HEADER_SIZE)
        used = sum(1 for s in slots if s)
        if entries:
            last = entries[-1]
            checks = [("begin_phy_offset", entries[0][1], h.begin_phy_offset),
                      ("end_phy_offset", last[1], h.end_phy_offset)]
            r_last = records.get(last[1])
            if r_last is not None:
                checks.append(("end_timestamp", r_last.store_timestamp, h.end_timestamp))
            for name, exp, act in checks:
                if exp != act:
                    yield Finding(ERROR, "index_header_mismatch", path, 0, f"header {name} disagrees with the entries",
                                  exp, act)
            if h.hash_slot_count not in (used, len(entries)):
                yield Finding(ERROR, "index_header_mismatch", path, 32, "hashSlotCount disagrees with the slots",
                              used, h.hash_slot_count)
        for n, (key_hash, phy, _, prev) in enumerate(entries, start=1):
            where = (path, g.entry_pos(n))
            if not 0 <= prev < n:
                yield Finding(ERROR, "index_bad_chain", *where, f"entry {n}: previous entry {prev} is not older")
            if phy < min_offset:
                continue
            r = records.get(phy)
            if r is None:
                yield Finding(ERROR, "index_entry_no_record", *where,
                              f"entry {n} points at {phy}, where no valid record starts", actual=phy)
            elif key_hash not in {index_key_hash(f"{r.topic}#{k}") for k in r.index_keys}:
                yield Finding(ERROR, "index_entry_key_mismatch", *where,
                              f"entry {n}: hash {key_hash} matches no key of the record at {phy}", actual=key_hash)


def _verify_checkpoint(store: Store, records: dict[int, RecordInfo], end: int) -> Iterator[Finding]:
    try:
        cp = store.checkpoint()
    except FormatError as exc:
        yield Finding(ERROR, "checkpoint_bad", exc.path, exc.offset, exc.message)
        return
    if cp is None or not store.is_store_root:
        return
    path = str(store.root / "checkpoint")
    latest = max((r.store_timestamp for r in records.values()), default=0)
    for pos, name in ((0, "physic_msg_timestamp"), (8, "logics_msg_timestamp"), (16, "index_msg_timestamp")):
        value = getattr(cp, name)
        if value > latest:
            yield Finding(ERROR, "checkpoint_ahead", path, pos,
                          f"{name} is later than the newest record's store time", latest, value)
    if cp.confirm_phy_offset > end:
        yield Finding(ERROR, "checkpoint_ahead", path, 32, "confirmPhyOffset lies past the written end",
                      end, cp.confirm_phy_offset)

