"""DLedger commit logs (4.9.7 and 5.3.3 with DLedger 0.3.1.2): every entry, index unit, BLANK and text file
equals what DLedger itself read back, the records inside entries sit at the broker's physical offsets,
files re-encode byte for byte, and damage gives one-line errors with the byte position."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import DLEDGER_CRASH_SETS, DLEDGER_SETS, FIXTURES, index_queries, readback, run, store_path
from rmqtool.errors import FormatError, StoreError
from rmqtool.format import dledger as D
from rmqtool.store.dledger import DLedgerCommitLog
from rmqtool.store.store import Store
from test_columnar import assert_parity

# (set name, the store directory its readback describes)
STORES = [(n, store_path(n)) for n in DLEDGER_SETS] + \
    [(n, FIXTURES / n / "recovered-store") for n in DLEDGER_CRASH_SETS]
IDS = [n for n, _ in STORES]
KILLED = [store_path(n) for n in DLEDGER_CRASH_SETS]

i32 = st.integers(-2**31, 2**31 - 1)
i64 = st.integers(-2**63, 2**63 - 1)


@pytest.mark.parametrize("name,path", STORES, ids=IDS)
def test_entries_match_readback(name, path):
    cl = Store.open(path).commitlog
    assert isinstance(cl, DLedgerCommitLog)
    ledger = list(cl.iter_ledger())
    entries = [cl.read_entry(le) for le in ledger if le.blank is None]
    want = readback(name)["dledgerEntries"]
    assert [{"index": e.index, "term": e.term, "pos": e.pos, "magic": e.magic, "size": e.size,
             "channel": e.channel, "chainCrc": e.chain_crc, "bodyCrc": e.body_crc, "bodyLength": len(e.body)}
            for e in entries] == want
    assert [le.header for le in ledger if le.blank is None] == [e.header for e in entries]
    blanks = [{"pos": le.pos, "magic": D.BLANK_MAGIC, "size": le.blank.total_size} for le in ledger if le.blank]
    assert blanks == readback(name)["dledgerBlanks"]
    store = readback(name)["dledgerStore"]
    assert (entries[0].index, entries[-1].index, entries[-1].term) == (
        store["ledgerBeginIndex"], store["ledgerEndIndex"], store["ledgerEndTerm"])
    assert entries[-1].pos + entries[-1].size == store["writePos"] == cl.written_end()


@pytest.mark.parametrize("name,path", STORES, ids=IDS)
def test_index_units_match_readback(name, path):
    files = Store.open(path).dledger
    got = [[slot, *unit] for slot, _, unit in files.iter_index_units()]
    assert got == readback(name)["dledgerIndexUnits[slot,magic,pos,size,index,term]"]
    assert [f.path.name for f in files.index_queue()] == [f["file"] for f in readback(name)["dledgerIndexFiles"]]


@pytest.mark.parametrize("name,path", STORES, ids=IDS)
def test_records_sit_in_their_entries(name, path):
    """physicalOffset = entry pos + 48, and the entry index and buffer size the broker reports."""
    cl = Store.open(path).commitlog
    by_pos = {le.pos: le for le in cl.iter_ledger()}
    for exp in readback(name)["commitlogRecords"]:
        le = by_pos[exp["dledgerEntryPos"]]
        assert exp["physicalOffset"] == le.pos + D.HEADER_SIZE
        assert exp["dledgerEntryIndex"] == le.header.index
        assert exp["dledgerBufferSize"] == le.header.size
        assert cl.read_at(exp["physicalOffset"]).queue_offset == exp["queueOffset"]


@pytest.mark.parametrize("name,path", STORES, ids=IDS)
def test_text_files_match_readback(name, path):
    files = Store.open(path).dledger
    cp_text = readback(name)["dledger-n0/checkpoint(raw text)"]
    ct_text = readback(name)["dledger-n0/currterm(raw text)"]
    assert (files.dir / "checkpoint").read_text() == cp_text
    cp = files.checkpoint()
    assert D.encode_ledger_checkpoint(cp) == cp_text
    assert cp.end_index == readback(name)["dledgerStore"]["ledgerEndIndex"]
    assert cp.committed_index == readback(name)["dledgerStore"]["committedIndex"]
    ct = files.currterm()
    assert D.encode_currterm(ct) == ct_text
    assert ct == (0, "n0")


@pytest.mark.parametrize("name", DLEDGER_CRASH_SETS)
def test_killed_store_has_no_ledger_checkpoint(name):
    files = Store.open(store_path(name)).dledger
    before = readback(name)["beforeRecovery"]
    assert (files.checkpoint() is None) == (before["dledger-n0/checkpoint(raw text)"] is None)
    assert D.encode_currterm(files.currterm()) == before["dledger-n0/currterm(raw text)"]


@pytest.mark.parametrize("path", [p for _, p in STORES] + KILLED, ids=IDS + [f"{n}-killed" for n in DLEDGER_CRASH_SETS])
def test_files_reencode_exactly(path):
    store = Store.open(path)
    cl = store.commitlog
    by_file: dict = {}
    for le in cl.iter_ledger():
        by_file.setdefault(le.file.path, []).append(
            D.encode_blank(le.blank) if le.blank else D.encode_entry(cl.read_entry(le)))
    for f in cl.queue:
        data = f.path.read_bytes()
        body = b"".join(by_file.get(f.path, []))
        assert data[:len(body)] == body and not any(data[len(body):])
    for f in store.dledger.index_queue():
        data = f.path.read_bytes()
        assert b"".join(D.encode_index_unit(u) for u in D.decode_index_units(data)) == data


@pytest.mark.parametrize("name,path", STORES, ids=IDS)
def test_index_units_describe_entries(name, path):
    store = Store.open(path)
    entries = [store.commitlog.read_entry(le) for le in store.commitlog.iter_ledger() if le.blank is None]
    assert [u for _, _, u in store.dledger.iter_index_units()] == [D.index_unit_of(e) for e in entries]


@pytest.mark.parametrize("path", [p for _, p in STORES] + KILLED)
def test_columnar_parity(path):
    rows = assert_parity(path, batch_rows=7)
    assert rows and rows[0]["physical_offset"] == D.HEADER_SIZE


def test_spec_vector():
    """store-format §8: the §2.12 record wrapped at pos 0, index 0, term 1 (header and index unit)."""
    entry = D.DLedgerEntry(index=0, term=1, pos=0, body=bytes(0xBA))
    assert D.encode_entry(entry)[:48].hex() == (
        "00000001000000ea0000000000000000000000000000000100000000000000000000000000000000"
        "00000000000000ba")
    assert D.encode_index_unit(D.index_unit_of(entry)).hex() == (
        "00000001" "0000000000000000" "000000ea" "0000000000000000" "0000000000000001")


# -- codecs: hypothesis round trips ------------------------------------------------------------------
@given(index=i64, term=i64, pos=i64, body=st.binary(max_size=300), magic=st.sampled_from(D.VALID_MAGICS),
       channel=i32, chain=i32, crc=i32)
def test_entry_roundtrip(index, term, pos, body, magic, channel, chain, crc):
    entry = D.DLedgerEntry(index, term, pos, body, magic, channel, chain, crc)
    raw = D.encode_entry(entry)
    assert len(raw) == entry.size
    file_start = pos - 100
    assert D.decode_entry(bytes(100) + raw, 100, file_start) == entry
    assert D.encode_entry(D.decode_entry(bytes(100) + raw, 100, file_start)) == raw


@given(st.builds(D.IndexUnit, i32, i64, i32, i64, i64))
def test_index_unit_roundtrip(unit):
    raw = D.encode_index_unit(unit)
    assert len(raw) == D.INDEX_UNIT_SIZE and D.decode_index_unit(raw) == unit
    assert D.decode_index_units(raw * 3) == [unit] * 3


@given(size=st.integers(8, 400), filler=st.binary(min_size=0, max_size=1))
def test_blank_roundtrip(size, filler):
    blank = D.DLedgerBlank(size, (filler * size)[:size - 8] if filler else b"")
    raw = D.encode_blank(blank)
    assert len(raw) == size and raw[:4] == b"\xff\xff\xff\xff"
    back = D.decode_entry(b"x" * 10 + raw, 10, 1000)
    assert isinstance(back, D.DLedgerBlank) and back.total_size == size and back.physical_offset == 1010
    assert D.encode_blank(back) == raw


@given(committed=st.integers(-1, 2**62), end=st.integers(-1, 2**62), term=st.integers(0, 2**62),
       leader=st.one_of(st.none(), st.from_regex(r"n[0-9a-z]{1,6}", fullmatch=True)))
def test_text_files_roundtrip(committed, end, term, leader):
    cp = D.LedgerCheckpoint(committed, end)
    assert D.decode_ledger_checkpoint(D.encode_ledger_checkpoint(cp)) == cp
    ct = D.CurrentTerm(term, leader)
    assert D.decode_currterm(D.encode_currterm(ct)) == ct


# -- damage ------------------------------------------------------------------------------------------
def _first_data_file(root):
    return sorted((root / "dledger-n0" / "data").iterdir())[0]


def _entry_positions(root):
    return [le.pos for le in Store.open(root).commitlog.iter_ledger() if le.blank is None]


def test_truncated_index_unit_and_bad_text():
    with pytest.raises(FormatError, match="truncated DLedger index unit"):
        D.decode_index_unit(bytes(31))
    with pytest.raises(FormatError) as err:
        D.decode_index_units(bytes(70))
    assert err.value.offset == 64
    with pytest.raises(FormatError, match="not key=value"):
        D.decode_ledger_checkpoint("committedIndex 3\n")
    with pytest.raises(FormatError, match="endIndex"):
        D.decode_ledger_checkpoint("committedIndex=3\n")


@pytest.mark.parametrize("damage,where,reason", [
    ("pos", 0, "records position"),          # entry header says another position
    ("size", 0, "body size"),                # size and bodySize disagree
    ("magic", 0, "bad DLedger entry magic"),
    ("inner", 48, "bad magic code"),         # the record inside the entry
])
def test_damaged_entry_is_one_line_error(store_copy, damage, where, reason):
    root = store_copy("dev-dledger")
    pos = _entry_positions(root)[3]
    path = _first_data_file(root)
    data = bytearray(path.read_bytes())
    at = {"pos": pos + 24 + 7, "size": pos + 4 + 3, "magic": pos + 3, "inner": pos + 48 + 7}[damage]
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError) as err:
        list(Store.open(root).commitlog.iter_entries())
    assert err.value.offset == pos + where and err.value.path == str(path) and reason in str(err.value)
    # the columnar scan yields the same records before the damage and raises the same error
    assert_parity(root)
    result = run("cat-commitlog", root, "-f", "jsonl")
    assert result.exit_code != 0
    last = result.stderr.strip().splitlines()[-1] if result.stderr else result.output.strip().splitlines()[-1]
    assert f"offset {pos + where}" in last and "Traceback" not in result.output


def test_torn_last_entry(store_copy):
    root = store_copy("dev-dledger-5x")
    last = sorted((root / "dledger-n0" / "data").iterdir())[-1]
    pos = _entry_positions(root)[-1]
    data = last.read_bytes()
    cut = pos - int(last.name) + 60
    last.write_bytes(data[:cut] + bytes(len(data) - cut))   # the tail of the last entry is lost
    with pytest.raises(FormatError) as err:
        list(Store.open(root).commitlog.iter_entries())
    assert err.value.offset == pos + D.HEADER_SIZE
    got = list(Store.open(root).commitlog.iter_entries(stop_at_damage=True))
    assert got[-1].offset + got[-1].entry.total_size == pos
    assert_parity(root)


def test_record_boundaries_and_offsets():
    cl = Store.open(store_path("dev-dledger")).commitlog
    recs = [loc for loc in cl.iter_entries(include_blank=False)]
    # start at a record (pos + 48) or at its entry (pos): the same walk
    assert next(cl.iter_entries(recs[5].offset)).offset == recs[5].offset
    assert next(cl.iter_entries(recs[5].offset - 48)).offset == recs[5].offset
    with pytest.raises(StoreError, match="neither a DLedger entry"):
        next(cl.iter_entries(recs[5].offset + 1))


def test_bare_data_dir_and_file_are_dledger():
    data = store_path("dev-dledger") / "dledger-n0" / "data"
    second = sorted(data.iterdir())[1]
    for path, start in ((data, 0), (second, int(second.name))):
        cl = Store.open(path).commitlog
        assert isinstance(cl, DLedgerCommitLog)
        assert next(cl.iter_entries()).offset == start + D.HEADER_SIZE


# -- read commands -----------------------------------------------------------------------------------
def _ok_output(*args):
    result = run(*args)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("name", DLEDGER_SETS)
def test_read_commands(name):
    root = store_path(name)
    rb = readback(name)
    recs = rb["commitlogRecords"]
    rows = [json.loads(line) for line in _ok_output("cat-commitlog", root, "-f", "jsonl").splitlines()]
    assert [r["physical_offset"] for r in rows] == [r["physicalOffset"] for r in recs]
    assert [r["msg_id"] for r in rows] == [r["msgId"] for r in recs]
    one = json.loads(_ok_output("cat-commitlog", root, "--offset", recs[7]["physicalOffset"], "-n", "1", "-f", "json"))
    assert one[0]["uniq_key"] == recs[7]["uniqKey"]
    q = rb["consumeQueues"][0]
    out = json.loads(_ok_output("cat-cq", root, q["topic"], q["queueId"], "--resolve", "-f", "json"))
    assert [[u["queue_offset"], u["physical_offset"], u["size"], u["tags_code"]] for u in out] == \
        q["units[queueOffset,commitLogOffset,size,tagsCode]"]
    assert {u["status"] for u in out} == {"ok"}
    found = json.loads(_ok_output("query-id", root, recs[-1]["msgId"], "-f", "json"))
    assert found[0]["physical_offset"] == recs[-1]["physicalOffset"]
    query = next(q for q in index_queries(rb) if q["key"] != recs[0]["uniqKey"] and len(q["phyOffsets"]) == 1)
    hits = json.loads(_ok_output("query-key", root, query["topic"], query["key"], "-f", "json"))
    assert [h["physical_offset"] for h in hits] == query["phyOffsets"]
    info = json.loads(_ok_output("info", root, "-f", "json"))
    assert info["messages"] == len(recs) and info["max_physical_offset"] == rb["maxPhyOffset"]
    stats = json.loads(_ok_output("stats", root, "-f", "json"))
    assert sum(r["messages"] for r in stats) == len(recs)


def test_export_and_grep(tmp_path):
    import pyarrow.parquet as pq

    root = store_path("dev-dledger-5x")
    recs = readback("dev-dledger-5x")["commitlogRecords"]
    _ok_output("export", root, "--to", tmp_path / "out.parquet", "--include-blank")
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["physical_offset"] for r in table if r["type"] == "message"] == [r["physicalOffset"] for r in recs]
    assert [(r["physical_offset"], r["magic_code"]) for r in table if r["type"] == "blank"] == \
        [(b["pos"], "0xffffffff") for b in readback("dev-dledger-5x")["dledgerBlanks"]]
    hits = [json.loads(line) for line in _ok_output("grep", root, "--topic", "TopicB", "-f", "jsonl").splitlines()]
    assert [h["physical_offset"] for h in hits] == [r["physicalOffset"] for r in recs if r["topic"] == "TopicB"]


def test_spark_data_source_reads_dledger_partitions():
    """The rocketmq data source's partitions and reader (run here without a JVM): one partition per
    DLedger data file, records at the broker's offsets."""
    pytest.importorskip("pyspark.sql.datasource")
    from rmqtool.spark.datasource import RocketMQReader

    root = store_path("dev-dledger")
    reader = RocketMQReader([str(root)], "commitlog", True, False, False)
    parts = reader.partitions()
    assert [p.value.name for p in parts] == [p.name for p in sorted((root / "dledger-n0" / "data").iterdir())]
    rows = [r for p in parts for b in reader.read(p) for r in b.to_pylist() if r["type"] == "message"]
    recs = readback("dev-dledger")["commitlogRecords"]
    assert [(r["physical_offset"], r["msg_id"], r["crc_ok"]) for r in rows] == \
        [(r["physicalOffset"], r["msgId"], True) for r in recs]
