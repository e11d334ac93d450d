"""java.util.Properties text (``Properties.load``): the broker's configuration as it persists it
(``Configuration.persist`` writes ``MixAll.properties2String``: one ``key=value`` line per setting)."""

from __future__ import annotations

import re

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_KEY_END = re.compile(r"(?<!\\)(?:\\\\)*[=:\s]")


def _logical_lines(text: str):
    """Natural lines joined where one ends with an odd number of backslashes (the next line's leading
    whitespace dropped); blank and comment lines skipped."""
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip(" \t\f")
        if not pending and (not line or line[0] in "#!"):
            continue
        stripped = line.rstrip("\\")
        if (len(line) - len(stripped)) % 2:
            pending += line[:-1]
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2:i + 6]):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_java_properties(text: str) -> dict[str, str]:
    """Key/value pairs as Properties.load reads them (a later key wins)."""
    out: dict[str, str] = {}
    for line in _logical_lines(text):
        m = _KEY_END.search(line)
        if m is None:
            key, value = line, ""
        else:
            key = line[:m.end() - 1]
            rest = line[m.end() - 1:].lstrip(" \t\f")
            if rest[:1] in ("=", ":"):
                rest = rest[1:].lstrip(" \t\f")
            value = rest
        out[_unescape(key)] = _unescape(value)
    return out
