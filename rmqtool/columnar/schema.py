"""The Arrow schema of decoded commit-log records: the record fields of ``rmqtool.format.rows`` with
native types (timestamps as timestamp[ms], ``body`` as binary, ``properties`` as map<string,string>)
plus ``properties_raw`` and ``topic_raw`` (the stored bytes; the topic's only where they are not UTF-8)
and, when CRCs are checked, ``crc_ok``.

``body_encoding`` is not a column: the body is binary here; text outputs add it.
"""

from __future__ import annotations

import pyarrow as pa

from rmqtool.format.rows import RECORD_FIELDS

_TYPES = {
    "type": pa.string(),
    "physical_offset": pa.int64(),
    "total_size": pa.int32(),
    "magic_code": pa.string(),
    "body_crc": pa.int32(),
    "queue_id": pa.int32(),
    "flag": pa.int32(),
    "queue_offset": pa.int64(),
    "sys_flag": pa.int32(),
    "born_timestamp": pa.timestamp("ms"),
    "born_host": pa.string(),
    "store_timestamp": pa.timestamp("ms"),
    "store_host": pa.string(),
    "reconsume_times": pa.int32(),
    "prepared_transaction_offset": pa.int64(),
    "topic": pa.string(),
    "properties": pa.map_(pa.string(), pa.string()),
    "tags": pa.string(),
    "keys": pa.list_(pa.string()),
    "uniq_key": pa.string(),
    "real_topic": pa.string(),
    "real_queue_id": pa.int32(),
    "msg_id": pa.string(),
    "tags_code": pa.int64(),
    "body_length": pa.int32(),
    "body": pa.binary(),
}
COLUMNS = [name for name in RECORD_FIELDS if name in _TYPES or name in ("properties_raw", "topic_raw")]


def record_schema(check_crc: bool = False) -> pa.Schema:
    fields = [pa.field(name, _TYPES.get(name, pa.binary())) for name in COLUMNS]
    if check_crc:
        fields.append(pa.field("crc_ok", pa.bool_()))
    return pa.schema(fields)
