"""Benchmark of the compaction checks (verify's compaction part, not a pytest test).

    python tests/bench/bench_compaction.py [--dir DIR] [--size 64M] [--topics 1] [--runs 3] [--root CHECKOUT]

A store is generated under DIR (rmqtool's generator: ``--topics`` topics of two queues, keyed messages),
then ``Topic-00`` is given a compaction log and sparse queue per queue the way
CommitLogDispatcherCompaction writes them before any compaction (every keyed record copied, PHYSICALOFFSET
set to its compaction-log offset; no checkpoint, so every record must be kept). ``compaction_findings``
then runs in a fresh process per run (timed on its second call: the first pays the lazy imports and
loads the kernel's compiled code), with the checkout given by ``--root`` (default: this one) first on the
path, so two checkouts compare on the same store; the line gives the median wall and CPU seconds and
the compaction-log records checked per second.
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MEASURE = r"""
import sys, time
from rmqtool.ops.compaction import compaction_findings
from rmqtool.store.store import Store
list(compaction_findings(Store.open(sys.argv[1])))       # first call: lazy imports, the kernel's cache
t, cpu = time.perf_counter(), time.process_time()
found = list(compaction_findings(Store.open(sys.argv[1])))
print(time.perf_counter() - t, time.process_time() - cpu, len(found))
"""


def add_compaction(root: Path, topic: str) -> int:
    """Write compaction/ for ``topic`` (one log file and one sparse-queue file per queue); records copied."""
    from rmqtool import constants as C
    from rmqtool.format.batchcq import BatchCqUnit, encode_unit
    from rmqtool.format.commitlog import Message, encode_entry
    from rmqtool.store.store import Store

    store = Store.open(root)
    copies: dict[int, list[Message]] = {}
    for msg in store.commitlog.iter_messages():
        if msg.topic == topic and msg.properties.get("KEYS"):
            copies.setdefault(msg.queue_id, []).append(msg)
    name = "0" * C.FILE_NAME_DIGITS
    for qid, msgs in copies.items():
        log, units = bytearray(), bytearray()
        for m in msgs:
            raw = bytearray(encode_entry(m))
            raw[28:36] = struct.pack(">q", len(log))
            units += encode_unit(BatchCqUnit(len(log), len(raw), m.tags_code(), m.store_timestamp, m.queue_offset, 1))
            log += raw
        for kind, data in (("compactionLog", log + bytes(8)), ("compactionCq", units + bytes(46))):
            d = root / "compaction" / kind / topic / str(qid)
            d.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(data)
    return sum(len(m) for m in copies.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/rmqtool-bench-compaction"))
    ap.add_argument("--size", default="64M")
    ap.add_argument("--topics", type=int, default=1, help="topics in the store (Topic-00 is compacted)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose compaction_findings runs")
    args = ap.parse_args()
    store = args.dir / f"store-{args.size}-{args.topics}"
    if not store.exists():
        subprocess.run([sys.executable, "-m", "rmqtool", "generate", str(store), "--size", args.size,
                        "--file-size", "16M", "--topics", str(args.topics), "--queues", "2", "--no-index"], check=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        add_compaction(store, "Topic-00")
    queues = sum(1 for _ in (store / "compaction" / "compactionCq").glob("*/*/*"))
    runs = []
    for _ in range(args.runs + 1):           # the first run warms the page cache
        out = subprocess.run([sys.executable, "-c", MEASURE, str(store)], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONPATH": str(args.root)}).stdout.split()
        runs.append((float(out[0]), float(out[1]), int(out[2])))
    wall, cpu, found = sorted(runs[1:])[len(runs[1:]) // 2]
    units = sum((p.stat().st_size // 46) - 1 for p in (store / "compaction" / "compactionCq").glob("*/*/*"))
    print(f"{args.root}: {args.size} store of {args.topics} topic(s), {units} compaction-log records in {queues} queues: "
          f"wall {wall:.2f} s, cpu {cpu:.2f} s ({units / wall:,.0f} records/s), {found} findings")


if __name__ == "__main__":
    main()
