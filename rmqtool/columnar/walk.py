"""Window size of the scan and the DLedger entry-header check over a window's records (numpy).

The record walk itself is the compiled kernel's (``rmqtool.columnar.kernel.scan_window``).
"""

from __future__ import annotations

import numpy as np

from rmqtool.format.dledger import HEADER_SIZE as DLEDGER_HEADER_SIZE, VALID_MAGICS as DLEDGER_MAGICS

WINDOW_BYTES = 16 * 1024 * 1024       # bytes of a file walked and decoded at a time (cache-sized)


def read_i32(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Big-endian int32 at each position (positions must leave 4 bytes)."""
    words = np.ndarray((max(len(data) - 3, 0),), ">i4", data, 0, (1,))
    return words[pos].astype(np.int64)


def read_i64(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return (read_i32(data, pos) << 32) | (read_i32(data, pos + 4) & 0xFFFFFFFF)


def ledger_headers_ok(data: np.ndarray, starts: np.ndarray, total: np.ndarray, file_start: int) -> int:
    """How many leading records sit in a sound DLedger entry: magic, size = record + 48, pos = its
    position, bodySize = record size (DLedgerMmapFileStore.recover's checks on one entry)."""
    head = starts - DLEDGER_HEADER_SIZE
    ok = ((head >= 0) & np.isin(read_i32(data, np.maximum(head, 0)), DLEDGER_MAGICS)
          & (read_i32(data, np.maximum(head, 0) + 4) == total + DLEDGER_HEADER_SIZE)
          & (read_i64(data, np.maximum(head, 0) + 24) == head + file_start)
          & (read_i32(data, starts - 4) == total))
    return len(ok) if ok.all() else int(np.argmin(ok))
