"""init, put and import: stores written by rmqtool decode back and verify clean."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from conftest import CLEAN_SETS, run, store_path
from helpers_maintain import snapshot
from rmqtool.ops.write import StoreWriter, build_message, init_store
from rmqtool.format.indexfile import Geometry
from rmqtool.ops.verify import verify_store
from rmqtool.store.store import Store, query_index

SMALL = ["--commitlog-file-size", "4096", "--cq-file-size", "160", "--slots", "16", "--max-entries", "64"]


def _export(root) -> list[dict]:
    result = run("cat-commitlog", root, "-f", "jsonl", "--body-encoding", "base64")
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_init_put_decodes_back_and_verifies(tmp_path):
    root = tmp_path / "s"
    assert run("init", root, *SMALL).exit_code == 0
    for i in range(40):      # enough for BLANKs and new commit-log, consume-queue and index files
        result = run("put", root, "--topic", "T", "--queue-id", str(i % 2), "--tag", f"t{i % 3}",
                     "--key", f"k{i} shared", "--property", f"n={i}", "--body", f"body {i} " * 5, "--apply")
        assert result.exit_code == 0, result.stderr
    rows = _export(root)
    assert [r["body"] for r in rows] == [__import__("base64").b64encode((f"body {i} " * 5).encode()).decode()
                                         for i in range(40)]
    assert [r["queue_offset"] for r in rows] == [i // 2 for i in range(40)]
    assert [{k: v for k, v in r["properties"].items() if k != "UNIQ_KEY"} for r in rows] == \
        [{"TAGS": f"t{i % 3}", "KEYS": f"k{i} shared", "n": str(i)} for i in range(40)]
    assert len({r["uniq_key"] for r in rows}) == 40        # a client's UNIQ_KEY each (an empty store: no CLUSTER)
    assert len(list((root / "commitlog").iterdir())) > 1 and len(list((root / "index").iterdir())) > 1
    assert run("verify", root, "--check-crc").exit_code == 0
    refs = Store.open(root).index_files()
    assert [phy for phy, _ in query_index(refs, "T", "k7")] == [rows[7]["physical_offset"]]
    assert len(query_index(refs, "T", "shared")) == 40
    cp = Store.open(root).checkpoint()
    assert cp.physic_msg_timestamp == cp.logics_msg_timestamp == rows[-1]["store_timestamp"]


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_import_round_trip(name, tmp_path):
    source = _export(store_path(name))
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in source))
    a = tmp_path / "a"
    assert run("init", a, "--commitlog-file-size", "65536", "--cq-file-size", "160", "--slots", "16",
               "--max-entries", "64").exit_code == 0
    result = run("import", a, tmp_path / "a.jsonl", "--apply")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"imported": sum(r['type'] == 'message' for r in source)}
    imported = _export(a)
    # re-exports identical: every field, offsets and msgIds included (properties_raw carries the stored
    # bytes, e.g. the real broker's batch records with WAIT twice, which the properties object cannot)
    assert imported == source
    assert run("verify", a, "--check-crc").exit_code == 0
    # a store written by import round-trips byte for byte through its own export
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in imported))
    b = tmp_path / "b"
    init_store(b, commitlog_file_size=65536, cq_file_size=160, geometry=Geometry(16, 64))
    assert run("import", b, tmp_path / "b.jsonl", "--apply").exit_code == 0
    assert _export(b) == imported
    assert {k: v for k, v in snapshot(b).items() if not k.startswith("config")} == \
        {k: v for k, v in snapshot(a).items() if not k.startswith("config")}


def test_put_refuses_hostile_topics_and_damaged_stores(tmp_path, store_copy):
    root = tmp_path / "s"
    init_store(root, commitlog_file_size=4096, cq_file_size=160, geometry=Geometry(16, 64))
    before = {p for p in tmp_path.rglob("*")}
    for topic in ("../../x", "a/b", ".."):
        result = run("put", root, "--topic", topic, "--body", "x", "--apply")
        assert result.exit_code == 2 and "cannot be a consume-queue directory name" in result.stderr   # a bad argument
    assert {p for p in tmp_path.rglob("*")} == before
    crashed = store_copy("dev-sample-crash-torn")
    result = run("put", crashed, "--topic", "T", "--body", "x", "--apply")
    assert result.exit_code == 4 and "run repair first" in result.stderr


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["A", "B_1", "%RETRY%g"]), st.integers(0, 3), st.binary(max_size=300),
                          st.text(alphabet=st.characters(blacklist_characters="\x00\x01\x02 ",
                                                         blacklist_categories=("Cs",)), min_size=1, max_size=8)),
                min_size=1, max_size=25))
def test_written_messages_decode_back(tmp_path_factory, messages):
    root = tmp_path_factory.mktemp("w") / "s"
    init_store(root, commitlog_file_size=2048, cq_file_size=100, geometry=Geometry(5, 12))
    writer = StoreWriter(Store.open(root), backup=root.parent / "bk")
    for topic, qid, body, key in messages:
        writer.append(build_message(topic, body, queue_id=qid, keys=key, store_timestamp=1_700_000_000_000))
    writer.commit()
    store = Store.open(root)
    got = [(m.topic, m.queue_id, m.body, m.keys) for m in store.commitlog.iter_messages()]
    assert got == [(t, q, b, [k]) for t, q, b, k in messages]
    assert list(verify_store(root, deep=True)) == []
