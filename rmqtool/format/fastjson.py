"""Broker config JSON as fastjson 1.x writes it (``RemotingSerializable.toJson``).

fastjson writes non-String map keys unquoted (``{0:123,1:456}``), so the text is not strict JSON: bare
integer keys are quoted before ``json.loads`` (their values stay strings, e.g. ``"0"``); errors give the
byte offset in the original text. Also the ``DataVersion`` every config file carries.
"""

from __future__ import annotations

import bisect
import json
import re
from typing import Any, NamedTuple

from rmqtool.errors import EncodeError, FormatError

# A string literal, or a bare integer key after '{' or ',' (string literals are matched first and kept).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?\d+)(\s*:)')


def parse_fastjson(text: str) -> Any:
    """json.loads after quoting bare integer object keys (strings are left untouched)."""
    inserted: list[int] = []     # positions in the quoted text of each inserted quote

    def quote(match: re.Match) -> str:
        if match.group(2) is None:
            return match.group(0)
        at = match.start() + len(inserted) + len(match.group(1))
        inserted.extend((at, at + len(match.group(2)) + 1))
        return f'{match.group(1)}"{match.group(2)}"{match.group(3)}'
    quoted = _TOKEN.sub(quote, text)
    try:
        return json.loads(quoted)
    except json.JSONDecodeError as exc:
        pos = exc.pos - bisect.bisect_left(inserted, exc.pos)
        raise FormatError(f"not fastjson: {exc.msg}", offset=len(text[:pos].encode("utf-8"))) from exc


def dumps_compact(value: Any) -> str:
    """fastjson's compact form of parsed values (keys in their order; non-ASCII as \\u escapes, as
    BrowserCompatible writes them)."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EncodeError(f"not JSON-encodable: {exc}") from exc


class DataVersion(NamedTuple):
    """``DataVersion``: bumped on each change of a config table."""

    state_version: int = 0
    timestamp: int = 0
    counter: int = 0

    def to_json(self) -> dict[str, int]:
        return {"counter": self.counter, "stateVersion": self.state_version, "timestamp": self.timestamp}


def data_version(obj: dict) -> DataVersion | None:
    """The ``dataVersion`` object of a parsed config file (None when absent, as in 4.x offset files)."""
    dv = obj.get("dataVersion")
    if dv is None:
        return None
    if not isinstance(dv, dict):
        raise FormatError("dataVersion is not an object")
    return DataVersion(as_int(dv.get("stateVersion", 0), "dataVersion.stateVersion"),
                       as_int(dv.get("timestamp", 0), "dataVersion.timestamp"),
                       as_int(dv.get("counter", 0), "dataVersion.counter"))


def as_int(value: Any, what: str) -> int:
    """An integer field (a quoted key or a number); FormatError otherwise."""
    if isinstance(value, bool):
        raise FormatError(f"{what} is not an integer: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        return int(value)
    raise FormatError(f"{what} is not an integer: {value!r}")
