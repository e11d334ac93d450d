"""A verify finding: one problem, where it is, and what was expected."""

from __future__ import annotations

import dataclasses
from typing import Any

ERROR = "error"
WARNING = "warning"

FINDING_FIELDS = ["severity", "kind", "path", "offset", "message", "expected", "actual"]


@dataclasses.dataclass(frozen=True)
class Finding:
    severity: str            # "error" (the broker would fail or lose data) or "warning"
    kind: str                # stable machine name, e.g. "bad_magic", "crc_mismatch", "torn_tail"
    path: str | None         # the file (or directory) concerned
    offset: int | None       # physical offset (commit log), byte position (other files), or None
    message: str
    expected: Any = None
    actual: Any = None
    counts: dict[str, Any] | None = None     # broker_start: what the start costs (ops.consequences.Loss)

    def row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        if self.counts is None:
            del row["counts"]
        return row

    def __str__(self) -> str:
        where = self.path or ""
        if self.offset is not None:
            where += f": offset {self.offset}"
        return f"{self.severity}: {self.kind}: {where}: {self.message}"
