"""stats on a small store totals record by record (no numpy, pyarrow or kernel); larger stores, filters and
damage take the Arrow path. Both give the same rows."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from rmqtool.errors import FormatError
from rmqtool.ops import scan, stats

BUNDLED = sorted(p.parent.name for p in FIXTURES.glob("*/store"))
BYS = [None, *stats.GROUPINGS]


@pytest.mark.parametrize("name", BUNDLED)
def test_small_path_and_arrow_path_give_the_same_rows(name, monkeypatch):
    """Every grouping, both paths forced: the same rows wherever the Arrow path reads without damage; where
    it skips damage, the small path refuses (FormatError) and stats_local takes the Arrow path."""
    files, _ = scan.readable_files(scan.list_files([str(FIXTURES / name / "store")]), read_anyway=True)
    monkeypatch.setattr(scan, "FEW_BYTES", -1)                  # stats_local: the Arrow path only
    for by in BYS:
        damage: list = []
        arrow = stats.stats_local(files, by, on_damage=damage.append)
        if damage:
            with pytest.raises(FormatError):
                stats._few_stats(files, by, None)
        else:
            assert arrow and stats._few_stats(files, by, None) == arrow, by


@pytest.mark.parametrize("by", BYS)
@pytest.mark.parametrize("where", [None, "topic"])
def test_the_warm_up_before_the_workers_decodes_what_they_decode(by, where, monkeypatch):
    """With workers, the first batch decoded before they fork (``scan.warm``: the compiled code they inherit)
    takes the columns each worker's scan takes, every one under a filter: not the whole decode, whose code
    no worker would call while each loaded its own from the cache."""
    from rmqtool.ops.filters import RecordFilter

    files = scan.list_files([str(FIXTURES / "dev-sample" / "store")] * 2)
    flt = RecordFilter(topics=("TopicTest",)) if where else None
    asked = []
    real_batches = scan.record_batches

    def batches(f, **options):
        asked.append(options.get("columns"))
        return real_batches(f, **options)

    monkeypatch.setattr(scan, "record_batches", batches)
    monkeypatch.setattr(scan, "FEW_BYTES", -1)
    stats.stats_local(files, by, where=flt, jobs=2)
    assert len(asked) >= 1 and all(c == stats._columns(stats.GROUPINGS[by] if by else [], flt) for c in asked)
    assert (asked[0] is None) == bool(where)
