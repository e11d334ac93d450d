"""DLedger checks (findings for verify) and the recovery plan, against the clean sets, the killed sets and
what the real broker's recovery left in their recovered-store/ (recovery-readback.json)."""

from __future__ import annotations

import pytest

from conftest import DLEDGER_CRASH_SETS, DLEDGER_SETS, FIXTURES, readback, run, store_path
from rmqtool.format import dledger as D
from rmqtool.ops.dledger import check_dledger, plan_dledger_recovery
from rmqtool.store.store import Store

CLEAN = [store_path(n) for n in DLEDGER_SETS] + [FIXTURES / n / "recovered-store" for n in DLEDGER_CRASH_SETS]


@pytest.mark.parametrize("path", CLEAN, ids=[f"{p.parent.name}/{p.name}" for p in CLEAN])
def test_clean_stores_have_no_findings(path):
    assert check_dledger(Store.open(path), deep=True) == []


def test_classic_store_has_no_dledger_findings():
    assert check_dledger(Store.open(store_path("dev-sample"))) == []


@pytest.mark.parametrize("name", DLEDGER_CRASH_SETS)
def test_killed_store_reports_the_kill(name):
    findings = check_dledger(Store.open(store_path(name)), deep=True)
    assert [(f.severity, f.kind) for f in findings] == [("warning", "dledger_checkpoint_missing")]
    assert readback(name)["beforeRecovery"]["dledger-n0/checkpoint(raw text)"] is None


@pytest.mark.parametrize("name", DLEDGER_CRASH_SETS)
def test_recovery_plan_matches_the_broker(name):
    killed, recovered = store_path(name), FIXTURES / name / "recovered-store"
    plan = plan_dledger_recovery(Store.open(killed))
    rb = readback(name)
    ledger = rb["dledgerStore"]
    assert (plan.end_index, plan.end_term, plan.end_pos) == (
        ledger["ledgerEndIndex"], ledger["ledgerEndTerm"], ledger["writePos"])
    assert plan.end_pos == rb["maxPhyOffset"]
    assert D.encode_ledger_checkpoint(plan.ledger_checkpoint) == rb["dledger-n0/checkpoint(raw text)"]
    assert not (plan.data_cut or plan.data_delete or plan.index_cut or plan.index_delete or plan.index_rewrite)
    # data and index files the plan keeps are the recovered ones, byte for byte
    for sub in ("data", "index"):
        for f in sorted((recovered / "dledger-n0" / sub).iterdir()):
            assert (killed / "dledger-n0" / sub / f.name).read_bytes() == f.read_bytes()
    before = {p.name for p in (killed / "index").iterdir()}
    after = {p.name for p in (recovered / "index").iterdir()}
    assert {p.name for p in plan.rocketmq_index_delete} == before - after
    new = sorted(after - before)
    if name.endswith("-5x-crash"):      # 5.3.3 indexes the dropped file's records again, into a new file
        assert len(new) == 1
        ref = next(r for r in Store.open(recovered).index_files() if r.name == new[0])
        assert plan.reindex_from == ref.header.begin_phy_offset
    else:                               # 4.9.7: nothing re-dispatched, those keys stay unindexed
        assert new == [] and plan.reindex_from is None
    assert plan_dledger_recovery(Store.open(killed), broker_5x=False).reindex_from is None


def test_recovered_store_needs_nothing():
    for name in DLEDGER_CRASH_SETS:
        plan = plan_dledger_recovery(Store.open(FIXTURES / name / "recovered-store"))
        assert not (plan.data_cut or plan.index_rewrite or plan.rocketmq_index_delete) and plan.reindex_from is None


# -- damage ------------------------------------------------------------------------------------------
def _ledger(root):
    return [le for le in Store.open(root).commitlog.iter_ledger() if le.blank is None]


def _patch(path, at: int, data: bytes) -> None:
    buf = bytearray(path.read_bytes())
    buf[at:at + len(data)] = data
    path.write_bytes(bytes(buf))


def _kinds(root, deep=False):
    return [(f.kind, f.path, f.offset) for f in check_dledger(Store.open(root), deep=deep)]


def test_corrupt_index_unit(store_copy):
    root = store_copy("dev-dledger")
    le = _ledger(root)[70]
    index_file = root / "dledger-n0" / "index" / "00000000000000002048"
    at = le.header.index * 32 - 2048
    _patch(index_file, at + 4, (le.pos + 1).to_bytes(8, "big"))      # the unit's pos
    assert _kinds(root) == [("dledger_index_mismatch", str(index_file), at)]
    plan = plan_dledger_recovery(Store.open(root))
    assert plan.index_rewrite == [(le.header.index, D.IndexUnit(1, le.pos, le.header.size, le.header.index, 0))]
    assert plan.end_index == 197


def test_truncated_index_file(store_copy):
    root = store_copy("dev-dledger")
    index_file = root / "dledger-n0" / "index" / "00000000000000006144"
    index_file.write_bytes(index_file.read_bytes()[:100])
    findings = check_dledger(Store.open(root))
    assert [(f.kind, f.offset) for f in findings][0] == ("dledger_index_bad_file", 96)
    assert "not a multiple of 32" in findings[0].message


@pytest.mark.parametrize("field,value,kind", [
    ("index", 999, "dledger_index_chain"),
    ("term", -1, "dledger_term_order"),
    ("pos", 5, "dledger_bad_entry"),
])
def test_broken_chain_ends_the_log(store_copy, field, value, kind):
    root = store_copy("dev-dledger-5x")
    entries = _ledger(root)
    le = entries[120]
    at = le.pos - le.file.start + {"index": 8, "term": 16, "pos": 24}[field]
    _patch(le.file.path, at, value.to_bytes(8, "big", signed=True))
    findings = check_dledger(Store.open(root))
    assert (findings[0].kind, findings[0].path, findings[0].offset) == (kind, str(le.file.path), le.pos)
    assert "dledger_index_past_end" in {f.kind for f in findings}
    plan = plan_dledger_recovery(Store.open(root))
    assert (plan.end_index, plan.end_pos) == (entries[119].header.index, le.pos)
    assert plan.ledger_checkpoint == D.LedgerCheckpoint(entries[119].header.index, entries[119].header.index)
    last_data = sorted((root / "dledger-n0" / "data").iterdir())
    assert plan.data_cut == [(le.file.path, le.pos - le.file.start)]
    assert plan.data_delete == [p for p in last_data if int(p.name) > le.pos]
    cut = (entries[119].header.index + 1) * 32
    assert [(p.name, keep) for p, keep in plan.index_cut] == [(f"{cut // 2048 * 2048:020d}", cut % 2048)]


def test_torn_last_entry(store_copy):
    root = store_copy("dev-dledger")
    entries = _ledger(root)
    le = entries[-1]
    data = le.file.path.read_bytes()
    cut = le.pos - le.file.start + 30
    le.file.path.write_bytes(data[:cut] + bytes(len(data) - cut))
    findings = check_dledger(Store.open(root))
    assert (findings[0].kind, findings[0].offset) == ("dledger_bad_entry", le.pos)
    plan = plan_dledger_recovery(Store.open(root))
    assert (plan.end_index, plan.end_pos) == (entries[-2].header.index, le.pos)
    assert plan.data_cut == [(le.file.path, le.pos - le.file.start)]


def test_damaged_record_inside_an_entry(store_copy):
    root = store_copy("dev-dledger")
    le = _ledger(root)[33]
    at = le.pos - le.file.start + D.HEADER_SIZE
    _patch(le.file.path, at + 4, b"\x00\x00\x00\x00")                  # the record's magic
    assert _kinds(root) == [("dledger_record_invalid", str(le.file.path), le.pos + D.HEADER_SIZE)]


def test_body_crc_checked_when_deep(store_copy):
    root = store_copy("dev-dledger-5x")
    le = _ledger(root)[10]
    at = le.pos - le.file.start + D.HEADER_SIZE
    _patch(le.file.path, at + 8, b"\x00\x00\x00\x01")                  # the record's BODYCRC
    assert _kinds(root) == []
    assert _kinds(root, deep=True) == [("dledger_crc_mismatch", str(le.file.path), le.pos + D.HEADER_SIZE)]


def test_stale_checkpoint_and_bad_text(store_copy):
    root = store_copy("dev-dledger")
    (root / "dledger-n0" / "checkpoint").write_text("committedIndex=150\nendIndex=150\n")
    assert [f.kind for f in check_dledger(Store.open(root))] == ["dledger_checkpoint_stale"]
    (root / "dledger-n0" / "checkpoint").write_text("committedIndex=x\n")
    (f,) = check_dledger(Store.open(root))
    assert f.kind == "dledger_bad_text_file" and f.path.endswith("checkpoint")
    (root / "dledger-n0" / "checkpoint").write_text("committedIndex=197\nendIndex=197\n")
    (root / "dledger-n0" / "currterm").write_text("voteLeader=n0\ncurrTerm=-1\n")
    assert [f.kind for f in check_dledger(Store.open(root))] == ["dledger_term_ahead"]


def test_repair_leaves_a_dledger_checkpoint_bak_beside_a_right_checkpoint(store_copy):
    """Seeded garbage in checkpoint.bak of the broker's recovered store: DLedger reads the checkpoint (the .bak
    only without it) and overwrites the .bak at its next persist; verify finds nothing and repair's dry run
    has nothing to do (it planned to rewrite the .bak: exit 1)."""
    import random
    rng = random.Random(101)
    root = store_copy("dev-dledger-5x-crash", "recovered-store")
    bak = next(root.rglob("checkpoint.bak"))
    data = bytearray(bak.read_bytes())
    at = rng.randrange(len(data))
    data[at:at + 8] = bytes(rng.randrange(256) for _ in data[at:at + 8])
    bak.write_bytes(bytes(data))
    assert run("verify", root).exit_code == 0
    dry = run("repair", root, "-f", "jsonl")
    assert dry.exit_code == 0 and dry.stdout == "", dry.output
