"""config/*.json as fastjson writes them: integer map keys unquoted (``{0:123}``). Parsed leniently."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rmqtool.errors import FormatError

# A bare integer key after '{' or ',' (outside strings: the lookbehind on the quote-free prefix is
# enforced by scanning tokens below).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?\d+)(\s*:)')


def parse_fastjson(text: str):
    """json.loads after quoting bare integer object keys (strings are left untouched)."""
    def quote(match: re.Match) -> str:
        if match.group(2) is None:
            return match.group(0)
        return f'{match.group(1)}"{match.group(2)}"{match.group(3)}'
    try:
        return json.loads(_TOKEN.sub(quote, text))
    except json.JSONDecodeError as exc:
        raise FormatError(f"not fastjson: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc


def read_config(path: Path):
    try:
        return parse_fastjson(path.read_text("utf-8"))
    except FormatError as exc:
        raise exc.at(path=str(path)) from None
