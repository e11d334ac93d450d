"""Parity of the columnar decoder with the record-at-a-time decoder (iter_entries + entry_row): every
field of every record, BLANKs, the end of written data and damaged records, on the real-broker fixtures,
generated stores and hypothesis-generated commit logs."""

from __future__ import annotations

import datetime as dt
import struct

import pyarrow as pa

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rmqtool.columnar.batches as columnar
from rmqtool import constants as C
from rmqtool.columnar import iter_record_batches
from rmqtool.columnar.decode import COLUMNS
from rmqtool.columnar.props import _per_record
from rmqtool.columnar.text import encode_bodies, text_fallbacks
from rmqtool.errors import FormatError
from rmqtool.format.commitlog import Message, encode_message
from rmqtool.format.hosts import Host
from rmqtool.format.indexfile import Geometry
from rmqtool.ops.generate import generate_store
from rmqtool.store.appender import CommitLogAppender, FileSink
from rmqtool.format.rows import body_field, decode_body, encode_body, entry_row
from rmqtool.store.store import Store
from tests.conftest import ALL_SETS, CLEAN_SETS, CRASH_SETS, FIXTURES, readback


def reference(path) -> tuple[list[dict], str | None]:
    """Rows of the record-at-a-time decoder (plus raw fields) and the error that stopped it."""
    rows = []
    try:
        for loc in Store.open(path).commitlog.iter_entries():
            row = entry_row(loc.entry, loc.offset, body_encoding="none", check_crc=True)
            del row["body_encoding"]
            row["body"] = getattr(loc.entry, "body", None)
            row["properties_raw"] = getattr(loc.entry, "properties_raw", None)
            row["topic_raw"] = getattr(loc.entry, "topic_raw", None)
            if row["properties"] is not None:
                row["properties"] = list(row["properties"].items())
            rows.append(row)
    except FormatError as exc:
        return rows, f"{type(exc).__name__}: {exc} @ {exc.offset}"
    return rows, None


def columnar_rows(path, **kwargs) -> tuple[list[dict], str | None]:
    rows = []
    try:
        for batch in iter_record_batches(path, check_crc=True, **kwargs):
            cols = {}
            for name, col in zip(batch.schema.names, batch.columns):
                if pa.types.is_timestamp(col.type):
                    col = col.cast(pa.int64())   # epoch ms, as in rows (any int64 is a valid value)
                cols[name] = col.to_pylist()
            for values in zip(*cols.values()):
                row = dict(zip(cols, values))
                if row.get("properties") is not None:
                    row["properties"] = [tuple(item) for item in row["properties"]]   # order and repeats count
                rows.append(row)
    except FormatError as exc:
        return rows, f"{type(exc).__name__}: {exc} @ {exc.offset}"
    return rows, None


def projected(row: dict, names) -> dict:
    """A whole row's values of ``names`` (a column, or a property's value)."""
    props = dict(row.get("properties") or [])
    return {n: row[n] if n in row else props.get(n) for n in names}


def assert_columns_parity(path, **kwargs) -> None:
    """Batches of only some columns (every one ``decode_columns`` makes) hold the values of whole ones."""
    names = sorted(COLUMNS)
    whole, whole_error = columnar_rows(path, **kwargs)
    got, got_error = columnar_rows(path, columns=names, **kwargs)
    assert got_error == whole_error
    assert [projected(r, names) for r in got] == [projected(r, names) for r in whole]


def _epoch_ms(value) -> int:
    return (value - dt.datetime(1970, 1, 1)) // dt.timedelta(milliseconds=1)


def assert_parity(path, **kwargs) -> list[dict]:
    expected, expected_error = reference(path)
    got, got_error = columnar_rows(path, **kwargs)
    assert got_error == expected_error
    assert len(got) == len(expected)
    for want, have in zip(expected, got):
        assert have == want, f"record at {want['physical_offset']}"
    return got


STORES = [(name, which) for name in ALL_SETS for which in ("store", "recovered-store")
          if (FIXTURES / name / which).is_dir()]


@pytest.mark.parametrize("name,which", STORES)
def test_fixture_parity(name, which):
    rows = assert_parity(FIXTURES / name / which)
    assert_columns_parity(FIXTURES / name / which)
    assert any(r["type"] == "blank" for r in rows)
    assert all(r["crc_ok"] for r in rows if r["type"] == "message")


@pytest.mark.parametrize("name,which", STORES[:4])
def test_parity_across_batches_and_windows(name, which, monkeypatch):
    monkeypatch.setattr(columnar, "WINDOW_BYTES", 1500)
    assert_parity(FIXTURES / name / which, batch_rows=3)
    assert_columns_parity(FIXTURES / name / which, batch_rows=3)


@pytest.mark.parametrize("name", CLEAN_SETS)
def test_against_broker_readback(name):
    """Ground truth: the real broker's read-back of every record (commitlogRecords)."""
    import base64
    import hashlib
    import ipaddress
    rows = [r for b in iter_record_batches(FIXTURES / name / "store", check_crc=True) for r in b.to_pylist()]
    truth = readback(name)["commitlogRecords"]
    assert len(rows) == len(truth)
    for row, want in zip(rows, truth):
        assert (row["physical_offset"], row["total_size"], row["magic_code"], row["type"]) == \
               (want["physicalOffset"], want["totalSize"], want["magicCode"], want["type"].lower())
        if want["type"] != "MESSAGE":
            continue
        host = lambda h: str(Host(ipaddress.ip_address(h["ip"]).packed, h["port"]))  # noqa: E731
        assert (row["topic"], row["queue_id"], row["queue_offset"], row["sys_flag"], row["flag"],
                row["tags_code"], row["prepared_transaction_offset"], row["uniq_key"], row["msg_id"],
                row["body_crc"], row["reconsume_times"], row["body_length"], row["born_host"],
                row["store_host"], _epoch_ms(row["store_timestamp"]), _epoch_ms(row["born_timestamp"])) == \
               (want["topic"], want["queueId"], want["queueOffset"], want["sysFlag"], want["flag"],
                want["tagsCode"], want["preparedTransactionOffset"], want["uniqKey"], want["msgId"],
                want["bodyCRC"], want["reconsumeTimes"], want["bodyLength"], host(want["bornHost"]),
                host(want["storeHost"]), want["storeTimestamp"], want["bornTimestamp"])
        assert dict(row["properties"]) == want["properties"]
        assert hashlib.sha256(row["body"]).hexdigest() == want["bodySha256"]
        if want.get("bodyBase64") is not None:
            assert base64.b64decode(want["bodyBase64"]) == row["body"]
        assert row["crc_ok"]


@pytest.mark.parametrize("name", [n for n in CRASH_SETS if "torn" in n])
def test_torn_record_is_reported_with_its_offset(name):
    damaged = []
    rows = [r for b in iter_record_batches(FIXTURES / name / "store", on_damage=damaged.append)
            for r in b.to_pylist()]
    assert len(damaged) == 1 and damaged[0].offset == rows[-1]["physical_offset"] + rows[-1]["total_size"]


def test_generated_store_parity(tmp_path, monkeypatch):
    generate_store(tmp_path / "gen", 400_000, file_size=64 * 1024, cq_file_size=2000,
                   index_geometry=Geometry(100, 400), seed=7)
    monkeypatch.setattr(columnar, "WINDOW_BYTES", 20_000)
    rows = assert_parity(tmp_path / "gen", batch_rows=200)
    assert sum(r["type"] == "blank" for r in rows) == 6


# -- hypothesis: random records, hosts, versions, properties, damage ------------------------------------
_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=6)
_prop_raw = st.one_of(
    st.dictionaries(st.sampled_from(["KEYS", "TAGS", "UNIQ_KEY", "DELAY", "a", "ü"]), _text, max_size=4).map(
        lambda d: "\x02".join(f"{k}\x01{v}" for k, v in d.items()).encode()),
    st.lists(st.sampled_from([b"\x01", b"\x02", b"KEYS", b"TAGS", b"UNIQ_KEY", b"REAL_QID", b"A_LONGER_KEY_NAME",
                              b"A_LONGER_KEY_NAMF", b" x  y", b"\xff", b"\xc3\xbc", b"3", b"12345678", b"ab"]),
             max_size=14).map(b"".join),
)
_magic_in_body = struct.pack(">I", C.MESSAGE_MAGIC_CODE)


@st.composite
def messages(draw):
    v6 = draw(st.sampled_from([0, 0x10, 0x20, 0x30]))
    extra = draw(st.sampled_from([0, C.SysFlag.COMPRESSED, C.TransactionType.COMMIT, C.SysFlag.MULTI_TAGS]))
    topic = draw(st.sampled_from(["T", "TopicA", C.RMQ_SYS_SCHEDULE_TOPIC, "x" * 130, "ä"]))
    body = draw(st.one_of(st.binary(max_size=40), st.just(b"ab" + _magic_in_body + struct.pack(">i", 91))))
    host = lambda width, port: Host(bytes(range(1, width - 3)), port)  # noqa: E731
    return Message(
        topic=topic, body=body, properties_raw=draw(_prop_raw), queue_id=draw(st.integers(0, 7)),
        flag=draw(st.integers(-5, 5)), queue_offset=draw(st.integers(0, 2**40)),
        sys_flag=v6 | extra, born_timestamp=draw(st.integers(0, 2**42)),
        born_host=host(C.host_lengths(v6)[0], draw(st.integers(-1, 65535))),
        store_timestamp=draw(st.integers(0, 2**42)), store_host=host(C.host_lengths(v6)[1], 10911),
        reconsume_times=draw(st.integers(0, 3)), body_crc=draw(st.sampled_from([None, 12345])),
        topic_raw=draw(st.sampled_from([None, b"bad\xff"])),
    )


def write_commitlog(d, msgs, file_size: int):
    """A commit log of ``msgs`` (each at the offset it is appended at; one too big for a file is left out)."""
    sink = FileSink(d, file_size)
    sink(0, 0, b"")
    out = CommitLogAppender(file_size, 0, sink)
    for m in msgs:
        record = encode_message(m)
        if len(record) + C.END_FILE_MIN_BLANK_LENGTH <= file_size:
            out.write(encode_message(Message(**{**_fields(m), "physical_offset": out.reserve(len(record))})))
    sink.close()
    return d


@settings(max_examples=60)
@given(msgs=st.lists(messages(), min_size=1, max_size=25), file_size=st.sampled_from([700, 2048]),
       damage=st.one_of(st.none(), st.tuples(st.integers(0, 4000), st.binary(min_size=1, max_size=3))),
       batch_rows=st.sampled_from([1, 4, 1000]))
def test_random_commitlog_parity(tmp_path_factory, msgs, file_size, damage, batch_rows):
    d = write_commitlog(tmp_path_factory.mktemp("cl") / "commitlog", msgs, file_size)
    if damage:
        files = sorted(d.iterdir())
        pos, patch = damage
        target = files[pos * len(files) // 4001]
        data = bytearray(target.read_bytes())
        at = pos % len(data)
        data[at:at + len(patch)] = patch
        target.write_bytes(bytes(data[:len(data)]))
    assert_parity(d, batch_rows=batch_rows)
    assert_columns_parity(d, batch_rows=batch_rows)


def _fields(m: Message) -> dict:
    return {name: getattr(m, name) for name in Message.__slots__}


# -- columnar helpers against their record-at-a-time counterparts -----------------------------------------
_PROP_TOKENS = [b"\x01", b"\x02", b"KEYS", b"TAGS", b"UNIQ_KEY", b"A_LONGER_KEY_NAME", b"A_LONGER_KEY_NAMF", b" a",
                b"\xc3\xbc", b"x", b"12345678"]


def test_irregular_real_queue_ids_are_null_in_both_paths(tmp_path):
    raws = [b"REAL_TOPIC\x01T\x02REAL_QID\x013\x02", b"REAL_QID\x01x1\x02", b"TAGS\x01a\x02", b"REAL_QID\x01+7\x02"]
    msgs = [Message(topic="T", body=b"b", properties_raw=raw) for raw in raws]
    batch = next(iter_record_batches(write_commitlog(tmp_path / "commitlog", msgs, 4096)))
    for cols in (batch.to_pydict(), {k: v.to_pylist() for k, v in _per_record(pa.array(raws, pa.binary())).items()}):
        assert cols["real_topic"] == ["T", None, None, None]
        assert cols["real_queue_id"] == [3, None, None, 7]


@settings(max_examples=100)
@given(bodies=st.lists(st.one_of(st.none(), st.binary(max_size=20)), max_size=30), cut=st.integers(0, 4))
def test_body_encodings_match_encode_body(bodies, cut):
    arr = pa.array(bodies, pa.binary()).slice(min(cut, len(bodies)))
    for encoding in ("base64", "hex", "text"):
        want = [None if b is None else encode_body(b, encoding) for b in arr.to_pylist()]
        assert encode_bodies(arr, encoding).to_pylist() == want
    # text that is not UTF-8 comes in base64, flagged, never with replacement characters
    flags = text_fallbacks(arr).to_pylist()
    for b, flag, text in zip(arr.to_pylist(), flags, encode_bodies(arr, "text").to_pylist()):
        assert flag == (b is not None and body_field(b, "text")[1] == "base64")
        assert b is None or decode_body(text, "base64" if flag else "text") == b


@pytest.mark.parametrize("columns", [None, sorted(COLUMNS), ["type", "topic", "tags_code", C.PROPERTY_KEYS]])
def test_a_batch_makes_no_reference_cycle(columns):
    """A batch's arrays go when the batch goes, by reference counting: nothing of a scan waits for the cyclic
    collector, which the CLI runs rarely (a cycle per window kept ~125 MB per GiB scanned alive)."""
    import gc

    path = FIXTURES / CLEAN_SETS[0] / "store"
    list(iter_record_batches(path, columns=columns, batch_rows=7))        # imports and first-call caches
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        for batch in iter_record_batches(path, columns=columns, batch_rows=7):
            del batch
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()


@settings(max_examples=40, deadline=None)
@given(data=st.data(), name=st.sampled_from(CLEAN_SETS), near=st.sampled_from([1, 3, 16]),
       window=st.sampled_from([1500, 1 << 24]), crc=st.booleans())
def test_a_key_search_decodes_whole_only_the_records_around_its_hits(data, name, near, window, crc):
    """``iter_record_batches(select=RecordFilter.selective())`` (grep's and query-key --scan's key search):
    after the filter, the same rows as every record decoded whole, for any keys (present or not, in many
    records or one), with or without a topic and CRCs, over windows of any size; records far from a hit are
    not decoded whole."""
    from rmqtool.ops.filters import RecordFilter, filter_batch

    path = FIXTURES / name / "store"
    whole = list(iter_record_batches(path, check_crc=crc))
    found = sorted({k for b in whole for ks in b.column("keys").to_pylist() if ks for k in ks}
                   | {u for u in pa.concat_arrays([b.column("uniq_key") for b in whole]).to_pylist() if u})
    keys = data.draw(st.lists(st.sampled_from(found + ["no-such-key"]), min_size=1, max_size=3))
    first_topic = tuple(sorted({t for b in whole for t in b.column("topic").to_pylist() if t}))[:1]
    topics = data.draw(st.sampled_from([(), ("no-such-topic",), first_topic]))
    where = RecordFilter(keys=tuple(keys), topics=topics)

    def kept(batches):
        return [r for b in batches for r in filter_batch(b, where, None, False).to_pylist()]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(columnar, "NEAR", near)
        mp.setattr(columnar, "WINDOW_BYTES", window)
        selected = list(iter_record_batches(path, check_crc=crc, select=where.selective()))
    assert kept(selected) == kept(whole)
    decoded = sum(b.num_rows for b in selected if b.column("type")[0].as_py() == "message")
    hits = len(kept(whole))
    assert decoded <= hits + (hits - 1) * (near - 1) if hits else decoded == 0
