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


def test_generate_writes_only_a_new_or_empty_directory(tmp_path):
    """A store, or any directory with something in it, is refused (its undo line, rm -r, would take what was
    there); an empty one is filled."""
    args = ["generate", str(tmp_path / "g"), "--size", "10K", "--file-size", "64K", "--no-index"]
    assert run(*args).exit_code == 0
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    (tmp_path / "empty").mkdir()
    for where in ("g", "other"):
        before = sorted(p.name for p in (tmp_path / where).iterdir())
        result = run(*args[:1], tmp_path / where, *args[2:])
        assert (result.exit_code, result.stderr) == (4, f"rmqtool: error: {tmp_path / where}: exists and is not an "
                                                        "empty directory (generate writes a new one)\n")
        assert sorted(p.name for p in (tmp_path / where).iterdir()) == before
    assert run(*args[:1], tmp_path / "empty", *args[2:]).exit_code == 0
    assert (tmp_path / "empty" / "commitlog").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "g", "other"]


def test_a_failed_generate_leaves_nothing(tmp_path, monkeypatch):
    """A write error part-way (disk full, injected at the commit log's third write): exit 4, one line naming the
    directory, and no directory or hidden leftover at all."""
    import errno

    from rmqtool.store import appender

    real, calls = appender.FileSink.__call__, []

    def full(self, start, pos, data):
        calls.append(pos)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, start, pos, data)

    monkeypatch.setattr(appender.FileSink, "__call__", full)
    result = run("generate", tmp_path / "g", "--size", "300K", "--file-size", "64K", "--no-index")
    assert (result.exit_code, result.stderr) == (4, f"rmqtool: error: {tmp_path / 'g'}: No space left on device\n")
    assert len(calls) == 3 and list(tmp_path.iterdir()) == []
