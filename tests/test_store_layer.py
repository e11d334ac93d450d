"""Store layer: file queues with inferred sizes, offsets across files, end of data, single files, config."""

from __future__ import annotations

import os
import shutil
import sys

import pytest
from hypothesis import given, settings, strategies as st

from conftest import FIXTURES, UPSTREAM, readback, store_path
from rmqtool.errors import FormatError, StoreError
from rmqtool.format.commitlog import Blank, Message, encode_message
from rmqtool.format.consumequeue import decode_ext_unit, ext_addr_to_offset
from rmqtool.format.java import java_string_hash
from rmqtool.store.config import parse_fastjson
from rmqtool.format.consumequeue import CqUnit, decode_written_units, encode_units, valid_prefix
from rmqtool.store import filequeue
from rmqtool.store.filequeue import (FileQueue, first_difference, first_nonzero, first_nonzero_byte, map_file,
                                     same_content)
from rmqtool.store.store import Store


def test_file_sizes_are_inferred_from_the_files():
    store = Store.open(store_path("dev-sample"))
    assert store.commitlog.file_size == 65536
    assert {q.queue.file_size for q in store.consume_queues()} == {160}
    crash = Store.open(store_path("dev-sample-crash"))
    assert {q.queue.file_size for q in crash.consume_queues()} == {800}


def test_locate_maps_every_record_offset_to_its_file():
    store = Store.open(store_path("dev-sample"))
    for loc in store.commitlog.iter_entries():
        f, pos = store.commitlog.queue.locate(loc.offset)
        assert f == loc.file and f.start + pos == loc.offset
    with pytest.raises(StoreError):
        store.commitlog.queue.locate(10**12)


def test_walk_starts_at_any_record_boundary():
    store = Store.open(store_path("dev-sample-5x"))
    offsets = [loc.offset for loc in store.commitlog.iter_entries()]
    for start in offsets[::17]:
        assert [loc.offset for loc in store.commitlog.iter_entries(start)] == offsets[offsets.index(start):]


def test_end_of_data_in_preallocated_files():
    """Crash stores end inside a file followed by an all-zero pre-allocated next file."""
    store = Store.open(store_path("dev-sample-crash"))
    last_file = store.commitlog.queue.files[-1]
    assert not any(last_file.path.read_bytes())
    entries = list(store.commitlog.iter_entries())
    end = entries[-1].offset + entries[-1].entry.total_size
    assert store.commitlog.written_end() == end < last_file.start
    kinds = [type(loc.entry) for loc in entries]
    assert kinds.count(Blank) == len(store.commitlog.queue) - 2   # every full file ends with a BLANK


def test_single_commitlog_file_keeps_its_start_offset(tmp_path):
    src = store_path("dev-sample") / "commitlog" / "00000000000000065536"
    store = Store.open(src)
    entries = list(store.commitlog.iter_entries())
    expected = [r for r in readback("dev-sample")["commitlogRecords"] if 65536 <= r["physicalOffset"] < 131072]
    assert [loc.offset for loc in entries] == [r["physicalOffset"] for r in expected]
    renamed = tmp_path / "segment.bin"          # a file not named by its offset starts at 0
    shutil.copy(src, renamed)
    assert list(Store.open(renamed).commitlog.iter_entries())[0].offset == 0


def test_commitlog_directory_alone_opens():
    store = Store.open(store_path("dev-sample") / "commitlog")
    assert len(list(store.commitlog.iter_entries())) == len(readback("dev-sample")["commitlogRecords"])
    assert store.consume_queues() == [] and store.index_files() == [] and store.checkpoint() is None


def test_wrong_size_and_missing_files_are_reported(store_copy):
    root = store_copy("dev-sample")
    (root / "commitlog" / "00000000000000065536").unlink()
    with open(root / "commitlog" / "00000000000000131072", "ab") as fh:
        fh.write(b"\0" * 10)
    queue = FileQueue.from_dir(root / "commitlog")
    problems = [msg for _, msg in queue.problems()]
    assert any("expected 131072" in m for m in problems)
    assert any("65546 bytes" in m for m in problems)


def test_damage_in_the_middle_raises_with_path_and_offset(store_copy):
    root = store_copy("dev-sample")
    target = readback("dev-sample")["commitlogRecords"][5]["physicalOffset"]
    path = root / "commitlog" / "00000000000000000000"
    data = bytearray(path.read_bytes())
    data[target + 4:target + 8] = b"\x12\x34\x56\x78"
    path.write_bytes(bytes(data))
    store = Store.open(root)
    with pytest.raises(FormatError) as err:
        list(store.commitlog.iter_entries())
    assert err.value.offset == target and err.value.path.endswith("00000000000000000000")
    assert "bad magic code 0x12345678" in str(err.value)
    assert len(list(store.commitlog.iter_entries(stop_at_damage=True))) == 5


def test_not_a_store_and_missing_paths(tmp_path):
    with pytest.raises(StoreError):
        Store.open(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="not a RocketMQ store"):
        Store.open(tmp_path / "empty")


def test_fastjson_config_with_unquoted_integer_keys():
    assert Store.open(store_path("dev-sample")).config("delayOffset.json") == {"offsetTable": {"1": 2, "2": 2}}
    text = '{"offsetTable":{"T@G":{0:123,1:456}},"note":"{7:8}","n":-1}'
    assert parse_fastjson(text) == {"offsetTable": {"T@G": {"0": 123, "1": 456}}, "note": "{7:8}", "n": -1}
    with pytest.raises(FormatError):
        parse_fastjson("{nope")


def test_5x_checkpoint_has_the_extra_fields():
    cp = Store.open(store_path("dev-sample-5x")).checkpoint()
    assert (cp.master_flushed_offset, cp.confirm_phy_offset) == (0, 0)
    assert cp.physic_msg_timestamp > 0


def test_record_after_blank_in_next_file(tmp_path):
    """A hand-made two-file log: message + BLANK padding, then the next file's records."""
    size = 512
    first = encode_message(Message(topic="T", body=b"a" * 100, physical_offset=0))
    blank_len = size - len(first)
    f0 = first + blank_len.to_bytes(4, "big") + bytes.fromhex("cbd43194") + bytes(blank_len - 8)
    second = encode_message(Message(topic="T", body=b"b", physical_offset=size))
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(f0)
    (tmp_path / "commitlog" / f"{size:020d}").write_bytes(second + bytes(size - len(second)))
    entries = list(Store.open(tmp_path).commitlog.iter_entries())
    assert [(loc.offset, type(loc.entry).__name__) for loc in entries] == [
        (0, "Message"), (len(first), "Blank"), (size, "Message")]


UPSTREAM_STORES = sorted(p.parent for p in UPSTREAM.glob("*/**/commitlog")) if UPSTREAM.is_dir() else []


@pytest.mark.skipif(not UPSTREAM_STORES, reason="upstream store files not present beside the project")
@pytest.mark.parametrize("root", UPSTREAM_STORES, ids=lambda p: p.relative_to(UPSTREAM).parts[0])
def test_upstream_stores_decode(root):
    store = Store.open(root)
    entries = list(store.commitlog.iter_entries(check_crc=True))
    messages = [loc.entry for loc in entries if isinstance(loc.entry, Message)]
    assert len(messages) >= 47 and store.commitlog.file_size == 8192
    for loc in entries:
        if isinstance(loc.entry, Message):
            assert loc.entry.physical_offset == loc.offset
            assert loc.entry.properties_raw.endswith(b"\x02")      # <= 4.9.0 brokers keep the separator
            assert loc.entry.properties["TAGS"] == "TAG1"


@pytest.mark.skipif(not (UPSTREAM / "EricPanGopher-rocketmq").is_dir(), reason="upstream files not present")
def test_upstream_consume_queue_ext_addresses_resolve():
    """A 4.2 store with ConsumeQueueExt: CQ tagsCodes are ext addresses of units holding the real tagsCode."""
    root = UPSTREAM / "EricPanGopher-rocketmq" / "store" / "unit_test_store"
    store = Store.open(root)
    (cq,) = store.consume_queues()
    ext = store.consume_queue_ext(cq.topic, cq.queue_id)
    units = list(cq.iter_units())
    assert units and all(u.has_ext_address for _, u in units)
    for _, unit in units:
        f, pos = ext.locate(ext_addr_to_offset(unit.tags_code))
        ext_unit = decode_ext_unit(f.read(), pos)
        msg = store.commitlog.read_at(unit.physical_offset)
        assert msg.total_size == unit.size
        assert ext_unit.tags_code == java_string_hash(msg.tags)
        assert ext_unit.msg_store_time == msg.store_timestamp
    assert store.checkpoint() is not None and store.abort_path.exists()


def test_fixture_sets_are_complete():
    for name in ("dev-sample", "dev-sample-5x"):
        assert (FIXTURES / name / "readback.json").is_file()



def _resident_pages(path) -> int:
    """Pages of a file in the page cache: mincore(2) over a private map that is never written."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    vec = (ctypes.c_ubyte * ((len(mm) + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
    anchor = ctypes.c_char.from_buffer(mm)
    rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(len(mm)), vec)
    del anchor
    mm.close()
    assert rc == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec)


@pytest.mark.skipif(sys.platform != "linux", reason="mincore and posix_fadvise as Linux has them")
def test_reading_a_preallocated_queue_leaves_its_hole_out_of_the_page_cache(tmp_path):
    """The kernel's read-around (read_ahead_kb) on a map fault would bring a pre-allocated file's hole
    into the page cache as zero pages: 12 GB for 2,000 queues of a large store."""
    path = tmp_path / "00000000000000000000"
    with open(path, "wb") as fh:
        fh.write(encode_units([CqUnit(100 * i, 100, 0) for i in range(1000)]))     # 20,000 bytes, 5 pages
        fh.truncate(6_000_000)
        fh.flush()
        os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if os.stat(path).st_blocks * 512 > 1 << 20 or _resident_pages(path):
        pytest.skip("this file system keeps no holes, or its pages cannot be dropped")
    assert valid_prefix(map_file(path)) == (1000, 100 * 999 + 100)
    assert len(decode_written_units(map_file(path))) == 1000
    assert _resident_pages(path) <= 16         # the data's pages and the first read's, not the hole
    assert first_nonzero(path, 20_000) is None
    assert _resident_pages(path) <= 16


@pytest.mark.parametrize("size", [0, 1, 16, 17, 1024, 1041, 65536, 65553, 1 << 20])
def test_first_nonzero_byte_at_every_block_edge(size):
    """The block-by-block search (blocks of 64 KiB, 1 KiB, 16 bytes) finds what bytes.lstrip finds."""
    assert first_nonzero_byte(bytes(size)) is None
    for at in sorted({0, 15, 16, 1023, 1024, 65535, 65536, size // 3, size - 1} & set(range(size))):
        data = bytearray(size)
        data[at] = 1
        data[-1] |= 2
        assert first_nonzero_byte(bytes(data)) == at == size - len(bytes(data).lstrip(b"\0"))


@given(st.binary(max_size=3000), st.integers(0, 2999), st.integers(1, 255), st.integers(0, 70_000),
       st.booleans())
@settings(max_examples=300, deadline=None)
def test_first_difference_is_where_the_files_first_differ(data, at, xor, zeros, longer):
    """Two files' data (each read as followed by zeros): the first differing position, block by block, as a
    byte-by-byte walk finds it, with differences anywhere and either one longer."""
    a = bytes(data) + bytes(zeros)
    b = bytearray(a)
    if at < len(b):
        b[at] ^= xor
    if longer:
        b += bytes([xor])
    n = max(len(a), len(b))
    want = next((i for i, (x, y) in enumerate(zip(a.ljust(n, b"\0"), bytes(b).ljust(n, b"\0"))) if x != y), None)
    assert first_difference(a, bytes(b)) == first_difference(bytes(b), a) == want
    assert first_difference(a.rstrip(b"\0"), a) is None


_SPARSE = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9000)), max_size=4)   # (page, bytes) written


@given(_SPARSE, _SPARSE, st.integers(0, 200_000), st.integers(0, 2), st.sampled_from([4096, 5000, 1 << 20]))
@settings(max_examples=200, deadline=None)
def test_same_content_compares_every_byte_either_file_holds(tmp_path_factory, writes_a, writes_b, size, change, chunk):
    """Two sparse files (data at any pages, holes between, the same data or one byte changed, or another
    size): same_content says what comparing their whole bytes says, whatever the compare's buffer size."""
    tmp = tmp_path_factory.mktemp("same")
    a, b = tmp / "a", tmp / "b"
    for path, writes in ((a, writes_a), (b, writes_a + writes_b)):
        with open(path, "wb") as fh:
            fh.truncate(size)
            for page, n in writes:
                fh.seek(page * 4096)
                fh.write(bytes(range(256)) * (n // 256) + bytes(n % 256))
    if change == 1 and b.stat().st_size:
        data = bytearray(b.read_bytes())
        data[(7919 * len(writes_b)) % len(data)] ^= 0x5A
        b.write_bytes(data)
    elif change == 2:
        with open(b, "ab") as fh:
            fh.write(b"\0")
    old, filequeue._COMPARE = filequeue._COMPARE, chunk
    try:
        assert same_content(a, b) == same_content(b, a) == (a.read_bytes() == b.read_bytes())
        assert same_content(a, a)
    finally:
        filequeue._COMPARE = old


@pytest.mark.skipif(sys.platform != "linux", reason="mincore and posix_fadvise as Linux has them")
def test_an_index_lookup_reads_the_pages_it_touches(tmp_path):
    """A 420 MB index file: a key lookup reads its header, one slot and the chain's entries, not the
    read-ahead window around each (8 MiB apiece where read_ahead_kb is large)."""
    from rmqtool.ops.generate import generate_store
    from rmqtool.ops.query import lookup_key

    generate_store(tmp_path / "s", 256 << 10, file_size=1 << 20, topics=2, queues=1, seed=3)
    index = next((tmp_path / "s" / "index").iterdir())
    store = Store.open(tmp_path / "s")
    offset, msg = next((loc.offset, loc.entry) for loc in store.commitlog.iter_entries(include_blank=False)
                       if loc.entry.keys)
    fd = os.open(index, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if _resident_pages(index):
        pytest.skip("the index file's pages cannot be dropped here")
    hits = lookup_key(Store.open(tmp_path / "s"), msg.topic, msg.keys[0]).records
    assert offset in [o for o, _ in hits]
    assert _resident_pages(index) <= 16


@pytest.mark.parametrize("name", ["dev-sample", "dev-sample-5x", "dev-sample-crash-torn", "dev-lmq-5x"])
def test_the_append_end_from_a_hint_is_the_walks_end(name):
    """A record start from elsewhere (the newest index entry) only shortens the header walk: any hint, a
    record start or not, gives the end (or the refusal) of the walk over the last three files."""
    import json

    from conftest import run

    st = Store.open(store_path(name))
    rows = [json.loads(line) for line in run("cat-commitlog", store_path(name), "-f", "jsonl").stdout.splitlines()]
    starts = [r["physical_offset"] for r in rows]
    try:
        want = st.commitlog.append_end()
    except FormatError as exc:
        want = (exc.path, exc.offset)
    for hint in starts + [s + 1 for s in starts[-5:]] + [0, 1 << 40]:
        try:
            got = st.commitlog.append_end(hint)
        except FormatError as exc:
            got = (exc.path, exc.offset)
        assert got == want, hint
