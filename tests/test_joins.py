"""verify's compiled joins (rmqtool.columnar.joins) against the plain rule: a unit or index entry belongs
to the record that starts at its physical offset."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqtool.columnar.joins import join_entries, join_units, queue_rows, unbroken, unmatched_keys


@st.composite
def records(draw):
    n = draw(st.integers(0, 40))
    gaps = draw(st.lists(st.integers(1, 50), min_size=n, max_size=n))
    offsets = np.cumsum(np.array(gaps, np.int64)) + 1000 if n else np.empty(0, np.int64)
    queue = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int32)
    qo = np.zeros(n, np.int64)
    for c in range(4):                                    # each queue's offsets rise, with an occasional gap
        rows = np.flatnonzero(queue == c)
        qo[rows] = np.cumsum(1 + np.array(draw(st.lists(st.sampled_from([0, 0, 0, 1]), min_size=len(rows),
                                                                   max_size=len(rows))), np.int64))
    size = np.array(draw(st.lists(st.integers(1, 60), min_size=n, max_size=n)), np.int32)
    tags = np.array(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)), np.int64)
    return offsets, queue, qo, size, tags


@settings(max_examples=150, deadline=None)
@given(recs=records(), data=st.data())
def test_units_join_the_record_at_their_offset(recs, data):
    offsets, queue, qo, size, tags = recs
    n = len(offsets)
    picks = data.draw(st.lists(st.tuples(st.integers(-1, max(n - 1, 0)), st.integers(0, 5), st.integers(-1, 4)),
                               max_size=30))
    phy, usize, utags, uqo, code = [], [], [], [], []
    for r, tweak, c in sorted(picks, key=lambda p: p[0]):
        if r < 0 or not n:
            phy.append(int(data.draw(st.integers(0, 3000)))), usize.append(5), utags.append(0), uqo.append(1)
        else:
            phy.append(int(offsets[r])), usize.append(int(size[r]) + (tweak == 1))
            utags.append(int(tags[r]) + (tweak == 2)), uqo.append(int(qo[r]) + (tweak == 3))
        code.append(c if c < 4 else int(queue[r]) if r >= 0 and n else -1)
    phy, usize, utags, uqo, code = (np.array(v, np.int64) for v in (phy, usize, utags, uqo, code))
    end = int(offsets[-1]) + 10 if n else 0
    covered = np.zeros(n, bool)
    at, bad = join_units(offsets, queue, qo, size, tags, *queue_rows(queue, 4), end, phy, usize, utags, uqo, code,
                         covered)
    want_covered = np.zeros(n, bool)
    for i in range(len(phy)):
        hits = np.flatnonzero(offsets == phy[i])
        r = int(hits[0]) if len(hits) else -1
        assert at[i] == r
        mine = r >= 0 and queue[r] == code[i]
        assert bad[i] == (not (mine and size[r] == usize[i] and qo[r] == uqo[i] and tags[r] == utags[i]))
        if mine and phy[i] + usize[i] <= end:
            want_covered[r] = True
    assert (covered == want_covered).all()


@settings(max_examples=150, deadline=None)
@given(recs=records(), data=st.data())
def test_entries_join_and_mark_the_keys_they_hold(recs, data):
    offsets, queue, _, _, _ = recs
    n = len(offsets)
    counts = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int64)
    key_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    key_hashes = np.array(data.draw(st.lists(st.integers(0, 5), min_size=int(counts.sum()),
                                             max_size=int(counts.sum()))), np.int32)
    entries = sorted(data.draw(st.lists(st.tuples(st.integers(-1, max(n - 1, 0)), st.integers(0, 5)), max_size=30)))
    phy = np.array([int(offsets[r]) if r >= 0 and n else 7 for r, _ in entries], np.int64)
    key_hash = np.array([h for _, h in entries], np.int64)
    matched = np.zeros(len(key_hashes), bool)
    at, ok = join_entries(offsets, key_offsets, key_hashes, phy, key_hash, matched)
    have = set()
    for i in range(len(phy)):
        hits = np.flatnonzero(offsets == phy[i])
        r = int(hits[0]) if len(hits) else -1
        assert at[i] == r
        keys = set(key_hashes[key_offsets[r]:key_offsets[r + 1]].tolist()) if r >= 0 else set()
        assert ok[i] == (int(key_hash[i]) in keys)
        if ok[i]:
            have.add((r, int(key_hash[i])))
    wanted = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    missing = sorted({(r, h) for r in np.flatnonzero(wanted).tolist()
                      for h in key_hashes[key_offsets[r]:key_offsets[r + 1]].tolist() if (r, h) not in have})
    count, first = unmatched_keys(key_offsets, key_hashes, matched, wanted)
    assert (count, first) == (len(missing), missing[0][0] if missing else -1)


@given(st.lists(st.integers(0, 4), max_size=40), st.lists(st.integers(0, 2), min_size=40, max_size=40))
def test_queue_rows_groups_stably_and_unbroken_runs(queue, steps):
    q = np.array(queue, np.int32)
    rows, first = queue_rows(q, 5)
    assert rows.tolist() == np.argsort(q, kind="stable").tolist()
    assert first.tolist() == np.concatenate([[0], np.cumsum(np.bincount(q, minlength=5))]).tolist()
    offset = np.cumsum(np.array(steps[:len(q)], np.int64))
    end = offset * 10
    runs = unbroken(first, offset, end)
    for c in range(5):
        o = offset[first[c]:first[c + 1]]
        assert runs[c] == bool((np.diff(o) == 1).all())


@settings(max_examples=100, deadline=None)
@given(gaps=st.lists(st.integers(1, 10_000), min_size=1, max_size=700), data=st.data())
def test_a_segment_cut_by_a_file_is_found_as_a_bisection_finds_it(tmp_path_factory, gaps, data):
    from rmqtool import constants as C
    from rmqtool.ops.verify import UNIT_DTYPE, Segment, _bisect, _seek

    units = np.zeros(len(gaps), UNIT_DTYPE)
    units["phy"], units["size"] = np.cumsum(gaps), 1
    path = tmp_path_factory.mktemp("cq") / "00000000000000000000"
    path.write_bytes(units.tobytes())
    lo = data.draw(st.integers(0, len(gaps) - 1))
    hi = data.draw(st.integers(lo + 1, len(gaps)))
    phys = units["phy"].astype(np.int64)
    seg = Segment(path, lo, hi, int(phys[lo]), int(phys[hi - 1]))
    pos = lambda i: i * C.CQ_STORE_UNIT_SIZE    # noqa: E731
    with open(path, "rb") as fh:
        for phy in data.draw(st.lists(st.integers(0, int(phys[-1]) + 10), min_size=1, max_size=8)):
            start = data.draw(st.integers(lo, hi))
            want = _bisect(fh.fileno(), start, hi, phy, lambda i: pos(i))
            assert _seek(fh.fileno(), seg, start, phy, UNIT_DTYPE, pos) == want
