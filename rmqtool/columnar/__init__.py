"""Columnar bulk decoding: commit-log files to Arrow record batches, without a Python object per field.

The batch scan lives in ``rmqtool.columnar.batches`` (``iter_record_batches`` and friends, importable from
here); ``walk`` (record boundaries and lengths, numpy only), ``decode``, ``props``, ``schema`` and
``text`` are its parts. Names are loaded on first use, so a command that only walks record boundaries
(``info``) does not import pyarrow.
"""

from __future__ import annotations

_BATCHES = ("iter_record_batches", "record_schema", "entries_batch", "open_commitlog", "ledger_file_batches",
            "DEFAULT_BATCH_ROWS", "WINDOW_BYTES")
__all__ = list(_BATCHES)


def __getattr__(name: str):
    if name in _BATCHES:
        from rmqtool.columnar import batches
        return getattr(batches, name)
    raise AttributeError(f"module 'rmqtool.columnar' has no attribute {name!r}")
