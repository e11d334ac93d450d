"""Exit statuses, one enum for every command."""

from __future__ import annotations

import enum


@enum.unique
class ExitCode(enum.IntEnum):
    OK = 0            # the whole answer; found; verify clean; a write applied cleanly; a plan with nothing to do
    FINDINGS = 1      # nothing found (queries), errors (verify), something to do (plans), a write that left errors
    USAGE = 2         # every bad option or argument
    BAD_INPUT = 3     # a partial answer (damaged input skipped on request); import input that does not decode
    IO_ERROR = 4      # refused: not a store, missing path, permission, disk full; refused or failed writes
    INTERNAL = 70     # a bug in rmqtool (EX_SOFTWARE); rerun with --traceback
    INTERRUPTED = 130


# The one exit table: --help, the man pages and the README show it as it is here.
EXIT_STATUS_HELP = {
    ExitCode.OK: "the whole answer / found / verify: every detected broker version starts without loss (warnings "
                 "allowed) / a write applied and the store verifies without error / a plan with nothing to do",
    ExitCode.FINDINGS: "nothing found (queries); verify: errors (starting the broker loses or misplaces data); a "
                       "plan with something to do; a write that applied but left errors (it names them)",
    ExitCode.USAGE: "usage: every bad option or argument, including a malformed message ID, time, hex or number",
    ExitCode.BAD_INPUT: "a partial answer: the command read what was readable on request (a flag), skipped "
                        "damaged/incomplete input and ends with a warning naming what it skipped (records, bytes, "
                        "where); also input given to import that does not decode (nothing written)",
    ExitCode.IO_ERROR: "refused: not a store / a store the broker would refuse to load / missing path, permission, "
                       "disk full / a refused or failed write (a bound exceeded, a lock, ...)",
    ExitCode.INTERNAL: "internal error (a bug); rerun with --traceback and report it",
    ExitCode.INTERRUPTED: "interrupted",
}
