"""Index files (IndexHeader, IndexFile): a 40-byte header, hash slots (i32), then 20-byte entries.

Header: beginTimestamp i64 | endTimestamp i64 | beginPhyOffset i64 | endPhyOffset i64 |
hashSlotCount i32 | indexCount i32. Slot: the number of the newest entry of its chain (0 = empty).
Entry: keyHash i32 | phyOffset i64 | timeDiff (seconds) i32 | prevIndex i32. Entry 0 is never used.

The geometry (slot count, entry capacity) is not stored; ``infer_geometry`` finds it from the bytes.
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

from rmqtool import constants as C
from rmqtool.errors import EncodeError, FormatError
from rmqtool.format.java import index_key_hash

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
_SLOT = struct.Struct(">i")
_INT_MAX = 2**31 - 1
ENTRY_FIELDS = [("hash", ">i4"), ("phy", ">i8"), ("time_diff", ">i4"), ("prev", ">i4")]   # numpy dtype


class IndexHeader(NamedTuple):
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 0

    @property
    def entry_count(self) -> int:
        """Entries written: indexCount starts at 1 (0 on disk before the first put)."""
        return max(self.index_count - 1, 0)


class IndexEntry(NamedTuple):
    key_hash: int
    phy_offset: int
    time_diff: int
    prev_index: int


class Geometry(NamedTuple):
    hash_slot_num: int
    index_num: int

    @property
    def file_size(self) -> int:
        return C.INDEX_HEADER_SIZE + C.INDEX_HASH_SLOT_SIZE * self.hash_slot_num \
            + C.INDEX_ENTRY_SIZE * self.index_num

    def slot_pos(self, slot: int) -> int:
        return C.INDEX_HEADER_SIZE + C.INDEX_HASH_SLOT_SIZE * slot

    def entry_pos(self, number: int) -> int:
        return C.INDEX_HEADER_SIZE + C.INDEX_HASH_SLOT_SIZE * self.hash_slot_num + C.INDEX_ENTRY_SIZE * number


DEFAULT_GEOMETRY = Geometry(C.DEFAULT_MAX_HASH_SLOT_NUM, C.DEFAULT_MAX_INDEX_NUM)


def decode_header(buf) -> IndexHeader:
    if len(buf) < C.INDEX_HEADER_SIZE:
        raise FormatError(f"index file of {len(buf)} bytes is smaller than its 40-byte header")
    return IndexHeader._make(HEADER.unpack_from(buf, 0))


def header_problem(header: IndexHeader, geometry: Geometry) -> str | None:
    """Why these 40 bytes cannot be the header of an index file of this geometry (None: they can).

    IndexFile.putKey writes the header: indexCount starts at 1 and stays within the capacity, every slot
    it fills (hashSlotCount) holds an entry, and the times and offsets grow with the entries. A file not
    yet written to has a header of zeros."""
    if header.index_count == 0:
        return None if header == IndexHeader() else "indexCount is 0 but the header is not empty"
    if not 1 <= header.index_count <= geometry.index_num:
        return f"indexCount {header.index_count} outside 1..{geometry.index_num}"
    if not 0 <= header.hash_slot_count <= min(geometry.hash_slot_num, header.index_count - 1):
        return f"hashSlotCount {header.hash_slot_count} outside 0..{min(geometry.hash_slot_num, header.index_count - 1)}"
    if not 0 <= header.begin_timestamp <= header.end_timestamp:
        return f"beginTimestamp {header.begin_timestamp} after endTimestamp {header.end_timestamp}"
    if not 0 <= header.begin_phy_offset <= header.end_phy_offset:
        return f"beginPhyOffset {header.begin_phy_offset} after endPhyOffset {header.end_phy_offset}"
    return None


def encode_header(header: IndexHeader) -> bytes:
    return HEADER.pack(*header)


def candidate_geometries(file_size: int) -> list[Geometry]:
    """Every (slots, entries) split of the bytes after the header, fewest slots first."""
    rest = file_size - C.INDEX_HEADER_SIZE
    if rest < C.INDEX_HASH_SLOT_SIZE + C.INDEX_ENTRY_SIZE:
        return []
    out = []
    for slots in range(1, rest // C.INDEX_HASH_SLOT_SIZE + 1):
        left = rest - C.INDEX_HASH_SLOT_SIZE * slots
        if left >= C.INDEX_ENTRY_SIZE and left % C.INDEX_ENTRY_SIZE == 0:
            out.append(Geometry(slots, left // C.INDEX_ENTRY_SIZE))
    return out


def _consistent(buf, geometry: Geometry, header: IndexHeader) -> bool:
    """Does every slot and entry agree with this geometry? (hash % slots lands on its own chain)."""
    count = max(header.index_count, 1)
    if count > geometry.index_num:
        return False
    slots = struct.unpack_from(f">{geometry.hash_slot_num}i", buf, C.INDEX_HEADER_SIZE)
    owner = {}
    for slot, value in enumerate(slots):
        if value < 0 or value >= count:
            return False
        number = value
        seen = 0
        while number > 0:
            if owner.setdefault(number, slot) != slot or seen > count:
                return False
            key_hash, _, _, prev = ENTRY.unpack_from(buf, geometry.entry_pos(number))
            if key_hash < 0 or key_hash % geometry.hash_slot_num != slot or not 0 <= prev < number:
                return False
            number, seen = prev, seen + 1
    if any(buf[geometry.entry_pos(0):geometry.entry_pos(1)]):
        return False
    tail_start = geometry.entry_pos(count)
    return not any(buf[tail_start:geometry.file_size])


def infer_geometry(buf, *, hint: Geometry | None = None) -> Geometry:
    """Find the slot count and entry capacity of an index file from its bytes.

    A ``hint`` (e.g. the geometry of a sibling file) wins when it fits; the broker default wins for
    420,000,040-byte files; otherwise the first split under which every slot chain is consistent.
    An index file with no entries fits every split: then the hint, the default, or N = 4 x slots.
    """
    size = len(buf)
    header = decode_header(buf)
    for preferred in (hint, DEFAULT_GEOMETRY):
        if preferred is not None and preferred.file_size == size:
            return preferred
    candidates = candidate_geometries(size)
    if not candidates:
        raise FormatError(f"index file size {size} fits no geometry (40 + 4*slots + 20*entries)")
    if header.index_count <= 1:
        return next((g for g in candidates if g.index_num == 4 * g.hash_slot_num), candidates[0])
    for geometry in candidates:
        if _consistent(buf, geometry, header):
            return geometry
    raise FormatError(f"index file of {size} bytes: no slot/entry geometry is consistent with its chains")


class IndexFile(NamedTuple):
    """A whole index file: header, every slot, every entry (entry 0 included) and its geometry."""

    header: IndexHeader
    slots: tuple[int, ...]
    entries: tuple[IndexEntry, ...]

    @property
    def geometry(self) -> Geometry:
        return Geometry(len(self.slots), len(self.entries))


def decode_index_file(buf, geometry: Geometry | None = None) -> IndexFile:
    geometry = geometry or infer_geometry(buf)
    if len(buf) != geometry.file_size:
        raise FormatError(f"index file is {len(buf)} bytes, geometry {geometry} needs {geometry.file_size}")
    header = decode_header(buf)
    slots = struct.unpack_from(f">{geometry.hash_slot_num}i", buf, C.INDEX_HEADER_SIZE)
    start = geometry.entry_pos(0)
    entries = tuple(IndexEntry._make(e) for e in ENTRY.iter_unpack(buf[start:geometry.file_size]))
    return IndexFile(header, slots, entries)


def encode_index_file(index: IndexFile) -> bytes:
    return b"".join((encode_header(index.header),
                     struct.pack(f">{len(index.slots)}i", *index.slots),
                     b"".join(ENTRY.pack(*e) for e in index.entries)))


def is_time_matched(header: IndexHeader, begin: int, end: int) -> bool:
    """IndexFile.isTimeMatched."""
    b, e = header.begin_timestamp, header.end_timestamp
    return (begin < b and end > e) or b <= begin <= e or b <= end <= e


def select_phy_offsets(buf, geometry: Geometry, key: str, begin: int, end: int,
                       max_num: int, header: IndexHeader | None = None) -> list[int]:
    """IndexFile.selectPhyOffset: walk the key's chain (newest first), comparing the hash only.

    Reads only the header, one slot and the chain's entries, so it is cheap on a 420 MB file. Beyond the
    broker (whose walk never ends on a loop of links, and reads past the file for a damaged count): a link
    past the file's entries ends the chain, and so does the walk's ``index_num``-th step (no chain is longer).
    """
    header = header or decode_header(buf)
    key_hash = index_key_hash(key)
    slot_value = _SLOT.unpack_from(buf, geometry.slot_pos(key_hash % geometry.hash_slot_num))[0]
    out: list[int] = []
    last = min(header.index_count, geometry.index_num - 1)          # a damaged count reaches no further
    if slot_value <= 0 or slot_value > last or header.index_count <= 1:
        return out
    number = slot_value
    for _ in range(geometry.index_num):
        if len(out) >= max_num:
            break
        entry_hash, phy, time_diff, prev = ENTRY.unpack_from(buf, geometry.entry_pos(number))
        if time_diff < 0:
            break
        time_read = header.begin_timestamp + time_diff * 1000
        if entry_hash == key_hash and begin <= time_read <= end:
            out.append(phy)
        if prev <= 0 or prev > last or prev == number or time_read < begin:
            break
        number = prev
    return out


class IndexWriter:
    """IndexFile.putKey into an in-memory file, byte-for-byte as the broker writes it.

    ``hash_slot_count_every_put`` selects the <= 4.7.0 rule (count every put) over the 4.7.1+ rule
    (count a slot only when it was empty). The hash slots are read and set in ``slot_buf`` from ``slot_at``
    (by default ``buf`` itself); entries go out through ``_write_entries`` (by default into ``buf``).
    """

    def __init__(self, geometry: Geometry, prev_end_phy_offset: int = 0, prev_end_timestamp: int = 0,
                 hash_slot_count_every_put: bool = False, buf=None):
        self.geometry = geometry
        self.buf = bytearray(geometry.file_size) if buf is None else buf    # e.g. a writable mmap
        self.every_put = hash_slot_count_every_put
        self.slot_buf, self.slot_at = self.buf, C.INDEX_HEADER_SIZE
        h = IndexHeader(0, 0, 0, 0, 0, 0)
        if prev_end_phy_offset > 0 and prev_end_timestamp > 0:
            h = IndexHeader(prev_end_timestamp, prev_end_timestamp, prev_end_phy_offset, prev_end_phy_offset, 0, 0)
        self.header = h
        self.buf[:C.INDEX_HEADER_SIZE] = encode_header(h)

    @classmethod
    def from_bytes(cls, buf, geometry: Geometry, hash_slot_count_every_put: bool = False) -> "IndexWriter":
        """Continue putting keys into an existing index file (as the broker does after a restart). A
        writable buffer (a private map of the file, say) is written in place, a read-only one copied."""
        if len(buf) != geometry.file_size:
            raise FormatError(f"index file is {len(buf)} bytes, geometry {geometry} needs {geometry.file_size}")
        header = decode_header(buf)
        own = bytearray(buf) if memoryview(buf).readonly else buf
        writer = cls(geometry, hash_slot_count_every_put=hash_slot_count_every_put, buf=own)
        writer.header = header
        writer.buf[:C.INDEX_HEADER_SIZE] = encode_header(header)
        return writer

    @property
    def index_count(self) -> int:
        return max(self.header.index_count, 1)

    def is_full(self) -> bool:
        return self.index_count >= self.geometry.index_num

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        if self.is_full():
            return False
        h = self.header
        count = self.index_count
        key_hash = index_key_hash(key)
        slot_pos = self.slot_at + C.INDEX_HASH_SLOT_SIZE * (key_hash % self.geometry.hash_slot_num)
        slot_value = _SLOT.unpack_from(self.slot_buf, slot_pos)[0]
        if slot_value <= 0 or slot_value > count:
            slot_value = 0
        time_diff = 0 if h.begin_timestamp <= 0 else (store_timestamp - h.begin_timestamp)
        time_diff = int(time_diff / 1000) if time_diff < 0 else time_diff // 1000   # Java truncation
        time_diff = min(max(time_diff, 0), _INT_MAX)
        self._write_entries(count, ENTRY.pack(key_hash, phy_offset, time_diff, slot_value))
        _SLOT.pack_into(self.slot_buf, slot_pos, count)
        begin_ts, begin_phy = h.begin_timestamp, h.begin_phy_offset
        if count <= 1:
            begin_ts, begin_phy = store_timestamp, phy_offset
        slots_used = h.hash_slot_count + (1 if self.every_put or slot_value == 0 else 0)
        self.header = IndexHeader(begin_ts, store_timestamp, begin_phy, phy_offset, slots_used, count + 1)
        self.buf[:C.INDEX_HEADER_SIZE] = encode_header(self.header)
        return True

    def put_hashes(self, key_hash, phy_offset, store_timestamp) -> None:
        """``put_key`` for each key in order, given as numpy columns (hashes already computed)."""
        import numpy as np

        n = len(key_hash)
        if not n:
            return
        g, h = self.geometry, self.header
        count = self.index_count
        if count + n > g.index_num:
            raise EncodeError(f"{n} keys do not fit into an index file with {g.index_num - count} free entries")
        # keys grouped by slot in put order: (slot, i) as one int64, so a plain sort of it is stable (and
        # several times faster than a stable argsort); then every step is in slot order, no mask selections
        shift = n.bit_length()
        ranked = np.remainder(key_hash, g.hash_slot_num, dtype=np.int64)
        ranked <<= shift
        ranked |= np.arange(n)
        ranked.sort()                                 # in place, as most steps here: fewer arrays to fault in
        order = ranked & ((1 << shift) - 1)
        by_slot = ranked
        by_slot >>= shift
        first = np.empty(n, bool)                                         # a slot's first key of the put
        first[0] = True
        np.not_equal(by_slot[1:], by_slot[:-1], out=first[1:])
        slots = np.frombuffer(self.slot_buf, ">i4", g.hash_slot_num, self.slot_at)
        held = slots[by_slot]
        if held.min() < 0 or held.max() > count:                          # as putKey validates a slot
            held = held.astype(np.int64)
            held[(held <= 0) | (held > order + count)] = 0
        linked = np.roll(order, 1)                                        # the slot's key before, or for
        linked += count                                                   # its first key what the slot held
        np.copyto(linked, held, where=first)
        begin_ts, begin_phy = (int(store_timestamp[0]), int(phy_offset[0])) if count <= 1 else \
            (h.begin_timestamp, h.begin_phy_offset)
        entries = np.empty(n, ENTRY_FIELDS)
        entries["hash"], entries["phy"] = key_hash, phy_offset
        entries["prev"][order] = linked
        if begin_ts > 0:
            diff = store_timestamp - begin_ts
            diff //= 1000
            entries["time_diff"] = np.clip(diff, 0, _INT_MAX, out=diff)
        else:
            entries["time_diff"] = 0
        old = h.begin_timestamp                                           # the first put sees the old header
        entries["time_diff"][0] = 0 if old <= 0 else min(max((int(store_timestamp[0]) - old) // 1000, 0), _INT_MAX)
        self._write_entries(count, entries)
        newest = np.append(first[1:], True)                              # each slot's last entry
        slots[by_slot[newest]] = order[newest] + count
        used = n if self.every_put else int(np.count_nonzero(linked == 0))
        self.header = IndexHeader(begin_ts, int(store_timestamp[-1]), begin_phy, int(phy_offset[-1]),
                                  h.hash_slot_count + used, count + n)
        self.buf[:C.INDEX_HEADER_SIZE] = encode_header(self.header)

    def _write_entries(self, number: int, data) -> None:
        """Entries ``number`` on, packed (a bytes-like object of whole entries), into the file."""
        data = memoryview(data).cast("B")
        pos = self.geometry.entry_pos(number)
        self.buf[pos:pos + len(data)] = data

    def to_bytes(self) -> bytes:
        return bytes(self.buf)


def iter_chain(buf, geometry: Geometry, slot: int, index_count: int) -> Iterator[tuple[int, IndexEntry]]:
    """(entry number, entry) along one slot's chain, newest first, stopping at any loop."""
    number = _SLOT.unpack_from(buf, geometry.slot_pos(slot))[0]
    seen = set()
    while 0 < number < max(index_count, 1) and number not in seen:
        seen.add(number)
        entry = IndexEntry._make(ENTRY.unpack_from(buf, geometry.entry_pos(number)))
        yield number, entry
        number = entry.prev_index


def check_geometry(geometry: Geometry) -> None:
    if geometry.hash_slot_num <= 0 or geometry.index_num <= 1:
        raise EncodeError(f"impossible index geometry {geometry}")
