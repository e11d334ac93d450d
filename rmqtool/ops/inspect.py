"""What is in a store: commit-log files and records, consume queues, index files, checkpoint, abort/lock
state and hints about the broker version that wrote it. Read-only; returns plain values.
"""

from __future__ import annotations

from typing import Any, Callable

from rmqtool import constants as C
from rmqtool.errors import FormatError, RmqError
from rmqtool.store.filequeue import QueueFile
from rmqtool.store.lock import lock_is_held
from rmqtool.store.store import Store


def store_info(store: Store, progress: Callable[[int], None] | None = None,
               jobs: int | None = None, read_anyway: bool = False) -> dict[str, Any]:
    """A summary of the whole store: the commit log's record boundaries and fixed header fields are
    walked once (``progress`` is told the bytes walked; ``jobs`` worker processes, default one per core
    for a large store); bodies and properties are not decoded. The counts stop at a damaged record, or
    with ``read_anyway`` skip the rest of its file and go on (as stats and grep count)."""
    cl = store.commitlog
    problems = [f"{f.path if f else 'commitlog'}: {text}" for f, text in cl.queue.problems()]
    scan = _scan_commitlog(store, progress, jobs, read_anyway)
    problems += scan.pop("damage")
    queues = []
    for cq in store.consume_queues():
        first, units = cq.extent(commitlog_end=scan["max_physical_offset"])
        queues.append({"topic": cq.topic, "queue_id": cq.queue_id, "files": len(cq.queue),
                       "min_queue_offset": first, "max_queue_offset": first + units if units else 0,
                       "units": units})
    if store.consumequeue_is_rocksdb:
        queues = rocksdb_queue_rows(store, scan["max_physical_offset"])
    batch = [{"topic": q.topic, "queue_id": q.queue_id, "files": len(q.queue), "units": len(q.units()),
              "min_queue_offset": low, "max_queue_offset": high}
             for q in store.batch_consume_queues() for low, high in [q.offsets(cl.min_offset)]]
    cp = store.checkpoint()
    warnings = []
    unread = store.compaction.loaded_position()[1] if store.compaction is not None else None
    if unread is not None:
        from rmqtool.ops.compaction import checkpoint_unread

        path, _, text = checkpoint_unread(store.compaction, unread)
        warnings.append(f"{path}: {text}")
    topic_config, ledger = _or_problem(problems, topic_config_rows, store, queues + batch, default=[]), \
        _or_problem(problems, dledger_row, store)
    return {
        "store": str(store.root),
        "commitlog_file_size": cl.file_size,
        "commitlog_files": [{"file": f.path.name, "start_offset": f.start, "end_offset": f.start + f.length,
                             "size": f.length} for f in cl.queue],
        **scan,
        "topics": len({q["topic"] for q in queues + batch}),
        "consume_queues": queues,
        "batch_consume_queues": batch,
        **({"consume_queue_store": "RocksDB (storeType=defaultRocksDB)"} if store.consumequeue_is_rocksdb else {}),
        **({"compaction_queues": compaction_rows(store)} if store.compaction and store.compaction.topics() else {}),
        "topic_config": topic_config,
        "dledger": ledger,
        "index_files": [index_file_row(ref) for ref in store.index_files()],
        "checkpoint": checkpoint_row(cp) if cp else None,
        "abort": store.abort_path.exists(),
        "lock": lock_state(store.lock_path),
        "version_hints": version_hints(store, scan),
        "problems": problems,
        **({"warnings": warnings} if warnings else {}),     # what the broker mends or ignores as it starts
    }


def rocksdb_queue_rows(store: Store, end: int) -> list[dict[str, Any]]:
    """The queues of a RocksDB consume queue as the file-queue rows (``files``: None, one database)."""
    db = store.rocksdb_consumequeue
    rows = []
    for topic in db.topics():
        for qid in db.queue_ids(topic):
            q = db.queue(topic, qid)
            first, units = q.extent(commitlog_end=end)
            rows.append({"topic": topic, "queue_id": qid, "files": None, "min_queue_offset": q.min_offset,
                         "max_queue_offset": q.max_offset, "units": units})
    return rows


def compaction_rows(store: Store) -> list[dict[str, Any]]:
    """Each compaction queue: its offsets, the checkpoint, records kept and removed by compaction."""
    from rmqtool.ops.compaction import queue_summaries

    return queue_summaries(store)


def _scan_commitlog(store: Store, progress: Callable[[int], None] | None,
                    jobs: int | None = None, read_anyway: bool = False) -> dict[str, Any]:
    """Counts and dates from the boundary walk and fixed header fields (no body or property decoding),
    file by file (in ``jobs`` worker processes) as a reader's CommitLog.iter_entries goes: each file to its
    end of data, up to the first damage (``read_anyway``: past it, the rest of its file skipped)."""
    from rmqtool.ops.workers import default_jobs, process_map

    cl = store.commitlog
    if cl.entry_header_size:
        return _scan_records(store, progress, read_anyway)
    files = [f for f in cl.queue if f.length]
    jobs = default_jobs(sum(f.length for f in files), len(files)) if jobs is None else jobs
    total = {"messages": 0, "blanks": 0, "v2": 0, "trailing": 0, "first_ts": None, "last_ts": None,
             "end": cl.min_offset, "damage": []}
    for part in process_map(_scan_file, files, jobs, progress):
        for k in ("messages", "blanks", "v2", "trailing"):
            total[k] += part[k]
        for k, pick in (("first_ts", min), ("last_ts", max)):
            if part[k] is not None:
                total[k] = part[k] if total[k] is None else pick(total[k], part[k])
        total["end"] = part["end"] if part["end"] is not None else total["end"]
        if part["damage"]:
            total["damage"].append(f"{part['damage']} ({_PAST_DAMAGE[read_anyway]})")
        if part["damage"] and not read_anyway:
            break
    return _summary(cl, total["end"], total["messages"], total["blanks"], total["v2"], total["trailing"],
                    total["first_ts"], total["last_ts"], total["damage"])


def _scan_file(f: QueueFile, progress: Callable[[int], None] | None) -> dict[str, Any]:
    """One commit-log file's part of ``_scan_commitlog``: counts, dates, the end of its last entry,
    or the damage that stops the walk."""
    import numpy as np

    from rmqtool.columnar.kernel import scan_window, words
    from rmqtool.columnar.walk import WINDOW_BYTES
    from rmqtool.format.commitlog import decode_entry, peek_header
    from rmqtool.store.broker_model import recovered_tail
    from rmqtool.store.filequeue import release_pages

    out = {"messages": 0, "blanks": 0, "v2": 0, "trailing": 0, "first_ts": None, "last_ts": None,
           "end": None, "damage": None}
    buf = f.read()
    data = np.frombuffer(buf, np.uint8, min(len(buf), f.readable))    # a file cut to what is readable
    data64 = words(data)
    pos = released = 0
    try:
        while len(data) - pos >= C.END_FILE_MIN_BLANK_LENGTH:
            released = release_pages(buf, pos, released)
            size, magic = peek_header(buf, pos)
            if size == 0 and magic == 0:
                break
            if magic in (C.MESSAGE_MAGIC_CODE, C.MESSAGE_MAGIC_CODE_V2):
                win = scan_window(data, pos, pos + WINDOW_BYTES, data64=data64)
                good = win.n
                if good:
                    salvaged = _salvaged(data, win, good)
                    ts = win["store_timestamp"][:good][~salvaged]
                    props_len = win["props_len"]
                    out["messages"] += good - int(salvaged.sum()) + _extra_inner_messages(data, win, good)
                    if progress:
                        progress(int(win["total"].sum()))
                    out["v2"] += int(win["v2"].sum())
                    out["trailing"] += int(((props_len > 0) & (data[win["props_pos"] + props_len - 1] == 2)).sum())
                    if len(ts):
                        lo, hi = int(ts.min()), int(ts.max())
                        out["first_ts"] = lo if out["first_ts"] is None else min(out["first_ts"], lo)
                        out["last_ts"] = hi if out["last_ts"] is None else max(out["last_ts"], hi)
                    out["end"] = f.start + int(win.next if win.bad < 0 else win.bad)
                    if win.bad < 0:
                        pos = win.next
                        continue
                pos = win.bad
            entry = decode_entry(buf, pos)          # a BLANK, or damage named by the decoder
            if entry.magic_code != C.BLANK_MAGIC_CODE:
                raise FormatError("record decodes alone but not in the walk", offset=f.start + pos)
            out["end"] = f.start + pos + entry.total_size
            out["blanks"] += 1
            break
    except FormatError as exc:
        if recovered_tail(f.path, buf, pos, len(data)):
            out["end"] = f.start + pos          # the torn record a recovered store keeps past its end
        else:
            exc.offset = f.start + pos
            out["damage"] = str(exc.at(path=str(f.path)))
    return out


_PAST_DAMAGE = {False: "records after it were not read", True: "the rest of that file was skipped"}


def _salvaged(data, parts, good: int):
    """Which of the walked records are rmqtool repair's placeholders (a rollback-type record on
    C.SALVAGED_TOPIC, type ``salvaged_record``): not messages, as stats, grep and export count. Only
    rollback-type records have their topic read."""
    import numpy as np

    out = np.zeros(good, bool)
    name = C.SALVAGED_TOPIC.encode()
    rollback = (parts["sys_flag"][:good] & C.TransactionType.ROLLBACK) == C.TransactionType.ROLLBACK
    for i in np.flatnonzero(rollback):
        pos, n = int(parts["topic_pos"][i]), int(parts["topic_len"][i])
        out[i] = data[pos:pos + n].tobytes() == name
    return out


def _extra_inner_messages(data, parts, good: int) -> int:
    """The messages beyond one per record of the walked records' inner batches (facts.message_counts):
    only records with the INNER_BATCH sysFlag, which the broker gives every inner batch, have their
    properties read. ``parts``: the scan kernel's window of the records."""
    import numpy as np

    from rmqtool.format.properties import parse_properties

    extra = 0
    for i in np.flatnonzero(parts["sys_flag"][:good] & C.SysFlag.INNER_BATCH):
        pos, n = int(parts["props_pos"][i]), int(parts["props_len"][i])
        props = parse_properties(data[pos:pos + n].tobytes())
        num = props.get(C.PROPERTY_INNER_NUM, "")
        if C.PROPERTY_INNER_BASE in props and num.isdigit():
            extra += int(num) - 1
    return extra


def _scan_records(store: Store, progress: Callable[[int], None] | None, read_anyway: bool = False) -> dict[str, Any]:
    """The same counts from decoded record batches (records inside DLedger entries)."""
    import pyarrow.compute as pc

    from rmqtool.columnar import iter_record_batches
    from rmqtool.ops.facts import message_counts

    cl = store.commitlog
    messages = blanks = v2 = trailing = 0
    first_ts = last_ts = None
    end = cl.min_offset
    damage = []
    for batch in iter_record_batches(store, on_damage=lambda exc: damage.append(exc)):
        if damage and not read_anyway:
            break                       # a batch of the next file: the counts stop at the damage
        kinds = batch.column("type").to_pylist()
        blanks += kinds.count("blank")
        end = int(batch.column("physical_offset")[-1].as_py() + (batch.column("total_size")[-1].as_py() or 0))
        msgs = batch.filter(pc.equal(batch.column("type"), "message"))
        if not msgs.num_rows:
            continue
        if progress:
            progress(int(pc.sum(msgs.column("total_size")).as_py()))
        messages += pc.sum(message_counts(msgs)).as_py()
        v2 += msgs.column("magic_code").to_pylist().count(f"0x{C.MESSAGE_MAGIC_CODE_V2:08x}")
        trailing += sum(1 for p in msgs.column("properties_raw").to_pylist() if p.endswith(C.PROPERTY_SEPARATOR))
        ts = pc.min_max(msgs.column("store_timestamp").cast("int64"))
        first_ts = ts["min"].as_py() if first_ts is None else min(first_ts, ts["min"].as_py())
        last_ts = ts["max"].as_py() if last_ts is None else max(last_ts, ts["max"].as_py())
    note = [f"{exc} ({_PAST_DAMAGE[read_anyway]})" for exc in damage]
    return _summary(cl, end, messages, blanks, v2, trailing, first_ts, last_ts, note)


def _summary(cl, end, messages, blanks, v2, trailing, first_ts, last_ts, damage) -> dict[str, Any]:
    return {"min_physical_offset": cl.min_offset, "max_physical_offset": end, "messages": messages,
            "blanks": blanks, "v2_records": v2, "trailing_separator_records": trailing,
            "min_store_timestamp": first_ts, "max_store_timestamp": last_ts, "damage": damage}


def _or_problem(problems: list[str], fn, *args, default=None):
    """``fn(*args)``, or ``default`` with the error noted among the problems (the rest of info stands)."""
    try:
        return fn(*args)
    except RmqError as exc:
        problems.append(str(exc))
        return default


def topic_config_rows(store: Store, queues: list[dict]) -> list[dict]:
    """config/topics.json (or .bak), one row a topic, with how many queue directories the store holds."""
    from rmqtool.store.metadata import topic_table

    table = topic_table(store)
    if table is None:
        return []
    held: dict[str, int] = {}
    for q in queues:
        held[q["topic"]] = held.get(q["topic"], 0) + 1
    return [{"topic": name, "read_queue_nums": t.read_queue_nums, "write_queue_nums": t.write_queue_nums,
             "perm": t.perm_text, "queue_type": t.queue_type, "order": t.order, "queues_on_disk": held.get(name, 0)}
            for name, t in sorted(table.items())]


def dledger_row(store: Store) -> dict[str, Any] | None:
    """A DLedger store's log: entries, term, and its checkpoint/currterm files (None otherwise)."""
    files = store.dledger
    if files is None:
        return None
    units = list(files.iter_index_units())
    cp, term = files.checkpoint(), files.currterm()
    return {"dledger_dir": str(files.dir), "entries": len(units),
            "begin_index": units[0][0] if units else -1, "end_index": units[-1][0] if units else -1,
            "end_term": units[-1][2].term if units else -1,
            "committed_index": cp.committed_index if cp else None, "current_term": term.curr_term if term else None,
            "vote_leader": term.vote_leader if term else None}


def index_file_row(ref) -> dict[str, Any]:
    h = ref.header
    return {"index_file": ref.name, "hash_slot_num": ref.geometry.hash_slot_num,
            "index_num": ref.geometry.index_num, "entry_count": h.entry_count,
            "begin_timestamp": h.begin_timestamp, "end_timestamp": h.end_timestamp,
            "begin_phy_offset": h.begin_phy_offset, "end_phy_offset": h.end_phy_offset,
            "hash_slot_count": h.hash_slot_count, "index_count": h.index_count}


def checkpoint_row(cp) -> dict[str, Any]:
    return {"physic_msg_timestamp": cp.physic_msg_timestamp, "logics_msg_timestamp": cp.logics_msg_timestamp,
            "index_msg_timestamp": cp.index_msg_timestamp, "master_flushed_offset": cp.master_flushed_offset,
            "confirm_phy_offset": cp.confirm_phy_offset, "min_timestamp": cp.min_timestamp,
            "min_timestamp_index": cp.min_timestamp_index}


def lock_state(path) -> str:
    """"absent", "free", or "locked" when another process (a running broker) holds it."""
    if not path.exists():
        return "absent"
    return "locked" if lock_is_held(path) else "free"


def version_hints(store: Store, scan: dict[str, Any]) -> list[str]:
    """What the bytes say about the broker version (evidence, not proof)."""
    hints = []
    if scan["v2_records"]:
        hints.append(f"{scan['v2_records']} V2 records (magic 0xdaa320ab): RocketMQ 5.1 or later")
    if scan["messages"]:
        if scan["trailing_separator_records"]:
            hints.append(f"{scan['trailing_separator_records']} of {scan['messages']} properties strings end "
                         "with \\x02: broker <= 4.9.0 or >= 5.2, or an old client on <= 4.5")
        else:
            hints.append("no properties string ends with \\x02: typical of 4.9.1-4.9.8 and 5.0-5.1")
    if store.broker_version == "5.x":          # Store.broker_version: the one rule, with its evidence
        hints.append("abort.bak, a PID in abort, compaction/ or checkpoint masterFlushedOffset/confirmPhyOffset: "
                     "RocketMQ 5.x")
    elif store.broker_version == "4.x":
        hints.append("config/delayOffset.json and no 5.x files: RocketMQ 4.x")
    return hints
