"""export of a small store reads record by record (no kernel; JSON lines and CSV: no numpy or pyarrow either); larger
stores, damage and records the two paths might read otherwise take the Arrow path. Both write the same bytes."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from rmqtool.errors import FormatError
from rmqtool.ops import export, scan
from rmqtool.ops.filters import RecordFilter

BUNDLED = sorted(p.parent.name for p in FIXTURES.glob("*/store"))
CASES = [("jsonl", {}), ("csv", {}), ("jsonl", dict(check_crc=True, include_blank=True, body_encoding="text")),
         ("parquet", {}), ("parquet", dict(check_crc=True, include_blank=True))]
# the filters on stores of every kind of record (retries, transactions, delays, compressed and inner-batch
# bodies, a compaction topic, CRC damage)
FILTERED = ["dev-batchcq-5x", "dev-compaction-5x", "dev-config-5x", "dev-damage-midfile-crc-497", "dev-sample",
            "dev-sample-5x", "dev-timer-5x"]
FILTER_CASES = [("jsonl", dict(where=RecordFilter(topics=("TopicA", "订单主题", "CompactTopic")), body_encoding="text")),
                ("csv", dict(where=RecordFilter(tags=("Tag3", "TagA", "标签1"), queue_ids=(0, 1)),
                             body_encoding="none")),
                ("jsonl", dict(where=RecordFilter(keys=("key-70", "键-17", "key-57", "key-90")), body_encoding="hex",
                               check_crc=True)),
                ("csv", dict(where=RecordFilter(body_regex="1", since=1795216390000, until=1795418125900))),
                ("parquet", dict(where=RecordFilter(topics=("TopicA", "订单主题")), check_crc=True))]


@pytest.mark.parametrize("name", BUNDLED)
def test_small_path_and_arrow_path_write_the_same_bytes(name, tmp_path, monkeypatch):
    """Each case, both paths: the same bytes and counts wherever the Arrow path reads without damage; where it
    skips damage (--read-anyway), the small path refuses (FormatError) and export_local takes the Arrow path."""
    store = str(FIXTURES / name / "store")
    taken = []

    def spied(small):
        def few(*args):
            try:
                counts = small(*args)
            except Exception as exc:
                taken.append(type(exc))
                raise
            taken.append(None)
            return counts
        return few

    few_bytes = scan.FEW_BYTES
    for name_ in ("_few_text", "_few_parquet"):
        monkeypatch.setattr(export, name_, spied(getattr(export, name_)))
    for k, (fmt, options) in enumerate(CASES + FILTER_CASES * (name in FILTERED)):
        out = {}
        for path, few in (("arrow", -1), ("small", few_bytes)):
            monkeypatch.setattr(scan, "FEW_BYTES", few)
            result = export.export_local([store], tmp_path / f"{k}-{path}.{fmt}", fmt, read_anyway=True, **options)
            out[path] = (result.records, result.messages, result.input_bytes, result.path.read_bytes())
            damaged = result.damaged
        if not taken:                           # a compaction topic named: its logs take the Arrow path
            assert options.get("where") and name == "dev-compaction-5x", (k, fmt, options)
        elif damaged:
            assert issubclass(taken.pop(), FormatError), (k, fmt, options)
        else:
            assert taken.pop() is None, (k, fmt, options)
            assert out["small"] == out["arrow"], (k, fmt, options)
            assert out["small"][0] or options.get("where"), (k, fmt, options)
