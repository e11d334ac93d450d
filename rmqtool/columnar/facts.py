"""The facts the maintenance commands keep per record, computed from a window of the scan kernel in one
compiled pass (no Arrow arrays, no copies of topics or properties).

``window_facts`` gives, for the records of a window scanned without ``items``: each record's topic as
an index into the window's distinct topics (numbered in order of first appearance, as
``pyarrow.compute.dictionary_encode`` numbers them), the TAGS hashCode (the consume queue's tagsCode
off the delay topic), and on request the index key hashes (IndexService.buildIndex: UNIQ_KEY, then each
KEYS element split at a space, each hashed as IndexFile.indexKeyHashMethod of ``topic#key``). Java's
String.hashCode runs over UTF-16 code units, taken from the UTF-8 text as it is walked: a window whose
topics or hashed values are not valid UTF-8 gives None, and the caller takes the Arrow path
(``rmqtool.columnar.decode.decode_facts``) for it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rmqtool import constants as C
from rmqtool.columnar.kernel import Window, _helper, _jit, _prefetch, _same, prop_column, text_hash
from rmqtool.format.java import tags_code
from rmqtool.format.properties import parse_properties

# Properties the dispatch of batch and LMQ queues reads (CommitLog.setBatchSizeIfNeeded, multi-dispatch)
DISPATCH_PROPERTIES = (C.PROPERTY_INNER_NUM, C.PROPERTY_INNER_BASE, C.PROPERTY_INNER_MULTI_DISPATCH,
                       C.PROPERTY_INNER_MULTI_QUEUE_OFFSET)
_M = 0xFFFFFFFF
_SPACE = ord(C.KEY_SEPARATOR)
_HASH_SIGN = ord("#")
_ZERO = np.int64(0)     # a seed as a typed global, not a literal: text_hash compiles once


class WindowFacts(NamedTuple):
    topic_index: np.ndarray      # per record: its topic's number (the window's topics, in order of first appearance)
    first: np.ndarray            # per topic: the record it first appears in
    topic_hash: np.ndarray       # per topic: String.hashCode (unsigned 32-bit)
    pairs: np.ndarray            # the distinct (topic number << 32 | queue id as uint32), in order of first appearance
    pair_index: np.ndarray       # per record: its pair's number in ``pairs``
    tags_code: np.ndarray        # int64: TAGS hashCode (0 without TAGS); delay-topic records not derived yet
    key_counts: np.ndarray       # int64: index keys per record (empty without keys)
    key_hashes: np.ndarray       # int32: the records' index key hashes one after another


@_helper
def _index_hash(h):
    """IndexFile.indexKeyHashMethod: abs of the signed hashCode, Integer.MIN_VALUE as 0."""
    s = h - (1 << 32) if h >= (1 << 31) else h
    return 0 if s == -(1 << 31) else abs(s)


@_jit
def _window_facts(d, topic_pos, topic_len, queue_id, props, tag, uniq, keys, text, want_keys, want_tags, want_pairs,
                  table, pair_table, topic_index, first, topic_hash, pairs, pair_index, tags, counts, hashes):
    """(ok, topics, pairs, key hashes): the facts into the caller's arrays (``table`` and ``pair_table``:
    empty hash tables, a power of two of slots, at least twice the records); ``props``: the window's
    property spans, the TAGS, UNIQ_KEY and KEYS values' starts in columns ``tag``, ``uniq`` and ``keys``
    (their ends in the next); ok False: text that is not valid UTF-8 in a topic, a hashed value or one of
    the properties whose starts are in the columns ``text``."""
    n = len(topic_pos)
    cap = len(table)
    npairs = k = topics = np.int64(0)
    for i in range(n):
        if i + 6 < n:
            _prefetch(d, topic_pos[i + 6])
            if props[i + 6, uniq] >= 0:
                _prefetch(d, props[i + 6, uniq])
        a = topic_pos[i]
        ln = topic_len[i]
        h = text_hash(d, a, a + ln, _ZERO)
        if h < 0:
            return False, topics, npairs, k
        slot = h & (cap - 1)
        while True:
            t = table[slot]
            if t < 0:
                table[slot] = topics
                first[topics] = i
                topic_hash[topics] = h
                t = topics
                topics += 1
                break
            r = first[t]
            if topic_hash[t] == h and topic_len[r] == ln and _same(d, topic_pos[r], d, a, ln):
                break
            slot = (slot + 1) & (cap - 1)
        topic_index[i] = t
        if want_pairs:
            key = (t << 32) | (queue_id[i] & _M)
            mixed = t * 0x9E3779B1 ^ (queue_id[i] & _M) * 0x85EBCA6B     # both halves of the key reach the slot
            slot = (mixed ^ (mixed >> 17)) & (cap - 1)
            while True:
                c = pair_table[slot]
                if c < 0:
                    pair_table[slot] = npairs
                    pairs[npairs] = key
                    c = npairs
                    npairs += 1
                    break
                if pairs[c] == key:
                    break
                slot = (slot + 1) & (cap - 1)
            pair_index[i] = c
        if want_tags:
            tags[i] = 0
            if props[i, tag] >= 0:
                g = text_hash(d, props[i, tag], props[i, tag + 1], _ZERO)
                if g < 0:
                    return False, topics, npairs, k
                tags[i] = g - (1 << 32) if g >= (1 << 31) else g
        if want_keys:
            head = (h * 31 + _HASH_SIGN) & _M
            k0 = k
            if props[i, uniq] >= 0:
                g = text_hash(d, props[i, uniq], props[i, uniq + 1], head)
                if g < 0:
                    return False, topics, npairs, k
                hashes[k] = _index_hash(g)
                k += 1
            a = props[i, keys]
            e = props[i, keys + 1]
            while a < e:                # an absent KEYS: start and end -1
                b = a
                while b < e and d[b] != _SPACE:
                    b += 1
                if b > a:
                    g = text_hash(d, a, b, head)
                    if g < 0:
                        return False, topics, npairs, k
                    hashes[k] = _index_hash(g)
                    k += 1
                a = b + 1
            counts[i] = k - k0
    for j in text:
        for i in range(n):
            if props[i, j] >= 0 and text_hash(d, props[i, j], props[i, j + 1], _ZERO) < 0:
                return False, topics, npairs, k
    return True, topics, npairs, k


def window_facts(data: np.ndarray, win: Window, keys: bool, text_props: tuple[str, ...] = (), *, tags: bool = True,
                 pairs: bool = True) -> WindowFacts | None:
    """The facts of the window's records (scanned without ``items``: spans point into ``data``); None when
    a topic, TAGS, UNIQ_KEY or KEYS value, or one of the properties ``text_props``, is not valid UTF-8.
    Without ``tags`` the TAGS hashCodes are neither taken nor their text checked (``tags_code`` empty);
    without ``pairs``, no (topic, queue id) pairs (``pairs`` and ``pair_index`` empty)."""
    n = win.n
    # arrays made here, not in compiled code (each numpy constructor there is one more compiled function)
    slots = np.full((2, max(16, 1 << (2 * n - 1).bit_length())), -1, np.int64)     # topic and pair hash tables
    rows = np.empty((7, n), np.int64)
    room = 0
    if keys:                              # each key at least one byte and a space
        (uniq_s, _), (keys_s, keys_e) = win.prop(C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), win.prop(C.PROPERTY_KEYS)
        room = int(np.count_nonzero(uniq_s >= 0) + ((keys_e - keys_s + 1) // 2).sum())    # absent: (-1 + 1) // 2
    hashes = np.empty(room, np.int32)
    topic_index, first, topic_hash, pair_keys, pair_index, tags_code, counts = rows
    ok, topics, npairs, k = _window_facts(
        data, win["topic_pos"], win["topic_len"], win["queue_id"], win.props, prop_column(C.PROPERTY_TAGS),
        prop_column(C.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), prop_column(C.PROPERTY_KEYS),
        np.array([prop_column(name) for name in text_props], np.int64), keys, tags, pairs, slots[0], slots[1],
        topic_index, first, topic_hash, pair_keys, pair_index, tags_code, counts, hashes)
    if not ok:
        return None
    return WindowFacts(topic_index, first[:topics], topic_hash[:topics], pair_keys[:npairs],
                       pair_index if pairs else pair_index[:0], tags_code if tags else tags_code[:0],
                       counts if keys else counts[:0], hashes[:k])


def split_pairs(pairs: np.ndarray) -> tuple[list[int], list[int]]:
    """(topic numbers, queue ids as the int32 a record holds) of (topic number << 32 | queue id as uint32)
    pairs (``WindowFacts.pairs``)."""
    return (pairs >> 32).tolist(), (pairs & 0xFFFFFFFF).astype(np.uint32).view(np.int32).tolist()


def window_topic(data: np.ndarray, win: Window, facts: WindowFacts, t: int) -> str:
    """The window's topic number ``t`` (valid UTF-8: the window's facts were taken)."""
    r = facts.first[t]
    a = win["topic_pos"][r]
    return bytes(data[a:a + win["topic_len"][r]]).decode()


@_helper
def _pair_slot(t, q, cap):
    mixed = t * 0x9E3779B1 + q * 0x2F                    # both halves reach the slot; no int64 overflow
    return (mixed ^ (mixed >> 17)) & (cap - 1)


@_helper
def _find_topic(t_slots, t_hash, t_start, t_len, t_bytes, d, a, ln, h):
    """(number of the topic d[a:a + ln] of hash ``h`` or -1, its slot or the empty slot it would take)."""
    cap = len(t_slots)
    slot = h & (cap - 1)
    while True:
        t = t_slots[slot]
        if t < 0:
            return -1, slot
        if t_hash[t] == h and t_len[t] == ln:
            s = t_start[t]
            same = True
            for j in range(ln):
                if t_bytes[s + j] != d[a + j]:
                    same = False
                    break
            if same:
                return t, slot
        slot = (slot + 1) & (cap - 1)


@_helper
def _find_pair(p_slots, p_key, t, q):
    """(index of pair (t, q) in ``p_key`` or -1, its slot or the empty slot it would take)."""
    cap = len(p_slots)
    key = (t << 32) | q
    slot = _pair_slot(t, q, cap)
    while True:
        c = p_slots[slot]
        if c < 0 or p_key[c] == key:
            return c, slot
        slot = (slot + 1) & (cap - 1)


@_jit
def _table_codes(d, topic_pos, topic_len, first, topic_hash, pairs, codes, t_slots, t_hash, t_start, t_len,
                 t_bytes, p_slots, p_key, p_code, used, number):
    """The table's code of each of a window's ``pairs`` into ``codes``; a pair the table lacks keeps its
    code there: -1 (looked up only), or one the caller gives, and then the pair goes into the table with it
    (the caller has made room). ``used``: (topics, topic bytes, pairs) in the table, updated; ``number``:
    room for the table's number of each of the window's topics. One function for look-up and insert: each
    compiled function costs a first run ~0.1 CPU-s."""
    for w in range(len(first)):
        number[w] = -2                      # not looked up yet
    for i in range(len(pairs)):
        w = pairs[i] >> 32
        t = number[w]
        if t == -2:
            r = first[w]
            a, ln, h = topic_pos[r], topic_len[r], topic_hash[w]
            t, slot = _find_topic(t_slots, t_hash, t_start, t_len, t_bytes, d, a, ln, h)
            if t < 0 and codes[i] >= 0:
                t = used[0]
                t_slots[slot] = t
                t_hash[t], t_start[t], t_len[t] = h, used[1], ln
                for j in range(ln):         # not a slice assignment: its shape check compiles an error message
                    t_bytes[used[1] + j] = d[a + j]
                used[0] += 1
                used[1] += ln
            number[w] = t
        if t < 0:
            continue
        c, slot = _find_pair(p_slots, p_key, t, pairs[i] & _M)
        if c >= 0:
            codes[i] = p_code[c]
        elif codes[i] >= 0:
            p_slots[slot] = used[2]
            p_key[used[2]], p_code[used[2]] = (t << 32) | (pairs[i] & _M), codes[i]
            used[2] += 1


@_jit
def _rehash(slots, keys, count, topics):
    """Refill emptied ``slots`` from the first ``count`` keys (topics: hashes; else pair keys)."""
    cap = len(slots)
    for c in range(count):
        slot = keys[c] & (cap - 1) if topics else _pair_slot(keys[c] >> 32, keys[c] & _M, cap)
        while slots[slot] >= 0:
            slot = (slot + 1) & (cap - 1)
        slots[slot] = c


class QueueTable:
    """Queue codes of (topic, queue id) pairs across the windows of a scan, looked up in compiled code
    (topics by String.hashCode and bytes, pairs by topic number and queue id): a window's pairs cost
    no Python unless they are new to the scan."""

    def __init__(self):
        self.t_slots, self.p_slots = np.full(64, -1, np.int64), np.full(64, -1, np.int64)
        self.t_hash, self.t_start, self.t_len = (np.empty(32, np.int64) for _ in range(3))
        self.t_bytes = np.empty(4096, np.uint8)
        self.p_key, self.p_code = np.empty(32, np.int64), np.empty(32, np.int64)
        self.used = np.zeros(3, np.int64)            # topics, topic bytes, pairs

    def lookup(self, data: np.ndarray, win: Window, facts: WindowFacts) -> np.ndarray:
        """The code of each pair of ``facts`` (-1: not in the table)."""
        codes = np.full(len(facts.pairs), -1, np.int64)
        self._codes(data, win, facts, facts.pairs, codes)
        return codes

    def _codes(self, data: np.ndarray, win: Window, facts: WindowFacts, pairs: np.ndarray, codes: np.ndarray):
        _table_codes(data, win["topic_pos"], win["topic_len"], facts.first, facts.topic_hash, pairs, codes,
                     self.t_slots, self.t_hash, self.t_start, self.t_len, self.t_bytes, self.p_slots, self.p_key,
                     self.p_code, self.used, np.empty(len(facts.first), np.int64))

    def insert(self, data: np.ndarray, win: Window, facts: WindowFacts, pairs: np.ndarray, codes: np.ndarray) -> None:
        """Pairs of ``facts.pairs`` that ``lookup`` did not find, with their codes."""
        topics, used, count = (int(v) for v in self.used)
        more = len(pairs)
        if 2 * (topics + more) > len(self.t_slots):                    # slots: a power of two, at most half full
            cap = 1 << (4 * (topics + more)).bit_length()
            self.t_hash, self.t_start, self.t_len = (np.resize(a, cap // 2)
                                                     for a in (self.t_hash, self.t_start, self.t_len))
            self.t_slots = np.full(cap, -1, np.int64)
            _rehash(self.t_slots, self.t_hash, topics, True)
        room = used + int(win["topic_len"][facts.first].sum())
        if room > len(self.t_bytes):
            self.t_bytes = np.resize(self.t_bytes, 2 * room)
        if 2 * (count + more) > len(self.p_slots):
            cap = 1 << (4 * (count + more)).bit_length()
            self.p_key, self.p_code = np.resize(self.p_key, cap // 2), np.resize(self.p_code, cap // 2)
            self.p_slots = np.full(cap, -1, np.int64)
            _rehash(self.p_slots, self.p_key, count, False)
        self._codes(data, win, facts, pairs, codes)


def delay_tags_code(raw: bytes, store_timestamp: int) -> int | None:
    """The tagsCode of a record on the delay topic (SCHEDULE_TOPIC_XXXX) from its PROPERTIES, as the
    record-at-a-time decoder takes it (the DELAY level's deliver time); None for a malformed DELAY, which the
    broker rejects (CommitLog.checkMessageAndReturnSize: Integer.parseInt)."""
    try:
        return tags_code(C.RMQ_SYS_SCHEDULE_TOPIC, parse_properties(raw), store_timestamp)
    except ValueError:
        return None
