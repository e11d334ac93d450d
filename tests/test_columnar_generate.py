"""The synthetic store generator: commit log, consume queues, index and checkpoint agree."""

from __future__ import annotations

from rmqtool.format.commitlog import Blank
from rmqtool.store.store import Store, query_index
from tests.conftest import run


def test_generated_store_is_consistent(tmp_path):
    root = tmp_path / "gen"
    result = run("generate", root, "--size", "300K", "--file-size", "64K", "--cq-file-size", "2000",
                 "--index-geometry", "50:200", "--topics", "3", "--queues", "2", "--seed", "3")
    assert result.exit_code == 0, result.output
    st = Store.open(root)
    entries = list(st.commitlog.iter_entries(check_crc=True))
    files = st.commitlog.queue.files
    assert len(files) == 5 and all(f.length == 64 * 1024 for f in files)
    blanks = [e for e in entries if isinstance(e.entry, Blank)]
    assert [b.offset + b.entry.total_size for b in blanks] == [f.start + f.length for f in files[:-1]]
    messages = {e.offset: e.entry for e in entries if not isinstance(e.entry, Blank)}
    assert all(200 <= len(m.body) <= 500 and m.crc_ok() and m.physical_offset == off
               for off, m in messages.items())
    assert all(3 <= len(m.properties) <= 4 and m.uniq_key and m.tags for m in messages.values())
    units = 0
    for cq in st.consume_queues():
        for queue_offset, unit in cq.iter_units():
            m = messages[unit.physical_offset]
            assert (m.topic, m.queue_id, m.queue_offset, m.total_size, m.tags_code()) == \
                   (cq.topic, cq.queue_id, queue_offset, unit.size, unit.tags_code)
            units += 1
    assert units == len(messages) and len(st.consume_queues()) == 6
    refs = st.index_files()
    assert len(refs) > 1
    for off, m in list(messages.items())[::25]:
        for key in [m.uniq_key] + m.keys:
            assert off in [phy for phy, _ in query_index(refs, m.topic, key)]
    cp = st.checkpoint()
    assert cp.physic_msg_timestamp == max(m.store_timestamp for m in messages.values())


def test_generate_refuses_an_existing_store(tmp_path):
    args = ["generate", str(tmp_path / "g"), "--size", "10K", "--file-size", "64K", "--no-index"]
    assert run(*args).exit_code == 0
    result = run(*args)
    assert result.exit_code == 4 and "already holds a commit log" in result.output
