"""verify against the real fixtures and hand-made damage."""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import CLEAN_SETS, CRASH_SETS, FEATURE_SETS, FIXTURES, made_at, run, store_path
from rmqtool.format.commitlog import decode_entry
from rmqtool.ops.findings import FINDING_FIELDS
from rmqtool.ops.verify import verify_store


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_clean_fixture_verifies_clean(name):
    result = run("verify", store_path(name), "--check-crc", "-f", "jsonl")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


@pytest.mark.parametrize("name", CRASH_SETS)
def test_crash_fixture_reports_damage(name):
    """The kill is reported as what the broker's crash recovery handles: warnings (exit 0, 1 with --strict)."""
    result = run("verify", store_path(name), "-f", "jsonl")
    assert result.exit_code == 0, result.output
    assert run("verify", store_path(name), "--strict").exit_code == 1
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(list(r) == FINDING_FIELDS for r in rows)
    assert {r["severity"] for r in rows} == {"warning"}
    kinds = {r["kind"] for r in rows}
    assert "abort_file" in kinds
    tear_path = FIXTURES / name / "tear.json"
    if tear_path.exists():
        tear = json.loads(tear_path.read_text())
        torn = tear["tornRecordPhysicalOffset"]
        commitlog = [r for r in rows if "/commitlog/" in (r["path"] or "")]
        assert [r["offset"] for r in commitlog] == [torn]
        assert commitlog[0]["path"].endswith(tear["file"])
        cq = [r for r in rows if r["kind"] == "cq_unit_past_end"]
        assert cq and cq[0]["actual"] == torn + tear["tornRecordSize"]
    else:   # only the abort file: the killed broker's data itself is consistent
        assert kinds == {"abort_file"}


def test_deep_finds_a_flipped_body_byte(store_copy):
    root = store_copy("dev-sample")
    f = root / "commitlog" / "00000000000000000000"
    data = bytearray(f.read_bytes())
    msg = decode_entry(data, 0)
    tail = len(msg.body) + 1 + len(msg.topic_bytes) + 2 + len(msg.properties_raw)
    data[msg.total_size - tail] ^= 0xFF        # the first body byte
    f.write_bytes(bytes(data))
    # 3 files: a 4.9.7 start's recovery reads all of them with CRCs, so verify checks them without --check-crc
    for deep in (False, True):
        found = [x for x in verify_store(root, deep=deep) if x.path.endswith("00000000000000000000")]
        assert found[0].kind == "crc_mismatch" and found[0].offset == 0 and found[0].severity == "error"


def test_two_gib_length_is_reported_without_allocating_it(store_copy):
    root = store_copy("dev-sample")
    f = root / "commitlog" / "00000000000000131072"
    data = bytearray(f.read_bytes())
    first = struct.unpack_from(">i", data, 0)[0]
    struct.pack_into(">i", data, first, 0x7FFFFFFF)
    f.write_bytes(bytes(data))
    tracemalloc.start()
    findings = list(verify_store(root))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    hit = [x for x in findings if x.offset == 131072 + first]
    assert hit and hit[0].kind == "record_crosses_file_end" and hit[0].actual == 0x7FFFFFFF
    assert peak < 64 * 1024 * 1024


def test_partial_cq_unit_and_lost_queue_are_reported(store_copy):
    root = store_copy("dev-sample")
    cq = root / "consumequeue" / "TopicA" / "1" / "00000000000000000000"
    cq.write_bytes(cq.read_bytes()[:150])
    kinds = {x.kind for x in verify_store(root)}
    assert "cq_file_size" in kinds
    import shutil
    shutil.rmtree(root / "consumequeue" / "TopicB")
    assert {"cq_missing_queue"} <= {x.kind for x in verify_store(root)}


@pytest.mark.parametrize("name", FEATURE_SETS)
def test_clean_feature_stores_verify_clean(name):
    """DLedger, BatchConsumeQueue, LMQ, timer and config stores written by the real 5.3.3/4.9.7 broker, started as
    they were made."""
    result = run("verify", store_path(name), "--check-crc", "-f", "jsonl", "--now", made_at(store_path(name)))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


@pytest.mark.parametrize("name,queue", [("dev-batchcq-5x", "batchconsumequeue/BatchTopic/0/00000000000000000000"),
                                        ("dev-lmq-5x", "consumequeue/%LMQ%room-1/0/00000000000000000000")])
def test_damaged_batch_and_lmq_units_are_named(name, queue, store_copy):
    root = store_copy(name)
    f = root / queue
    data = bytearray(f.read_bytes())
    data[len(data) // 2 // 46 * 46 if "batch" in queue else 27] ^= 0x01
    f.write_bytes(bytes(data))
    findings = [x for x in verify_store(root) if x.kind == "cq_unit_mismatch"]
    assert [x.path for x in findings] == [str(f)]
    assert findings[0].expected != findings[0].actual


def _read_bytes() -> int:
    return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="Linux's per-process I/O counters")
def test_lmq_queues_are_compared_without_reading_their_empty_preallocated_space(store_copy):
    """dev-lmq-5x's queues rebuilt into files of the broker's default 6,000,000 bytes (sparse, a few units of
    data each): verify compares each LMQ queue with the dispatch reading only their data, not the ~12 MB of
    zeros a queue's two files hold (it read 54 MB); a damaged unit is still named with both units, the unit
    zeroed (the file's data ends before it) as zeros."""
    root = store_copy("dev-lmq-5x")
    assert run("rebuild-cq", root, "--cq-file-size", "6000000", "--apply", "--backup", root.parent / "bk").exit_code == 0
    before = _read_bytes()
    result = run("verify", root, "-f", "jsonl")
    assert (result.exit_code, result.stdout) == (0, "") and _read_bytes() - before < 15_000_000
    f = root / "consumequeue" / "%LMQ%room-1" / "0" / "00000000000000000000"
    with open(f, "r+b") as fh:
        data = fh.read(4096)
        last = max(i for i in range(0, len(data), 20) if any(data[i:i + 20]))
        fh.seek(20 + 8)
        fh.write(b"\x00\x00\x00\x01")                       # the second unit's size
    findings = [x for x in verify_store(root) if x.kind == "cq_unit_mismatch"]
    assert [(x.path, x.offset) for x in findings] == [(str(f), 20)]
    assert findings[0].actual[16:24] == "00000001" and findings[0].expected[16:24] != "00000001"
    with open(f, "r+b") as fh:                                # undone; the queue's last unit zeroed instead
        fh.seek(20)
        fh.write(data[20:40])
        fh.seek(last)
        fh.write(bytes(20))
    findings = [x for x in verify_store(root) if x.kind == "cq_unit_mismatch"]
    assert [(x.offset, x.expected, x.actual) for x in findings] == [(last, data[last:last + 20].hex(), "0" * 40)]


def test_a_lying_physical_offset_field_is_a_warning(store_copy):
    root = store_copy("dev-sample")
    f = root / "commitlog" / "00000000000000000000"
    data = bytearray(f.read_bytes())
    struct.pack_into(">q", data, 257 + 28, 999)         # the second record's PHYSICALOFFSET
    f.write_bytes(bytes(data))
    hits = [x for x in verify_store(root) if x.kind == "physical_offset_mismatch"]
    assert [(x.severity, x.offset, x.expected, x.actual) for x in hits] == [("warning", 257, 257, 999)]


def _swapped(src: str, root: Path, swaps: list[tuple[int, int]]) -> set[tuple[str, str, int]]:
    """verify --deep's findings on a copy of ``src`` whose queue Topic-00/2 has, in its file ``f``, the units
    ``i`` and ``i + 1`` swapped for each (f, i) of ``swaps``."""
    shutil.copytree(src, root)
    files = sorted((root / "consumequeue" / "Topic-00" / "2").iterdir())
    for f, i in swaps:
        data = bytearray(files[f].read_bytes())
        data[i * 20:(i + 2) * 20] = data[(i + 1) * 20:(i + 2) * 20] + data[i * 20:(i + 1) * 20]
        files[f].write_bytes(bytes(data))
    return {(x.kind, x.path.replace(str(root), ""), x.offset) for x in verify_store(root, deep=True, jobs=1)}


def test_units_out_of_order_are_named_where_they_are_in_every_file_of_a_queue(generated, tmp_path):
    """Two swapped units give cq_order and queue-offset findings there and nothing else, even when the queue
    went backwards in an earlier file and the pair straddles a commit-log file's start (where the check cuts
    the queue file by offset: it must not search it as sorted)."""
    second = sorted((Path(generated) / "consumequeue" / "Topic-00" / "2").iterdir())[1]
    phy = np.frombuffer(second.read_bytes(), ">i8,>i4,>i8")["f0"]
    assert phy[0] // 65536 != phy[1] // 65536            # its first two units point into two commit-log files
    clean = _swapped(generated, tmp_path / "clean", [])
    first = _swapped(generated, tmp_path / "first", [(0, 0)]) - clean
    straddling = _swapped(generated, tmp_path / "straddling", [(1, 0)]) - clean
    for got, name in ((first, "00000000000000000000"), (straddling, "00000000000000001000")):
        where = f"/consumequeue/Topic-00/2/{name}"
        assert got == {("cq_order", where, 20), ("cq_queue_offset_mismatch", where, 0),
                       ("cq_queue_offset_mismatch", where, 20)}
    assert _swapped(generated, tmp_path / "both", [(0, 0), (1, 0)]) - clean == first | straddling




@pytest.fixture(scope="module")
def long_queues(tmp_path_factory):
    """Six commit-log files of 64 KiB, four queues of ~190 units in files of ten, index files of 100 entries."""
    from rmqtool.format.indexfile import Geometry
    from rmqtool.ops.generate import generate_store

    root = tmp_path_factory.mktemp("long") / "store"
    generate_store(root, 6 * 65536 - 5000, file_size=65536, topics=2, queues=2, cq_file_size=20 * 10,
                   index_geometry=Geometry(10, 100), seed=3)
    return root


def _items(root: Path, kind: str, pick: int) -> list[tuple[Path, int, int]]:
    """(file, position of the first item, items) of one queue's files, or of every index file."""
    if kind == "queue":
        queues = sorted((root / "consumequeue").glob("*/*"))
        return [(f, 0, next((k for k in range(0, f.stat().st_size, 20) if not any(f.read_bytes()[k:k + 20])),
                            f.stat().st_size) // 20) for f in sorted(queues[pick % len(queues)].iterdir())]
    return [(f, 40 + 4 * 10 + 20, struct.unpack_from(">i", f.read_bytes(), 36)[0] - 1)
            for f in sorted((root / "index").iterdir())]


def _damage(data, items: list[tuple[Path, int, int]], phy_at: int) -> None:
    """Up to four edits of 20-byte items (units or index entries): two swapped, one copied over another, or
    one's physical offset moved."""
    for _ in range(data.draw(st.integers(1, 4))):
        f, first, count = items[data.draw(st.integers(0, len(items) - 1))]
        if count < 2:
            continue
        raw = bytearray(f.read_bytes())
        i, j = (first + 20 * data.draw(st.integers(0, count - 1)) for _ in "ij")
        edit = data.draw(st.sampled_from(["swap", "copy", "move"]))
        if edit == "swap":
            raw[i:i + 20], raw[j:j + 20] = raw[j:j + 20], raw[i:i + 20]
        elif edit == "copy":
            raw[j:j + 20] = raw[i:i + 20]
        else:
            phy = struct.unpack_from(">q", raw, i + phy_at)[0] + data.draw(st.sampled_from([-70000, -1, 1, 65536]))
            struct.pack_into(">q", raw, i + phy_at, max(phy, 0))
        f.write_bytes(bytes(raw))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), kind=st.sampled_from(["queue", "index"]))
def test_the_cut_of_queue_and_index_files_by_offset_finds_what_a_filter_finds(long_queues, data, kind, monkeypatch):
    """verify searches a queue file or index file whose offsets rise for a commit-log file's units or entries
    (a seek); with every segment filtered item by item instead, damaged queues and index files give the same
    findings."""
    import rmqtool.ops.verify as verify

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        shutil.copytree(long_queues, root)
        _damage(data, _items(root, kind, data.draw(st.integers(0, 3))), 0 if kind == "queue" else 4)
        want = list(verify_store(root, deep=True, jobs=1))
        pick = verify._pick
        with monkeypatch.context() as m:
            m.setattr(verify, "_pick", lambda seg, *a: pick(dataclasses.replace(seg, ordered=False), *a))
            assert list(verify_store(root, deep=True, jobs=1)) == want


@pytest.mark.parametrize("main,backup,kind,exit_code,last", [
    ("{", "keep", "config_fallback", 0, "4.9.7: safe to start; 5.3.3: safe to start"),
    (None, "keep", "config_fallback", 0, "4.9.7: safe to start; 5.3.3: safe to start"),
    ("{", None, "config_empty_table", 1, "4.9.7: not safe to start (1 error(s))"),
    ("{", "{", "config_refused", 1, "4.9.7: refuses to start; 5.3.3: refuses to start"),
])
def test_config_files_are_judged_as_the_broker_loads_them(main, backup, kind, exit_code, last, store_copy):
    """ConfigManager.load: a config file that does not load falls back to its .bak (a warning); with no .bak
    the broker starts with an empty table (an error: offsets lost), and a .bak that does not decode makes it
    refuse to start. repair writes no config file and says so (exit 1)."""
    root = store_copy("dev-config-5x")
    path = root / "config" / "consumerOffset.json"
    bak = path.with_name(path.name + ".bak")
    for f, text in ((path, main), (bak, backup)):
        if text is None:
            f.unlink()
        elif text != "keep":
            f.write_text(text)
    result = run("verify", root, "-f", "plain")
    assert result.exit_code == exit_code, result.output
    rows = [json.loads(line) for line in run("verify", root, "-f", "jsonl").stdout.splitlines()]
    found = [r for r in rows if r["kind"].startswith("config_")]
    assert [(r["kind"], r["path"].rsplit("/", 1)[1]) for r in found] == \
        [(kind, bak.name if kind == "config_refused" else path.name)]
    assert result.stderr.splitlines()[-1].startswith(last)
    if exit_code:
        repaired = run("repair", root, "-f", "plain")
        assert repaired.exit_code == 1 and "repair does not rewrite config files" in repaired.stderr


@pytest.mark.parametrize("sub", ["commitlog", "commitlog/00000000000000065536"])
def test_a_commit_log_alone_is_checked_without_a_start_verdict(sub):
    """verify STORE/commitlog (or one of its files) checks the records it was given: no finding about the
    store's consume queues, which it did not read, and no claim that a broker starts safely."""
    result = run("verify", FIXTURES / "dev-sample" / "store" / sub, "-f", "plain")
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and result.stderr.splitlines() == [
        "no problems found", "the commit log reads whole (no start verdict without its store: verify the store "
        "directory)"]


def test_an_index_entrys_time_is_checked_against_its_record(store_copy, tmp_path):
    """Seeded: a bit of one entry's timeDiff flipped (IndexFile.selectPhyOffset matches it against a query's
    time range). verify found nothing (exit 0) while rebuild-index had the file to rewrite: now an
    index_entry_time error at the field, repair's dry run names rebuild-index, which fixes it."""
    import random
    from rmqtool.store.store import Store
    rng = random.Random(303)
    root = store_copy("dev-sample-5x")
    ref = rng.choice(Store.open(root).index_files())
    f = ref.path
    data = bytearray(f.read_bytes())
    at = ref.geometry.entry_pos(rng.randrange(2, ref.header.index_count)) + 12 + rng.randrange(2, 4)
    data[at] ^= 1 << rng.randrange(8)
    f.write_bytes(bytes(data))
    result = run("verify", root, "-f", "jsonl")
    found = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.exit_code == 1 and [(x["kind"], x["path"], x["offset"]) for x in found
                                      if x["severity"] == "error"] == [("index_entry_time", str(f), at - at % 4)]
    repair = run("repair", root)
    assert repair.exit_code == 1 and "rebuild-index" in repair.stderr
    assert run("rebuild-index", root, "--apply", "--backup", tmp_path / "bk").exit_code == 0
    assert run("verify", root).exit_code == 0
