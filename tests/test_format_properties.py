"""Property-based round trips (hypothesis) and truncation / corruption sweeps of the format layer."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given, strategies as st

from conftest import FIXTURES
from rmqtool.errors import FormatError
from rmqtool.format.commitlog import Blank, Message, decode_entry, encode_blank, encode_message
from rmqtool.format.consumequeue import (CqUnit, decode_unit, decode_units, decode_written_units, encode_unit,
                                        encode_units, valid_prefix)
from rmqtool.format.hosts import Host
from rmqtool.format.indexfile import (Geometry, IndexWriter, decode_index_file, encode_index_file,
                                      infer_geometry, select_phy_offsets)
from rmqtool.format.java import body_crc, index_key_hash
from rmqtool.format.properties import encode_properties
from rmqtool.store.store import Store

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TOPIC_CHARS = st.sampled_from("%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
PROP_TEXT = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                    min_size=1, max_size=12)


@st.composite
def hosts(draw, v6: bool) -> Host:
    return Host(draw(st.binary(min_size=16 if v6 else 4, max_size=16 if v6 else 4)),
                draw(st.integers(0, 65535)))


@st.composite
def messages(draw) -> Message:
    born_v6, store_v6 = draw(st.booleans()), draw(st.booleans())
    sys_flag = draw(st.integers(0, 0x7FF)) & ~0x30 | (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
    topic = draw(st.one_of(st.text(TOPIC_CHARS, min_size=1, max_size=255),
                           st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)))
    assume(len(topic.encode("utf-8")) <= 255)
    props = draw(st.dictionaries(PROP_TEXT, PROP_TEXT, max_size=5))
    return Message(
        topic=topic, body=draw(st.binary(max_size=600)),
        properties_raw=encode_properties(props, trailing_separator=draw(st.booleans())),
        queue_id=draw(INT32), flag=draw(INT32), queue_offset=draw(INT64), physical_offset=draw(INT64),
        sys_flag=sys_flag, born_timestamp=draw(INT64), born_host=draw(hosts(born_v6)),
        store_timestamp=draw(INT64), store_host=draw(hosts(store_v6)), reconsume_times=draw(INT32),
        prepared_transaction_offset=draw(INT64))


@given(messages())
def test_message_round_trip(msg):
    raw = encode_message(msg)
    assert len(raw) == msg.total_size
    decoded = decode_entry(raw, check_crc=True)
    expected_magic = 0xDAA320AB if len(msg.topic.encode()) > 127 else 0xDAA320A7
    assert decoded == dataclasses.replace(msg, body_crc=body_crc(msg.body), magic_code=expected_magic)
    assert encode_message(decoded) == raw


@given(messages(), st.dictionaries(PROP_TEXT, PROP_TEXT, max_size=5), st.booleans())
def test_properties_parse_back(msg, props, trailing):
    msg = dataclasses.replace(msg, properties_raw=encode_properties(props, trailing_separator=trailing))
    decoded = decode_entry(encode_message(msg))
    if all(len(k) + len(v) >= 2 for k, v in props.items()):   # items shorter than 3 chars are dropped
        assert decoded.properties == props


@given(messages(), st.data())
def test_truncated_record_raises_format_error_with_offset(msg, data):
    raw = encode_message(msg)
    cut = data.draw(st.integers(0, len(raw) - 1))
    prefix = data.draw(st.binary(max_size=8))
    with pytest.raises(FormatError) as err:
        decode_entry(prefix + raw[:cut], len(prefix))
    assert err.value.offset == len(prefix)


def _fixture_records() -> list[bytes]:
    out = []
    for name in ("dev-sample", "dev-sample-5x"):
        store = Store.open(FIXTURES / name / "store")
        for loc in store.commitlog.iter_entries():
            if loc.offset % 7 == 0 or loc.entry.total_size < 300 or isinstance(loc.entry, Blank):
                data = loc.file.read()
                pos = loc.offset - loc.file.start
                out.append(bytes(data[pos:pos + loc.entry.total_size]))
    return out


def test_truncation_sweep_on_real_records():
    """Every cut of a real record raises the project's own error carrying the offset."""
    records = _fixture_records()
    assert len(records) > 20
    for raw in records:
        for cut in range(len(raw)):
            with pytest.raises(FormatError) as err:
                decode_entry(raw[:cut])
            assert err.value.offset == 0


@given(messages(), st.data())
def test_corrupted_record_never_raises_anything_else(msg, data):
    raw = bytearray(encode_message(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    try:
        decode_entry(bytes(raw), check_crc=data.draw(st.booleans()))
    except FormatError as exc:
        assert exc.offset == 0


def test_huge_length_field_is_not_allocated():
    raw = bytearray(encode_message(Message(topic="T", body=b"x")))
    raw[0:4] = (2**31 - 1).to_bytes(4, "big")
    with pytest.raises(FormatError, match="needs 2147483647"):
        decode_entry(bytes(raw))


@given(st.integers(8, 5000), st.booleans())
def test_blank_round_trip(size, stale):
    padding = bytes(range(256)) * (size // 256 + 1)
    blank = Blank(size, padding[:size - 8] if stale else b"")
    raw = encode_blank(blank)
    assert len(raw) == size
    decoded = decode_entry(raw + b"\0" * 3)
    assert isinstance(decoded, Blank) and encode_blank(decoded) == raw


@given(st.lists(st.tuples(INT64, INT32, INT64).map(CqUnit._make), max_size=50))
def test_consume_queue_units_round_trip(units):
    raw = encode_units(units)
    assert len(raw) == 20 * len(units)
    assert decode_units(raw) == units
    for i, unit in enumerate(units):
        assert decode_unit(raw, 20 * i) == unit
        assert encode_unit(unit) == raw[20 * i:20 * i + 20]


VALID_UNIT = st.tuples(st.integers(0, 2**63 - 1), st.integers(1, 2**31 - 1), INT64).map(CqUnit._make)


@given(st.lists(VALID_UNIT, max_size=3000), st.one_of(st.none(), st.tuples(INT64, INT32, INT64).map(CqUnit._make)),
       st.integers(0, 3000), st.integers(0, 3000))
def test_written_units_stop_where_recovery_stops(units, bad, at, tail):
    """The units before the first with a negative offset or a size <= 0, however long the file."""
    if bad is not None:
        units.insert(min(at, len(units)), bad)
    raw = encode_units(units) + bytes(20 * tail)
    written = next((i for i, u in enumerate(units) if u.physical_offset < 0 or u.size <= 0), len(units))
    assert decode_written_units(raw) == units[:written]
    last = units[written - 1] if written else None
    assert valid_prefix(raw) == (written, last.physical_offset + last.size if last else -1)   # across chunks


@given(st.integers(1, 40), st.integers(2, 60),
       st.lists(st.tuples(st.sampled_from(["k1", "k2", "k3", "order#1", "中文", "a😀b", "x" * 40]),
                          st.integers(0, 2**40), st.integers(0, 10**6)), max_size=80))
def test_index_entries_round_trip_and_chain_walk(slots, capacity, puts):
    geometry = Geometry(slots, capacity)
    writer = IndexWriter(geometry)
    base = 1_700_000_000_000
    stored = []
    for key, phy, dt_ms in sorted(puts, key=lambda p: p[2]):
        if writer.put_key(key, phy, base + dt_ms):
            stored.append((key, phy))
    raw = writer.to_bytes()
    decoded = decode_index_file(raw, geometry)
    assert encode_index_file(decoded) == raw
    assert decoded.header.entry_count == len(stored) == min(len(puts), capacity - 1)
    for number, (key, phy) in enumerate(stored, start=1):
        entry = decoded.entries[number]
        assert (entry.key_hash, entry.phy_offset) == (index_key_hash(key), phy)
    if stored:
        assert infer_geometry(raw) == geometry
    for key in {k for k, _ in stored}:
        want = [p for k, p in reversed(stored) if index_key_hash(k) == index_key_hash(key)]
        assert select_phy_offsets(raw, geometry, key, 0, 2**63 - 1, 10**6) == want


@given(st.integers(1, 40), st.lists(st.tuples(st.sampled_from(["k1", "k2", "k3", "order#1", "中文", "x" * 40]),
                                              st.integers(0, 2**40), st.integers(-2000, 10**6)), max_size=80),
       st.lists(st.integers(1, 80), max_size=6), st.booleans(), st.booleans())
def test_index_keys_put_as_columns_are_put_one_by_one(slots, puts, cuts, every_put, continued):
    """put_hashes (the rebuild's columns, split anywhere) writes the bytes put_key writes key by key, on a new
    file or one continued after an earlier file's end, with either hashSlotCount rule."""
    import numpy as np

    geometry = Geometry(slots, 100)
    prev = (4096, 1_699_999_999_000) if continued else (0, 0)
    one, columns = (IndexWriter(geometry, *prev, hash_slot_count_every_put=every_put) for _ in "ab")
    base = 1_700_000_000_000
    for key, phy, dt_ms in puts:
        one.put_key(key, phy, base + dt_ms)
    hashes = np.array([index_key_hash(k) for k, _, _ in puts], np.int32)
    phys = np.array([p for _, p, _ in puts], np.int64)
    times = np.array([base + t for _, _, t in puts], np.int64)
    bounds = sorted({0, len(puts), *(c for c in cuts if c < len(puts))})
    for lo, hi in zip(bounds, bounds[1:]):
        columns.put_hashes(hashes[lo:hi], phys[lo:hi], times[lo:hi])
    assert columns.to_bytes() == one.to_bytes()



@given(st.lists(st.tuples(INT64, INT64, st.binary(max_size=40)), max_size=30))
def test_consume_queue_ext_units_round_trip(items):
    from rmqtool.format.consumequeue import (CqExtUnit, decode_ext_units, encode_ext_unit, ext_addr_to_offset,
                                             is_ext_addr, offset_to_ext_addr)
    units = [CqExtUnit(*item) for item in items]
    raw = b"".join(encode_ext_unit(u) for u in units) + b"\xff\xff"   # the writer's end-of-file marker
    decoded = decode_ext_units(raw)
    assert [u for _, u in decoded] == units
    for pos, _ in decoded:
        address = offset_to_ext_addr(pos)
        assert is_ext_addr(address) and ext_addr_to_offset(address) == pos
