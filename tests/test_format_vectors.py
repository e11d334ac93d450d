"""The Java-verified vectors of the store-format reference (§2.4, §2.12, §4.1, §4.2, §5.10, §7, §9.2)."""

from __future__ import annotations

import crcmod.predefined
import pytest

from rmqtool.format.commitlog import Message, decode_entry, encode_message
from rmqtool.format.consumequeue import CqUnit, decode_unit, encode_unit
from rmqtool.format.hosts import Host
from rmqtool.format.indexfile import (DEFAULT_GEOMETRY, Geometry, IndexWriter, decode_index_file,
                                      encode_index_file, infer_geometry, select_phy_offsets)
from rmqtool.format.java import body_crc, index_key_hash, java_string_hash, tags_code
from rmqtool.format.msgid import create_message_id, decode_message_id, decode_uniq_key
from rmqtool.format.properties import parse_properties
from rmqtool.store.store import Store

from conftest import store_path

V1_IPV4_HEX = (
    "000000ba daa320a7 69c865ed 00000003 00000000 0000000000000007 00000000000004d2"
    "00000000 0000018bcfe56800 c0a8010a 0000d431 0000018bcfe5687b 0a000001 00002a9f"
    "00000000 0000000000000000 0000000e 48656c6c6f20526f636b65744d51 09 546f70696354657374"
    "0048 4b455953014b45593102554e49515f4b4559014330413830313041443433313138423441414332"
    "303030303030303030303030025741495401747275650254414753015461674102")
V1_IPV6_HEX = (
    "00000080 daa320a7 58932aac 00000000 00000000 0000000000000000 0000000000000000 00000030"
    "0000018bcfe56800 00000000000000000000000000000001 00009c40 0000018bcfe56801"
    "fe800000000000000000000000000001 00002a9f 00000000 0000000000000000 00000002 6869"
    "02 5436 0009 544147530154616741")


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def test_crc_vectors_and_crcmod_reference():
    crc32 = crcmod.predefined.mkCrcFun("crc-32")
    assert body_crc(b"Hello RocketMQ") == 1774740973
    assert crc32(b"123456789") == 0xCBF43926
    assert body_crc(b"123456789") == 1274296614 == crc32(b"123456789") & 0x7FFFFFFF


def test_v1_ipv4_record():
    raw = _hex(V1_IPV4_HEX)
    msg = Message(
        topic="TopicTest", body=b"Hello RocketMQ", queue_id=3, queue_offset=7, physical_offset=1234,
        born_timestamp=1700000000000, born_host=Host.parse("192.168.1.10:54321"),
        store_timestamp=1700000000123, store_host=Host.parse("10.0.0.1:10911"),
        properties_raw=b"KEYS\x01KEY1\x02UNIQ_KEY\x01C0A8010AD43118B4AAC2000000000000\x02WAIT\x01true"
                       b"\x02TAGS\x01TagA\x02")
    assert len(raw) == 186 and encode_message(msg) == raw
    decoded = decode_entry(raw, check_crc=True)
    assert decoded.topic == "TopicTest" and decoded.body == b"Hello RocketMQ"
    assert decoded.properties == {"KEYS": "KEY1", "UNIQ_KEY": "C0A8010AD43118B4AAC2000000000000",
                                  "WAIT": "true", "TAGS": "TagA"}
    assert decoded.msg_id == "0A00000100002A9F00000000000004D2"
    assert decoded.tags_code() == 0x27A807


def test_v1_ipv6_record_and_its_v2_form():
    raw = _hex(V1_IPV6_HEX)
    msg = decode_entry(raw, check_crc=True)
    assert msg.sys_flag == 0x30 and msg.topic == "T6" and msg.body == b"hi"
    assert str(msg.born_host) == "[::1]:40000" and str(msg.store_host) == "[fe80::1]:10911"
    assert msg.msg_id == "FE80000000000000000000000000000100002A9F0000000000000000"
    assert encode_message(msg) == raw
    v2 = _hex(V1_IPV6_HEX.replace("daa320a7", "daa320ab", 1).replace("00000080", "00000081", 1)
              .replace("02 5436", "0002 5436"))
    decoded = decode_entry(v2)
    assert decoded.version == 2 and decoded.total_size == 0x81 and decoded.topic == "T6"
    assert encode_message(decoded) == v2


def test_consume_queue_unit_vector():
    raw = _hex("00000000000004d2 000000ba 000000000027a807")
    assert decode_unit(raw) == CqUnit(1234, 186, 0x27A807)
    assert encode_unit(CqUnit(1234, 186, 0x27A807)) == raw


def test_delay_topic_tags_code_is_deliver_time():
    props = {"DELAY": "3", "TAGS": "TagA"}
    assert tags_code("SCHEDULE_TOPIC_XXXX", props, 1700000000123) == 1700000010123
    assert tags_code("TopicTest", props, 1700000000123) == 0x27A807
    assert tags_code("SCHEDULE_TOPIC_XXXX", {"DELAY": "99"}, 0) == 7_200_000   # clamped to level 18
    with pytest.raises(ValueError):
        tags_code("SCHEDULE_TOPIC_XXXX", {"DELAY": "x"}, 0)


@pytest.mark.parametrize("text,hash_code,index_hash,tags", [
    ("TopicTest#KEY1", -1656969516, 1656969516, 0xFFFFFFFF9D3CA6D4),
    ("TopicTest#KEY2", -1656969515, 1656969515, None),
    ("TagA", 2598919, 2598919, 0x27A807),
    ("TagB", 2598920, None, 0x27A808),
    ("TagA||TagB", 1789476431, None, 0x6AA93E4F),
    ("order_created_event", -2143158446, None, 0xFFFFFFFF8041FF52),
    ("polygenelubricants", -2147483648, 0, 0xFFFFFFFF80000000),
    ("TopicTest#polygenelubricants", 26908034, 26908034, None),
    ("中文", 646394, None, None),
    ("支付", 823177, None, None),
    ("a😀b", 57849694, None, None),
    ("", 0, 0, None),
    ("TopicTest#7F0000010B7418B4AAC208DA6B5F0000", -483035477, 483035477, None),
])
def test_java_hash_vectors(text, hash_code, index_hash, tags):
    assert java_string_hash(text) == hash_code
    if index_hash is not None:
        assert index_key_hash(text) == index_hash
    if tags is not None:
        stored = tags_code("T", {"TAGS": text}, 0) & 0xFFFFFFFFFFFFFFFF
        assert stored == tags


def test_default_geometry_slot_addresses():
    assert DEFAULT_GEOMETRY.file_size == 420_000_040
    assert DEFAULT_GEOMETRY.slot_pos(index_key_hash("TopicTest#KEY1") % 5_000_000) == 7878104
    assert DEFAULT_GEOMETRY.slot_pos(0) == 40
    assert DEFAULT_GEOMETRY.entry_pos(1) == 20000060


INDEX_5_10 = _hex(
    "0000018bcfe56800 0000018bcfe58f0f 0000000000000000 0000000000000190 00000003 00000004"
    + "00000000" * 5 + "00000003 00000002" + "00000000" * 3
    + "00" * 20
    + "62c3592c 0000000000000000 00000000 00000000"
    + "62c3592c 00000000000000c8 00000005 00000001"
    + "62c3592b 0000000000000190 00000009 00000000"
    + "00" * 20 * 4)


def test_index_vector_small_geometry():
    """IndexFile(hashSlotNum=10, indexNum=8) after three puts, with the <= 4.7.0 hashSlotCount rule."""
    geometry = Geometry(10, 8)
    writer = IndexWriter(geometry, hash_slot_count_every_put=True)
    assert writer.put_key("TopicTest#KEY1", 0, 1700000000000)
    assert writer.put_key("TopicTest#KEY1", 200, 1700000005500)
    assert writer.put_key("TopicTest#KEY2", 400, 1700000009999)
    assert len(INDEX_5_10) == 240 and writer.to_bytes() == INDEX_5_10
    modern = IndexWriter(geometry)
    for args in (("TopicTest#KEY1", 0, 1700000000000), ("TopicTest#KEY1", 200, 1700000005500),
                 ("TopicTest#KEY2", 400, 1700000009999)):
        modern.put_key(*args)
    assert modern.header.hash_slot_count == 2
    assert select_phy_offsets(INDEX_5_10, geometry, "TopicTest#KEY1", 0, 2**63 - 1, 64) == [200, 0]
    assert select_phy_offsets(INDEX_5_10, geometry, "TopicTest#KEY1", 1700000003000, 2**63 - 1, 64) == [200]
    assert infer_geometry(INDEX_5_10) == geometry
    assert encode_index_file(decode_index_file(INDEX_5_10)) == INDEX_5_10


def test_index_first_entry_of_a_later_file_is_relative_to_previous_end():
    writer = IndexWriter(Geometry(10, 8), prev_end_phy_offset=400, prev_end_timestamp=1700000009999)
    writer.put_key("TopicTest#KEY3", 600, 1700000020000)
    entry = decode_index_file(writer.to_bytes(), Geometry(10, 8)).entries[1]
    assert entry.time_diff == 10
    assert writer.header.begin_timestamp == 1700000020000


def test_message_id_vectors():
    assert create_message_id(Host.parse("10.0.0.1:10911"), 1234) == "0A00000100002A9F00000000000004D2"
    host, offset = decode_message_id("0A00000100002A9F00000000000004D2")
    assert (str(host), offset) == ("10.0.0.1:10911", 1234)
    host, offset = decode_message_id("FE80000000000000000000000000000100002A9F0000000000000000")
    assert (str(host), offset) == ("[fe80::1]:10911", 0)


def test_uniq_key_vector():
    key = decode_uniq_key("C0A8010AD43118B4AAC208DA6B5F0000")
    assert (key.ip, key.pid, key.class_loader_hash, key.time_diff, key.counter) == (
        "192.168.1.10", 54321, 0x18B4AAC2, 148532063, 0)


def test_uniq_key_time_anchors_on_born_timestamp():
    """The client creates UNIQ_KEY at send time: anchored on the born time it lands within seconds."""
    store = Store.open(store_path("dev-sample-5x"))
    checked = 0
    for msg in store.commitlog.iter_messages():
        if msg.uniq_key:
            key = decode_uniq_key(msg.uniq_key)
            assert key.ip == "fd00::2" or key.ip.count(".") == 3
            assert abs(key.timestamp(msg.born_timestamp) - msg.born_timestamp) < 10_000
            checked += 1
    assert checked > 100


def test_properties_parsers_differ_like_the_brokers():
    raw = "A\x01\x02B\x012\x02\x01X\x02C\x01v\x01w\x02".encode()
    assert parse_properties(raw, legacy=True) == {"": "X", "B": "2"}      # 4.3.1
    assert parse_properties(raw) == {"B": "2", "C": "v\x01w"}            # 4.9.8
