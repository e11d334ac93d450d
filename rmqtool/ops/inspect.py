"""What is in a store: commit-log files and records, consume queues, index files, checkpoint, abort/lock
state and hints about the broker version that wrote it. Read-only; returns plain values.
"""

from __future__ import annotations

from typing import Any

from rmqtool import constants as C
from rmqtool.errors import FormatError
from rmqtool.format.commitlog import Blank
from rmqtool.store.lock import lock_is_held
from rmqtool.store.store import Store


def store_info(store: Store) -> dict[str, Any]:
    """A summary of the whole store (reads every record once)."""
    cl = store.commitlog
    problems = [f"{f.path if f else 'commitlog'}: {text}" for f, text in cl.queue.problems()]
    scan = _scan_commitlog(store)
    if scan["damage"]:
        problems.append(scan.pop("damage"))
    else:
        scan.pop("damage")
    queues = []
    for cq in store.consume_queues():
        try:
            offsets = [qo for qo, _ in cq.iter_units(commitlog_end=scan["max_physical_offset"])]
        except FormatError as exc:
            problems.append(str(exc))
            offsets = []
        queues.append({"topic": cq.topic, "queue_id": cq.queue_id, "files": len(cq.queue),
                       "min_queue_offset": offsets[0] if offsets else 0,
                       "max_queue_offset": offsets[-1] + 1 if offsets else 0,
                       "units": len(offsets)})
    cp = store.checkpoint()
    return {
        "store": str(store.root),
        "commitlog_file_size": cl.file_size,
        "commitlog_files": [{"file": f.path.name, "start_offset": f.start, "end_offset": f.start + f.length,
                             "size": f.length} for f in cl.queue],
        **scan,
        "topics": len({q["topic"] for q in queues}),
        "consume_queues": queues,
        "index_files": [index_file_row(ref) for ref in store.index_files()],
        "checkpoint": checkpoint_row(cp) if cp else None,
        "abort": store.abort_path.exists(),
        "lock": lock_state(store.lock_path),
        "version_hints": version_hints(store, scan),
        "problems": problems,
    }


def _scan_commitlog(store: Store) -> dict[str, Any]:
    cl = store.commitlog
    messages = blanks = v2 = trailing = 0
    first_ts = last_ts = None
    end = cl.min_offset
    damage = None
    try:
        for loc in cl.iter_entries():
            end = loc.offset + loc.entry.total_size
            msg = loc.entry
            if isinstance(msg, Blank):
                blanks += 1
                continue
            messages += 1
            v2 += msg.version == 2
            trailing += msg.properties_raw.endswith(C.PROPERTY_SEPARATOR)
            ts = msg.store_timestamp
            first_ts = ts if first_ts is None else min(first_ts, ts)
            last_ts = ts if last_ts is None else max(last_ts, ts)
    except FormatError as exc:
        damage = f"{exc} (records after it were not read)"
    return {"min_physical_offset": cl.min_offset, "max_physical_offset": end, "messages": messages,
            "blanks": blanks, "v2_records": v2, "trailing_separator_records": trailing,
            "min_store_timestamp": first_ts, "max_store_timestamp": last_ts, "damage": damage}


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
    if (store.root / "abort.bak").exists() or (store.root / "compaction" / "position-checkpoint").exists():
        hints.append("abort.bak or compaction/position-checkpoint present: RocketMQ 5.x")
    elif (store.root / "config" / "delayOffset.json").exists():
        hints.append("config/delayOffset.json and no 5.x files: RocketMQ 4.x")
    cp = store.checkpoint()
    if cp and (cp.master_flushed_offset or cp.confirm_phy_offset):
        hints.append("checkpoint masterFlushedOffset/confirmPhyOffset set: RocketMQ 5.x")
    return hints
