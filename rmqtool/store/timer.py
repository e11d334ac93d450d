"""The timer store of a 5.x broker on disk: ``timerlog/`` (a file queue of 52-byte units), the sparse
``timerwheel`` file and ``config/timercheck`` / ``config/timermetrics``.

Nothing assumes the broker's defaults: timer-log file sizes come from the files, the wheel's slot count
from its size (``slotsTotal * 2`` slots of 32 bytes), and the precision from the wheel itself (a slot
stores ``timeMs / precisionMs`` and its last unit the full time) unless the caller knows it. The wheel
is never read whole: its data extents are found with SEEK_DATA/SEEK_HOLE and read in chunks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator

from rmqtool.errors import FormatError, StoreError
from rmqtool.format.timer import (DEFAULT_PRECISION_MS, SLOT_SIZE, UNIT_SIZE, TimerBlank, TimerCheckpoint,
                                  TimerLogEntry, TimerMetrics, TimerSlot, TimerUnit, decode_slot,
                                  decode_timer_metrics, decode_timercheck, decode_timerlog_entry)
from rmqtool.store.config import Loaded, load_config
from rmqtool.store.filequeue import FileQueue, data_extents

CHUNK_BYTES = 1 << 20          # wheel bytes examined at a time (a multiple of the slot size)


@dataclass(frozen=True)
class TimerStore:
    root: Path
    given_precision_ms: int | None = None

    @classmethod
    def open(cls, root: Path, precision_ms: int | None = None) -> "TimerStore | None":
        """The timer store under a store root, or None when it has neither timerlog/ nor timerwheel."""
        root = Path(root)
        if not (root / "timerlog").is_dir() and not (root / "timerwheel").is_file():
            return None
        if precision_ms is not None and precision_ms <= 0:
            raise StoreError(f"timer precision must be positive, not {precision_ms}")
        return cls(root, precision_ms)

    # -- timer log --------------------------------------------------------------------------------
    @cached_property
    def timerlog(self) -> FileQueue:
        d = self.root / "timerlog"
        return FileQueue.from_dir(d) if d.is_dir() else FileQueue([])

    def iter_timerlog(self) -> Iterator[tuple[int, TimerLogEntry]]:
        """(offset, unit or BLANK) in order up to the end of written units (a zero unit header).
        A unit that does not decode raises FormatError with its file and offset."""
        for f in self.timerlog:
            buf = f.read()
            pos = 0
            while pos < len(buf):
                head = bytes(buf[pos:pos + UNIT_SIZE])
                if not any(head[:16]):
                    if any(head):
                        raise FormatError("not a timer-log unit: zero size and magic, data after them",
                                          path=str(f.path), offset=f.start + pos)
                    return
                try:
                    entry = decode_timerlog_entry(buf, pos)
                except FormatError as exc:
                    exc.offset = f.start + pos
                    raise exc.at(path=str(f.path)) from None
                yield f.start + pos, entry
                if isinstance(entry, TimerBlank):
                    break
                pos += UNIT_SIZE

    def read_unit(self, offset: int) -> TimerUnit:
        try:
            f, pos = self.timerlog.locate(offset)
        except StoreError as exc:
            raise FormatError(f"timer-log position {offset} lies in no timer-log file",
                              path=str(self.root / "timerlog")) from exc
        try:
            entry = decode_timerlog_entry(f.read(), pos)
        except FormatError as exc:
            exc.offset = offset
            raise exc.at(path=str(f.path)) from None
        if isinstance(entry, TimerBlank):
            raise FormatError("a slot points at the timer-log BLANK", path=str(f.path), offset=offset)
        return entry

    # -- timer wheel ------------------------------------------------------------------------------
    @property
    def wheel_path(self) -> Path:
        return self.root / "timerwheel"

    @cached_property
    def slot_count(self) -> int:
        """Slots in the wheel (0 without a wheel file)."""
        if not self.wheel_path.is_file():
            return 0
        size = self.wheel_path.stat().st_size
        if size % SLOT_SIZE:
            raise FormatError(f"timer wheel of {size} bytes is not a whole number of {SLOT_SIZE}-byte slots",
                              path=str(self.wheel_path), offset=size - size % SLOT_SIZE)
        return size // SLOT_SIZE

    def read_slot(self, index: int) -> TimerSlot:
        with open(self.wheel_path, "rb") as fh:
            return decode_slot(os.pread(fh.fileno(), SLOT_SIZE, index * SLOT_SIZE))

    def slot_at(self, time_ms: int) -> TimerSlot | None:
        """TimerWheel.getSlot: the slot of ``time_ms``, or None when it holds another time."""
        slot = self.read_slot((time_ms // self.precision_ms) % self.slot_count)
        return slot if slot.ticks == time_ms // self.precision_ms else None

    def iter_slots(self) -> Iterator[tuple[int, TimerSlot]]:
        """(index, slot) of every non-empty slot in index order, reading only the wheel's data extents."""
        import numpy as np

        if not self.slot_count:
            return
        seen = -1          # extents are block-aligned; this only guards against a slot split by one
        with open(self.wheel_path, "rb") as fh:
            fd = fh.fileno()
            for start, end in data_extents(fd, 0, self.slot_count * SLOT_SIZE):
                pos = start - start % SLOT_SIZE
                while pos < end:
                    chunk = os.pread(fd, min(CHUNK_BYTES, end - pos + (-(end - pos)) % SLOT_SIZE), pos)
                    chunk = chunk[:len(chunk) - len(chunk) % SLOT_SIZE]
                    if not chunk:
                        break
                    words = np.frombuffer(chunk, np.uint64).reshape(-1, SLOT_SIZE // 8)
                    for i in np.flatnonzero(words.any(axis=1)):
                        if pos // SLOT_SIZE + int(i) > seen:
                            seen = pos // SLOT_SIZE + int(i)
                            yield seen, decode_slot(chunk, int(i) * SLOT_SIZE)
                    pos += len(chunk)

    @cached_property
    def precision_ms(self) -> int:
        """The given precision, else the one the wheel shows (a slot's stored ``timeMs / precisionMs``
        against its last unit's delayed time), else the broker's default (1000 ms)."""
        if self.given_precision_ms is not None:
            return self.given_precision_ms
        for _, slot in self.iter_slots():
            try:
                unit = self.read_unit(slot.last_pos)
            except FormatError:
                continue
            if slot.ticks > 0 and unit.delayed_time_ms % slot.ticks == 0:
                return unit.delayed_time_ms // slot.ticks
        return DEFAULT_PRECISION_MS

    # -- config files -----------------------------------------------------------------------------
    def checkpoint(self) -> TimerCheckpoint | None:
        path = self.root / "config" / "timercheck"
        if not path.is_file():
            return None
        try:
            return decode_timercheck(path.read_bytes())
        except FormatError as exc:
            raise exc.at(path=str(path)) from None

    def metrics(self) -> Loaded[TimerMetrics] | None:
        return load_config(self.root / "config" / "timermetrics", decode_timer_metrics)
