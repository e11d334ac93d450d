"""Benchmark of put and import on a store with the broker's default sizes (not a pytest test).

    python tests/bench/bench_write.py [--dir DIR] [--messages 100000]

``init`` makes a store with 1 GiB commit-log files, 6,000,000-byte consume-queue files and the default
5,000,000 / 20,000,000 index geometry; ``import`` appends ``--messages`` rows (16 topics x 8 queues,
200-500-byte bodies, one or two keys each) in one transaction; ``put`` then appends one message to the
store that holds them, three times. Each command runs in its own process, with its modules byte-compiled
beforehand (as an installed tool has them); the table gives wall time, the process's peak RSS and the size
of the backup the command left (the bytes of its files). ``--version`` is the start-up every command pays.

Then the index writers at the default geometry with 2,000 queues: a generated store (48 MiB of commit
log in 16 MiB files, 250 topics x 8 queues), killed after its last index file (``abort``, and a
checkpoint whose indexMsgTimestamp is before that file), so that ``repair --apply`` rebuilds a whole
index file; and ``rebuild-index --dry-run`` on the same store. Last, the header walk ``put`` falls back
to without an index file, over one full 1 GiB commit-log file of 400-byte records.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


PYCACHE = Path(tempfile.gettempdir()) / "rmqtool-bench-pycache"    # compiled once, as an installed tool is


def rmqtool(*args) -> tuple[float, int, int, str]:
    """(seconds, peak RSS in bytes, exit status, stdout) of one rmqtool process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "rmqtool", *map(str, args)], stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        code = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if code not in (0, 1):
            raise SystemExit(f"rmqtool {' '.join(map(str, args))} failed: {err.read().decode()}")
        return seconds, usage.ru_maxrss * 1024, code, out.read().decode()


def rows(n: int, seed: int = 0):
    rnd = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 "
    for i in range(n):
        keys = " ".join(f"order-{rnd.randrange(10**9)}" for _ in range(rnd.randint(1, 2)))
        body = "".join(rnd.choices(alphabet, k=rnd.randint(200, 500)))
        yield {"topic": f"Topic-{i % 16:02d}", "queue_id": rnd.randrange(8), "body": body, "body_encoding": "text",
               "properties": {"KEYS": keys, "TAGS": f"Tag{i % 5}"}}


def backup_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _crash_after_last_index_file(root: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from rmqtool.format.checkpoint import encode_checkpoint
    from rmqtool.store.store import Store

    st = Store.open(root)
    last = st.index_files()[-1].header
    (root / "abort").write_bytes(b"")
    (root / "checkpoint").write_bytes(encode_checkpoint(st.checkpoint()._replace(
        index_msg_timestamp=last.begin_timestamp - 1)))


def walk_full_file(work: Path) -> tuple[int, float]:
    """(records, seconds) of the header walk that finds the commit log's end without an index hint (the
    broker's normal recovery): one full 1 GiB commit-log file of 400-byte records, in this process."""
    sys.path.insert(0, str(ROOT))
    from rmqtool import constants as C
    from rmqtool.store.store import Store

    root = work / "full"
    (root / "commitlog").mkdir(parents=True, exist_ok=True)
    record = struct.pack(">iI", 400, C.MESSAGE_MAGIC_CODE) + bytes(392)
    count = ((1 << 30) - 4096) // 400
    with open(root / "commitlog" / f"{0:020d}", "wb") as fh:
        for i in range(0, count, 10_000):
            fh.write(record * min(10_000, count - i))
        fh.truncate(1 << 30)
    log = Store.open(root).commitlog
    started = time.perf_counter()
    assert log.append_end() == count * 400
    seconds = time.perf_counter() - started
    shutil.rmtree(root)
    return count, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--messages", type=int, default=100_000)
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="rmqtool-bench-write-"))
    work.mkdir(parents=True, exist_ok=True)
    store, src = work / "store", work / "rows.jsonl"
    shutil.rmtree(store, ignore_errors=True)
    with open(src, "w") as fh:
        for row in rows(args.messages):
            fh.write(json.dumps(row) + "\n")
    table = []
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "rmqtool")], check=True,
                   env={**os.environ, "PYTHONPYCACHEPREFIX": str(PYCACHE)})     # rmqtool's modules, once
    seconds, rss, _, _ = rmqtool("--version")
    table.append(("start-up (--version)", seconds, rss, 0))
    seconds, rss, _, _ = rmqtool("init", store)
    table.append(("init (1 GiB files)", seconds, rss, 0))
    seconds, rss, _, _ = rmqtool("import", store, src, "--backup", work / "import.bk", "--apply")
    table.append((f"import {args.messages:,} messages", seconds, rss, backup_bytes(work / "import.bk")))
    for i in range(3):
        seconds, rss, _, _ = rmqtool("put", store, "--topic", "Topic-00", "--key", f"k{i}", "--body", "hello",
                                  "--backup", work / f"put{i}.bk", "--apply")
        table.append((f"put 1 message (#{i + 1})", seconds, rss, backup_bytes(work / f"put{i}.bk")))
    crashed = work / "crashed"
    shutil.rmtree(crashed, ignore_errors=True)
    _, _, code, out = rmqtool("generate", crashed, "--size", "48M", "--file-size", "16M", "--topics", "250",
                              "--queues", "8")
    _crash_after_last_index_file(crashed)
    seconds, rss, _, _ = rmqtool("rebuild-index", crashed, "--dry-run")
    table.append(("rebuild-index --dry-run (2,000 q)", seconds, rss, 0))
    seconds, rss, _, _ = rmqtool("repair", crashed, "--apply", "--backup", work / "repair.bk")
    table.append(("repair --apply (2,000 queues)", seconds, rss, backup_bytes(work / "repair.bk")))
    _, _, code, out = rmqtool("verify", store)
    assert code == 0, out
    blocks = sum(p.stat().st_blocks * 512 for p in store.rglob("*") if p.is_file())
    records, walk = walk_full_file(work)
    print(f"store: {store} ({blocks / 2**20:.1f} MB on disk)")
    print(f"{'command':32} {'wall s':>8} {'peak RSS MB':>12} {'backup KB':>10}")
    for name, seconds, rss, backup in table:
        print(f"{name:32} {seconds:8.2f} {rss / 2**20:12.0f} {backup / 1024:10.1f}")
    print(f"the end of a full 1 GiB commit-log file without an index hint ({records:,} headers walked): "
          f"{walk:.2f} s")
    if args.dir is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
