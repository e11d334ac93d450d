"""Message-trace data: the text the client's trace dispatcher stores as the body of trace-topic messages.

Mirrors the 5.3.3 client, org.apache.rocketmq.client.trace: ``TraceDataEncoder.decoderFromTraceDataString``
(decode_trace_data) and ``TraceDataEncoder.encoderFromContextBean`` (encode_trace_context, trans_keys).
Contexts end with FIELD_SPLITOR (\\u0002), their fields are separated by CONTENT_SPLITOR (\\u0001)
(``TraceConstants``). Both splits are Java's ``String.split``: trailing empty strings are dropped, so a
context whose last fields are empty decodes with fewer fields. The decoder keeps one context per line
(a SubBefore/SubAfter line per bean) and ignores lines of an unknown type; fields a line does not carry
are None here where Java keeps a default it did not read (a new requestId, the reading machine's IP, the
current time).
"""

from __future__ import annotations

import dataclasses
import re

from rmqtool.errors import FormatError

CONTENT_SPLITOR = "\x01"
FIELD_SPLITOR = "\x02"
TRACE_TYPES = ("Pub", "SubBefore", "SubAfter", "EndTransaction", "Recall")           # TraceType
MESSAGE_TYPES = ("Normal_Msg", "Trans_Msg_Half", "Trans_msg_Commit", "Delay_Msg", "Order_Msg")   # MessageType
CONSUME_RETURN_TYPES = ("SUCCESS", "TIME_OUT", "EXCEPTION", "RETURNNULL", "FAILED")  # ConsumeReturnType
TRANSACTION_STATES = ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW")                 # LocalTransactionState
KEY_SEPARATOR = " "                                                                   # MessageConst.KEY_SEPARATOR
INT_MIN, INT_MAX = -2**31, 2**31 - 1
LONG_MIN, LONG_MAX = -2**63, 2**63 - 1
_JAVA_INT = re.compile(r"[+-]?\d+")     # Integer/Long.parseLong: a sign, then decimal digits (Unicode Nd too)


@dataclasses.dataclass(frozen=True)
class TraceBean:
    """TraceBean fields a trace line can carry (None: not in the line)."""

    msg_id: str
    topic: str | None = None
    offset_msg_id: str | None = None
    tags: str | None = None
    keys: str | None = None
    store_host: str | None = None
    client_host: str | None = None          # Pub lines of more than 14 fields (older clients)
    body_length: int | None = None
    retry_times: int | None = None
    msg_type: int | None = None             # MessageType ordinal
    transaction_id: str | None = None
    transaction_state: str | None = None
    from_transaction_check: bool | None = None


@dataclasses.dataclass(frozen=True)
class TraceContext:
    """One decoded line: a TraceContext with its one TraceBean (None: not in the line)."""

    trace_type: str
    bean: TraceBean
    time_stamp: int | None = None
    region_id: str | None = None
    group_name: str | None = None
    request_id: str | None = None
    cost_time: int | None = None
    success: bool | None = None
    context_code: int | None = None         # SubAfter: ConsumeReturnType ordinal

    @property
    def status(self) -> str | None:
        """SubAfter: the ConsumeReturnType its contextCode names."""
        code = self.context_code
        if self.trace_type != "SubAfter" or code is None:
            return None
        return CONSUME_RETURN_TYPES[code] if 0 <= code < len(CONSUME_RETURN_TYPES) else str(code)

    @property
    def msg_type_name(self) -> str | None:
        t = self.bean.msg_type
        return None if t is None else MESSAGE_TYPES[t]


def java_split(text: str, sep: str) -> list[str]:
    """String.split(sep) for a one-character, non-regex separator (trailing empty strings removed)."""
    if sep not in text:
        return [text]
    parts = text.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _number(text: str, low: int, high: int, what: str) -> int:
    """Integer.parseInt / Long.parseLong: NumberFormatException becomes a FormatError."""
    if _JAVA_INT.fullmatch(text):
        value = int(text)
        if low <= value <= high:
            return value
    raise FormatError(f"{what} {text!r} is not a Java {'int' if high == INT_MAX else 'long'}")


def _int(text: str, what: str) -> int:
    return _number(text, INT_MIN, INT_MAX, what)


def _long(text: str, what: str) -> int:
    return _number(text, LONG_MIN, LONG_MAX, what)


def _bool(text: str) -> bool:
    """Boolean.parseBoolean: "true" in any case, anything else false."""
    return text.lower() == "true"


def _msg_type(text: str) -> int:
    """MessageType.values()[Integer.parseInt(text)]."""
    n = _int(text, "msgType")
    if not 0 <= n < len(MESSAGE_TYPES):
        raise FormatError(f"msgType {n} is not a MessageType ordinal (0-{len(MESSAGE_TYPES) - 1})")
    return n


def decode_trace_data(data: str) -> list[TraceContext]:
    """TraceDataEncoder.decoderFromTraceDataString: the contexts of a trace message's text.

    Raises FormatError where the Java decoder throws (a missing field, a number that does not parse, an
    unknown MessageType ordinal or LocalTransactionState), naming the context (0-based line).
    """
    out: list[TraceContext] = []
    if not data:
        return out
    for i, context in enumerate(java_split(data, FIELD_SPLITOR)):
        line = java_split(context, CONTENT_SPLITOR)
        try:
            decoded = _decode_line(line)
        except IndexError:
            raise FormatError(f"trace context {i} ({line[0]}) has {len(line)} fields: too few") from None
        except FormatError as exc:
            raise FormatError(f"trace context {i} ({line[0]}): {exc.message}") from None
        if decoded is not None:
            out.append(decoded)
    return out


def _decode_line(line: list[str]) -> TraceContext | None:
    kind = line[0]
    if kind == "Pub":
        bean = dict(topic=line[4], msg_id=line[5], tags=line[6], keys=line[7], store_host=line[8],
                    body_length=_int(line[9], "bodyLength"))
        cost, msg_type = _int(line[10], "costTime"), _msg_type(line[11])
        success = None
        if len(line) == 13:
            success = _bool(line[12])
        elif len(line) >= 14:
            bean["offset_msg_id"], success = line[12], _bool(line[13])
            if len(line) >= 15:
                bean["client_host"] = line[14]
        return TraceContext("Pub", TraceBean(msg_type=msg_type, **bean), _long(line[1], "timeStamp"), line[2],
                            line[3], cost_time=cost, success=success)
    if kind == "SubBefore":
        return TraceContext("SubBefore", TraceBean(line[5], retry_times=_int(line[6], "retryTimes"), keys=line[7]),
                            _long(line[1], "timeStamp"), line[2], line[3], request_id=line[4])
    if kind == "SubAfter":
        bean = TraceBean(line[2], keys=line[5])
        cost, success = _int(line[3], "costTime"), _bool(line[4])
        code = _int(line[6], "contextCode") if len(line) >= 7 else None
        stamp, group = (_long(line[7], "timeStamp"), line[8]) if len(line) >= 9 else (None, None)
        return TraceContext("SubAfter", bean, stamp, group_name=group, request_id=line[1], cost_time=cost,
                            success=success, context_code=code)
    if kind == "EndTransaction":
        stamp, msg_type = _long(line[1], "timeStamp"), _msg_type(line[9])
        if line[11] not in TRANSACTION_STATES:
            raise FormatError(f"transactionState {line[11]!r} is not a LocalTransactionState")
        bean = TraceBean(line[5], topic=line[4], tags=line[6], keys=line[7], store_host=line[8], msg_type=msg_type,
                         transaction_id=line[10], transaction_state=line[11],
                         from_transaction_check=_bool(line[12]))
        return TraceContext("EndTransaction", bean, stamp, line[2], line[3])
    if kind == "Recall":
        return TraceContext("Recall", TraceBean(line[5], topic=line[4]), _long(line[1], "timeStamp"), line[2],
                            line[3], success=_bool(line[6]))
    return None


def _java(value) -> str:
    """StringBuilder.append: null as "null", booleans as true/false."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def encode_trace_context(ctx: TraceContext) -> str:
    """TraceDataEncoder.encoderFromContextBean's transData for one line.

    A SubAfter without timeStamp is written as AccessChannel.CLOUD writes it (contextCode, then an empty
    field). Fields older clients wrote and 5.3.3 does not (a Pub line without offsetMsgId, or with a
    clientHost; a SubAfter without contextCode) are written when the context has them, so that decoding
    and encoding a client's text gives it back.
    """
    b = ctx.bean
    t = ctx.trace_type
    if t == "Pub":
        fields = [t, ctx.time_stamp, ctx.region_id, ctx.group_name, b.topic, b.msg_id, b.tags, b.keys, b.store_host,
                  b.body_length, ctx.cost_time, b.msg_type]
        fields += ([] if b.offset_msg_id is None else [b.offset_msg_id]) + [ctx.success]
        fields += [] if b.client_host is None else [b.client_host]
    elif t == "SubBefore":
        fields = [t, ctx.time_stamp, ctx.region_id, ctx.group_name, ctx.request_id, b.msg_id, b.retry_times, b.keys]
    elif t == "SubAfter":
        fields = [t, ctx.request_id, b.msg_id, ctx.cost_time, ctx.success, b.keys]
        tail = FIELD_SPLITOR
        if ctx.context_code is not None:
            fields.append(ctx.context_code)
            if ctx.time_stamp is None:
                tail = CONTENT_SPLITOR + FIELD_SPLITOR
            else:
                fields += [ctx.time_stamp, ctx.group_name]
        return CONTENT_SPLITOR.join(map(_java, fields)) + tail
    elif t == "EndTransaction":
        fields = [t, ctx.time_stamp, ctx.region_id, ctx.group_name, b.topic, b.msg_id, b.tags, b.keys, b.store_host,
                  b.msg_type, b.transaction_id, b.transaction_state, b.from_transaction_check]
    elif t == "Recall":
        fields = [t, ctx.time_stamp, ctx.region_id, ctx.group_name, b.topic, b.msg_id, ctx.success]
    else:
        raise ValueError(f"unknown trace type {t!r}")
    return CONTENT_SPLITOR.join(map(_java, fields)) + FIELD_SPLITOR


def encode_trace_data(contexts: list[TraceContext]) -> str:
    """The text of a trace message: its contexts' lines, concatenated (AsyncTraceDispatcher.flushData)."""
    return "".join(map(encode_trace_context, contexts))


def trans_keys(ctx: TraceContext) -> list[str]:
    """encoderFromContextBean's transKey: the bean's msgId, then its keys split on spaces."""
    keys = [ctx.bean.msg_id]
    if ctx.bean.keys:
        keys += java_split(ctx.bean.keys, KEY_SEPARATOR)
    return keys


def decode_trace_body(body: bytes) -> list[TraceContext]:
    """A trace message's (decompressed) body: UTF-8 as ``new String(body, UTF_8)`` reads it, then decoded."""
    return decode_trace_data(body.decode("utf-8", "replace"))
