"""The broker model (rmqtool.store.broker_model) against what the real broker did with damaged stores
(fixtures/dev-damage-*: the damage, the broker's log and result) and with its own recovered stores."""

from __future__ import annotations

import json
import os
import shutil
import struct
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import FIXTURES, index_queries, run
from helpers_maintain import snapshot
from rmqtool.format.consumequeue import FILLER_UNIT
from rmqtool.ops.query import query_index
from rmqtool.store.store import Store
from rmqtool.ops.verify import verify_store
from rmqtool.store.broker_model import RULES, V4, V5

CLASSIC_DAMAGE = ["dev-damage-midfile-magic-497", "dev-damage-midfile-crc-497", "dev-damage-midfile-magic-533",
                  "dev-damage-midfile-crc-533", "dev-damage-oldfile-magic-497", "dev-damage-oldfile-crc-497"]
DLEDGER_DAMAGE = ["dev-damage-dledger-body-497", "dev-damage-dledger-body-533"]
# (dev-damage-recovered-reopen-*: their store/ is byte for byte these recovered stores, fixtures/README.md)
RECOVERED = [("dev-sample-crash-torn", "recovered-store"), ("dev-sample-5x-crash-torn", "recovered-store")]


@lru_cache(maxsize=None)
def damage(name: str) -> dict:
    return json.loads((FIXTURES / name / "damage.json").read_text("utf-8"))


def version_of(name: str) -> str:
    return V4 if name.endswith("497") else V5


@pytest.mark.parametrize("name,which", RECOVERED)
def test_broker_recovered_stores_verify_clean(name, which):
    """Seen 2: the broker reopens its recovered stores unchanged, so verify has no error (exit 0)."""
    result = run("verify", FIXTURES / name / which, "--deep", "-f", "jsonl")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(r["severity"] == "warning" for r in rows)
    assert not [r for r in rows if r["kind"] == "broker_start"]      # starting it changes nothing


def _readback(name: str, which: str = "readback.json") -> dict:
    path = FIXTURES / name / which
    if not path.is_file():
        path = FIXTURES / name / "recovery-readback.json"
    return json.loads(path.read_text("utf-8"))


def _comparison(name: str) -> dict:
    """What the real broker's start cost, from the set's readback against its undamaged base's: units
    missing and at another queue offset (as damage.json's comparisonWithUndamagedSet counts them), the
    commit-log offsets no unit references any more, and the index look-ups that lose a phyOffset (the
    comparison's raw count also counts look-ups that only lose a duplicate entry of the crash base)."""
    d = damage(name)
    base = _readback(d["comparisonWithUndamagedSet"]["undamagedReadback"].split("/")[0],
                     d["comparisonWithUndamagedSet"]["undamagedReadback"].split("/")[1])
    result = _readback(name)

    def units(rb):
        return {(q["topic"], q["queueId"], u[0]): u[1] for q in rb["consumeQueues"]
                for u in q[next(k for k in q if k.startswith("units"))]}

    want, have = units(base), units(result)
    lookups = {q["indexKey"]: set(q["phyOffsets"]) for q in index_queries(base)}
    after = {q["indexKey"]: set(q["phyOffsets"]) for q in index_queries(result)}
    return {"units_missing": len(set(want) - set(have)),
            "units_misplaced": sum(1 for k in want if k in have and have[k] != want[k]),
            "messages_lost": len(set(want.values()) - set(have.values())),
            "index_keys_missing": sum(1 for k, v in lookups.items() if v - after.get(k, set()))}


@pytest.mark.parametrize("name", CLASSIC_DAMAGE)
def test_verify_counts_what_the_brokers_start_cost(name):
    """Each damaged set: verify exits 1, the damaged record is an error at its offset, and the set's version's
    broker_start finding carries what the real broker's start did (units missing and misplaced, index look-ups
    losing a message, and the messages lost: those no unit references any more, the damaged one included,
    and the damaged record served as it is where the broker does not check it)."""
    d = damage(name)
    at = d["damagedRecord"]["physicalOffset"]
    result = run("verify", FIXTURES / name / "store", "--check-crc", "-f", "jsonl")
    assert result.exit_code == 1, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["kind"], r["severity"]) for r in rows if r["offset"] == at and r["kind"] != "broker_start"] == \
        [("bad_magic" if "magic" in name else "crc_mismatch", "error")]
    said = [r for r in rows if r["kind"] == "broker_start" and r["expected"] == version_of(name)]
    assert len(said) == 1 and said[0]["severity"] == "error" and said[0]["offset"] == at
    counts, truth = said[0]["counts"], _comparison(name)
    unnoticed = name == "dev-damage-oldfile-crc-497"           # 4.9.7's dispatch serves the damaged body
    assert {k: counts[k] for k in truth} == {**truth, "messages_lost": truth["messages_lost"] + unnoticed}
    deleted = [p for p in next(v for k, v in d.items() if k.startswith("fileDiff"))["onlyInInput"]
               if p.startswith("commitlog/")]
    assert counts["files_deleted"] == len(deleted)
    plain = run("verify", FIXTURES / name / "store", "--check-crc", "-f", "plain")
    last = plain.stderr.splitlines()[-1]
    assert f"{version_of(name)}: starting loses {counts['messages_lost']} message(s) / " \
           f"{counts['units_missing'] + counts['units_misplaced']} unit(s)" in last
    assert last.endswith(f"run `rmqtool repair {FIXTURES / name / 'store'}`")


@pytest.mark.parametrize("name", CLASSIC_DAMAGE + DLEDGER_DAMAGE)
def test_verify_checks_the_crcs_a_start_checks(name):
    """Without --check-crc, verify still checks the body CRCs of the files a broker start's recovery reads
    (checkCRCOnRecover): each damaged set gets the same exit status and broker_start counts as with it, so
    `verify && start` never meets a CRC stop verify did not see."""
    def said(*flags):
        result = run("verify", FIXTURES / name / "store", *flags, "-f", "jsonl")
        rows = [json.loads(line) for line in result.stdout.splitlines()]
        return result.exit_code, sorted(json.dumps(r.get("counts")) for r in rows if r["kind"] == "broker_start"), \
            [r["kind"] for r in rows if r["severity"] == "error"]

    exit_code, counts, errors = said()
    assert exit_code == 1 and errors, errors
    assert (exit_code, counts) == said("--check-crc")[:2]


@pytest.mark.parametrize("name", DLEDGER_DAMAGE)
def test_dledger_damaged_body_is_an_error(name):
    """The broker keeps and dispatches a DLedger entry with a damaged body (both versions): it serves the
    damaged body, so that message is lost (an error), in the set's store as in the broker's recovered store;
    repair names what fixes it."""
    for which in ("store", "recovered-store"):
        findings = list(verify_store(FIXTURES / name / which, deep=True))
        assert [f.kind for f in findings if f.severity == "error" and f.kind != "index_missing_entry"] == \
            ["dledger_crc_mismatch"], [str(f) for f in findings]


def test_strict_makes_warnings_count():
    store = FIXTURES / "dev-sample-crash-torn" / "store"
    assert run("verify", store).exit_code == 0
    assert run("verify", store, "--strict").exit_code == 1


def test_every_rule_cites_a_broker_method():
    assert all(r.source and r.versions in ("both", V4, V5) for r in RULES)


def test_readme_table_is_the_model():
    from conftest import ROOT
    readme = (ROOT / "README.md").read_text("utf-8")
    for r in RULES:
        assert f"| `{r.key}` | {r.versions} | {r.says} | `{r.source}` |" in readme


def _geometry(name: str) -> dict:
    return damage(name)["geometry"]


@pytest.mark.parametrize("name", CLASSIC_DAMAGE)
def test_rebuild_cq_as_broker_gives_the_brokers_queues(name, tmp_path):
    """--as-broker reproduces the real broker's consume queues byte for byte (Seen 1: its recovery cut,
    its dispatch skipping the rest of a file, units appended at each queue's position)."""
    out = tmp_path / "cq"
    result = run("rebuild-cq", FIXTURES / name / "store", "--as-broker", "--out", out,
                 "--cq-file-size", str(_geometry(name)["mappedFileSizeConsumeQueue"]), "-f", "jsonl")
    assert result.exit_code == 0, result.output
    assert snapshot(out) == snapshot(FIXTURES / name / "result-store" / "consumequeue")
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    at = damage(name)["damagedRecord"]["physicalOffset"]
    skipped = any(r["action"] == "skip_record" and f"offset {at} " in r["detail"] for r in rows)
    assert skipped == (name != "dev-damage-oldfile-crc-497")     # 4.9.7's dispatch checks no body CRC


@pytest.mark.parametrize("name", CLASSIC_DAMAGE)
def test_rebuild_index_as_broker_gives_the_brokers_index(name, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(FIXTURES / name / "store", root)
    g = _geometry(name)
    result = run("rebuild-index", root, "--as-broker", "--slots", str(g["maxHashSlotNum"]),
                 "--max-entries", str(g["maxIndexNum"]), "--backup", tmp_path / "bk", "--apply")
    assert result.exit_code == 0, result.output
    refs = Store.open(root).index_files()
    for q in index_queries(json.loads((FIXTURES / name / "readback.json").read_text("utf-8"))):
        assert sorted(phy for phy, _ in query_index(refs, q["topic"], q["key"])) == sorted(q["phyOffsets"])
    # file names are the broker's wall clock; contents are the broker's
    assert [p.read_bytes() for p in sorted((root / "index").iterdir())] == \
        [p.read_bytes() for p in sorted((FIXTURES / name / "result-store" / "index").iterdir())]


def _units(directory: Path) -> dict[tuple[str, int, int], tuple[int, int, int]]:
    """(topic, queue, queue offset) -> unit, blank units left out."""
    out = {}
    for f in directory.rglob("*"):
        if f.is_file():
            topic, qid = f.parent.parent.name, int(f.parent.name)
            data = f.read_bytes()
            for i in range(len(data) // 20):
                unit = struct.unpack_from(">qiq", data, i * 20)
                if unit[1] > 0 and unit != FILLER_UNIT:
                    out[(topic, qid, int(f.name) // 20 + i)] = unit
    return out


@pytest.mark.parametrize("name", CLASSIC_DAMAGE)
def test_repair_makes_each_damaged_set_safe_to_start(name, store_copy, tmp_path):
    """The incident: verify says what a start loses, repair (salvage, the default) with the flags it names makes
    the store one a broker of either version starts on without loss: verify --check-crc exits 0 and says so,
    every undamaged message has its unit at the queue offset it has in the undamaged base (the salvaged one's
    place a blank unit, or the queue's end), every index look-up of the base finds its messages (but the
    salvaged one), the salvaged record is named as such, and a second repair has nothing to do."""
    d = damage(name)
    at = d["damagedRecord"]["physicalOffset"]
    g = d["geometry"]
    root = store_copy(name)
    named = run("repair", root)                   # no queue or index file tells the broker's sizes: it asks
    assert named.exit_code == 4 and "--cq-file-size" in named.stderr and named.stderr.count("\n") == 1
    flags = ["--cq-file-size", str(g["mappedFileSizeConsumeQueue"]), "--slots", str(g["maxHashSlotNum"]),
             "--max-entries", str(g["maxIndexNum"])]
    dry = run("repair", root, *flags, "-f", "jsonl")
    assert dry.exit_code == 1 and json.loads(dry.stdout.splitlines()[0])["action"] == "salvage_record"
    done = run("repair", root, "--apply", *flags, "--backup", tmp_path / "bk", "-f", "jsonl")
    assert done.exit_code == 0, done.stderr
    verified = run("verify", root, "--check-crc", "-f", "plain")
    assert verified.exit_code == 0, verified.output
    assert verified.stderr.splitlines()[-1] == "4.9.7: safe to start; 5.3.3: safe to start"
    rows = [json.loads(line) for line in run("verify", root, "--check-crc", "-f", "jsonl").stdout.splitlines()]
    assert ("salvaged_record", at) in {(r["kind"], r["offset"]) for r in rows}
    kinds = [json.loads(line)["type"] for line in run("cat-commitlog", root, "-f", "jsonl").stdout.splitlines()
             if json.loads(line)["physical_offset"] == at]
    assert kinds == ["salvaged_record"]
    base = _readback(*d["comparisonWithUndamagedSet"]["undamagedReadback"].split("/"))
    want = {(q["topic"], q["queueId"], u[0]): u[1] for q in base["consumeQueues"]
            for u in q[next(k for k in q if k.startswith("units"))] if u[1] != at}
    have = {k: u[0] for k, u in _units(root / "consumequeue").items()}
    assert have == want
    assert {f.stat().st_size for f in (root / "consumequeue").rglob("*") if f.is_file()} == {g["mappedFileSizeConsumeQueue"]}
    refs = Store.open(root).index_files()
    for q in index_queries(base):
        assert {phy for phy, _ in query_index(refs, q["topic"], q["key"])} == set(q["phyOffsets"]) - {at}, q
    again = run("repair", root, "-f", "jsonl")
    assert (again.exit_code, again.stdout) == (0, "")


@pytest.mark.parametrize("name", CLASSIC_DAMAGE)
def test_rebuild_cq_default_puts_every_readable_record_at_its_queue_offset(name, tmp_path):
    """Seen 1: the default rebuild drops nothing but the damaged record, listed with its offset; every
    other record's unit is the undamaged store's unit at the same queue offset."""
    out = tmp_path / "cq"
    size = _geometry(name)["mappedFileSizeConsumeQueue"]
    result = run("rebuild-cq", FIXTURES / name / "store", "--out", out, "--cq-file-size", str(size), "-f", "jsonl")
    assert result.exit_code == 0, result.output
    rec = damage(name)["damagedRecord"]
    base = damage(name)["baseSet"]
    undamaged = FIXTURES / base.split()[0] / ("recovered-store" if "crash" in base else "store") / "consumequeue"
    end = damage(name)["comparisonWithUndamagedSet"]["maxPhyOffset"][0]
    want = {k: u for k, u in _units(undamaged).items() if u[0] < end}     # not the stale unit past the end
    skipped = want.pop((rec["topic"], rec["queueId"], rec["queueOffset"]))
    assert skipped[0] == rec["physicalOffset"]
    got = _units(out)
    assert got == want
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["detail"].split(" (")[0] for r in rows if r["action"] == "skip_record"][0] == \
        f"{'bad_magic' if 'magic' in name else 'crc_mismatch'} at offset {rec['physicalOffset']}"


# -- repair: never beyond the torn tail unasked, fixes all it finds ---------------------------------
@pytest.mark.parametrize("name,which", [("dev-sample-5x", "store"), ("dev-sample", "store")] + RECOVERED[:2])
def test_repair_has_nothing_to_do_on_clean_and_broker_recovered_stores(name, which):
    """Seen 2: a clean 5.x store and the broker's own recovered stores need no repair (dry run exit 0)."""
    result = run("repair", FIXTURES / name / which, "-f", "jsonl")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


@pytest.mark.parametrize("name,which", RECOVERED)
def test_rebuilds_end_a_broker_recovered_store_where_every_reader_does(name, which, store_copy):
    """The torn record a recovered store keeps past its end ends the data (broker_model.recovered_tail)
    and the unit left pointing at it is one the broker drops on every load (stale_units_only): rebuild-cq
    has nothing to change where verify and repair find nothing (it listed the record as skipped and the
    queue as to rewrite, exit 1), --apply writes nothing; rebuild-index skips no record there."""
    root = store_copy(name, which)
    before = snapshot(root)
    assert run("verify", root).exit_code == 0
    dry = run("rebuild-cq", root, "-f", "jsonl")
    assert dry.exit_code == 0 and dry.stdout == "" and "nothing to change" in dry.stderr, dry.output
    index = run("rebuild-index", root, "-f", "jsonl")
    assert not [line for line in index.stdout.splitlines() if json.loads(line)["action"] == "skip_record"]
    done = run("rebuild-cq", root, "--apply", "--backup", root.parent / "bk")
    assert done.exit_code == 0 and snapshot(root) == before and not (root.parent / "bk").exists(), done.output


def test_rebuild_cq_leaves_stray_bytes_past_a_queues_end_as_the_broker_does(store_copy):
    """Seeded: a bit of a tags code flipped in a unit past a queue's end (size 0: ConsumeQueue.recover
    stops before it). verify warns (cq_stale_unit) and exits 0; rebuild-cq had the file to rewrite (exit 1),
    now nothing to change, as the broker reads it (broker_model.stale_units_only)."""
    import random
    root = store_copy("dev-sample-5x")
    rng = random.Random(202)
    f = sorted((root / "consumequeue" / "TopicA" / "0").iterdir())[-1]
    data = bytearray(f.read_bytes())
    units = len(data) // 20
    used = next(i for i in range(units) if not any(data[20 * i:20 * i + 20]))
    at = 20 * rng.randrange(used, units) + 12 + rng.randrange(8)
    data[at] ^= 1 << rng.randrange(8)
    f.write_bytes(bytes(data))
    assert run("verify", root).exit_code == 0
    dry = run("rebuild-cq", root, "-f", "jsonl")
    assert dry.exit_code == 0 and dry.stdout == "" and "nothing to change" in dry.stderr, dry.output


@pytest.mark.parametrize("command", ["rebuild-cq", "rebuild-index"])
def test_a_rebuilds_skipped_records_are_notes_once_applied(command, store_copy, tmp_path):
    """A damaged record (seeded: one record's magic code) stays skipped by every rebuild: after --apply the
    dry run lists it and exits 0, 'nothing to change' (it said '1 action(s); run with --apply', and a
    second --apply changed nothing); a second --apply writes no byte."""
    import random
    root = store_copy("dev-sample-5x")
    starts = [loc.offset for loc in Store.open(root).commitlog.iter_entries()]
    at = random.Random(101).choice(starts[len(starts) // 3:2 * len(starts) // 3])
    f = max((p for p in (root / "commitlog").iterdir() if int(p.name) <= at), key=lambda p: int(p.name))
    data = bytearray(f.read_bytes())
    data[at - int(f.name) + 7] ^= 0x10
    f.write_bytes(bytes(data))
    assert run(command, root, "--apply", "--backup", tmp_path / "bk1").exit_code == 0
    applied = snapshot(root)
    dry = run(command, root, "-f", "jsonl")
    rows = [json.loads(line) for line in dry.stdout.splitlines()]
    assert dry.exit_code == 0 and dry.stderr.endswith("nothing to change\n"), dry.output
    assert [r["action"] for r in rows] == ["skip_record", "total"] and f"offset {at} " in rows[0]["detail"]
    assert run(command, root, "--apply", "--backup", tmp_path / "bk2").exit_code == 0
    assert snapshot(root) == applied


def _damage_mid_log(root: Path) -> int:
    """dev-sample's record at 36769 (file 0 of 3, inside 4.9.7's recovery window) gets a bad magic code."""
    f = root / "commitlog" / "00000000000000000000"
    data = bytearray(f.read_bytes())
    struct.pack_into(">I", data, 36769 + 4, 0xDEADBEEF)
    f.write_bytes(bytes(data))
    return 36769


def test_repair_refuses_to_delete_valid_messages_unless_accepted(store_copy, tmp_path):
    """Seen 1 and 4: the cut at a mid-log bad record deletes valid messages: the dry run counts them, the
    write is refused without --accept-loss; with it, index entries past the cut and the checkpoint's times
    are fixed too, so verify finds no error and a second repair nothing to do."""
    root = store_copy("dev-sample")
    at = _damage_mid_log(root)
    before = snapshot(root)
    dry = run("repair", root, "--no-salvage", "-f", "jsonl")
    assert dry.exit_code == 1
    rows = [json.loads(line) for line in dry.stdout.splitlines()]
    assert rows[0]["action"] == "lose_messages" and rows[0]["detail"].startswith(f"133 valid message(s) after offset {at}")
    refused = run("repair", root, "--no-salvage", "--apply", "--backup", tmp_path / "bk0")
    assert refused.exit_code == 4 and "refused" in refused.stderr
    assert f"`rmqtool repair {root} --apply` keeps them" in refused.stderr
    assert snapshot(root) == before
    done = run("repair", root, "--no-salvage", "--apply", "--accept-loss", "--backup", tmp_path / "bk", "-f", "jsonl")
    assert done.exit_code == 0, done.stderr
    assert not [f for f in verify_store(root) if f.severity == "error"]
    assert not [f for f in verify_store(root) if f.kind in ("index_entry_no_record", "checkpoint_ahead")]
    again = run("repair", root, "-f", "jsonl")
    assert again.exit_code == 0 and again.stdout == ""


def test_repair_listing_is_bounded(store_copy):
    root = store_copy("dev-sample")
    _damage_mid_log(root)
    full = run("repair", root, "-f", "jsonl", "--limit", "0")
    short = run("repair", root, "-f", "jsonl", "--limit", "2")
    n = len(full.stdout.splitlines()) - 1          # the total row is always shown, last
    assert n > 3 and len(short.stdout.splitlines()) == 3 and '"action":"total"' in short.stdout.splitlines()[-1]
    assert f"{n - 2} more action(s) not listed" in short.stderr


@pytest.mark.parametrize("name", ["dev-sample-crash-torn", "dev-sample-5x-crash-torn"])
def test_read_commands_work_on_broker_recovered_stores(name, tmp_path):
    """Seen 2: the torn record the broker's recovery left past the end is the end of the data."""
    root = FIXTURES / name / "recovered-store"
    end = json.loads((FIXTURES / name / "recovery-readback.json").read_text("utf-8"))["maxPhyOffset"]
    rows = run("cat-commitlog", root, "-f", "jsonl")
    assert rows.exit_code == 0, rows.stderr
    last = json.loads(rows.stdout.splitlines()[-1])
    assert last["physical_offset"] + last["total_size"] == end
    assert run("stats", root).exit_code == 0
    out = run("export", root, "--to", tmp_path / "x", "-f", "jsonl")
    assert out.exit_code == 0, out.stderr
    assert sum(len(p.read_text().splitlines()) for p in (tmp_path / "x").glob("*.jsonl")) == \
        sum(1 for line in rows.stdout.splitlines() if json.loads(line)["type"] == "message")


# -- verify strictness: what rmqtool passed although the broker refuses it or serves less -----------
def _no_first_cq_file(root: Path) -> None:
    (root / "consumequeue" / "TopicA" / "0" / "00000000000000000000").unlink()


def _dir_for_first_cq_file(root: Path) -> None:
    f = root / "consumequeue" / "TopicA" / "0" / "00000000000000000000"
    f.unlink()
    f.mkdir()


def _zeroed_index_file(root: Path) -> None:
    f = sorted((root / "index").iterdir())[0]
    f.write_bytes(bytes(f.stat().st_size))


def _deleted_index_file(root: Path) -> None:
    sorted((root / "index").iterdir())[1].unlink()


@pytest.mark.parametrize("damage_fn,kinds,level", [
    (_no_first_cq_file, {"cq_missing_unit"}, "error"),                 # records no consumer can reach
    (_dir_for_first_cq_file, {"cq_file_size", "cq_missing_unit"}, "error"),   # MappedFileQueue.load refuses
    (_zeroed_index_file, {"index_missing_entry"}, "error"),         # the broker starts; query-key misses them
    (_deleted_index_file, {"index_missing_entry"}, "error"),
])
def test_verify_reports_what_the_broker_refuses_or_cannot_serve(damage_fn, kinds, level, store_copy):
    """Seen 3: each of these passed verify --deep before."""
    root = store_copy("dev-sample")
    damage_fn(root)
    findings = list(verify_store(root, deep=True))
    assert {f.kind for f in findings} == kinds, [str(f) for f in findings]
    assert level in {f.severity for f in findings}
    assert run("verify", root, "--strict").exit_code == 1


def test_repair_salvage_keeps_every_valid_record_after_a_bad_one(store_copy, tmp_path):
    """Seen 4: --salvage (beyond the broker) keeps the 133 messages after the bad record: it becomes a
    placeholder the broker steps over; every other record keeps its unit and its index entries."""
    root = store_copy("dev-sample")
    at = _damage_mid_log(root)
    result = run("repair", root, "--salvage", "--apply", "--backup", tmp_path / "bk")
    assert result.exit_code == 0, result.stderr
    assert not [f for f in verify_store(root, deep=True) if f.severity == "error"]
    assert [(f.kind, f.offset) for f in verify_store(root, deep=True)][:1] == [("salvaged_record", at)]
    assert [f.kind for f in verify_store(root, deep=True)][1:] == ["cq_filler_unit"]  # the salvaged record's place
    rows = [json.loads(line) for line in run("cat-commitlog", root, "-f", "jsonl").stdout.splitlines()]
    original = [json.loads(line) for line in
                run("cat-commitlog", FIXTURES / "dev-sample" / "store", "-f", "jsonl").stdout.splitlines()]
    assert [r["physical_offset"] for r in rows] == [r["physical_offset"] for r in original]
    salvaged = next(r for r in rows if r["physical_offset"] == at)
    assert salvaged["topic"] == "rmqtool-salvaged" and salvaged["total_size"] == 283
    assert salvaged["type"] == "salvaged_record"
    refs = Store.open(root).index_files()
    lost = next(r for r in original if r["physical_offset"] == at)
    for q in index_queries(json.loads((FIXTURES / "dev-sample" / "readback.json").read_text("utf-8"))):
        want = sorted(p for p in q["phyOffsets"] if p != at)
        assert sorted(phy for phy, _ in query_index(refs, q["topic"], q["key"])) == want, (q, lost["topic"])
    assert run("repair", root).exit_code == 0


@pytest.mark.parametrize("name", ["dev-sample-crash-torn", "dev-sample-5x-crash-torn"])
@pytest.mark.parametrize("mode", ["--accept-loss", "--salvage"])     # --accept-loss: with --no-salvage
def test_repair_after_a_crash_leaves_no_stale_index_entry(name, mode, store_copy, tmp_path):
    """Seen 4: a bad record in the middle of a crashed store. Crash recovery keeps the older index files, which
    held entries of the damaged (salvage) or lost (accept-loss) records: they are rebuilt too, the
    checkpoint's times come back to the last kept record, verify finds nothing to fix and a second repair
    nothing to do; every kept record's keys are found, the lost ones' are not."""
    root = store_copy(name)
    f, pos, size = _record_at(root, 30)
    _damage(f, pos, size, "bad_magic")
    at = int(f.name) + pos
    done = run("repair", root, "--apply", mode, *(("--no-salvage",) if mode == "--accept-loss" else ()),
               "--backup", tmp_path / "bk")
    assert done.exit_code == 0, done.stderr
    left = [(x.kind, x.offset) for x in verify_store(root, deep=True)
            if x.kind not in ("cq_filler_unit", "salvaged_record")]
    assert left == []
    again = run("repair", root, "-f", "jsonl")
    assert again.exit_code == 0 and again.stdout == ""
    refs = Store.open(root).index_files()
    rb = json.loads((FIXTURES / name / "recovery-readback.json").read_text("utf-8"))
    for q in index_queries(rb):
        want = {p for p in q["phyOffsets"] if p != at and (mode == "--salvage" or p < at)}
        assert {phy for phy, _ in query_index(refs, q["topic"], q["key"])} == want, q     # (the broker's has repeats)


# -- the damage matrix: damage kind x broker version -> level, offset, repair and rebuild result ------
def _record_at(root: Path, nth: int) -> tuple[Path, int, int]:
    """(file, position, size) of the nth message record of commit-log file 0."""
    from rmqtool.format.commitlog import decode_entry
    f = root / "commitlog" / "00000000000000000000"
    data = f.read_bytes()
    pos = 0
    for _ in range(nth):
        pos += decode_entry(data, pos).total_size
    return f, pos, decode_entry(data, pos).total_size


def _damage(f: Path, pos: int, size: int, kind: str) -> None:
    data = bytearray(f.read_bytes())
    if kind == "bad_magic":
        struct.pack_into(">I", data, pos + 4, 0xDEADBEEF)
    elif kind == "crc_mismatch":                # the body's first byte
        from rmqtool.format.commitlog import decode_entry
        msg = decode_entry(data, pos)
        assert msg.body
        data[pos + size - (len(msg.body) + 1 + len(msg.topic_bytes) + 2 + len(msg.properties_raw))] ^= 0xFF
    else:                                      # length_mismatch: the size field lies by 8
        struct.pack_into(">i", data, pos, size + 8)
    f.write_bytes(bytes(data))


MATRIX = [(base, kind) for base in ("dev-sample", "dev-sample-5x")
          for kind in ("bad_magic", "crc_mismatch", "length_mismatch")]


@pytest.mark.parametrize("base,kind", MATRIX)
def test_damage_matrix(base, kind, store_copy, tmp_path):
    """On a store whose file 0 the broker's recovery reads (4.9.7: one of the last three files; 5.3.3: the
    queues end in later files, so it does not): verify's level and offset, the per-version prediction,
    the refusal of repair's loss, the default rebuild keeping every other record, --as-broker's cut."""
    root = store_copy(base)
    f, pos, size = _record_at(root, 20)
    _damage(f, pos, size, kind)
    findings = list(verify_store(root, deep=True))
    hits = [x for x in findings if x.offset == pos and x.path == str(f)]
    assert hits and {x.severity for x in hits} == {"error"}, [str(x) for x in findings]   # a start loses it
    said = {v: [x.message for x in findings if x.kind == "broker_start" and v in x.expected.split()]
            for v in (V4, V5)}
    # 4.9.7 reads all three files of dev-sample at load; dev-sample-5x has four, file 0 outside its window.
    # 5.3.3 starts in the newest file the queues reach. The dispatch starts at the queues' end: with the
    # queues in place, damage outside the recovery window goes unnoticed
    # (the record itself lost to its consumers)
    v4_cuts = base == "dev-sample"
    assert len(said[V4]) == 1 and (f"truncate the commit log at {pos}" in said[V4][0]) == v4_cuts
    assert len(said[V5]) == 1 and "starts without noticing the damaged record" in said[V5][0]
    dry = run("repair", root, "-f", "jsonl")
    rows = [json.loads(line) for line in dry.stdout.splitlines()]
    assert rows[0]["action"] == "salvage_record" and f"damaged record at {pos} " in rows[0]["detail"]
    out = tmp_path / "cq"
    cq_size = "160"
    assert run("rebuild-cq", root, "--out", out, "--cq-file-size", cq_size).exit_code == 0
    units = _units(out)
    assert len(units) == len({k: u for k, u in _units(FIXTURES / base / "store" / "consumequeue").items()}) - 1
    assert all(u[0] != pos for u in units.values())
    for version in (V4, V5):
        broker = tmp_path / f"broker-{version}"
        assert run("rebuild-cq", root, "--out", broker, "--cq-file-size", cq_size, "--as-broker",
                   "--broker-version", version).exit_code == 0
        kept = _units(broker)
        if version == V5 or v4_cuts:           # no consume queues: the recovery starts at file 0 and cuts
            assert kept and max(u[0] for u in kept.values()) < pos


@pytest.mark.parametrize("over", [True, False], ids=["over", "under"])
@pytest.mark.parametrize("base", ["dev-sample", "dev-sample-5x"])
def test_rebuild_cq_as_broker_follows_the_blank_size_rule(base, over, store_copy, tmp_path):
    """broker_model "blank_size": started without consume queues, 5.3.3's recovery stops at an end-of-file BLANK
    whose TOTALSIZE exceeds the rest of the file (its queues end before it); 4.9.7 goes on in the next file, and
    so does 5.3.3 at a smaller size: --as-broker gives every record its unit, as the default rebuild does."""
    import random
    root = store_copy(base)
    _, at = _blank_size(over)(root, random.Random(f"{base}/{over}"))
    assert run("rebuild-cq", root, "--out", tmp_path / "all").exit_code == 0
    every = _units(tmp_path / "all")
    for version in (V4, V5):
        out = tmp_path / version
        assert run("rebuild-cq", root, "--out", out, "--as-broker", "--broker-version", version).exit_code == 0
        cut = version == V5 and over
        assert _units(out) == {k: u for k, u in every.items() if not cut or u[0] < at}
        assert cut <= (max(u[0] for u in every.values()) > at)


@pytest.mark.parametrize("over", [True, False], ids=["over", "under"])
@pytest.mark.parametrize("base", ["dev-sample", "dev-sample-5x"])
def test_repair_rewrites_a_mismatched_blank_in_every_file(base, over, store_copy, tmp_path):
    """broker_model "blank_size": a BLANK whose TOTALSIZE is not the rest of its file, in any commit-log file
    (dev-sample-5x: one before the files its normal recovery reads), is planned in the dry run with its offset
    and rewritten by --apply; then verify has no blank-size finding, a second repair nothing to do, and
    rebuild-cq --as-broker 5.3.3 keeps every unit."""
    import random
    root = store_copy(base)
    path, at = _blank_size(over)(root, random.Random(f"{base}/{over}"))
    dry = run("repair", root, "-f", "jsonl")
    rows = [json.loads(line) for line in dry.stdout.splitlines()][:-1]       # the total row last
    assert dry.exit_code == 1 and [(r["action"], r["path"]) for r in rows] == [("fix_blank_size", path)], dry.output
    assert f"the BLANK at offset {at} " in rows[0]["detail"]
    assert run("repair", root, "--apply", "--backup", tmp_path / "bk").exit_code == 0
    assert not [f for f in verify_store(root, deep=True) if f.kind == "blank_size_mismatch"]
    again = run("repair", root, "-f", "jsonl")
    assert (again.exit_code, again.stdout) == (0, ""), again.output
    assert run("rebuild-cq", root, "--out", tmp_path / "v5", "--as-broker", "--broker-version", V5).exit_code == 0
    assert _units(tmp_path / "v5") == _units(FIXTURES / base / "store" / "consumequeue")


@pytest.mark.parametrize("length", [0, 13, 39])
@pytest.mark.parametrize("base", ["dev-sample", "dev-sample-5x"])
def test_short_checkpoint_is_read_as_the_broker_maps_it(base, length, store_copy, tmp_path):
    """broker_model "checkpoint": StoreCheckpoint.<init> maps one page READ_WRITE, so a short checkpoint reads
    zeros past its end and the broker starts (4.9.7 and 5.x): verify warns (exit 0); rebuild-index works; repair
    plans the checkpoint with its length, --apply rewrites it whole (the fields it lacked from the recovered
    store, the rest kept), then verify says nothing of it and a second repair has nothing to do."""
    root = store_copy(base)
    original = (root / "checkpoint").read_bytes()
    os.truncate(root / "checkpoint", length)
    found = [(f.severity, f.kind, f.offset) for f in verify_store(root, deep=True)]
    assert found == [("warning", "checkpoint_short", length)]
    assert run("verify", root).exit_code == 0
    shown = run("checkpoint", root, "-f", "json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["master_flushed_offset"] == 0   # as the broker reads it
    assert shown.stderr == (f"rmqtool: warning: {root / 'checkpoint'}: checkpoint is {length} bytes, not 4096: the "
                            "broker reads zeros past its end and writes every field at its next flush: "
                            "StoreCheckpoint.<init>; repair rewrites it\n")
    dry = run("repair", root, "-f", "jsonl")
    rows = [json.loads(line) for line in dry.stdout.splitlines()][:-1]       # the total row last
    assert dry.exit_code == 1 and [(r["action"], r["path"]) for r in rows] == [("checkpoint", "checkpoint")]
    assert rows[0]["detail"].startswith(f"{length} bytes -> 4096")
    assert run("repair", root, "--apply", "--backup", tmp_path / "bk").exit_code == 0
    fixed = (root / "checkpoint").read_bytes()
    assert len(fixed) == 4096 and fixed[:length] == original[:length] and fixed[40:] == bytes(4056)
    cp = Store.open(root).checkpoint()
    latest = max(r["storeTimestamp"] for r in json.loads((FIXTURES / base / "readback.json").read_text("utf-8"))
                 ["commitlogRecords"] if r.get("storeTimestamp"))
    assert cp.physic_msg_timestamp == cp.logics_msg_timestamp == latest or length >= 16
    assert not list(verify_store(root, deep=True)) and run("repair", root, "-f", "jsonl").exit_code == 0
    os.truncate(root / "checkpoint", length)
    assert run("rebuild-index", root, "--backup", tmp_path / "bk2", "--apply").exit_code == 0


@pytest.mark.parametrize("command", ["rebuild-cq", "rebuild-index"])
@pytest.mark.parametrize("base", ["dev-sample", "dev-sample-5x"])
def test_stray_commitlog_file_refused_as_the_broker_does(base, command, store_copy, tmp_path):
    """broker_model "commitlog_file_size": a stray 4 KiB commitlog/00000000000000012345 makes MappedFileQueue.load
    fail. verify: that one error, naming the file (the files around it checked as if it were not there);
    --as-broker (both versions): refused in one line naming the file and the rule, exit 4, nothing written; the
    default rebuild: the correct state from the other files (what the clean store gives) and a warning line
    naming the file and that the broker refuses to load this store until it is removed."""
    root = store_copy(base)
    stray = root / "commitlog" / "00000000000000012345"
    stray.write_bytes(bytes(4096))
    found = [(f.severity, f.kind, f.path) for f in verify_store(root, deep=True) if f.severity == "error"]
    assert found == [("error", "wrong_file_size", str(stray))]
    before = snapshot(root)
    out = ("--out", tmp_path / "out") if command == "rebuild-cq" else ("--backup", tmp_path / "bk", "--apply")
    for version in (V4, V5):
        done = run(command, root, *out, "--as-broker", "--broker-version", version)
        assert (done.exit_code, done.stdout) == (4, ""), done.output
        assert done.stderr == (f"rmqtool: error: {stray}: file is 4096 bytes, expected 65536: a {version} broker "
                               "refuses to load this store (rule commitlog_file_size, MappedFileQueue.load): there "
                               "is no broker result to reproduce\n")
        assert snapshot(root) == before and not (tmp_path / "out").exists()
    done = run(command, root, *out)        # refused as every reader refuses it (store.readable)
    assert (done.exit_code, done.stdout) == (4, ""), done.output
    assert done.stderr == (f"rmqtool: error: {stray}: named at offset 12345, between the starts of 65536-byte "
                           "files: it overlaps its neighbours: the broker reads the offsets after it in the wrong "
                           "file (MappedFileQueue.findMappedFileByOffset); a commit log over several directories "
                           "is named DIR;DIR; --read-anyway reads what is readable\n")
    assert snapshot(root) == before and not (tmp_path / "out").exists()
    done = run(command, root, *out, "--read-anyway")      # the other files, as every reader reads them
    assert done.exit_code == 3, done.output
    assert done.stderr.splitlines()[-1] == (f"rmqtool: warning: partial: skipped 0 record(s) and 4096 bytes: {stray}: "
                                            "4096 bytes from offset 12345 (a file off the grid of file names)")
    if command == "rebuild-cq":
        assert _units(tmp_path / "out") == _units(FIXTURES / base / "store" / "consumequeue")
    else:
        refs = Store.open(root).index_files()
        for q in index_queries(json.loads((FIXTURES / base / "readback.json").read_text("utf-8"))):
            assert set(q["phyOffsets"]) <= {phy for phy, _ in query_index(refs, q["topic"], q["key"])}, q
    stray.unlink()
    assert not [f for f in verify_store(root, deep=True) if f.severity == "error"]


@pytest.mark.parametrize("base", ["dev-sample", "dev-sample-5x"])
def test_put_and_import_refuse_a_store_with_a_stray_commitlog_file(base, store_copy, tmp_path):
    """broker_model "commitlog_file_size": appended after a stray file, records would land at offsets the broker
    never maps (it refuses to load the store): put and import refuse in one line naming the file, exit 4, and
    leave the store as it was; once the stray is moved out, put works."""
    root = store_copy(base)
    stray = root / "commitlog" / "00000000000000012345"
    stray.write_bytes(bytes(4096))
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"topic": "T", "body": "b"}) + "\n", "utf-8")
    before = snapshot(root)
    for args in (("put", root, "--topic", "T", "--body", "b", "--apply"), ("import", root, lines, "--apply")):
        done = run(*args, "--backup", tmp_path / f"bk-{args[0]}")
        assert (done.exit_code, done.stdout) == (4, ""), done.output
        assert done.stderr == (f"rmqtool: error: {stray}: file is 4096 bytes, expected 65536: a broker refuses to "
                               "load this store (rule commitlog_file_size, MappedFileQueue.load); move a stray file "
                               "out of the commit-log directory (or restore a truncated one with repair) first\n")
        assert snapshot(root) == before
    stray.unlink()
    assert run("put", root, "--topic", "T", "--body", "b", "--backup", tmp_path / "bk", "--apply").exit_code == 0


# -- batch queues (5.x): recovered and cut by BatchConsumeQueue's own rules --------------------------
def _torn_batch_tail(root: Path) -> int:
    """dev-batchcq-5x with its last batch record (BatchTopic2/0's unit at 87113) torn and the records after it
    gone, as a crash leaves a tail written in part."""
    f = root / "commitlog" / "00000000000000065536"
    data = bytearray(f.read_bytes())
    data[87113 - 65536 + 700:90018 - 65536] = bytes(90018 - 87113 - 700)
    f.write_bytes(bytes(data))
    return 87113


def _bcq_units(root: Path) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    """(topic, queue) -> [(physical offset, msgBaseOffset, batchSize)] of every valid batch unit."""
    from rmqtool.format.batchcq import decode_unit
    out = {}
    for q in sorted((root / "batchconsumequeue").glob("*/*")):
        units = out.setdefault((q.parent.name, int(q.name)), [])
        for f in sorted(q.iterdir()):
            data = f.read_bytes()
            for pos in range(0, len(data) - 45, 46):
                u = decode_unit(data, pos)
                if u.is_valid:
                    units.append((u.physical_offset, u.msg_base_offset, u.batch_size))
    return out


def test_batch_queue_after_a_crash_is_cut_and_repaired_as_the_broker_does(store_copy, tmp_path):
    """Point 5b: a crash tore the last batch record. Recovery cuts the commit log there; the batch queues lose
    the unit pointing at it (BatchConsumeQueue.truncateDirtyLogicFiles), so topic-status gives the cut max;
    repair writes batch units (never classic units for a BatchCQ topic), verify then finds nothing and a
    second repair nothing to do."""
    root = store_copy("dev-batchcq-5x")
    at = _torn_batch_tail(root)
    (root / "abort").write_bytes(b"")
    before = _bcq_units(root)
    status = {(r["topic"], r["queue_id"]): r["max_offset"] for r in
              map(json.loads, run("topic-status", root, "BatchTopic", "BatchTopic2", "-f", "jsonl").stdout.splitlines())}
    want = {q: [u for u in units if u[0] < at] for q, units in before.items()}
    assert before[("BatchTopic2", 0)][-1][0] == at
    assert status == {q: u[-1][1] + u[-1][2] for q, u in want.items()}
    done = run("repair", root, "--apply", "--backup", tmp_path / "bk")
    assert done.exit_code == 0, done.stderr
    assert _bcq_units(root) == want
    assert sorted(p.name for p in (root / "consumequeue").iterdir()) == ["TopicA", "TopicB"]
    assert not [(f.kind, f.path) for f in verify_store(root, deep=True) if f.severity == "error"]
    again = run("repair", root, "-f", "jsonl")
    assert again.exit_code == 0 and again.stdout == ""


def test_batch_unit_past_the_end_is_what_the_broker_drops_on_load(store_copy):
    """Without a crash the 5.x recovery cuts at the torn record too; the batch unit pointing there is
    dropped on every load: a warning with its file and byte offset, not an error."""
    root = store_copy("dev-batchcq-5x")
    at = _torn_batch_tail(root)
    found = [(f.severity, f.kind, Path(f.path).relative_to(root).as_posix(), f.offset, f.actual)
             for f in verify_store(root, deep=True) if "batchconsumequeue" in (f.path or "")]
    assert found == [("warning", "cq_unit_past_end", "batchconsumequeue/BatchTopic2/0/00000000000000000184", 46, at)]


def test_batch_queue_min_offset_after_the_commit_log_head_is_deleted(store_copy):
    """BatchConsumeQueue.correctMinOffset (ConsumeQueueStore.recoverOffsetTable, with the commit log's min offset):
    after the oldest commit-log file is deleted, a batch queue's min offset moves past each unit of its first file
    whose record was in it (msgBaseOffset + batchSize), stopping at the first unit at or after the commit log's
    first offset; topic-status and info give that min."""
    from rmqtool.format.batchcq import decode_unit
    root = store_copy("dev-batchcq-5x")
    (root / "commitlog" / "00000000000000000000").unlink()
    want = {}
    for q in sorted((root / "batchconsumequeue").glob("*/*")):
        first = sorted(q.iterdir())[0].read_bytes()
        units = [decode_unit(first, pos) for pos in range(0, len(first) - 45, 46)]
        low = units[0].msg_base_offset
        for u in units:
            if not u.is_valid or u.physical_offset >= 65536:
                break
            low = u.msg_base_offset + u.batch_size
        want[(q.parent.name, int(q.name))] = low
    assert any(want.values())
    rows = map(json.loads, run("topic-status", root, "BatchTopic", "BatchTopic2", "-f", "jsonl").stdout.splitlines())
    assert {(r["topic"], r["queue_id"]): r["min_offset"] for r in rows} == want
    info = json.loads(run("info", root, "-f", "json").stdout)
    assert {(q["topic"], q["queue_id"]): q["min_queue_offset"] for q in info["batch_consume_queues"]} == want


# -- the census: every kind of corruption the broker's load and recovery checks meet, seeded ---------
def _records(f: Path) -> list[tuple[int, int]]:
    """(position, size) of each message record of a commit-log file."""
    from rmqtool.format.commitlog import Blank, decode_entry
    data, pos, out = f.read_bytes(), 0, []
    while pos + 8 <= len(data) and any(data[pos:pos + 8]):
        entry = decode_entry(data, pos)
        if not isinstance(entry, Blank):
            out.append((pos, entry.total_size))
        pos += entry.total_size
    return out


def _record_damage(kind: str, which: int):
    def damage(root: Path, rng) -> tuple[str, int]:
        f = sorted((root / "commitlog").iterdir())[which]
        pos, size = rng.choice(_records(f)[1:-1])       # a record with records on both sides
        _damage(f, pos, size, kind)
        return f"commitlog/{f.name}", int(f.name) + pos
    return damage


def _cq_wrong_length(root, rng):
    f = sorted((root / "consumequeue" / rng.choice(["TopicA", "TopicB"]) / "0").iterdir())[0]
    os.truncate(f, f.stat().st_size - rng.choice([1, 10, 20]))
    return f.relative_to(root).as_posix(), None


def _stray_in_queue_dir(root, rng):
    f = root / "consumequeue" / "TopicA" / "0" / rng.choice(["x.tmp", "00000000000000000160.bak", "junk"])
    f.write_bytes(b"x")
    return f.relative_to(root).as_posix(), None


def _stray_in_commitlog(root, rng):
    f = root / "commitlog" / f"{rng.randrange(1, 65536):020d}"
    f.write_bytes(bytes(4096))
    return f.relative_to(root).as_posix(), int(f.name)


def _missing_first_cq(root, rng):
    d = root / "consumequeue" / "TopicA" / "0"
    (d / "00000000000000000000").unlink()
    return d.relative_to(root).as_posix(), "any"


def _dir_for_first_cq(root, rng):
    f = root / "consumequeue" / "TopicA" / "0" / "00000000000000000000"
    f.unlink()
    f.mkdir()
    return f.relative_to(root).as_posix(), None


def _truncated_checkpoint(root, rng):
    length = rng.randrange(0, 40)
    os.truncate(root / "checkpoint", length)
    return "checkpoint", length


def _zeroed_index(root, rng):
    f = rng.choice(sorted((root / "index").iterdir()))
    f.write_bytes(bytes(f.stat().st_size))
    return "commitlog", "any"


def _deleted_index(root, rng):
    rng.choice(sorted((root / "index").iterdir())).unlink()
    return "commitlog", "any"


def _slot_past_count(root, rng):
    f = rng.choice(sorted((root / "index").iterdir()))
    data = bytearray(f.read_bytes())
    count = struct.unpack_from(">i", data, 36)[0]
    slot = rng.choice([i for i in range(16) if struct.unpack_from(">i", data, 40 + 4 * i)[0]])
    struct.pack_into(">i", data, 40 + 4 * slot, count + rng.randrange(0, 100))
    f.write_bytes(bytes(data))
    return f.relative_to(root).as_posix(), 40 + 4 * slot


def _blank_size(over: bool):
    """The end-of-file BLANK of a file before the last: its TOTALSIZE beyond the rest of the file, or below it."""
    def damage(root: Path, rng) -> tuple[str, int]:
        from rmqtool.format.commitlog import decode_entry
        f = rng.choice(sorted((root / "commitlog").iterdir())[:-1])
        data = bytearray(f.read_bytes())
        pos = sum(size for _, size in _records(f))
        rest = decode_entry(data, pos).total_size
        assert rest == len(data) - pos
        struct.pack_into(">i", data, pos, rest + rng.randrange(1, 5000) if over else rng.randrange(-5000, rest))
        f.write_bytes(bytes(data))
        return f"commitlog/{f.name}", int(f.name) + pos
    return damage


def _truncated_last_file(root, rng):
    f = sorted((root / "commitlog").iterdir())[-1]
    os.truncate(f, rng.randrange(1, f.stat().st_size))
    return f.relative_to(root).as_posix(), int(f.name)


CENSUS = [
    # (damage, the broker's answer: level and finding kind)
    ("cq_wrong_length", _cq_wrong_length, "error", "cq_file_size"),            # MappedFileQueue.load
    ("stray_in_queue_dir", _stray_in_queue_dir, "error", "stray_file"),
    ("stray_in_commitlog", _stray_in_commitlog, "error", "wrong_file_size"),
    ("missing_first_cq", _missing_first_cq, "error", "cq_missing_unit"),       # records no consumer reaches
    ("dir_for_first_cq", _dir_for_first_cq, "error", "cq_file_size"),
    ("truncated_checkpoint", _truncated_checkpoint, "warning", "checkpoint_short"),  # StoreCheckpoint.<init>
    # the broker starts and never indexes them (its dispatch starts after them): lookups miss for good
    ("zeroed_index", _zeroed_index, "error", "index_missing_entry"),
    ("deleted_index", _deleted_index, "error", "index_missing_entry"),
    ("slot_past_count", _slot_past_count, "error", "index_bad_slot"),          # IndexFile.selectPhyOffset: lookups miss
    ("truncated_last_file", _truncated_last_file, "error", "wrong_file_size"),
    # both versions end the file at such a BLANK (5.3.3's recovery stops at one beyond the rest of the file,
    # outside the files it reads here: test_recovery_rules), CommitLog.checkMessageAndReturnSize
    ("blank_size_over", _blank_size(True), "warning", "blank_size_mismatch"),
    ("blank_size_under", _blank_size(False), "warning", "blank_size_mismatch"),
] + [(f"{kind}_file{which}", _record_damage(kind, which), "error", kind)   # a start loses the record
     for kind in ("bad_magic", "crc_mismatch", "length_mismatch") for which in (0, 1, -1)]


@pytest.mark.parametrize("base", ["dev-sample", "dev-sample-5x"])
@pytest.mark.parametrize("name,damage,level,kind", CENSUS, ids=[c[0] for c in CENSUS])
def test_damage_census(base, name, damage, level, kind, store_copy):
    """Seen 3: each corruption the broker's load or recovery checks meet (seeded choice of file, record,
    slot, size) is reported by verify --deep at the level the broker model gives it, with its path and byte
    offset; an error makes verify exit 1."""
    import random
    root = store_copy(base)
    path, offset = damage(root, random.Random(f"{base}/{name}"))
    found = [(f.severity, f.kind, Path(f.path).relative_to(root).as_posix() if f.path else None, f.offset)
             for f in verify_store(root, deep=True)]
    hits = [x for x in found if x[1] == kind and x[2].startswith(path) and (offset == "any" or x[3] == offset)]
    assert hits and {x[0] for x in hits} == {level}, found
    if kind == "wrong_file_size":       # what MappedFileQueue.load refuses every reader refuses (store.readable)
        codes = [run("verify", root, "--deep", *flag).exit_code for flag in ([], ["--read-anyway"])]
        assert codes == [4, 3]
        return
    assert run("verify", root, "--deep").exit_code == (1 if any(x[0] == "error" for x in found) else 0)


@pytest.mark.slow
@pytest.mark.parametrize("base", ["dev-sample", "dev-sample-5x"])
@pytest.mark.parametrize("name,damage", [c[:2] for c in CENSUS], ids=[c[0] for c in CENSUS])
def test_repair_fixes_each_census_damage_or_says_why_not(base, name, damage, store_copy, tmp_path):
    """Seen 4 (repair fixes everything it finds or says exactly why not): after repair --apply --accept-loss,
    verify finds no error, or repair refused with a one-line error, or each error left is named with the
    command that fixes it; a second repair has nothing to do."""
    import random

    from rmqtool.ops.repair import LEFT_TO
    root = store_copy(base)
    damage(root, random.Random(f"{base}/{name}"))
    before = snapshot(root)
    done = run("repair", root, "--apply", "--accept-loss", "--backup", tmp_path / "bk")
    if done.exit_code in (3, 4):                     # unreadable, or refused: one line, nothing changed
        assert done.stderr.startswith("rmqtool: error: ") and done.stderr.count("\n") == 1
        assert snapshot(root) == before
        return
    errors = [f for f in verify_store(root, deep=True) if f.severity == "error"]
    assert all(f.kind in LEFT_TO for f in errors), [str(f) for f in errors]
    assert done.exit_code == (1 if errors else 0)
    assert all(f"still: {f}" in done.stderr and LEFT_TO[f.kind] in done.stderr for f in errors)
    again = run("repair", root, "-f", "jsonl")
    assert again.stdout == "" and again.exit_code == (1 if "rmqtool: not repaired: " in again.stderr else 0)


def test_repair_dry_run_names_what_it_leaves(store_copy):
    """A store the broker refuses for what repair does not fix (a stray entry, a consume-queue file of the
    wrong size): the dry run plans nothing for it (no queue rewritten from a short file), names each with
    what fixes it and exits 1, the store untouched."""
    root = store_copy("dev-sample")
    (root / "consumequeue" / "TopicA" / "0" / "junk").write_bytes(b"x")
    os.truncate(root / "consumequeue" / "TopicB" / "0" / "00000000000000000000", 150)
    before = snapshot(root)
    dry = run("repair", root, "-f", "jsonl")
    assert (dry.exit_code, dry.stdout) == (1, "")
    assert dry.stderr.splitlines() == [
        "rmqtool: not repaired: consumequeue/TopicA/0/junk: not a file the broker maps (its name is not an offset): "
        "it refuses to load the store [repair removes no file it did not write: move it out of the store]",
        "rmqtool: not repaired: consumequeue/TopicB/0/00000000000000000000: file is 150 bytes, expected 160 "
        "[rebuild-cq rebuilds the queue from the commit log]"]
    assert snapshot(root) == before


# -- the census matrix: damage kind x broker version -> repair and rebuild-cq results, with the offset --------
# Per census kind and store: repair's dry run on the store as it is, and rebuild-cq --as-broker for each
# version (a broker started on it without consume queues). dev-sample is a 4.9.7 store of 3 commit-log files,
# dev-sample-5x a 5.3.3 store of 4 whose consume queues end in its last file.
#   repair: "nothing" (exit 0), "left" (exit 1, each refused file named with what fixes it), "refused" (exit 4,
#   one line), or the first actions planned (exit 1; a lose_messages row names the damaged offset)
#   broker: "all" (every unit at its queue offset), "cut" (exactly the units of records ending at or before
#   the offset: the recovery truncates there), "misplaced" (the units before the offset; the dispatch skips
#   the damaged record or the rest of its file and appends later units at each queue's current position),
#   "refused" (the broker's load fails: --as-broker exits 4 with one line naming the file and the rule)
_QUEUE_FILES = ("left", "all", "all")        # cq_file_size / recognition: the load refuses it; repair leaves the
#                                              queue to rebuild-cq, which reads the commit log only
_INDEX = ("left", "all", "all")              # the broker starts, lookups miss; repair names rebuild-index, which
#                                              fixes it (queues untouched)
CENSUS_RESULTS = {
    "cq_wrong_length": {"dev-sample": _QUEUE_FILES, "dev-sample-5x": _QUEUE_FILES},
    "stray_in_queue_dir": {"dev-sample": _QUEUE_FILES, "dev-sample-5x": _QUEUE_FILES},
    # commitlog_file_size: the broker refuses the store, so --as-broker refuses too (no broker result), and so does
    # repair (it removes no file it did not write); the default rebuild leaves the stray file out and says so
    "stray_in_commitlog": {"dev-sample": ("refused", "refused", "refused"),
                           "dev-sample-5x": ("refused", "refused", "refused")},
    "missing_first_cq": {"dev-sample": _QUEUE_FILES, "dev-sample-5x": _QUEUE_FILES},
    "dir_for_first_cq": {"dev-sample": _QUEUE_FILES, "dev-sample-5x": _QUEUE_FILES},
    # checkpoint: the broker reads zeros past the end of a short one and starts; repair rewrites it
    "truncated_checkpoint": {"dev-sample": (("checkpoint",), "all", "all"),
                             "dev-sample-5x": (("checkpoint",), "all", "all")},
    "zeroed_index": {"dev-sample": _INDEX, "dev-sample-5x": _INDEX},
    "deleted_index": {"dev-sample": _INDEX, "dev-sample-5x": _INDEX},
    "slot_past_count": {"dev-sample": _INDEX, "dev-sample-5x": _INDEX},
    # commitlog_file_size: the broker refuses a store whose last file is short (--as-broker too); the truncated
    # records are gone for every reader; repair restores the file's size, cutting the commit log at the torn end
    # (and the index entries past it when there are any)
    "truncated_last_file": {"dev-sample": (("truncate_commitlog", "index_delete", "index_write"), "refused", "refused"),
                            "dev-sample-5x": (("truncate_commitlog",), "refused", "refused")},
    # blank_size: 4.9.7 ends the file at the BLANK; 5.3.3 stops at an oversized one and deletes the later files.
    # repair rewrites the size in every file, those its recovery reads and older ones (dev-sample-5x: the damaged
    # file 0 or 1 is before the newest file the queues reach, recover_normal_start)
    "blank_size_over": {"dev-sample": (("fix_blank_size",), "all", "cut"),
                        "dev-sample-5x": (("fix_blank_size",), "all", "cut")},
    "blank_size_under": {"dev-sample": (("fix_blank_size",), "all", "all"),
                         "dev-sample-5x": (("fix_blank_size",), "all", "all")},
}
_SALVAGE = ("salvage_record",)
for _kind in ("bad_magic", "crc_mismatch", "length_mismatch"):
    # dev-sample: both versions' recovery reads every file (4.9.7: the last three; 5.3.3: from file 0 without
    # queues) and cuts at the damage (recover_cut, CRC on); repair salvages the record, keeping those after it
    for _which in ("file0", "file1", "file-1"):
        CENSUS_RESULTS[f"{_kind}_{_which}"] = {"dev-sample": (_SALVAGE, "cut", "cut")}
    # dev-sample-5x: 5.3.3 with queues recovers from the last file only, so it never meets damage in files 0 and
    # 1 (their units point at the damaged record); without queues it cuts. 4.9.7 reads files 1-3: file 0 is met
    # by the dispatch only (reput_bad_record: the rest of the file, or the one record whose size disagrees;
    # reput_no_crc). repair salvages the record wherever it is
    CENSUS_RESULTS[f"{_kind}_file0"]["dev-sample-5x"] = \
        (_SALVAGE, "all" if _kind == "crc_mismatch" else "misplaced", "cut")
    CENSUS_RESULTS[f"{_kind}_file1"]["dev-sample-5x"] = (_SALVAGE, "cut", "cut")
    CENSUS_RESULTS[f"{_kind}_file-1"]["dev-sample-5x"] = (_SALVAGE, "cut", "cut")


def _census_cases():
    for name, damage_fn, *_ in CENSUS:
        for base in ("dev-sample", "dev-sample-5x"):
            yield pytest.param(base, name, damage_fn, id=f"{base}-{name}")


@pytest.mark.parametrize("base,name,damage_fn", list(_census_cases()))
def test_census_repair_and_rebuild_per_version(base, name, damage_fn, store_copy, tmp_path):
    """Each census damage x broker version: the default rebuild-cq keeps every undamaged record's unit at its
    stored queue offset (only the damaged record, listed, or the truncated-away records are missing);
    --as-broker for 4.9.7 and 5.3.3 gives the broker model's result at the damaged offset; rebuild-index
    likewise for the key look-ups; repair's dry run plans what the model says, naming that offset."""
    import random
    repair_says, *broker = CENSUS_RESULTS[name][base]
    root = store_copy(base)
    path, offset = damage_fn(root, random.Random(f"{base}/{name}"))
    every = _units(FIXTURES / base / "store" / "consumequeue")
    at = offset if isinstance(offset, int) and path.startswith("commitlog/") else None
    if name == "truncated_last_file":          # the data ends where the file was cut
        at = offset + (root / path).stat().st_size
    ends_by = {k for k, u in every.items() if at is not None and u[0] + u[1] <= at}
    record = name.split("_file")[0] in ("bad_magic", "crc_mismatch", "length_mismatch")
    want = {"all": set(every), "cut": ends_by,
            "skip": set(every) - {k for k, u in every.items() if u[0] == at}}
    default = "cut" if name == "truncated_last_file" else "skip" if record else "all"
    out = tmp_path / "default"
    refused = "refused" in broker      # commitlog_file_size: refused as by every reader, or read anyway (exit 3)
    done = run("rebuild-cq", root, "--out", out, "--cq-file-size", "160", "-f", "jsonl",
               *(("--read-anyway",) if refused else ()))
    assert done.exit_code == (3 if refused else 0), done.output
    got = _units(out)
    assert {k for k in every if got.get(k) == every[k]} == want[default]
    if record:
        assert f"at offset {at} " in done.stdout
    if refused:                         # commitlog_file_size: the correct state, and the partial line naming the file
        assert done.stderr.splitlines()[-1].startswith("rmqtool: warning: partial: ") and path in done.stderr
    for version, says in zip((V4, V5), broker):
        out = tmp_path / version
        done = run("rebuild-cq", root, "--out", out, "--cq-file-size", "160", "--as-broker", "--broker-version",
                   version, "-f", "jsonl")
        if says == "refused":           # no broker result to reproduce: one line naming the file and the rule
            assert (done.exit_code, done.stdout, done.stderr.count("\n")) == (4, "", 1), done.output
            assert path in done.stderr and f"a {version} broker refuses" in done.stderr
            assert "commitlog_file_size" in done.stderr and not out.exists()
            continue
        assert done.exit_code == 0, done.output
        got = _units(out)
        kept = {k for k in every if got.get(k) == every[k]}
        if says == "misplaced":
            assert kept >= ends_by and not kept & {k for k, u in every.items() if u[0] == at}, version
            assert len(set(every) - kept) > 1, version          # later units of the queue moved
            assert {k for k in kept if every[k][0] > at} != {k for k, u in every.items() if u[0] > at}, version
        else:
            assert kept == want[says], (version, says, sorted(every[k] for k in set(every) ^ kept)[:5])
    _census_rebuild_index(base, name, damage_fn, at, (default, *broker), tmp_path)
    dry = run("repair", root, "-f", "jsonl")
    rows = [json.loads(line) for line in dry.stdout.splitlines()]
    if repair_says == "nothing":
        assert (dry.exit_code, rows) == (0, []), dry.output
    elif repair_says == "left":
        assert (dry.exit_code, rows) == (1, []), dry.output
        assert dry.stderr.startswith(f"rmqtool: not repaired: {path}")
    elif repair_says == "refused":
        assert dry.exit_code == 4, dry.output
        assert dry.stderr.startswith("rmqtool: error: ") and dry.stderr.count("\n") == 1 and path in dry.stderr
    else:
        assert dry.exit_code == 1 and [r["action"] for r in rows][:len(repair_says)] == list(repair_says), dry.output
        if "lose_messages" in repair_says:
            assert f"after offset {at} " in rows[0]["detail"]
        if "salvage_record" in repair_says:
            assert f"damaged record at {at} " in rows[0]["detail"]
        if "fix_blank_size" in repair_says:
            assert f"offset {at} " in rows[0]["detail"]


def _census_rebuild_index(base, name, damage_fn, at, says, tmp_path):
    """rebuild-index (default, then --as-broker 4.9.7 and 5.3.3) on copies of the damaged store: which of the
    readback's key look-ups lose their record, per the same results as rebuild-cq's (a wrong-size commit-log
    file: --as-broker refused, exit 4, one line, nothing changed)."""
    import random
    queries = index_queries(json.loads((FIXTURES / base / "readback.json").read_text("utf-8")))
    phys = {p for q in queries for p in q["phyOffsets"]}
    if name == "truncated_last_file":      # the first record the truncation tore
        last = sorted((FIXTURES / base / "store" / "commitlog").iterdir())[-1]
        at = min((int(last.name) + pos for pos, size in _records(last) if int(last.name) + pos + size > at),
                 default=at)
    for i, (args, result) in enumerate(zip(((), ("--broker-version", V4), ("--broker-version", V5)), says)):
        root = tmp_path / f"index-{i}"
        shutil.copytree(FIXTURES / base / "store", root)
        damage_fn(root, random.Random(f"{base}/{name}"))
        before = snapshot(root)
        refused = "refused" in says and not args        # the default reads a refused store only when asked
        done = run("rebuild-index", root, "--apply", "--backup", tmp_path / f"bk-{i}",
                   *(("--as-broker",) + args if args else ("--read-anyway",) if refused else ()))
        if result == "refused":                # commitlog_file_size: the broker does not start
            assert done.exit_code == 4 and done.stderr.count("\n") == 1 and "commitlog_file_size" in done.stderr
            assert snapshot(root) == before
            continue
        assert done.exit_code == (3 if refused else 0), done.output
        refs = Store.open(root).index_files()
        missing = {p for q in queries
                   for p in set(q["phyOffsets"]) - {phy for phy, _ in query_index(refs, q["topic"], q["key"])}}
        if result == "misplaced":              # the index has no queue offsets: the skipped records only
            assert at in missing and all(p >= at for p in missing), args
        else:
            assert missing == (set() if result == "all" else phys & {at} if result == "skip"
                               else {p for p in phys if p >= at}), args
