"""stats on a small store totals record by record (no numpy, pyarrow or kernel); larger stores, filters and
damage take the Arrow path. Both give the same rows."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES
from rmqtool import constants as C
from rmqtool.errors import FormatError
from rmqtool.ops import scan, stats
from tests.test_columnar import write_commitlog

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


_TOPICS = ["T", "TopicA", "ä", "%RETRY%g1", "%DLQ%g1", C.RMQ_SYS_TRANS_HALF_TOPIC, C.RMQ_SYS_TRANS_OP_HALF_TOPIC,
           C.RMQ_SYS_SCHEDULE_TOPIC, C.SALVAGED_TOPIC]
_PROPS = st.lists(st.sampled_from(["TAGS\x01a", "TAGS\x01b\udcff", "RETRY_TOPIC\x01TopicA", "RETRY_TOPIC\x01Other",
                                   "RETRY_TOPIC\x01", "RETRY_TOPIC\x01TopicA\x00", "INNER_NUM\x013",
                                   "INNER_BASE\x017", "INNER_NUM\x01x", "UNIQ_KEY\x01u", "DELAY\x012"]),
                  max_size=3).map(lambda items: "\x02".join(items))     # \udcff: the byte 0xFF (not UTF-8)


@st.composite
def _records(draw):
    from rmqtool.format.commitlog import Message

    raw = draw(st.sampled_from([None] * 9 + [b"bad\xff"]))             # a topic that is not UTF-8
    return Message(topic=draw(st.sampled_from(_TOPICS)), topic_raw=raw,
                   properties_raw=draw(_PROPS).encode("utf-8", "surrogateescape"),
                   queue_id=draw(st.sampled_from([0, 1, 3, -1, 2**31 - 1, -2**31])),
                   store_timestamp=draw(st.integers(0, 2**42)),
                   sys_flag=draw(st.sampled_from(list(C.TransactionType))), body=b"x" * draw(st.integers(0, 300)))


def _sent(topic: str, props: str = "", tx: int = 0):
    from rmqtool.format.commitlog import Message

    return Message(topic=topic, properties_raw=props.encode(), sys_flag=tx, store_timestamp=len(topic))


_RETRIES = [_sent("T", tx=C.TransactionType.PREPARED), _sent("%RETRY%g1", "RETRY_TOPIC\x01TopicA"), _sent("%DLQ%g1"),
            _sent("%DLQ%g1", "RETRY_TOPIC\x01TopicA"), _sent("TopicA", tx=C.TransactionType.COMMIT),
            _sent("%RETRY%g2", "RETRY_TOPIC\x01"), _sent("%RETRY%g1", "RETRY_TOPIC\x01TopicA\x00"),
            _sent(C.RMQ_SYS_TRANS_HALF_TOPIC),
            _sent(C.RMQ_SYS_SCHEDULE_TOPIC, "DELAY\x012")]
_EACH_KIND = [_sent("T"), _sent(C.SALVAGED_TOPIC, tx=C.TransactionType.ROLLBACK), *_RETRIES,
              _sent("T", "INNER_NUM\x013\x02INNER_BASE\x011")]


@settings(max_examples=150, deadline=None)
@given(msgs=st.lists(_records(), min_size=1, max_size=40), file_size=st.sampled_from([1024, 4096, 1 << 16]),
       window=st.sampled_from([200, 1500, 1 << 21]))
@example(msgs=_EACH_KIND, file_size=4096, window=200).via("each kind of record in a window of its own")
@example(msgs=_EACH_KIND, file_size=1 << 16, window=1 << 21).via("all in one window (the Arrow path's)")
@example(msgs=_RETRIES, file_size=1 << 16, window=1 << 21).via("retries and their topics in one window")
def test_windows_summed_from_the_facts_give_the_arrow_paths_sums(tmp_path_factory, msgs, file_size, window):
    """stats in total, by topic and by queue: the windows ``WindowSums`` takes (from the facts pass; by topic,
    retry and DLQ records filed under the RETRY_TOPIC they name) and those it leaves to the Arrow path (text
    that is not UTF-8, inner batches, repair's placeholder) give the rows the Arrow path gives for every
    window, over files ending in a BLANK."""
    from unittest import mock

    import rmqtool.columnar.batches as batches

    root = tmp_path_factory.mktemp("store")
    write_commitlog(root / "commitlog", msgs, file_size)
    files = scan.list_files([str(root)])
    taken = []

    class Counted(stats.WindowSums):
        def __call__(self, *args) -> bool:
            taken.append(super().__call__(*args))
            return taken[-1]

    for by in (None, "topic", "queue"):
        with mock.patch.object(batches, "WINDOW_BYTES", window):
            with mock.patch.object(stats, "WindowSums", Counted):
                summed = stats.stats_rows(stats.merge([stats.file_stats(f, by) for f in files], by), by)
            with mock.patch.object(stats, "_sums", lambda keys, where: None):
                arrow = stats.stats_rows(stats.merge([stats.file_stats(f, by) for f in files], by), by)
        assert summed == arrow, by
    plain = [m.topic_raw is None and m.topic != C.SALVAGED_TOPIC and b"INNER_NUM" not in m.properties_raw
             for m in msgs]
    assert not all(plain) or all(taken)                  # windows of such records are all taken


_KEY_VALUES = {"topic": st.sampled_from(["T", "TopicA", "ä", "%RETRY%g1"]), "queue_id": st.integers(-2, 3),
               "hour": st.sampled_from([0, 3_600_000, -3_600_000, 1 << 62]),    # (past what a datetime holds)
               "store_host": st.sampled_from(["10.0.0.1:10911", "[::1]:10911"]),
               "tags": st.sampled_from([None, "", "TagA"]), "store": st.sampled_from(["/a/store", "/b/store"]),
               "group": st.sampled_from([None, "g1", "g2"])}


@st.composite
def _partials(draw):
    """A grouping and partial sums as files give them: tables with a row per key (keys repeat across tables;
    a table may come in two chunks), counts up to 2^40, store-time ranges."""
    import pyarrow as pa

    by = draw(st.sampled_from(BYS))
    keys = stats.GROUPINGS[by] if by else []
    types = {"queue_id": pa.int32(), "hour": pa.timestamp("ms")}
    tables = []
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(st.lists(st.tuples(st.tuples(*(_KEY_VALUES[k] for k in keys)), st.integers(1, 1 << 40), st.lists(
            st.integers(0, 1 << 40), min_size=8, max_size=8), st.integers(-(1 << 45), 1 << 45),
            st.integers(0, 1 << 30)), max_size=6, unique_by=lambda r: r[0]))
        cut = draw(st.integers(0, len(rows)))
        chunks = []
        for part in (rows[:cut], rows[cut:]):
            cols = {k: pa.array([r[0][i] for r in part], types.get(k, pa.string())) for i, k in enumerate(keys)}
            counts = [[r[1], *r[2]] for r in part]
            cols.update({c: pa.array([n[j] for n in counts], pa.int64()) for j, c in enumerate(stats.COUNTS)})
            cols["min_store_timestamp"] = pa.array([r[3] for r in part], pa.int64())
            cols["max_store_timestamp"] = pa.array([r[3] + r[4] for r in part], pa.int64())
            chunks.append(pa.table(cols))
        tables.append(pa.concat_tables(chunks))
    return by, tables


@settings(max_examples=200, deadline=None)
@given(_partials())
def test_merged_partial_sums_are_arrows_group_by(partials):
    """``merge`` (a dict and numpy) gives the rows Arrow's group-by of all the partial sums gives, for every
    grouping: sums added, ranges widened, null keys grouped together."""
    import pyarrow as pa

    by, tables = partials
    keys = stats.GROUPINGS[by] if by else []
    nonempty = [t for t in tables if t.num_rows]
    want = stats.stats_rows(stats._group(pa.concat_tables(nonempty), keys, stats._AGGREGATES), by) if nonempty \
        else []
    assert stats.stats_rows(stats.merge(tables, by), by) == want
