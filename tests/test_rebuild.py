"""rebuild-cq and rebuild-index against the clean fixtures written by the real broker."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import tempfile
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import CLEAN_SETS, DLEDGER_SETS, FEATURE_SETS, FIXTURES, index_queries, readback, run, store_path
from helpers_maintain import snapshot
from rmqtool.format.commitlog import Message, encode_message
from rmqtool.format.hosts import Host
from rmqtool.store.store import Store, query_index


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_rebuild_cq_after_deleting_consumequeue_is_byte_identical(name, store_copy, tmp_path):
    root = store_copy(name)
    shutil.rmtree(root / "consumequeue")
    result = run("rebuild-cq", root, "--cq-file-size", "160", "--backup", tmp_path / "bk", "-f", "jsonl", "--apply")
    assert result.exit_code == 0, result.output
    assert snapshot(root / "consumequeue") == snapshot(store_path(name) / "consumequeue")
    assert run("verify", root).exit_code == 0


@pytest.mark.parametrize("name", FEATURE_SETS)
def test_rebuild_cq_of_batch_lmq_and_dledger_stores_is_byte_identical(name, store_copy, tmp_path):
    """Classic, LMQ (%LMQ%name/0) and batch (batchconsumequeue/, 46-byte units) queues, from scratch.
    Which topics are BatchCQ the store says by its batchconsumequeue/<topic> directories (kept here) or
    config/topics.json."""
    root = store_copy(name)
    bcq_size = next((p.stat().st_size for p in (root / "batchconsumequeue").rglob("*") if p.is_file()), 46)
    shutil.rmtree(root / "consumequeue")
    for qdir in (root / "batchconsumequeue").glob("*/*"):
        shutil.rmtree(qdir)
    result = run("rebuild-cq", root, "--cq-file-size", "160", "--bcq-file-size", bcq_size, "--backup", tmp_path / "bk",
                 "-f", "jsonl", "--apply")
    assert result.exit_code == 0, result.output
    for kind in ("consumequeue", "batchconsumequeue"):
        theirs = store_path(name) / kind
        assert snapshot(root / kind) == (snapshot(theirs) if theirs.is_dir() else {}), kind
    assert any(p.name.startswith("%LMQ%") for p in (root / "consumequeue").iterdir()) == (name == "dev-lmq-5x")


@pytest.mark.parametrize("name", DLEDGER_SETS + ["dev-batchcq-5x", "dev-lmq-5x"])
def test_rebuild_index_of_feature_stores_answers_every_readback_query(name, store_copy, tmp_path):
    root = store_copy(name)
    shutil.rmtree(root / "index")
    result = run("rebuild-index", root, "--slots", "16", "--max-entries", "64", "--backup", tmp_path / "bk", "--apply")
    assert result.exit_code == 0, result.output
    refs = Store.open(root).index_files()
    for q in index_queries(readback(name)):
        assert sorted(phy for phy, _ in query_index(refs, q["topic"], q["key"])) == sorted(q["phyOffsets"])
    assert [p.read_bytes() for p in sorted((root / "index").iterdir())] == \
        [p.read_bytes() for p in sorted((store_path(name) / "index").iterdir())]


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_rebuild_cq_in_place_keeps_old_queues_as_backup(name, store_copy, tmp_path):
    root = store_copy(name)
    cq = root / "consumequeue" / "TopicA" / "0" / "00000000000000000000"
    cq.write_bytes(bytes(160))                         # damage one queue; file sizes still tell 160
    result = run("rebuild-cq", root, "--backup", tmp_path / "bk", "--apply")
    assert result.exit_code == 0, result.output
    assert snapshot(root / "consumequeue") == snapshot(store_path(name) / "consumequeue")
    assert (tmp_path / "bk" / "consumequeue" / "TopicA" / "0" / "00000000000000000000").read_bytes() == bytes(160)


def test_rebuild_cq_one_topic_and_out_dir(store_copy, tmp_path):
    root = store_copy("dev-sample")
    shutil.rmtree(root / "consumequeue" / "TopicB")
    assert run("rebuild-cq", root, "--topic", "TopicB", "--cq-file-size", "160", "--dry-run").exit_code == 1  # a plan
    assert not (root / "consumequeue" / "TopicB").exists()
    assert run("rebuild-cq", root, "--topic", "TopicB", "--out", tmp_path / "out").exit_code == 0
    expected = snapshot(store_path("dev-sample") / "consumequeue" / "TopicB")
    assert snapshot(tmp_path / "out") == {f"TopicB/{k}": v for k, v in expected.items()}
    assert run("rebuild-cq", root, "--topic", "TopicB", "--apply").exit_code == 0
    assert snapshot(root / "consumequeue") == snapshot(store_path("dev-sample") / "consumequeue")


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_rebuild_index_answers_every_readback_query(name, store_copy, tmp_path):
    root = store_copy(name)
    shutil.rmtree(root / "index")
    result = run("rebuild-index", root, "--slots", "16", "--max-entries", "64", "--backup", tmp_path / "bk", "--apply")
    assert result.exit_code == 0, result.output
    refs = Store.open(root).index_files()
    rb = readback(name)
    for q in index_queries(rb):
        got = sorted(phy for phy, _ in query_index(refs, q["topic"], q["key"]))
        assert got == sorted(q["phyOffsets"]), q["indexKey"]
    # same split into files as the broker's: header, slots and entries byte-identical
    ours = sorted((root / "index").iterdir())
    theirs = sorted((store_path(name) / "index").iterdir())
    assert [p.read_bytes() for p in ours] == [p.read_bytes() for p in theirs]
    for ref, expected in zip(refs, rb["indexFiles"]):
        assert ref.header.end_timestamp == expected["endTimestamp"]
    cp = Store.open(root).checkpoint()
    assert cp.index_msg_timestamp == rb["checkpointAfterShutdown"]["indexMsgTimestamp"]
    assert run("verify", root).exit_code == 0


def _plant_record(root, topic: str) -> None:
    """Write a record with a hostile topic right after the last record of a store."""
    st = Store.open(root)
    end = st.commitlog.written_end()
    f = root / "commitlog" / f"{end - end % 65536:020d}"
    data = bytearray(f.read_bytes())
    msg = Message(topic=topic, body=b"x", queue_id=0, physical_offset=end, store_timestamp=1795216400000,
                  born_host=Host(bytes(4), 1), store_host=Host(bytes(4), 2))
    raw = encode_message(msg)
    data[end % 65536:end % 65536 + len(raw)] = raw
    f.write_bytes(bytes(data))


@pytest.mark.parametrize("topic", ["../../x", "a/b", ".."])
def test_hostile_topic_never_escapes_the_store(topic, store_copy, tmp_path):
    root = store_copy("dev-sample")
    _plant_record(root, topic)
    before = {p for p in tmp_path.rglob("*")}
    result = run("rebuild-cq", root, "--apply")
    assert result.exit_code == 3
    assert "cannot be a consume-queue directory name" in result.stderr
    assert {p for p in tmp_path.rglob("*")} - before == set()
    assert snapshot(root / "consumequeue") == snapshot(store_path("dev-sample") / "consumequeue")


def test_index_keys_put_in_small_column_sets_give_the_same_files(store_copy, monkeypatch):
    from rmqtool.store.index_builder import IndexBuilder

    monkeypatch.setattr(IndexBuilder, "KEYS_PER_PUT", 3)
    root = store_copy("dev-sample")
    assert run("rebuild-index", root, "--apply").exit_code == 0
    ours = sorted((root / "index").iterdir())
    theirs = sorted((store_path("dev-sample") / "index").iterdir())
    assert len(ours) > 1
    assert [p.read_bytes() for p in ours] == [p.read_bytes() for p in theirs]      # names are creation times


_RECORD = st.tuples(st.integers(0, 3), st.lists(st.sampled_from(["a", "b", "order#1", "x" * 30]), max_size=3),
                    st.integers(1, 400), st.integers(0, 2500))     # (transaction type, keys, size, ms later)


@given(st.lists(st.lists(_RECORD, max_size=25), max_size=4), st.integers(1, 7), st.integers(2, 12),
       st.integers(0, 3), st.integers(1, 5))
@settings(max_examples=300, deadline=None)
def test_index_facts_are_put_as_records_are_one_by_one(files, slots, capacity, overlap, per_put):
    """IndexBuilder.add_facts (a file's facts at once, ``KEYS_PER_PUT`` keys a put) builds the index files
    IndexBuilder.add builds record by record: rollbacks and records before the last file's end left out, files
    filled and opened where the broker opens them, with or without keys; a file's records may begin before
    the previous one's last (a walk continued)."""
    import numpy as np

    from rmqtool.format.indexfile import Geometry
    from rmqtool.format.java import index_key_hash
    from rmqtool.ops.facts import FileFacts
    from rmqtool.store.index_builder import IndexBuilder, RecordInfo

    geometry = Geometry(slots, capacity)
    one, columns = IndexBuilder(geometry), IndexBuilder(geometry)
    columns.KEYS_PER_PUT = per_put
    phy, ts = 0, 1_700_000_000_000
    for records in files:
        phy = max(0, phy - overlap * 100)            # the next file's records may start before the last's end
        infos = []
        for kind, keys, size, later in records:
            ts += later
            infos.append(RecordInfo(phy, size, "T", 0, 0, kind << 2, 0, ts, tuple(keys)))
            phy += size
        for r in infos:
            one.add(r)
        hashes = [index_key_hash(f"T#{k}") for r in infos for k in r.index_keys]
        columns.add_facts(FileFacts(None, {"offset": np.array([r.offset for r in infos], np.int64),
                                           "store_timestamp": np.array([r.store_timestamp for r in infos], np.int64),
                                           "sys_flag": np.array([r.sys_flag for r in infos], np.int32)},
                                    key_offsets=np.cumsum([0] + [len(r.index_keys) for r in infos]).astype(np.int64),
                                    key_hashes=np.array(hashes + [7] * 3, np.int32)))    # (room to spare)
    assert [name for name, _ in columns.files] == [name for name, _ in one.files]
    assert [w.to_bytes() for _, w in columns.files] == [w.to_bytes() for _, w in one.files]
    assert columns.full_end_timestamp == one.full_end_timestamp


def test_rebuild_cq_refuses_a_topic_without_records(store_copy, tmp_path):
    root = store_copy("dev-sample")
    before = snapshot(root)
    result = run("rebuild-cq", root, "--topic", "TopicZ", "--backup", tmp_path / "bk", "--apply")
    assert result.exit_code == 1 and "TopicA" in result.stderr and "TopicZ" in result.stderr
    assert snapshot(root) == before and not (tmp_path / "bk").exists()
    assert run("rebuild-cq", root, "--topic", "TopicZ", "--allow-no-records", "--backup", tmp_path / "bk",
               "--apply").exit_code == 0
    assert (root / "consumequeue" / "TopicZ").is_dir()


def test_rebuild_cq_dry_run_lists_only_the_queues_that_would_change(store_copy):
    root = store_copy("dev-sample")
    before = snapshot(root)
    assert run("rebuild-cq", root, "--dry-run").exit_code == 0          # as the broker wrote them
    shutil.rmtree(root / "consumequeue" / "TopicB")
    result = run("rebuild-cq", root, "--dry-run", "-f", "jsonl")
    assert result.exit_code == 1
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(r["path"] for r in rows[:-1]) == ["consumequeue/TopicB/0", "consumequeue/TopicB/1"]
    gone = [v for k, v in before.items() if k.startswith("consumequeue/TopicB/")]     # full files: all data
    assert rows[-1] == {"action": "total", "path": "", "detail": f"{len(gone)} files new, 0 changed, 0 deleted; "
                        f"{sum(map(len, gone))} bytes"}
    assert snapshot(root) == {k: v for k, v in before.items() if not k.startswith("consumequeue/TopicB/")}


def test_a_queues_first_unit_keeps_its_offset_when_records_after_it_are_cut(store_copy, tmp_path):
    """rebuild-cq --read-anyway on a store whose second commit-log file is cut short: a queue whose first
    record (queue offset 0, in the first file) is followed by one at queue offset 3 (1 and 2 were in the cut
    file) keeps its unit at 0; nothing says it was misplaced."""
    root = store_copy("dev-sample-5x")
    os.truncate(root / "commitlog" / "00000000000000065536", 11809)
    out = tmp_path / "cq"
    done = run("rebuild-cq", root, "--out", out, "--read-anyway", "-f", "jsonl")
    assert done.exit_code == 3, done.output
    first = (out / "RMQ_SYS_TRANS_OP_HALF_TOPIC" / "0" / "00000000000000000000").read_bytes()[:20]
    assert struct.unpack(">qiq", first)[0] == 3362
    assert "stores queue offset 0" not in done.stdout


def test_an_index_file_written_as_it_fills_equals_one_written_through_a_map(tmp_path, monkeypatch):
    """StreamedIndexFile (slots held, entries appended with pwrite) against IndexWriter over a shared map of
    a sparse file, the way index files used to be written: the same bytes, and the same pages hold data
    (the slot pages never set stay holes), with keys put one by one, as columns, and both in turn, and a
    file closed half-way and resumed (repair continues the last kept file so)."""
    import mmap
    import random

    import numpy as np

    from rmqtool.format.indexfile import Geometry, IndexWriter
    from rmqtool.format.java import index_key_hash
    from rmqtool.store.filequeue import data_extents
    from rmqtool.store.index_builder import StreamedIndexFile

    monkeypatch.setattr(StreamedIndexFile, "FLUSH_BYTES", 100)    # pending entries and direct writes both
    geometry = Geometry(60_000, 900)                               # slots: 59 pages, entries: 5
    rnd = random.Random(7)
    keys = [f"Topic#k{rnd.randrange(40)}" for _ in range(geometry.index_num - 1)]
    mapped_path, streamed_path = tmp_path / "mapped", tmp_path / "streamed"
    for path in (mapped_path, streamed_path):
        with open(path, "wb") as fh:
            fh.truncate(geometry.file_size)
    with open(mapped_path, "r+b") as fh:
        mapped = IndexWriter(geometry, 4096, 1_700_000_000_000, buf=mmap.mmap(fh.fileno(), 0))
    streamed = StreamedIndexFile(geometry, streamed_path, 4096, 1_700_000_000_000)
    at = 0
    for size in (1, 2, 40, 1, 3, 200, 1, 651):
        batch = keys[at:at + size]
        phys = np.arange(at, at + size, dtype=np.int64) * 300 + 4096
        times = 1_700_000_000_000 + phys * 7
        for w in (mapped, streamed):
            if size < 3:
                for key, phy, ts in zip(batch, phys.tolist(), times.tolist()):
                    assert w.put_key(key, phy, ts)
            else:
                w.put_hashes(np.array([index_key_hash(k) for k in batch], np.int32), phys, times)
        at += size
        if at == 44:
            streamed.close()
            streamed = StreamedIndexFile.resume(geometry, streamed_path)
    assert streamed.is_full() and mapped.is_full()
    mapped.buf.flush()
    mapped.buf.close()
    streamed.close()
    assert streamed_path.read_bytes() == mapped_path.read_bytes()

    def pages(path):
        with open(path, "rb") as fh:
            return [(lo // mmap.PAGESIZE, -(-hi // mmap.PAGESIZE))
                    for lo, hi in data_extents(fh.fileno(), 0, geometry.file_size)]
    assert pages(streamed_path) == pages(mapped_path)
    assert len(pages(mapped_path)) > 2                             # holes between the slot pages set


INDEX_DAMAGE = st.lists(st.tuples(st.sampled_from(["delete", "rename", "flip", "tail", "copy"]),
                                  st.integers(0, 1 << 30)), max_size=3)


@pytest.mark.parametrize("name", CLEAN_SETS + ["dev-dledger"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=INDEX_DAMAGE)
def test_an_index_plan_compares_as_it_goes_and_tells_what_a_built_index_tells(name, damage, tmp_path_factory):
    """rebuild-index's plan writes no file (each new one is compared with the existing ones as it would be
    written): the files, names kept, entries, verdicts and plan size it tells are those of building every file
    and comparing it whole (the --apply path's), whatever was done to the index files beforehand."""
    from rmqtool.ops.dispatch_plan import DispatchPlan
    from rmqtool.ops.rebuild import _build_index, rebuild_index
    from rmqtool.store.bounds import PlanSize

    work = tmp_path_factory.mktemp("plan")
    root = work / "store"
    shutil.copytree(store_path(name), root)
    geometry = Store.open(root).index_geometry(None, None)
    for op, n in damage:
        files = sorted((root / "index").iterdir())
        if not files:
            break
        f = files[n % len(files)]
        data = bytearray(f.read_bytes())
        if op == "delete":
            f.unlink()
        elif op == "rename":                    # a later name, where the order allows one
            later = f.with_name(str(int(f.name) + 1 + n % 3).zfill(len(f.name)))
            if not later.exists():
                f.rename(later)
        elif op == "flip":
            data[n % len(data)] ^= 1 << n % 8
            f.write_bytes(bytes(data))
        elif op == "tail":                      # past the last entry where the file is not full
            data[-1 - n % 64] |= 1
            f.write_bytes(bytes(data))
        else:                                   # the same bytes under an earlier name too
            earlier = f.with_name(str(int(f.name) - 1 - n % 3).zfill(len(f.name)))
            if not earlier.exists():
                shutil.copyfile(f, earlier)
    store, before = Store.open(root), snapshot(root)
    planned, nowhere = PlanSize(), work / "not-a-directory"
    nowhere.write_bytes(b"")
    with mock.patch.object(tempfile, "tempdir", str(nowhere)):      # no temporary directory to write in
        told = rebuild_index(store, slots=geometry.hash_slot_num, max_entries=geometry.index_num, dry_run=True,
                             size=planned)[0]
    assert snapshot(root) == before
    built, size = work / "built", PlanSize()
    built.mkdir()
    expected = _build_index(store, geometry, built, DispatchPlan(), None, size)[0]
    assert told == expected
    assert planned == size


def _disjoint(points: list[int]) -> list[tuple[int, int]]:
    points = sorted(set(points))
    return [(a, b) for a, b in zip(points[::2], points[1::2])]


@given(spans=st.lists(st.integers(0, 300), max_size=12), end=st.integers(0, 320))
def test_the_bytes_a_compared_file_checks_for_zeros_are_those_it_does_not_write(spans, end):
    """ComparedIndexFile and ComparedQueueFile check for zeros in the store's file each byte before ``end`` that
    none of the writes covers, and no other."""
    from rmqtool.store.filequeue import gaps

    spans = _disjoint(spans)
    got = [x for lo, hi in gaps(spans, end) for x in range(lo, hi)]
    assert got == [x for x in range(end) if not any(a <= x < b for a, b in spans)]


QUEUE_DAMAGE = st.lists(st.tuples(st.sampled_from(["delete", "flip", "tail", "stale", "ghost", "extra", "cut",
                                                  "queue"]),
                                  st.integers(0, 1 << 30)), max_size=3)


@pytest.mark.parametrize("name, which, topic", [("dev-sample", "store", None), ("dev-sample-5x", "store", "TopicA"),
                                                ("dev-batchcq-5x", "store", None), ("dev-lmq-5x", "store", None),
                                                ("dev-sample-crash", "recovered-store", None)])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=QUEUE_DAMAGE, as_broker=st.sampled_from([None, "4.9.7"]))
def test_a_queue_plan_compares_as_it_goes_and_tells_what_built_queues_tell(name, which, topic, damage, as_broker,
                                                                          tmp_path_factory):
    """rebuild-cq's plan writes no file (each queue file compared with the store's as it would be written): the
    changes and plan size it tells are those of building every queue file in a directory and comparing it whole,
    stale units past the commit log's end included, whatever was done to the queue files beforehand."""
    from rmqtool.ops.dispatch_plan import DispatchPlan
    from rmqtool.ops.rebuild import _Built, _changes, dispatch_files, rebuild_consume_queues
    from rmqtool.store import layout as L
    from rmqtool.store.metadata import batch_cq_topics

    work = tmp_path_factory.mktemp("cqplan")
    root = work / "store"
    shutil.copytree(FIXTURES / name / which, root)
    files = sorted(p for kind in ("consumequeue", "batchconsumequeue") for p in (root / kind).rglob("*") if p.is_file())
    for op, n in damage:
        f = files[n % len(files)]
        if not f.exists():
            continue
        data = bytearray(f.read_bytes())
        if op == "delete":
            f.unlink()
        elif op == "flip" and data:
            data[n % len(data)] ^= 1 << n % 8
            f.write_bytes(bytes(data))
        elif op == "tail" and data:             # a byte set near the end (past the last unit, mostly)
            data[-1 - n % min(64, len(data))] |= 1
            f.write_bytes(bytes(data))
        elif op == "stale" and f.parts[-4] == "consumequeue":    # a unit past the commit log's end after the last
            end = data.rstrip(b"\0")
            at = -(-len(end) // 20) * 20
            if at + 20 <= len(data):
                data[at:at + 20] = struct.pack(">qiq", (1 << 40) + n % 1000, 100, 0)
                f.write_bytes(bytes(data))
        elif op == "ghost":                     # after the last unit, one the broker would keep (bytes no rebuild writes)
            at = -(-len(data.rstrip(b"\0")) // 20) * 20
            if at + 20 <= len(data):
                data[at:at + 20] = struct.pack(">qiq", n % 1000, 100, 0)
                f.write_bytes(bytes(data))
        elif op == "extra":                     # a file the rebuild does not make
            shutil.copyfile(f, f.with_name(str(int(f.name) + (1 << 30)).zfill(len(f.name))))
        elif op == "cut":
            os.truncate(f, n % (len(data) + 1))
        elif op == "queue":
            shutil.rmtree(f.parent)
    store, before = Store.open(root), snapshot(root)
    nowhere = work / "not-a-directory"
    nowhere.write_bytes(b"")
    with mock.patch.object(tempfile, "tempdir", str(nowhere)):      # no temporary directory to write in
        told = rebuild_consume_queues(store, topics=[topic] if topic else (), dry_run=True, as_broker=as_broker)
    assert snapshot(root) == before
    built, batch = work / "built", batch_cq_topics(store)
    plan = DispatchPlan(as_broker)
    dispatch_files(store, lambda t, qid, is_batch: built / L.queue_dir(t, qid, batch=is_batch),
                   store.queue_file_sizes(None, None), batch, topics={topic} if topic else None, plan=plan)
    rels = [L.queue_dir(topic, batch=topic in batch)] if topic else \
        ["consumequeue"] + (["batchconsumequeue"] if batch or (root / "batchconsumequeue").is_dir() else [])
    trees = {rel: _Built(built / rel) for rel in rels}
    changes, size = _changes(store, trees, plan.end)
    assert told.changes == changes
    assert dataclasses.replace(told.size, why={}) == size             # (why: misplaced units')
