"""Exit statuses, one enum for every command."""

from __future__ import annotations

import enum


@enum.unique
class ExitCode(enum.IntEnum):
    OK = 0            # success; found; verify clean
    FINDINGS = 1      # nothing found (queries), problems found (verify), something to do (dry runs)
    USAGE = 2         # bad options or arguments
    BAD_INPUT = 3     # input that does not decode (or encode)
    IO_ERROR = 4      # missing path, permission, disk full; store layout problems; refused or failed writes
    INTERNAL = 70     # a bug in rmqtool (EX_SOFTWARE); rerun with --traceback
    INTERRUPTED = 130


EXIT_STATUS_HELP = {
    ExitCode.OK: "success (for queries: something was found; for verify: no problem)",
    ExitCode.FINDINGS: "nothing found (queries), problems found (verify), or something to do (dry runs of "
                       "write commands, which exit 0 when there is nothing to do)",
    ExitCode.USAGE: "usage error: bad option or argument",
    ExitCode.BAD_INPUT: "bad or unreadable input: a file that does not decode",
    ExitCode.IO_ERROR: "I/O error: missing path, permission, refused or failed write (the line names the path "
                       "and, for a write, the state the store is left in and what finishes it)",
    ExitCode.INTERNAL: "internal error (a bug); rerun with --traceback and report it",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}
