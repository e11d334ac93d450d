"""Message traces: the 5.3.3 client's trace codec (TraceDataEncoder) and ``rmqtool trace`` against the real
trace set's readback (readback.json -> trace)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqtool.errors import FormatError
from rmqtool.format.trace import (CONSUME_RETURN_TYPES, MESSAGE_TYPES, TRANSACTION_STATES, TraceBean, TraceContext,
                                  decode_trace_data, encode_trace_context, encode_trace_data, java_split, trans_keys)
from tests.conftest import readback, run, store_path

SET = "dev-trace-5x"
STORE = store_path(SET)
CONTEXTS = "contexts(TraceDataEncoder.decoderFromTraceDataString)"
RAW = "traceData(raw, \\u0001 content / \\u0002 field separators)"
# Where decoderFromTraceDataString reads each TraceContext/TraceBean field (by Java name) in a line of each
# type; fields a line does not carry keep Java defaults that are not data (None here).
LAYOUT = {
    "Pub": ["timeStamp", "regionId", "groupName", "topic", "msgId", "tags", "keys", "storeHost", "bodyLength",
            "costTime", "msgType"],
    "SubBefore": ["timeStamp", "regionId", "groupName", "requestId", "msgId", "retryTimes", "keys"],
    "SubAfter": ["requestId", "msgId", "costTime", "success", "keys"],
    "EndTransaction": ["timeStamp", "regionId", "groupName", "topic", "msgId", "tags", "keys", "storeHost", "msgType",
                       "transactionId", "transactionState", "fromTransactionCheck"],
    "Recall": ["timeStamp", "regionId", "groupName", "topic", "msgId", "success"],
}
CONTEXT_FIELDS = {"timeStamp": "time_stamp", "regionId": "region_id", "groupName": "group_name",
                  "requestId": "request_id", "success": "success", "costTime": "cost_time",
                  "contextCode": "context_code"}
BEAN_FIELDS = {"topic": "topic", "msgId": "msg_id", "offsetMsgId": "offset_msg_id", "tags": "tags", "keys": "keys",
               "storeHost": "store_host", "bodyLength": "body_length", "retryTimes": "retry_times",
               "transactionId": "transaction_id", "transactionState": "transaction_state",
               "fromTransactionCheck": "from_transaction_check"}


def _carried(line: list[str]) -> set[str]:
    """The Java fields a split line sets, by its type and length (the decoder's length rules)."""
    kind, n = line[0], len(line)
    carried = set(LAYOUT[kind])
    if kind == "Pub":
        carried |= {"success"} | ({"offsetMsgId"} if n >= 14 else set())
    if kind == "SubAfter":
        carried |= ({"contextCode"} if n >= 7 else set()) | ({"timeStamp", "groupName"} if n >= 9 else set())
    return carried


def _trace():
    return readback(SET)["trace"]


def _expected_contexts():
    """(trace message, context) of the readback, the context's fields its line does not carry set to None."""
    out = []
    for m in _trace()["traceMessages"]:
        for c, line in zip(m[CONTEXTS], _lines(m[RAW]), strict=True):
            carried = _carried(line)
            out.append((m, {k: (v if k not in CONTEXT_FIELDS or k in carried else None) for k, v in c.items()}))
    return out


def _lines(raw: str) -> list[list[str]]:
    """The lines of a trace text the decoder makes a context of."""
    lines = (java_split(context, "\x01") for context in java_split(raw, "\x02"))
    return [line for line in lines if line[0] in LAYOUT]


def _assert_context(ctx: TraceContext, exp: dict, line: list[str]) -> None:
    """Every field the line carries equals the readback's (where the readback has it); every other one is
    absent."""
    assert ctx.trace_type == exp["traceType"] == line[0]
    carried = _carried(line)
    bean, exp_bean = ctx.bean, exp["beans"][0]
    assert len(exp["beans"]) == 1
    for fields, have, want in ((CONTEXT_FIELDS, ctx, exp), (BEAN_FIELDS, bean, exp_bean)):
        for java, name in fields.items():
            if java not in carried:
                assert getattr(have, name) is None, (java, exp)
            elif java in want:
                assert getattr(have, name) == want[java], (java, exp)
    assert ctx.msg_type_name == (exp_bean["msgType"] if "msgType" in carried else None)
    assert bean.msg_type == (exp_bean["msgTypeOrdinal"] if "msgType" in carried else None)


def test_every_trace_record_and_context_equals_the_readback():
    """Every record of the trace topic, read from the store (compressed body included), decodes to the
    readback's contexts, and encodes back to its body byte for byte."""
    from rmqtool.ops.trace import record_contexts, trace_records, trace_topic
    from rmqtool.store.store import Store

    store = Store.open(STORE)
    topic, _ = trace_topic(store)
    assert topic == _trace()["traceTopic"]
    records = list(trace_records(store, topic))
    expected = _trace()["traceMessages"]
    assert [o for o, _ in records] == [m["physicalOffset"] for m in expected]
    assert len(records) == _trace()["traceMessageCount"]
    types = Counter()
    for (offset, msg), exp in zip(records, expected):
        assert (msg.queue_offset, msg.uniq_key, msg.sys_flag) == (exp["queueOffset"], exp["uniqKey"], exp["sysFlag"])
        assert msg.compressed == exp["compressed(ZLIB by the trace producer)"]
        body = msg.decompressed_body()
        assert body.decode("utf-8") == exp[RAW] and len(body) == exp["traceDataUtf8Length"]
        contexts = record_contexts(offset, msg)
        assert len(contexts) == len(exp[CONTEXTS])
        for ctx, exp_ctx, line in zip(contexts, exp[CONTEXTS], _lines(exp[RAW]), strict=True):
            _assert_context(ctx, exp_ctx, line)
            types[ctx.trace_type] += 1
        assert encode_trace_data(contexts).encode("utf-8") == body
        # the KEYS property: a HashSet of every bean's msgId and keys (set order); a bean without keys was
        # encoded as "null" (StringBuilder.append(null)) but added no key
        keys = exp["keysProperty"].split(" ")
        assert len(keys) == len(set(keys))
        assert set(keys) == {k for c in contexts for k in trans_keys(c)} - {"null"}
    assert dict(types) == _trace()["contextsPerType"] and sum(types.values()) == _trace()["contextCount"]


def _sample_ids():
    """Every 9th traced msgId, with the contexts that name it in the readback."""
    by_id: dict[str, list[dict]] = {}
    for _, c in _expected_contexts():
        by_id.setdefault(c["beans"][0]["msgId"], []).append(c)
    return [(k, by_id[k]) for k in sorted(by_id)[::9]]


def _key(row_or_ctx: dict) -> tuple:
    """What a printed row and a readback context (_expected_contexts) must agree on."""
    if "trace_type" in row_or_ctx:
        r = row_or_ctx
        return r["trace_type"], r["time_stamp"], r["group"], r["msg_id"], r["cost_time"], r["success"], r["request_id"]
    c = row_or_ctx
    return (c["traceType"], c["timeStamp"], c["groupName"], c["beans"][0]["msgId"], c["costTime"], c["success"],
            c["requestId"])


def _rows(*args) -> tuple[int, list[dict]]:
    result = run("trace", STORE, *args, "-f", "jsonl")
    return result.exit_code, [json.loads(line) for line in result.stdout.splitlines()]


def test_trace_by_uniq_key_prints_every_context_naming_it():
    samples = _sample_ids()
    assert len(samples) >= 5
    code, rows = _rows(*(msg_id for msg_id, _ in samples))
    assert code == 0
    assert Counter(map(_key, rows)) == Counter(_key(c) for _, cs in samples for c in cs)
    statuses = {r["status"] for r in rows if r["trace_type"] == "SubAfter"}
    assert statuses <= set(CONSUME_RETURN_TYPES) and statuses


def test_trace_by_offset_msg_id_and_by_key():
    """An offsetMsgId names its record's UNIQ_KEY; a key names every context carrying it (also by --scan)."""
    pub = next(c for _, c in _expected_contexts() if c["traceType"] == "Pub" and c["beans"][0]["keys"] != "null")
    uniq, offset_id = pub["beans"][0]["msgId"], pub["beans"][0]["offsetMsgId"]
    naming = [c for _, c in _expected_contexts() if c["beans"][0]["msgId"] == uniq]
    code, rows = _rows(offset_id)
    assert code == 0 and Counter(map(_key, rows)) == Counter(map(_key, naming))
    key = pub["beans"][0]["keys"].split(" ")[0]
    with_key = [c for _, c in _expected_contexts() if key in c["beans"][0]["keys"].split(" ")]
    for extra in ((), ("--scan",)):
        code, rows = _rows(key, *extra)
        assert code == 0 and Counter(map(_key, rows)) == Counter(map(_key, with_key))


def test_bulk_listing_by_group_topic_and_time():
    everything = [c for _, c in _expected_contexts()]
    code, rows = _rows()
    assert code == 0 and Counter(map(_key, rows)) == Counter(map(_key, everything))
    points = {c["beans"][0]["msgId"]: c["beans"][0]["pointsTo"]["topic"] for c in everything}
    group, topic = Counter((c["groupName"], points[c["beans"][0]["msgId"]]) for c in everything
                           if c["traceType"] == "SubAfter").most_common()[-1][0]
    code, rows = _rows("--group", group, "--topic", topic)
    want = [c for c in everything if c["groupName"] == group and points[c["beans"][0]["msgId"]] == topic]
    assert code == 0 and want and Counter(map(_key, rows)) == Counter(map(_key, want))
    times = sorted(c["timeStamp"] for c in everything if c["timeStamp"] is not None)
    middle = times[len(times) // 2]
    code, rows = _rows("--since", str(middle))
    want = [c for c in everything if c["timeStamp"] is not None and c["timeStamp"] >= middle]
    assert code == 0 and Counter(map(_key, rows)) == Counter(map(_key, want))


def test_nothing_found_and_the_trace_topic_name(store_copy):
    result = run("trace", STORE, "no-such-key")
    assert result.exit_code == 1 and "no trace context names no-such-key" in result.stderr
    assert run("trace", STORE, "--group", "no-such-group").exit_code == 1
    assert run("trace", STORE, "--since", str(2**63)).exit_code == 2
    msg_id = _sample_ids()[0][0]
    store = store_copy(SET)
    (store / "config").mkdir()
    (store / "config" / "broker.properties").write_text("brokerName=broker-a\nmsgTraceTopicName = TRACE_X\n")
    result = run("trace", store, msg_id)
    assert result.exit_code == 1 and "'TRACE_X'" in result.stderr
    assert "trace topic TRACE_X (msgTraceTopicName in config/broker.properties)" in result.stderr
    assert run("trace", store, msg_id, "--trace-topic", "RMQ_SYS_TRACE_TOPIC").exit_code == 0


# -- the codec ----------------------------------------------------------------------------------------
def test_java_split_and_decoder_errors():
    assert java_split("", "\x01") == [""]
    assert java_split("\x01\x01", "\x01") == []
    assert java_split("\x01a\x01\x01", "\x01") == ["", "a"]
    assert decode_trace_data("\x02\x02Other\x01x\x02") == []           # empty and unknown lines are skipped
    with pytest.raises(FormatError, match="too few"):
        decode_trace_data("SubBefore\x011\x01r\x01g\x01req\x01m\x010\x01\x02")   # empty keys: Java's AIOOBE
    with pytest.raises(FormatError, match="retryTimes"):
        decode_trace_data("SubBefore\x011\x01r\x01g\x01req\x01m\x01 1\x01k\x02")
    with pytest.raises(FormatError, match="MessageType"):
        decode_trace_data("Pub\x011\x01r\x01g\x01t\x01m\x01a\x01k\x01h\x011\x012\x015\x01o\x01true\x02")
    (ctx,) = decode_trace_data("SubAfter\x01req\x01m\x01+7\x01TRUE\x01k\x013\x02")  # parseInt / parseBoolean
    assert (ctx.cost_time, ctx.success, ctx.status, ctx.time_stamp) == (7, True, "RETURNNULL", None)


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=12)
_word = _text.filter(bool)
_int = st.integers(-2**31, 2**31 - 1)
_long = st.integers(-2**63, 2**63 - 1)


@st.composite
def _contexts(draw) -> TraceContext:
    kind = draw(st.sampled_from(["Pub", "SubBefore", "SubAfter", "EndTransaction", "Recall"]))
    msg_id = draw(_text)
    if kind == "Pub":
        bean = TraceBean(msg_id, topic=draw(_text), offset_msg_id=draw(st.none() | _text), tags=draw(_text),
                         keys=draw(_text), store_host=draw(_text), client_host=draw(st.none() | _word),
                         body_length=draw(_int), msg_type=draw(st.integers(0, len(MESSAGE_TYPES) - 1)))
        if bean.offset_msg_id is None:
            bean = TraceBean(**{**bean.__dict__, "client_host": None})
        return TraceContext(kind, bean, draw(_long), draw(_text), draw(_text), cost_time=draw(_int),
                            success=draw(st.booleans()))
    if kind == "SubBefore":
        return TraceContext(kind, TraceBean(msg_id, retry_times=draw(_int), keys=draw(_word)), draw(_long),
                            draw(_text), draw(_text), request_id=draw(_text))
    if kind == "SubAfter":
        code = draw(st.none() | _int)
        stamp = None if code is None else draw(st.none() | _long)
        return TraceContext(kind, TraceBean(msg_id, keys=draw(_word if code is None else _text)), stamp,
                            group_name=None if stamp is None else draw(_word), request_id=draw(_text),
                            cost_time=draw(_int), success=draw(st.booleans()), context_code=code)
    if kind == "EndTransaction":
        bean = TraceBean(msg_id, topic=draw(_text), tags=draw(_text), keys=draw(_text), store_host=draw(_text),
                         msg_type=draw(st.integers(0, len(MESSAGE_TYPES) - 1)), transaction_id=draw(_text),
                         transaction_state=draw(st.sampled_from(TRANSACTION_STATES)),
                         from_transaction_check=draw(st.booleans()))
        return TraceContext(kind, bean, draw(_long), draw(_text), draw(_text))
    return TraceContext(kind, TraceBean(msg_id, topic=draw(_text)), draw(_long), draw(_text), draw(_text),
                        success=draw(st.booleans()))


@given(st.lists(_contexts(), max_size=6))
def test_codec_round_trip_is_byte_exact(contexts):
    """encode -> decode gives the contexts; decode -> encode gives the same bytes (UTF-8)."""
    text = encode_trace_data(contexts)
    decoded = decode_trace_data(text)
    assert decoded == contexts
    assert encode_trace_data(decoded).encode("utf-8") == text.encode("utf-8")
    assert all(encode_trace_context(c).endswith("\x02") for c in contexts)


def damage_a_trace_body(store_copy):
    """A copy of the set with one uncompressed trace message's first timeStamp made non-numeric (Java's decoder
    throws on it): (store, that message's readback entry, its first line's fields)."""
    damaged, line = next((m, line) for m in _trace()["traceMessages"] if not m["compressed(ZLIB by the trace producer)"]
                         for line in _lines(m[RAW])[:1] if line[0] != "SubAfter")      # field 1: a timeStamp
    store = store_copy(SET)
    path = store / "commitlog" / next(f["file"] for f in readback(SET)["commitlogFiles"]
                                      if 0 <= damaged["physicalOffset"] - f["fileFromOffset"] < f["fileSize"])
    data = path.read_bytes()
    old = "\x01".join(line[:2]).encode()
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, old[:len(line[0]) + 1] + b"x" + old[len(line[0]) + 2:]))
    return store, damaged, line


def test_a_trace_body_that_does_not_decode(store_copy):
    """Java's decoder throws on the whole message: an error (exit 3); --read-anyway skips that trace message
    with a warning naming it and prints the rest (exit 3)."""
    store, damaged, line = damage_a_trace_body(store_copy)
    msg_id = line[5]
    result = run("trace", store, msg_id)
    assert result.exit_code == 3 and f"offset {damaged['physicalOffset']}" in result.stderr
    assert "timeStamp" in result.stderr
    result = run("trace", store, msg_id, "--read-anyway", "-f", "jsonl")
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    naming = [c for m, c in _expected_contexts() if c["beans"][0]["msgId"] == msg_id and m is not damaged]
    assert result.exit_code == 3 and "that trace message skipped" in result.stderr
    assert Counter(map(_key, rows)) == Counter(map(_key, naming))


def test_broker_properties_as_java_reads_them():
    from rmqtool.format.javaprops import parse_java_properties

    text = ("# comment\n! also\n  msgTraceTopicName : My\\\n    Trace\nbrokerName=broker-a\nflag\n"
            "key\\=x = a\\u0041\\tb\nspaced   value here\n")
    assert parse_java_properties(text) == {"msgTraceTopicName": "MyTrace", "brokerName": "broker-a", "flag": "",
                                           "key=x": "aA\tb", "spaced": "value here"}
