"""Checks of decoded records against RocketMQ's own readback (readback.json ``commitlogRecords``)."""

from __future__ import annotations

import base64
import hashlib
import ipaddress

from rmqtool.format.commitlog import Blank
from rmqtool.format.java import body_crc


def _host_matches(host, expected: dict) -> bool:
    return (host.address == ipaddress.ip_address(expected["ip"]).packed and host.port == expected["port"]
            and host.ipv6 == expected["ipv6"])


def assert_record_matches(offset: int, entry, exp: dict) -> None:
    """Every field of one readback record equals the decoded entry read at ``offset``."""
    assert offset == exp["physicalOffset"]
    assert entry.total_size == exp["totalSize"]
    assert f"0x{entry.magic_code:08x}" == exp["magicCode"]
    if exp["type"] == "BLANK":
        assert isinstance(entry, Blank) and entry.total_size == exp.get("blankLength", exp["totalSize"])
        return
    props = entry.properties
    assert exp["type"] == "MESSAGE"
    assert entry.physical_offset == exp["physicalOffset"]
    assert entry.version == (2 if exp.get("version") == "V2" else 1)
    assert entry.topic == exp["topic"]
    assert entry.queue_id == exp["queueId"]
    assert entry.queue_offset == exp["queueOffset"]
    assert entry.sys_flag == exp["sysFlag"]
    assert entry.born_timestamp == exp["bornTimestamp"]
    assert entry.store_timestamp == exp["storeTimestamp"]
    assert _host_matches(entry.born_host, exp["bornHost"])
    assert _host_matches(entry.store_host, exp["storeHost"])
    assert entry.tags_code() == exp["tagsCode"]
    assert props.get("KEYS") == (exp["keys"] or None)
    assert entry.uniq_key == exp["uniqKey"]
    assert entry.msg_id == exp["msgId"]
    assert entry.body_crc == exp["bodyCRC"] == (body_crc(entry.body) if entry.body else entry.body_crc)
    assert entry.flag == exp["flag"]
    assert entry.reconsume_times == exp["reconsumeTimes"]
    assert entry.prepared_transaction_offset == exp["preparedTransactionOffset"]
    assert props == exp["properties"]
    assert len(entry.body) == exp["bodyLength"]
    assert hashlib.sha256(entry.body).hexdigest() == exp["bodySha256"]
    if "bodyBase64" in exp:
        assert entry.body == base64.b64decode(exp["bodyBase64"])
    if "compressionType" in exp:
        plain = entry.decompressed_body()
        assert entry.compressed
        assert len(plain) == exp["decompressedBodyLength"]
        assert hashlib.sha256(plain).hexdigest() == exp["decompressedBodySha256"]
