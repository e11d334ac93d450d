"""The compiled scan kernel against the record-at-a-time decoder (``decode_entry``) on random valid and
damaged commit-log files: every field of every record, where the walk stops, and every finding of the
maintenance scan with its byte offset."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqtool import constants as C
from rmqtool.columnar.kernel import PROPERTIES, scan_window
from rmqtool.errors import FormatError
from rmqtool.format.commitlog import Message, decode_entry, encode_message
from rmqtool.format.java import body_crc
from rmqtool.ops.facts import QueueNames, scan_file
from rmqtool.store.filequeue import QueueFile
from tests.test_columnar import messages


def _file(msgs: list[Message], damage, tail: bytes) -> bytes:
    data = bytearray()
    for m in msgs:
        data += encode_message(Message(**{**{k: getattr(m, k) for k in Message.__slots__},
                                          "physical_offset": len(data)}))
    data += tail
    if damage:
        at, patch = damage
        at %= len(data)
        data[at:at + len(patch)] = patch
    return bytes(data)


def test_window_of_small_ipv6_records_is_whole():
    """The msgId texts of the smallest records with an IPv6 store host (56 hex digits each) fit the window's
    buffer: one window holds every record (a buffer sized for IPv4's 32 digits ended it early)."""
    from rmqtool.format.hosts import Host
    v6 = Host(bytes(range(1, 17)), 10911)
    msgs = [Message(topic="T", body=b"", properties_raw=b"", sys_flag=int(C.SysFlag.STOREHOSTADDRESS_V6),
                    born_host=Host(b"\x01\x02\x03\x04", 0), store_host=v6)] * 40
    raw = _file(msgs, None, b"")
    win = scan_window(np.frombuffer(raw, np.uint8), 0, len(raw), items=True)
    assert (win.n, win.next, win.bad) == (40, len(raw), -1)
    assert bytes(win.ids[win["id_off"][-1]:]).decode() == decode_entry(raw, win.starts[-1]).msg_id


@pytest.mark.parametrize("address,port,offset", [(b"\xab\xcd\xef\x9f", -1, 0x7EDCBA9876543210),
                                                  (b"\x00\x0a\xf0\x01", 0x1234ABCD, 0x0123456789ABCDEF),
                                                  (bytes(range(0xF0, 0x100)), 10911, 0xA0)])
def test_msg_ids_have_every_hex_digit_in_place(address, port, offset):
    """The msgId text (store host, then the stored PHYSICALOFFSET, upper-case hex, eight digits a store)
    for digits and letters in every position, IPv4 and IPv6."""
    from rmqtool.format.hosts import Host
    flag = int(C.SysFlag.STOREHOSTADDRESS_V6) if len(address) == 16 else 0
    raw = encode_message(Message(topic="T", body=b"x", properties_raw=b"", sys_flag=flag, physical_offset=offset,
                                 born_host=Host(b"\x01\x02\x03\x04", 0), store_host=Host(address, port)))
    win = scan_window(np.frombuffer(raw, np.uint8), 0, len(raw), items=True)
    assert bytes(win.ids).decode() == decode_entry(raw, 0).msg_id == (
        address + port.to_bytes(4, "big", signed=True) + offset.to_bytes(8, "big")).hex().upper()


def _reference(data: bytes, deep: bool, delay: bool = True):
    """(records, stop position, error or None) of a walk with decode_entry to a BLANK or the zero end of
    data, as the broker's recovery checks (``delay``: a malformed DELAY stops it too)."""
    records, pos = [], 0
    while len(data) - pos >= 8 and data[pos:pos + 8] != bytes(8):
        if data[pos + 4:pos + 8] == C.BLANK_MAGIC_CODE.to_bytes(4, "big"):
            break   # a BLANK ends the file whatever its TOTALSIZE (broker_model rule blank_size)
        try:
            entry = decode_entry(data, pos, check_crc=deep)
            if delay:
                entry.tags_code()
        except (FormatError, ValueError) as exc:
            return records, pos, exc
        records.append((pos, entry))
        pos += entry.total_size
    return records, pos, None


_TAILS = st.sampled_from([b"", bytes(16), (24).to_bytes(4, "big") + C.BLANK_MAGIC_CODE.to_bytes(4, "big") + bytes(16)])
_DAMAGE = st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=4)))


@settings(max_examples=150, deadline=None)
@given(msgs=st.lists(messages(), min_size=1, max_size=20), damage=_DAMAGE, tail=_TAILS,
       crc=st.booleans(), items=st.booleans())
def test_kernel_matches_decode_entry(msgs, damage, tail, crc, items):
    raw = _file(msgs, damage, tail)
    data = np.frombuffer(raw, np.uint8)
    win = scan_window(data, 0, len(data), check_crc=crc, items=items)
    props_in = bytes(win.heap[2]) if items else raw     # copies of the properties, or the file
    records, stop, _ = _reference(raw, deep=False, delay=False)
    if win.bad >= 0:
        assert win.bad == stop and win.n == len(records)
    else:
        assert win.n == len(records) and (win.n == 0 or win.next == stop)
    for i, (pos, m) in enumerate(records[:win.n]):
        assert win.starts[i] == pos and win["total"][i] == m.total_size
        assert win["v2"][i] == (m.version == 2)
        for name in ("body_crc", "queue_id", "flag", "queue_offset", "sys_flag", "born_timestamp",
                     "store_timestamp", "reconsume_times", "prepared_transaction_offset"):
            assert win[name][i] == getattr(m, name), name
        assert win["stored_physical_offset"][i] == m.physical_offset
        born, store = win["born_host_pos"][i], win["store_host_pos"][i]
        assert raw[born:born + len(m.born_host.address)] == m.born_host.address
        assert raw[store:store + len(m.store_host.address)] == m.store_host.address
        for k, (part, value) in enumerate((("body", m.body), ("topic", m.topic_bytes), ("props", m.properties_raw))):
            at, length = win[f"{part}_pos"][i], win[f"{part}_len"][i]
            assert raw[at:at + length] == value, part
            if items:
                at = win[f"{part}_off"][i]
                assert bytes(win.heap[k][at:at + length]) == value, part
        for which, host in (("born", m.born_host), ("store", m.store_host)):
            if len(host.address) == 4:            # an IPv4 host as one int64: address, then port
                key = int(win[f"{which}_key"][i]) & (1 << 64) - 1
                assert key == int.from_bytes(host.address, "big") << 32 | host.port & 0xFFFFFFFF
        if items:
            at = win["id_off"][i]
            assert bytes(win.ids[at:at + len(m.msg_id)]).decode() == m.msg_id
        else:
            assert win["props_high"][i] == (max(m.properties_raw, default=0) >= 0x80)
        if crc:
            assert bool(win["crc_ok"][i]) == (body_crc(m.body) == m.body_crc or not m.body)
        if _utf8(m.properties_raw):
            for name in PROPERTIES:
                s, e = (v[i] for v in win.prop(name))
                assert (props_in[s:e].decode() if s >= 0 else None) == m.properties.get(name), name


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@settings(max_examples=100, deadline=None)
@given(msgs=st.lists(messages(), min_size=1, max_size=20), damage=_DAMAGE, tail=_TAILS, deep=st.booleans())
def test_facts_findings_match_decode_entry(tmp_path_factory, msgs, damage, tail, deep):
    raw = _file(msgs, damage, tail)
    path = tmp_path_factory.mktemp("cl") / "00000000000000000000"
    path.write_bytes(raw)
    facts = scan_file(QueueFile(path, 0, len(raw)), QueueNames(), deep=deep)
    records, stop, error = _reference(raw, deep)
    assert facts.columns["offset"].tolist() == [pos for pos, _ in records]
    assert facts.columns["size"].tolist() == [m.total_size for _, m in records]
    errors = [(f.kind, f.offset) for f in facts.findings if f.severity == "error"]
    if error is None:
        assert facts.stop_offset == stop and all(kind in ("torn_tail", "blank_size_mismatch") for kind, _ in errors)
        blank_size = int.from_bytes(raw[stop:stop + 4], "big", signed=True) if len(raw) - stop >= 8 else None
        if facts.stop == "blank" and blank_size != len(raw) - stop:
            assert ("blank_size_mismatch", stop) in errors
    else:
        assert facts.stop == "invalid" and facts.stop_offset == stop
        assert errors[0][1] == stop
        message = error.message if isinstance(error, FormatError) else f"bad DELAY property: {error}"
        assert [f.message for f in facts.findings if f.offset == stop][0].startswith(message)


# -- output at the kernel's pace: CSV lines per batch are the row writer's bytes ---------------------------
_CELLS = st.sampled_from(["plain", "a,b", 'q"t', "n\nl", "r\rx", "", "ü,\"\n"])


@settings(max_examples=60, deadline=None)
@given(msgs=st.lists(messages(), min_size=1, max_size=12), topics=st.lists(_CELLS, min_size=12, max_size=12),
       values=st.lists(_CELLS, min_size=12, max_size=12), encoding=st.sampled_from(["base64", "hex", "none"]))
def test_csv_lines_are_the_row_writers_bytes(tmp_path_factory, msgs, topics, values, encoding):
    import io

    from rmqtool.cli.output import _write_csv
    from rmqtool.columnar import iter_record_batches
    from rmqtool.columnar.text import csv_header, csv_lines
    from rmqtool.ops.grep import hit_rows

    msgs = [Message(**{**{k: getattr(m, k) for k in Message.__slots__}, "topic": topic or "T", "topic_raw": None,
                       "magic_code": None, "properties_raw": f"TAGS\x01{value}\x02k\x01{value}x".encode()})
            for m, topic, value in zip(msgs, topics, values)]
    d = tmp_path_factory.mktemp("cl") / "commitlog"
    d.mkdir()
    (d / "00000000000000000000").write_bytes(_file(msgs, None, bytes(16)))
    batches = list(iter_record_batches(d, check_crc=True, batch_rows=5))
    want = io.StringIO()
    _write_csv(hit_rows(batches, encoding), None, want)
    got = csv_header(batches[0]) + "".join("".join(csv_lines(b, encoding).to_pylist()) for b in batches)
    assert got == want.getvalue()


@pytest.mark.parametrize("name", ["dev-sample", "dev-dledger-5x", "dev-lmq-5x"])
def test_cat_commitlog_csv_batches_are_the_row_path(name):
    """The batch path (any count) prints what the record-at-a-time path (-n up to FEW_RECORDS) prints."""
    from conftest import run, store_path

    for extra in ([], ["--no-headers"], ["--check-crc", "--body", "hex"]):
        rows = run("cat-commitlog", store_path(name), "-f", "csv", "-n", "100", *extra)
        batches = run("cat-commitlog", store_path(name), "-f", "csv", *extra)
        assert rows.exit_code == batches.exit_code == 0
        assert batches.stdout.startswith(rows.stdout) and rows.stdout.count("\n") >= 100


def test_kernel_works_where_numba_finds_no_cache_location():
    """A read-only install with an unwritable home: numba has no cache locator, the kernel compiles in
    memory instead of failing at import."""
    import subprocess
    import sys

    from conftest import ROOT

    probe = ("import numba.core.caching as caching; caching.CacheImpl._locator_classes = []\n"
             "import numpy as np\nfrom rmqtool.columnar.kernel import load_compiled, scan_window\nload_compiled()\n"
             "print(scan_window(np.zeros(64, np.uint8), 0, 64).bad)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout == "-1\n", proc.stderr
    assert proc.stderr.startswith("rmqtool: note: no writable cache directory") and proc.stderr.count("\n") == 1


def test_kernel_works_with_a_numba_whose_cache_it_cannot_key():
    """A numba release whose cache keeps its index otherwise (no ``_source_stamp``): rmqtool cannot key entries
    on its helpers' sources, so it compiles in memory (no stale machine code), says so in one line, and runs."""
    import subprocess
    import sys

    from conftest import ROOT

    probe = ("import numba.core.caching as caching\ninit = caching.IndexDataCacheFile.__init__\n"
             "def other(self, *a, **k):\n    init(self, *a, **k)\n    del self._source_stamp\n"
             "caching.IndexDataCacheFile.__init__ = other\n"
             "import numpy as np\nfrom rmqtool.columnar.kernel import load_compiled, scan_window\nload_compiled()\n"
             "print(scan_window(np.zeros(64, np.uint8), 0, 64).bad)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout == "-1\n", proc.stderr
    assert proc.stderr.startswith("rmqtool: note: numba ") and "compiling it for this run only" in proc.stderr
    assert proc.stderr.count("\n") == 1


def _signatures(tmp_path, module: str, work: str) -> dict[str, str]:
    """{function: number of compiled signatures} of ``rmqtool.columnar.<module>``'s compiled functions after
    ``work`` ran in a fresh process with an empty cache (compiled code from the first record: no small-input
    path)."""
    import subprocess
    import sys

    from conftest import ROOT

    probe = (f"import numba\nfrom rmqtool.columnar import kernel, {module}\nkernel.load_compiled()\n{work}\n"
             f"for name, f in vars({module}).items():\n"
             "    if isinstance(f, numba.core.registry.CPUDispatcher): print(name, len(f.signatures))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    return dict(line.split() for line in proc.stdout.splitlines())


def test_kernel_compiles_each_function_once(tmp_path):
    """A first bulk command compiles every kernel function for one set of argument types (the mapped file
    and the kernel's copies alike; no Literal[int](0) counters; the scan once with the CRC and once without):
    the first compile stays a few seconds."""
    counts = _signatures(tmp_path, "kernel", (
        "from rmqtool.columnar import iter_record_batches\n"
        "for store in ('fixtures/dev-sample/store', 'fixtures/dev-lmq-5x/store', 'fixtures/dev-dledger/store'):\n"
        "    for crc in (False, True):\n"
        "        for batch in iter_record_batches(store, check_crc=crc): pass"))
    assert counts["_find"] == "1", counts          # its flag as a typed global, not Literal[bool] True or False
    assert counts["_properties"] == counts["_span_copy"] == "1", counts
    assert counts["_scan"] == "2", counts          # with and without the CRC (its tables or None), each once
    assert all(v in ("0", "1") for name, v in counts.items() if name != "_scan"), counts


def test_lines_compile_each_function_once(tmp_path):
    """JSON lines and CSV from stores with maps, lists, nulls, base64 and text bodies compile every function
    of the text renderer (lines.py) for one set of argument types: a first text command compiles it once."""
    counts = _signatures(tmp_path, "lines", (
        "from click.testing import CliRunner\nfrom rmqtool.cli import cli\nfrom rmqtool.ops import scan\n"
        "scan.FEW_BYTES = -1\n"                 # export: the bulk path on a small store too
        "for store in ('fixtures/dev-sample/store', 'fixtures/dev-lmq-5x/store'):\n"
        "    for fmt in ('jsonl', 'csv'):\n"
        "        for body in ('base64', 'text', 'hex'):\n"
        f"            r = CliRunner().invoke(cli, ['export', store, '--to', '{tmp_path}/out.' + fmt, '--force',"
        "                                         '--body-encoding', body])\n"
        "            assert r.exit_code == 0, r.output[-300:]"))
    assert counts["_lengths"] == counts["_render"] == counts["_put_base64"] == counts["_put_int"] == "1", counts
    assert set(counts.values()) == {"1"}, counts


@pytest.mark.slow
def test_facts_and_joins_compile_each_function_once(tmp_path):
    """verify of an ASCII store (the facts pass, not its Arrow fallback; the parent's warm-up over one
    record first) compiles each function of the facts pass, the joins and the queue walk once, and the scan without its
    copies and msgIds (passed as None: compiled out); the CRC once (verify checks the body CRCs of the files a
    broker start's recovery reads: here every file)."""
    work = ("from click.testing import CliRunner\nfrom rmqtool.cli import cli\n"
            "store = {store!r}\n"
            "r = CliRunner().invoke(cli, ['generate', store, '--size', '256K', '--file-size', '128K', '--topics', '3',"
            " '--queues', '2', '--cq-file-size', '6000', '--index-geometry', '64:256'])\n"
            "assert r.exit_code == 0, r.output\n"
            "r = CliRunner().invoke(cli, ['verify', store])\nassert r.exit_code == 0, r.output")
    for module in ("facts", "joins", "units", "kernel"):
        counts = _signatures(tmp_path / module, module, work.format(store=str(tmp_path / f"store-{module}")))
        assert counts[{"facts": "_window_facts", "joins": "_join_units", "units": "_walk_units",
                       "kernel": "_scan"}[module]] == "1", counts
        assert set(counts.values()) <= {"0", "1"}, counts
    assert counts["_msg_id"] == counts["_copy"] == "0", counts
    counts = _signatures(tmp_path / "crc", "crc", work.format(store=str(tmp_path / "store-crc")))
    assert counts["crc32"] == "1" and set(counts.values()) <= {"0", "1"}, counts


def test_a_change_to_a_kernel_helper_alone_recompiles_its_cached_callers_in_other_files(tmp_path):
    """numba keys a cached function on its own file's source; rmqtool.columnar.units' walk calls kernel.py's
    big-endian load, so a new kernel.py alone (an upgrade, a checkout) must not run the walk's old code."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import rmqtool
    shutil.copytree(Path(rmqtool.__file__).parent, tmp_path / "rmqtool", ignore=shutil.ignore_patterns("__pycache__"))
    unit = (1000).to_bytes(8, "big") + (100).to_bytes(4, "big") + bytes(8)
    script = ("from rmqtool.columnar.units import new_state, walk_units\n"
              f"print(walk_units({unit!r}, 0, -1, new_state()).min_phy)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def min_phy() -> str:
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                              check=True, cwd=tmp_path).stdout.strip()

    assert min_phy() == "1000"
    kernel = tmp_path / "rmqtool" / "columnar" / "kernel.py"
    source = kernel.read_text()
    assert "    return np.int64(_be64(d, p))\n" in source
    kernel.write_text(source.replace("    return np.int64(_be64(d, p))\n", "    return np.int64(_be64(d, p)) + 1\n"))
    assert min_phy() == "1001"
