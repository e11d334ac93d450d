"""The PROPERTIES string: ``name \\x01 value \\x02 ...`` in UTF-8 (MessageDecoder).

The raw bytes are always kept and re-emitted unchanged; parsing is for reading only. Two parsers exist:
``string2messageProperties`` of 4.9.1+ (index scan, the default) and the split-based one of <= 4.9.0.
"""

from __future__ import annotations

from rmqtool.format.java import java_utf8_decode

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


def parse_properties(raw: bytes | memoryview, legacy: bool = False) -> dict[str, str]:
    """Parse raw PROPERTIES bytes the way the broker reads them back."""
    if not raw:
        return {}
    text = java_utf8_decode(raw)
    return _parse_legacy(text) if legacy else _parse_modern(text)


def _parse_modern(text: str) -> dict[str, str]:
    # 4.9.1+: an item needs length >= 3; the first \x01 splits key and value, both non-empty.
    result: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        if len(item) < 3:
            continue
        cut = item.find(NAME_VALUE_SEPARATOR)
        if 0 < cut < len(item) - 1:
            result[item[:cut]] = item[cut + 1:]
    return result


def _parse_legacy(text: str) -> dict[str, str]:
    # <= 4.9.0: String.split drops trailing empty strings; an item is kept only if it has exactly 2 parts.
    result: dict[str, str] = {}
    for item in _java_split(text, PROPERTY_SEPARATOR):
        parts = _java_split(item, NAME_VALUE_SEPARATOR)
        if len(parts) == 2:
            result[parts[0]] = parts[1]
    return result


def _java_split(text: str, sep: str) -> list[str]:
    parts = text.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts or [""] if text == "" else parts


def encode_properties(properties: dict[str, str], trailing_separator: bool = False) -> bytes:
    """messageProperties2String for an explicit order (dict order); None values are skipped.

    Brokers 4.9.1-5.1.4 drop the trailing separator; <= 4.9.0 and 5.2+ keep it.
    """
    items = [f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in properties.items() if v is not None]
    text = PROPERTY_SEPARATOR.join(items)
    if trailing_separator and items:
        text += PROPERTY_SEPARATOR
    return text.encode("utf-8", "replace")
