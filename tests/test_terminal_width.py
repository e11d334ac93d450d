"""Every table fits an 80-column terminal (#34 item 7): each table-printing command runs on the bundled
stores under a pseudo-terminal of 80 columns; no line is wider, no finding's message or plan's detail is
cut (it wraps), and names, IDs and offsets print whole (a table too wide falls back to the record layout,
whose long values wrap)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

import pytest
from rich.cells import cell_len

from tests.conftest import ROOT, readback, store_path

COLUMNS = 80
SAMPLE, CRASH_TORN = store_path("dev-sample"), store_path("dev-sample-crash-torn")
CONFIG, TIMER = store_path("dev-config-5x"), store_path("dev-timer-5x")
COMMANDS = [
    ["info", SAMPLE], ["info", CRASH_TORN],
    ["cat-commitlog", SAMPLE], ["cat-commitlog", SAMPLE, "-n", "4"], ["grep", SAMPLE, "--topic", "TopicA"],
    ["cat-cq", SAMPLE, "TopicA", "0"], ["cat-cq", SAMPLE, "TopicA", "0", "--resolve"],
    ["cat-cq", SAMPLE, "TopicA", "0", "--message"],
    ["cat-index", SAMPLE], ["cat-index", SAMPLE, "--entries"], ["cat-index", SAMPLE, "--slots"],
    ["checkpoint", SAMPLE], ["decode-id", "C0A8000A00002A9F0000000000000E33", "--now", "2026-11-26T12:00:00Z"],
    ["query-key", SAMPLE, "TopicA", "key-37"], ["query-id", SAMPLE, "C0A8000A00002A9F0000000000000E33"],
    ["stats", SAMPLE], ["stats", SAMPLE, "--by", "topic"], ["stats", SAMPLE, "--by", "queue"],
    ["stats", SAMPLE, "--by", "hour"], ["stats", SAMPLE, "--by", "group"], ["stats", SAMPLE, "--by", "store"],
    ["verify", CRASH_TORN], ["verify", TIMER, "--now", "2026-12-01T00:00:00Z"],
    ["repair", CRASH_TORN], ["rebuild-index", SAMPLE, "--slots", "32", "--max-entries", "128"],
    ["put", SAMPLE, "--topic", "T", "--body", "x", "--dry-run"],
    ["topics", CONFIG], ["groups", CONFIG], ["offsets", CONFIG], ["topic-status", CONFIG, "TopicA"],
    ["config", CONFIG], ["delay-offsets", CONFIG], ["transactions", SAMPLE, "--all"],
    ["timer", TIMER, "--now", "2026-11-23T07:00:00Z"], ["timer", TIMER, "--units"], ["timer", TIMER, "--slots"],
    ["timer", TIMER, "--check"],
]


def on_terminal(args: list, columns: int = COLUMNS) -> tuple[int, str]:
    """(exit status, stdout) of rmqtool on a pseudo-terminal ``columns`` wide (its size and COLUMNS)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns), "TZ": "UTC", "RMQTOOL_NO_PROGRESS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rmqtool", *map(str, args)], stdin=slave, stdout=slave,
                            stderr=subprocess.DEVNULL, env=env)
    os.close(slave)
    out = b""
    try:
        while select.select([master], [], [], 120)[0]:
            chunk = os.read(master, 1 << 16)
            if not chunk:
                break
            out += chunk
    except OSError:                 # EIO: the child closed the terminal
        pass
    finally:
        os.close(master)
    return proc.wait(timeout=120), out.decode().replace("\r\n", "\n")


def in_pipe(args: list) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "rmqtool", *map(str, args), "-f", "jsonl"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    return [json.loads(line) for line in done.stdout.splitlines()]


def texts_shown(out: str, field: str) -> list[str]:
    """The values of ``field`` a terminal shows, a wrapped one joined again: from a table's column (its
    continuation lines have an empty first cell) or the record layout (continuation lines are indented)."""
    lines = out.splitlines()
    head = next((line for line in lines if re.search(rf"┃ {field}\s+┃", line)), None)
    found: list[list[str]] = []
    if head is not None:
        i = head.split("┃").index(next(c for c in head.split("┃") if c.strip() == field))
        for line in lines:
            cells = line.split("│")
            if len(cells) > i:
                if cells[1].strip():
                    found.append([])
                if found and cells[i].strip():
                    found[-1].append(cells[i].strip())
        return [" ".join(parts) for parts in found]
    current = None
    for line in lines:
        label = re.match(r"(\w+):(?: |$)", line)
        if label:
            current = label.group(1)
            if current == field:
                found.append([line[label.end():].strip()])
        elif line.startswith(" ") and current == field:
            found[-1].append(line.strip())
    return [" ".join(parts) for parts in found]


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(str(a).replace(str(ROOT) + "/fixtures/", "")
                                                        for a in c) for c in COMMANDS])
def test_every_table_fits_80_columns(args):
    status, out = on_terminal(args)
    assert status in (0, 1), out
    assert out.strip(), args
    wide = [line for line in out.splitlines() if cell_len(line) > COLUMNS]
    assert wide == [], f"{len(wide)} line(s) wider than {COLUMNS}: {wide[:2]}"


@pytest.mark.parametrize("args,field", [
    (["verify", CRASH_TORN], "message"), (["verify", TIMER, "--now", "2026-12-01T00:00:00Z"], "message"),
    (["verify", store_path("dev-sample-5x-crash-torn")], "message"), (["repair", CRASH_TORN], "detail"),
    (["rebuild-index", SAMPLE, "--slots", "32", "--max-entries", "128"], "detail"),
])
def test_a_finding_is_never_cut(args, field):
    """What a finding or a plan says prints whole on an 80-column terminal (wrapped, never ending in '…')."""
    _, out = on_terminal(args)
    want = sorted(squeeze(r[field]) for r in in_pipe(args) if r.get(field))
    assert want, args
    assert sorted(squeeze(t) for t in texts_shown(out, field) if t) == want


def test_wide_terminal_keeps_the_table_and_narrow_names_stay_whole():
    """The same verify is a table on a wide terminal; on a narrow one every path and the long topic name
    (127 characters, wider than the screen) print whole, wrapped in the record layout."""
    _, wide = on_terminal(["verify", CRASH_TORN], 250)
    assert "┃ severity" in wide and "…" not in wide
    assert "findings in " in wide and "│ commitlog/00000000000000262144 " in wide     # paths relative to the store
    long_topic = next(r["topic"] for r in readback("dev-sample")["commitlogRecords"] if len(r.get("topic", "")) > 100)
    _, narrow = on_terminal(["stats", SAMPLE, "--by", "topic"])
    assert long_topic in squeeze(narrow)
    _, table = on_terminal(["stats", SAMPLE, "--by", "topic", "--topic", "TopicA", "--topic", "TopicB"])
    assert "┃ topic " in table and "│ TopicA " in table          # a table when the rows fit
