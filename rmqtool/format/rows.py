"""Records as rows: the documented field names every output uses (jsonl, csv, tables, Parquet, Spark).

Record fields, in order: type, physical_offset, total_size, magic_code, body_crc, queue_id, flag,
queue_offset, sys_flag, born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
prepared_transaction_offset, topic, properties, tags, keys, uniq_key, real_topic, real_queue_id (REAL_TOPIC
and REAL_QID: where a delay-level, timer or half message goes or came from), msg_id, tags_code, body_length,
body, body_encoding, properties_raw (the stored PROPERTIES bytes in base64, so that a row re-encodes
exactly even where the parsed ``properties`` object cannot hold them, e.g. a repeated key; tags and keys
that are not UTF-8 are there as stored), topic_raw (the stored topic bytes in base64 when they are not
UTF-8, where ``topic`` has U+FFFD as the broker reads it; else null), and crc_ok when checked.
Timestamps are epoch milliseconds; hosts are "ip:port" or "[ipv6]:port".
"""

from __future__ import annotations

import base64
import enum
import json
from typing import Any

from rmqtool import constants as C
from rmqtool.format.commitlog import Blank, Entry, Message
from rmqtool.format.java import parse_java_int

RECORD_FIELDS = [
    "type", "physical_offset", "total_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset",
    "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
    "prepared_transaction_offset", "topic", "properties", "tags", "keys", "uniq_key", "real_topic",
    "real_queue_id", "msg_id", "tags_code",
    "body_length", "body", "body_encoding", "properties_raw", "topic_raw",
]
CQ_UNIT_FIELDS = ["topic", "queue_id", "queue_offset", "physical_offset", "size", "tags_code"]
# A batch consume-queue unit: queue_offset is its msgBaseOffset, the first of its batch_size messages.
BCQ_UNIT_FIELDS = ["topic", "queue_id", "queue_offset", "batch_size", "physical_offset", "size", "tags_code",
                   "store_timestamp", "compacted_offset"]
INDEX_HIT_FIELDS = ["topic", "key", "physical_offset", "store_timestamp", "index_file"]
BODY_ENCODINGS = ("text", "hex", "base64", "none")


def json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, enum.Enum):
        return value.value
    return str(value)


def dumps(row: dict) -> str:
    """A row as one line of JSON (jsonl, and each element of json): UTF-8 as it is, no spaces."""
    return json.dumps(row, ensure_ascii=False, default=json_default, separators=(",", ":"))


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: None empty, booleans true / false, maps and lists as JSON, bytes in base64."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return dumps(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return json_default(value)
    return value


def real_queue_id(text: str | None) -> int | None:
    """REAL_QID as Integer.parseInt reads it; None when absent or not a Java int."""
    try:
        return parse_java_int(text) if text is not None else None
    except ValueError:
        return None


def encode_body(body: bytes, encoding: str) -> str | None:
    """The body in ``encoding``; see body_field for text that may not be UTF-8."""
    return body_field(body, encoding)[0]


def body_field(body: bytes, encoding: str) -> tuple[str | None, str | None]:
    """(body, body_encoding) of a row: a "text" body that is not UTF-8 is given in base64 instead (and
    labelled so), never with replacement characters."""
    if encoding == "none":
        return None, None
    if encoding == "text":
        try:
            return body.decode("utf-8"), "text"
        except UnicodeDecodeError:
            encoding = "base64"
    if encoding == "base64":
        return base64.b64encode(body).decode("ascii"), "base64"
    return body.hex(), "hex"


def decode_body(text: str | None, encoding: str) -> bytes:
    """The inverse of body_field (ValueError for an unknown encoding or text that does not decode)."""
    if encoding not in BODY_ENCODINGS:
        raise ValueError(f"unknown body_encoding {encoding!r} (expected one of {', '.join(BODY_ENCODINGS)})")
    if text is None or encoding == "none":
        return b""
    if not isinstance(text, str):
        raise ValueError(f"body must be a string, got {type(text).__name__}")
    if encoding == "base64":
        return base64.b64decode(text, validate=True)
    if encoding == "hex":
        return bytes.fromhex(text)
    return text.encode("utf-8")


def row_type(entry: Entry) -> str:
    """A row's type: "blank", "salvaged_record" (rmqtool repair's placeholder) or "message"."""
    if isinstance(entry, Blank):
        return "blank"
    salvaged = entry.topic == C.SALVAGED_TOPIC and entry.transaction_type is C.TransactionType.ROLLBACK
    return "salvaged_record" if salvaged else "message"


def entry_row(entry: Entry, physical_offset: int, *, body_encoding: str = "base64",
              check_crc: bool = False, decompress: bool = False) -> dict[str, Any]:
    """One record as a row. ``physical_offset`` is where it was read; a MESSAGE's stored
    PHYSICALOFFSET field is the same in a sound store (verify reports when it is not)."""
    if isinstance(entry, Blank):
        row: dict[str, Any] = dict.fromkeys(RECORD_FIELDS)
        row.update(type="blank", physical_offset=physical_offset, total_size=entry.total_size,
                   magic_code=f"0x{entry.magic_code:08x}")
        if check_crc:
            row["crc_ok"] = None
        return row
    msg: Message = entry
    props = msg.properties
    body = msg.body
    if decompress and msg.compressed:
        body = msg.decompressed_body()
    try:
        tags_code = msg.tags_code()
    except ValueError:           # a malformed DELAY: the broker rejects such a record
        tags_code = None
    row = {
        "type": row_type(msg),
        "physical_offset": physical_offset,
        "total_size": msg.total_size,
        "magic_code": f"0x{msg.effective_magic:08x}",
        "body_crc": msg.body_crc,
        "queue_id": msg.queue_id,
        "flag": msg.flag,
        "queue_offset": msg.queue_offset,
        "sys_flag": msg.sys_flag,
        "born_timestamp": msg.born_timestamp,
        "born_host": str(msg.born_host),
        "store_timestamp": msg.store_timestamp,
        "store_host": str(msg.store_host),
        "reconsume_times": msg.reconsume_times,
        "prepared_transaction_offset": msg.prepared_transaction_offset,
        "topic": msg.topic,
        "properties": props,
        "tags": props.get("TAGS"),
        "keys": msg.keys,
        "uniq_key": props.get("UNIQ_KEY"),
        "real_topic": props.get(C.PROPERTY_REAL_TOPIC),
        "real_queue_id": real_queue_id(props.get(C.PROPERTY_REAL_QUEUE_ID)),
        "msg_id": msg.msg_id,
        "tags_code": tags_code,
        "body_length": len(body),
        "body": None,
        "body_encoding": None,
        "properties_raw": base64.b64encode(msg.properties_raw).decode("ascii"),
        "topic_raw": None if msg.topic_raw is None else base64.b64encode(msg.topic_raw).decode("ascii"),
    }
    row["body"], row["body_encoding"] = body_field(body, body_encoding)
    if check_crc:
        row["crc_ok"] = msg.crc_ok()
    return row
