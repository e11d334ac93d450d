"""The per-file record facts of the maintenance commands equal the record-at-a-time decoder's values."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ALL_SETS, DLEDGER_SETS, store_path
from rmqtool.format.commitlog import Blank
from rmqtool.format.java import index_key_hash
from rmqtool.ops.facts import QueueNames, _key_hashes, scan_file
from rmqtool.store.store import Store
from tests.test_columnar import messages
from tests.test_kernel import _DAMAGE, _TAILS, _file


@pytest.mark.parametrize("name", ALL_SETS + DLEDGER_SETS)
@pytest.mark.parametrize("deep", [False, True])
def test_facts_equal_the_decoded_records(name, deep):
    st_ = Store.open(store_path(name))
    ledger = bool(st_.commitlog.entry_header_size)
    want = []
    try:
        for loc in st_.commitlog.iter_entries(check_crc=deep):
            if not isinstance(loc.entry, Blank):
                want.append(loc)
    except Exception:           # crash sets: the walk stops at the torn record, as the facts do
        pass
    names = QueueNames()
    got = []
    for f in st_.commitlog.queue:
        facts = scan_file(f, names, deep=deep, keys=True, ledger=ledger)
        c, ko, kh = facts.columns, facts.key_offsets, facts.key_hashes
        got += [(int(c["offset"][i]), int(c["size"][i]), names.names[c["queue"][i]], int(c["queue_offset"][i]),
                 int(c["sys_flag"][i]), int(c["tags_code"][i]), int(c["store_timestamp"][i]),
                 kh[ko[i]:ko[i + 1]].tolist()) for i in range(len(facts))]
    expected = []
    for loc in want:
        m = loc.entry
        keys = ([m.uniq_key] if m.uniq_key is not None else []) + m.keys
        expected.append((loc.offset, m.total_size, (m.topic, m.queue_id), m.queue_offset, m.sys_flag, m.tags_code(),
                         m.store_timestamp, [index_key_hash(f"{m.topic}#{k}") for k in keys]))
    assert got[:len(expected)] == expected and len(expected) > 100


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@given(st.lists(st.tuples(text, st.none() | text, st.lists(text.filter(bool), max_size=3)), min_size=1, max_size=20))
def test_key_hashes_compose_as_string_hash_code(rows):
    batch = pa.RecordBatch.from_arrays(
        [pa.array([t for t, _, _ in rows], pa.string()), pa.array([u for _, u, _ in rows], pa.string()),
         pa.array([k for _, _, k in rows], pa.list_(pa.string()))], names=["topic", "uniq_key", "keys"])
    counts, hashes = _key_hashes(batch)
    want = [index_key_hash(f"{t}#{k}") for t, u, keys in rows for k in ([u] if u is not None else []) + keys]
    assert hashes.tolist() == want
    assert counts.tolist() == [(u is not None) + len(k) for _, u, k in rows]


@pytest.mark.parametrize("name", ["dev-sample", "dev-dledger-5x"])
def test_whole_store_scans_report_progress_in_record_bytes(name):
    from conftest import readback
    from rmqtool.ops.inspect import store_info
    from rmqtool.ops.verify import verify_store

    want = sum(r["totalSize"] for r in readback(name)["commitlogRecords"] if r.get("type") != "BLANK")
    for run in (lambda p: store_info(Store.open(store_path(name)), p),
                lambda p: list(verify_store(store_path(name), deep=True, progress=p))):
        seen = []
        run(seen.append)
        assert sum(seen) == want and len(seen) >= 1


@pytest.mark.parametrize("name", ALL_SETS + ["dev-batchcq-5x", "dev-lmq-5x", "dev-config-5x", "dev-timer-5x"])
def test_fact_columns_equal_the_full_decoder(name):
    import mmap

    import numpy as np

    from rmqtool.columnar.decode import FACT_COLUMNS, decode_batch, decode_facts
    from rmqtool.columnar.kernel import scan_window

    compared = 0
    for f in Store.open(store_path(name)).commitlog.queue:
        with open(f.path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        data = np.frombuffer(mm, np.uint8)
        win = scan_window(data, 0, len(data), check_crc=True, items=True)
        good = win.n
        if not good:
            continue
        full = decode_batch(data, win, f.start, True)
        lean = decode_facts(data, win, f.start, True)
        for col in FACT_COLUMNS + ("crc_ok",):
            want = full.column(col) if col in full.schema.names else \
                pc.map_lookup(full.column("properties"), pa.scalar(col), "first")
            assert lean.column(col).equals(want), col
        compared += good
    assert compared > 100


def _ascii(m):
    from rmqtool.format.commitlog import Message

    fields = {k: getattr(m, k) for k in Message.__slots__}
    fields["topic"] = m.topic if m.topic.isascii() else "TopicA"
    fields["topic_raw"] = None
    fields["properties_raw"] = bytes(b if b < 128 else 63 for b in m.properties_raw)
    return Message(**fields)


@settings(max_examples=120, deadline=None)
@given(msgs=st.lists(messages(), min_size=1, max_size=20), damage=_DAMAGE, tail=_TAILS, deep=st.booleans(),
       ascii_only=st.booleans())
def test_compiled_facts_equal_the_arrow_path(tmp_path_factory, msgs, damage, tail, deep, ascii_only):
    """scan_file's compiled facts (columnar.facts) and the Arrow columns of decode_facts give the same
    facts, queue codes, key hashes, dispatch properties and findings on random valid and damaged files
    (a window with text that is not ASCII takes the Arrow path)."""
    raw = _file([_ascii(m) for m in msgs] if ascii_only else msgs, damage, tail)
    compiled_windows, records = _assert_both_paths_agree(tmp_path_factory.mktemp("cl"), raw, deep)
    if ascii_only and damage is None and records:
        assert all(compiled_windows)


def test_compiled_facts_take_text_beyond_ascii(tmp_path):
    """Topics, TAGS, KEYS and UNIQ_KEY in other scripts (a code point above U+FFFF too) stay on the compiled
    path, with Java's hashes over UTF-16 code units."""
    from rmqtool.format.commitlog import Message

    props = "TAGS\x01标签\x02KEYS\x01键1 𝄞键2\x02UNIQ_KEY\x01Ü1\x02".encode()
    msgs = [Message(topic=t, properties_raw=props, queue_id=i % 2, queue_offset=i // 4)
            for i, t in enumerate(["主题A", "TopicÄ", "主题A", "TopicÄ"] * 2)]
    compiled_windows, records = _assert_both_paths_agree(tmp_path, _file(msgs, None, b""), True)
    assert records == 8 and compiled_windows and all(compiled_windows)


@settings(max_examples=40, deadline=None)
@given(inner=st.lists(st.booleans(), min_size=1, max_size=30), window=st.sampled_from([1, 300, 2000, 1 << 21]))
def test_dispatch_properties_of_windows_with_and_without_them(tmp_path_factory, inner, window):
    """A file's dispatch properties hold each record's value and null elsewhere, the same whether its windows
    (of one record to all of them) have such a property or not (one without builds none of them)."""
    from unittest import mock

    from rmqtool.format.commitlog import Message
    from rmqtool.ops import facts as facts_mod

    def props(i: int, has: bool) -> bytes:
        return (f"INNER_NUM\x013\x02INNER_BASE\x01{i}\x02INNER_MULTI_DISPATCH\x01%LMQ%q{i}\x02"
                f"INNER_MULTI_QUEUE_OFFSET\x01{i}" if has else f"TAGS\x01t{i}").encode()

    msgs = [Message(topic="T", properties_raw=props(i, has), queue_offset=i) for i, has in enumerate(inner)]
    with mock.patch.object(facts_mod, "WINDOW_BYTES", window):
        _assert_both_paths_agree(tmp_path_factory.mktemp("cl"), _file(msgs, None, b""), True)
        facts = scan_file(_write(tmp_path_factory.mktemp("cl"), _file(msgs, None, b"")), QueueNames(), props=True)
    assert facts.props["INNER_BASE"].to_pylist() == [str(i) if has else None for i, has in enumerate(inner)]
    assert facts.props["INNER_MULTI_DISPATCH"].to_pylist() == [f"%LMQ%q{i}" if has else None
                                                               for i, has in enumerate(inner)]


def _write(directory, raw: bytes):
    from rmqtool.store.filequeue import QueueFile

    path = directory / "00000000000000000000"
    path.write_bytes(raw)
    return QueueFile(path, 0, len(raw))


def _assert_both_paths_agree(directory, raw: bytes, deep: bool) -> tuple[list[bool], int]:
    """scan_file's facts of the commit-log file ``raw`` from the compiled pass and from the Arrow path are
    the same; returns, per window, whether the compiled pass took it, and the records."""
    from unittest import mock

    from rmqtool.ops import facts as facts_mod

    f = _write(directory, raw)
    runs, compiled_windows = [], []
    window_facts = facts_mod.window_facts

    def counted(*args, **kw):
        out = window_facts(*args, **kw)
        compiled_windows.append(out is not None)
        return out

    for compiled in (True, False):
        names = QueueNames()
        with mock.patch.object(facts_mod, "window_facts", counted if compiled else lambda *a, **k: None):
            runs.append((scan_file(f, names, deep=deep, keys=True, props=True), names.names))
    (a, names_a), (b, names_b) = runs
    assert names_a == names_b
    for k in b.columns:
        assert a.columns[k].dtype == b.columns[k].dtype and a.columns[k].tolist() == b.columns[k].tolist(), k
    assert a.key_offsets.tolist() == b.key_offsets.tolist() and a.key_hashes.tolist() == b.key_hashes.tolist()
    assert a.key_hashes.dtype == b.key_hashes.dtype
    assert all(a.props[k].equals(b.props[k]) for k in b.props)
    assert (a.stop, a.stop_offset, a.findings) == (b.stop, b.stop_offset, b.findings)
    return compiled_windows, len(b)
