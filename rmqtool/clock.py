"""The one clock: the time a command takes as "now".

``--now TIME`` pins it for the command; otherwise it is the system clock. Every rule that depends on the
current time asks ``now_ms()``: relative times (``-2h``, ``yesterday``), the month a UNIQ_KEY without a born
time is anchored on, where the dequeue of a 5.3.3 broker started now begins (broker_model timer_read_time),
and the born/store time of records put or imported without one. Only ``system_now()`` reads the system
clock unpinned: backup and journal names say when a write really happened.
"""

from __future__ import annotations

import datetime as dt
import time

_pinned: int | None = None
_started: float | None = None


def begin() -> None:
    """A command starts: the process's first at the import of rmqtool (its start-up counts), any later one
    (in-process callers) now."""
    global _started
    from rmqtool import STARTED
    _started = STARTED if _started is None else time.perf_counter()


def elapsed() -> float:
    """Wall seconds since the command started (``begin``): what a command reports as its time."""
    from rmqtool import STARTED
    return time.perf_counter() - (STARTED if _started is None else _started)


def pin(ms: int | None) -> None:
    """Take ``ms`` (epoch milliseconds) as now from here on; None: the system clock again."""
    global _pinned
    _pinned = ms


def now_ms() -> int:
    """Now, in epoch milliseconds: the pinned time, else the system clock."""
    return int(time.time() * 1000) if _pinned is None else _pinned


def system_now() -> dt.datetime:
    """The system clock in local time, whatever is pinned: when a write really happens."""
    return dt.datetime.now()


def said(ms: int) -> str:
    """``ms`` as a finding that used it names it: the UTC time and where it came from."""
    try:
        text = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
    except (OverflowError, OSError, ValueError):
        text = f"{ms} ms"
    return f"{text} ({'--now' if _pinned is not None else 'the system clock; --now sets another time'})"
