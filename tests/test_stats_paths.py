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
