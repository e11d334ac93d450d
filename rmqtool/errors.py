"""The one error tree rmqtool raises for bad input or a bad environment (no click import here).

Every error renders as one line: ``<path>: offset N: <message>``.
"""

from __future__ import annotations


class RmqError(Exception):
    """Root of every error rmqtool raises on purpose."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.message = message
        self.path = path
        self.offset = offset

    def at(self, *, path: str | None = None, offset: int | None = None) -> "RmqError":
        """Fill in location details the raiser did not know (returns self for ``raise e.at(...)``)."""
        if self.path is None and path is not None:
            self.path = path
        if self.offset is None and offset is not None:
            self.offset = offset
        return self

    def __str__(self) -> str:
        parts = []
        if self.path is not None:
            parts.append(str(self.path))
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        parts.append(self.message)
        return ": ".join(parts)


def first_line(exc: BaseException) -> str:
    """The first line of a foreign exception's message (pyarrow and Py4J ones run to many lines)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class FormatError(RmqError):
    """Bytes that do not decode as the structure they should be."""


class Truncated(FormatError):
    def __init__(self, what: str, needed: int, available: int, *, offset: int | None = None,
                 path: str | None = None):
        super().__init__(f"truncated {what}: needs {needed} bytes, {available} available",
                         offset=offset, path=path)
        self.needed = needed
        self.available = available


class BadMagic(FormatError):
    def __init__(self, actual: int, *, offset: int | None = None, path: str | None = None):
        super().__init__(f"bad magic code 0x{actual & 0xFFFFFFFF:08x} "
                         "(expected 0xdaa320a7, 0xdaa320ab or 0xcbd43194)", offset=offset, path=path)
        self.actual = actual


class InconsistentLength(FormatError):
    def __init__(self, declared: int, computed: int, *, offset: int | None = None,
                 path: str | None = None):
        super().__init__(f"stored total size {declared} differs from the recomputed size {computed}",
                         offset=offset, path=path)
        self.declared = declared
        self.computed = computed


class ChecksumMismatch(FormatError):
    def __init__(self, stored: int, computed: int, *, offset: int | None = None,
                 path: str | None = None):
        super().__init__(f"body CRC mismatch: stored {stored}, computed {computed}",
                         offset=offset, path=path)
        self.stored = stored
        self.computed = computed


class EncodeError(RmqError):
    """A value that cannot be encoded as the broker would (refused, never truncated)."""


class StoreError(RmqError):
    """Store layout problems: missing directory, bad file name, file of the wrong size."""


class UnsafeWrite(RmqError):
    """A write was refused: the store may be in use, or the change could not be made safely."""


class WriteFailed(UnsafeWrite):
    """A write that failed part-way; the message says the state the store is left in and what finishes it."""


class SparkUnavailable(RmqError):
    """PySpark or Java is missing."""


class StoreWarning(UserWarning):
    """Something about a store the operator must know, though the command goes on (the CLI prints it as
    one ``rmqtool: warning: ...`` line)."""
