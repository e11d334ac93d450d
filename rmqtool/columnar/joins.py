"""verify's joins of one commit-log file's records (their facts: sorted offsets and columns) to the
consume-queue units and index entries pointing into it, each a compiled pass over sorted arrays
(no temporaries the size of the file, no per-record Python); the grouping by queue that rebuild-cq
shares.

Records are found by physical offset: through their queue's run of queue offsets where it is unbroken
(a unit's record is then one look-up away), else by a search of the sorted offsets that starts from
the last record found (units and entries come in rising offsets).
"""

from __future__ import annotations

import numpy as np

from rmqtool.columnar.kernel import _helper, _jit


# The functions below take their output arrays from their Python callers: each numpy constructor in
# compiled code is one more function for numba to compile on a first run.
def queue_rows(queue: np.ndarray, n_codes: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, first): the records grouped by queue code, in offset order within a queue (a counting
    sort); queue c's records are rows[first[c]:first[c + 1]]."""
    rows, first, fill = np.empty(len(queue), np.int64), np.zeros(n_codes + 1, np.int64), np.empty(n_codes, np.int64)
    _queue_rows(queue, rows, first, fill)
    return rows, first


@_jit
def _queue_rows(queue, rows, first, fill):
    for i in range(len(queue)):
        first[queue[i] + 1] += 1
    for c in range(len(fill)):
        first[c + 1] += first[c]
        fill[c] = first[c]
    for i in range(len(queue)):
        c = queue[i]
        rows[fill[c]] = i
        fill[c] += 1


@_helper
def _find(offsets, phy, hint):
    """The record starting at ``phy`` (-1 for none): a galloping search of the sorted ``offsets`` from
    ``hint`` (the last record found)."""
    n = len(offsets)
    if n == 0:
        return -1
    lo, hi = 0, n
    if 0 <= hint < n:
        if offsets[hint] <= phy:
            lo, step = hint, 1
            while lo + step < n and offsets[lo + step] <= phy:
                lo += step
                step *= 2
            hi = lo + step if lo + step < n else n
        else:
            hi, step = hint, 1
            while hi - step >= 0 and offsets[hi - step] > phy:
                hi -= step
                step *= 2
            lo = hi - step if hi > step else 0
    while lo < hi:                       # first index whose offset is > phy, in [lo, hi]
        mid = (lo + hi) // 2
        if offsets[mid] <= phy:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1 if lo > 0 and offsets[lo - 1] == phy else -1


def join_units(offsets, queue, queue_offset, size, tags_code, rows, first, end,
               phy, unit_size, unit_tags, unit_qo, unit_code, covered) -> tuple[np.ndarray, np.ndarray]:
    """(record of each unit or -1, whether the unit disagrees with it): size, queue, queue offset and
    tagsCode compared; ``covered`` set for the records a unit of their own queue holds (one that
    reaches past ``end``, the file's data, covers nothing). Each unit's record is read where it is (a copy
    of the columns in queue order, read in the units' order, cost as much to make as it saved, and ~60 MB
    more memory per GiB of commit log)."""
    at, bad = np.full(len(phy), -1, np.int64), np.ones(len(phy), np.bool_)
    _join_units(offsets, queue, queue_offset, size, tags_code, rows, first, end, phy, unit_size, unit_tags, unit_qo,
                unit_code, covered, at, bad)
    return at, bad


@_jit
def _join_units(offsets, queue, queue_offset, size, tags_code, rows, first, end,
                phy, unit_size, unit_tags, unit_qo, unit_code, covered, at, bad):
    m = len(phy)
    hint = np.int64(-1)         # not a literal: _find would compile once more for Literal[int](-1)
    for i in range(m):
        c = unit_code[i]
        if c >= 0 and first[c + 1] > first[c]:      # the queue's k-th record in the file, if its run is unbroken
            p = first[c] + unit_qo[i] - queue_offset[rows[first[c]]]
            if first[c] <= p < first[c + 1] and offsets[rows[p]] == phy[i]:
                r = rows[p]
                hint = r
                at[i] = r
                if phy[i] + unit_size[i] <= end:
                    covered[r] = True
                bad[i] = not (size[r] == unit_size[i] and queue_offset[r] == unit_qo[i]
                              and tags_code[r] == unit_tags[i])
                continue
        r = _find(offsets, phy[i], hint)
        if r < 0:
            continue
        mine = queue[r] == c            # a record of the queue's own rows
        hint = r
        at[i] = r
        if mine and phy[i] + unit_size[i] <= end:
            covered[r] = True
        bad[i] = not (mine and size[r] == unit_size[i] and queue_offset[r] == unit_qo[i]
                      and tags_code[r] == unit_tags[i])


def join_entries(offsets, key_offsets, key_hashes, phy, key_hash, matched) -> tuple[np.ndarray, np.ndarray]:
    """(record of each index entry or -1, whether that record has a key of the entry's hash); every key
    of a record an entry holds is set in ``matched`` (a flag per key hash)."""
    at, ok = np.full(len(phy), -1, np.int64), np.zeros(len(phy), np.bool_)
    _join_entries(offsets, key_offsets, key_hashes, phy, key_hash, matched, at, ok)
    return at, ok


@_jit
def _join_entries(offsets, key_offsets, key_hashes, phy, key_hash, matched, at, ok):
    m = len(phy)
    r = hint = np.int64(-1)
    for i in range(m):
        if i == 0 or phy[i] != phy[i - 1]:          # a record's keys come in a row: searched once
            r = _find(offsets, phy[i], hint)
        if r < 0:
            continue
        hint = r
        at[i] = r
        for s in range(key_offsets[r], key_offsets[r + 1]):
            if key_hashes[s] == key_hash[i]:
                ok[i] = True
                matched[s] = True


def unmatched_keys(key_offsets, key_hashes, matched, wanted) -> tuple[int, int]:
    """(distinct (record, key hash) pairs of the ``wanted`` records that no entry holds, the first such
    record or -1). An entry marks every key of its hash in its record, so only unmatched keys count (few:
    numpy over them, not one more function to compile on a first run)."""
    at = np.flatnonzero(~matched)
    rows = np.searchsorted(key_offsets, at, side="right") - 1      # the record each key belongs to
    keep = wanted[rows]
    # sorted and counted, not np.unique: that imports numpy.ma (~0.03 CPU-s of a small store's verify)
    pairs = np.sort(rows[keep] << 32 | (key_hashes[at[keep]].astype(np.int64) & 0xFFFFFFFF))
    if not len(pairs):
        return 0, -1
    return 1 + int(np.count_nonzero(pairs[1:] != pairs[:-1])), int(pairs[0] >> 32)


def unbroken(first: np.ndarray, queue_offset: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per group g (items first[g]:first[g + 1]): whether its queue offsets step by one and its ends
    (physical offset + size) rise, i.e. it can go into its queue as one block."""
    out = np.ones(len(first) - 1, np.bool_)
    _unbroken(first, queue_offset, end, out)
    return out


@_jit
def _unbroken(first, queue_offset, end, out):
    for g in range(len(first) - 1):
        for i in range(first[g] + 1, first[g + 1]):
            if queue_offset[i] != queue_offset[i - 1] + 1 or end[i] <= end[i - 1]:
                out[g] = False
                break
