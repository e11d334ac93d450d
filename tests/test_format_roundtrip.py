"""encode(decode(x)) == x, byte for byte, for every record, consume-queue file, index file and checkpoint
of the real-broker fixtures (stores as left by the broker and after its own recovery)."""

from __future__ import annotations

import pytest

from conftest import ALL_SETS, CRASH_SETS, FIXTURES
from rmqtool.format.checkpoint import decode_checkpoint, encode_checkpoint
from rmqtool.format.commitlog import decode_entry, encode_entry
from rmqtool.format.consumequeue import decode_units, encode_units
from rmqtool.format.indexfile import decode_index_file, encode_index_file
from rmqtool.store.store import Store

STORES = [FIXTURES / n / "store" for n in ALL_SETS] + [FIXTURES / n / "recovered-store" for n in CRASH_SETS]
IDS = [f"{p.parent.name}/{p.name}" for p in STORES]


@pytest.mark.parametrize("path", STORES, ids=IDS)
def test_commitlog_files_reencode_exactly(path):
    store = Store.open(path)
    by_file: dict = {}
    for loc in store.commitlog.iter_entries(stop_at_damage=True):
        by_file.setdefault(loc.file.path, []).append(loc)
    assert by_file
    for f in store.commitlog.queue:
        data = f.path.read_bytes()
        pos = 0
        for loc in by_file.get(f.path, []):
            raw = data[pos:pos + loc.entry.total_size]
            assert encode_entry(loc.entry) == raw
            assert encode_entry(decode_entry(raw)) == raw
            pos += len(raw)
        tail = data[pos:]
        torn = "torn" in path.parent.name
        # After the written end: zeros (pre-allocation), or in torn sets the torn record's 20 bytes.
        assert not any(tail) or (torn and not any(tail[20:]))


@pytest.mark.parametrize("path", STORES, ids=IDS)
def test_consume_queue_files_reencode_exactly(path):
    files = [f for q in Store.open(path).consume_queues() for f in q.queue]
    assert files
    for f in files:
        data = f.path.read_bytes()
        assert encode_units(decode_units(data)) == data


@pytest.mark.parametrize("path", STORES, ids=IDS)
def test_index_files_reencode_exactly(path):
    refs = Store.open(path).index_files()
    assert refs
    for ref in refs:
        data = ref.path.read_bytes()
        decoded = decode_index_file(data, ref.geometry)
        assert decoded.header == ref.header
        assert encode_index_file(decoded) == data


@pytest.mark.parametrize("path", STORES, ids=IDS)
def test_checkpoint_reencodes_exactly(path):
    data = (path / "checkpoint").read_bytes()
    assert len(data) == 4096
    assert encode_checkpoint(decode_checkpoint(data)) == data
