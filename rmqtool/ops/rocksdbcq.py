"""verify for a RocksDB consume queue: the database compared with what the commit log dispatches.

Every unit (commit-log offset, size, tagsCode at its queue offset, and its store timestamp), the ``offset``
family's max / min entries against the units, and the CHECKPOINT_TOPIC offset against the commit log's
end. A queue that the commit log feeds but the database lacks entirely is a deleted topic (DeleteTopic
drops its units with a DeleteRange, RocksDBConsumeQueueTable.destroyCQ) when the topic table no longer
has it or the database still holds that many range deletions; otherwise an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from rmqtool import constants as C
from rmqtool.errors import RmqError
from rmqtool.ops.findings import ERROR, WARNING, Finding
from rmqtool.store.filequeue import FileQueue
from rmqtool.store.store import ConsumeQueue, Store
from rmqtool.store.output import ScratchDir


def dispatched_units(store: Store) -> dict[tuple[str, int], list[tuple[int, int, int, int]]]:
    """(queue offset, commit-log offset, size, tagsCode) of every unit the broker's dispatch gives the commit
    log, by queue (built as file queues in a temporary directory, the dispatch rule living once)."""
    from rmqtool.ops.rebuild import dispatch_files

    out = {}
    with ScratchDir("rmqtool-rocksdb-") as tmp:
        def directory(topic: str, qid: int, is_batch: bool) -> Path:
            return Path(tmp, "batch" if is_batch else "cq", topic, str(qid))

        writers, _ = dispatch_files(store, directory, (C.DEFAULT_CQ_FILE_SIZE, C.DEFAULT_BCQ_FILE_SIZE), set())
        for qdir in Path(tmp, "cq").glob("*/*"):
            cq = ConsumeQueue(qdir.parent.name, int(qdir.name), FileQueue.from_dir(qdir))
            out[(cq.topic, cq.queue_id)] = [(qo, *u[:3]) for qo, u in cq.iter_units() if not u.is_filler]
    return out


def rocksdb_findings(store: Store, end: int, cut=None) -> Iterator[Finding]:
    """Findings on the RocksDB consume queue of ``store``; ``end``: the commit log's written end; ``cut``: the
    parts of the commit log not read (verify's _Cut: its ``place`` rule for the units pointing into them)."""
    from rmqtool.store.metadata import topic_table

    db = store.rocksdb_consumequeue
    path = str(store.consumequeue_dir)
    if db.checkpoint_offset is not None and db.checkpoint_offset > end:
        yield Finding(ERROR, "rocksdb_past_commitlog", path, db.checkpoint_offset,
                      f"the database was dispatched up to {db.checkpoint_offset}, past the commit log's end {end}",
                      end, db.checkpoint_offset)
    behind = db.checkpoint_offset if db.checkpoint_offset is not None else 0
    want = dispatched_units(store)
    try:
        table = topic_table(store)
    except RmqError:
        table = None
    absent = sorted(k for k in want if k not in db.units and (k[0], "max", k[1]) not in db.offsets)
    ranges = db.deletions.get("default", (0, 0))[1]
    gone = [k for k in absent if table is not None and k[0] not in table]
    unexplained = [k for k in absent if k not in gone]
    if len(unexplained) > ranges:
        for topic, qid in unexplained:
            first = want[(topic, qid)][0]
            yield Finding(ERROR, "rocksdb_missing_queue", path, first[1],
                          f"{len(want[(topic, qid)])} record(s) of {topic}/{qid} but no unit in the database "
                          "(and no range deletion of a deleted topic)")
    for topic, qid in sorted(set(want) | set(db.units)):
        if (topic, qid) in absent:
            continue
        yield from _queue_findings(store, topic, qid, want.get((topic, qid), []), behind, path, cut)


def _queue_findings(store: Store, topic: str, qid: int, want: list, behind: int, path: str,
                    cut) -> Iterator[Finding]:
    q = store.rocksdb_consumequeue.queue(topic, qid)
    have = {u.queue_offset: u for u in q.units}
    unread = set()
    if cut is not None and cut.spans:
        import numpy as np

        skipped, up = cut.place(np.array([u.physical_offset for u in q.units], np.int64),
                                np.array([w[1] for w in want], np.int64))
        unread = {u.queue_offset for u, s in zip(q.units, skipped.tolist()) if s}
        want = [(w[0] + n, *w[1:]) for w, n in zip(want, up.tolist())]
    wanted = {w[0]: w for w in want}
    name = f"{topic}/{qid}"
    late = [w for w in want if w[0] not in have and w[1] >= behind]
    missing = [w for w in want if w[0] not in have and w[1] < behind]
    if missing:
        yield Finding(ERROR, "rocksdb_missing_unit", path, missing[0][1],
                      f"{len(missing)} record(s) of {name} have no unit; first: queue offset {missing[0][0]}",
                      missing[0][0], None)
    if late:
        yield Finding(WARNING, "rocksdb_dispatch_behind", path, late[0][1],
                      f"{len(late)} record(s) of {name} past the database's dispatch checkpoint {behind} have no "
                      "unit yet (the broker dispatches them on start)", late[0][0], None)
    stray = [u for qo, u in have.items() if qo not in wanted and qo not in unread]
    if stray:
        yield Finding(ERROR, "rocksdb_stray_unit", path, stray[0].physical_offset,
                      f"{len(stray)} unit(s) of {name} match no record the commit log dispatches; first: queue "
                      f"offset {stray[0].queue_offset}", None, stray[0].queue_offset)
    bad = [(w, have[w[0]]) for w in want if w[0] in have and
           (have[w[0]].physical_offset, have[w[0]].size, have[w[0]].tags_code) != w[1:]]
    for w, u in bad[:1]:
        yield Finding(ERROR, "rocksdb_unit_mismatch", path, u.physical_offset,
                      f"{len(bad)} unit(s) of {name} differ from the dispatch; first: queue offset {w[0]}",
                      list(w[1:]), [u.physical_offset, u.size, u.tags_code])
    times = [u for qo, u in have.items() if qo in wanted and _store_time(store, u.physical_offset) != u.store_time]
    if times:
        u = times[0]
        yield Finding(ERROR, "rocksdb_store_time", path, u.physical_offset,
                      f"{len(times)} unit(s) of {name} carry another store timestamp than their record; first: "
                      f"queue offset {u.queue_offset}", _store_time(store, u.physical_offset), u.store_time)
    units = q.units
    high = q.entry("max")
    if units and (high is None or (high.physical_offset, high.queue_offset) !=
                  (units[-1].physical_offset, units[-1].queue_offset)):
        yield Finding(ERROR, "rocksdb_max_offset", path, None,
                      f"{name}: the offset family's max entry does not name the newest unit",
                      [units[-1].physical_offset, units[-1].queue_offset],
                      None if high is None else [high.physical_offset, high.queue_offset])
    low = q.entry("min")
    if low is not None and low.queue_offset in have and have[low.queue_offset].physical_offset != low.physical_offset:
        yield Finding(ERROR, "rocksdb_min_offset", path, None,
                      f"{name}: the offset family's min entry disagrees with its unit",
                      have[low.queue_offset].physical_offset, low.physical_offset)


def _store_time(store: Store, offset: int) -> int | None:
    try:
        return store.commitlog.read_at(offset).store_timestamp
    except (RmqError, AttributeError):
        return None
