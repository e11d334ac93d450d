"""The ``rmqtool`` command: one click group; commands live in modules by concern.

Errors become one line on stderr (``rmqtool: error: ...``) and an exit status from ExitCode;
``--traceback`` (anywhere on the command line) shows the Python trace instead.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import os
import sys
import warnings
from typing import Iterator

import click

from rmqtool import __version__, clock
from rmqtool.cli.exitcodes import EXIT_STATUS_HELP, ExitCode
from rmqtool.cli.output import CALENDAR_TIME
from rmqtool.errors import EncodeError, FormatError, RmqError, StoreError, StoreWarning, UnsafeWrite

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 80}


def _exit_status_epilog() -> str:
    """The exit table, each meaning wrapped under itself to fit the help's 80 columns."""
    import textwrap

    lines = ["\b", "Exit status:"]
    for code, text in EXIT_STATUS_HELP.items():
        lines += textwrap.wrap(text, 76, initial_indent=f"  {int(code):<4} ", subsequent_indent=" " * 7)
    return "\n".join(lines)


class RmqCliError(click.ClickException):
    """A RmqError on its way out: one line, the right exit status."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None) -> None:
        click.echo(f"rmqtool: error: {self.message}", err=True)


def exit_code_for(exc: BaseException) -> ExitCode:
    if isinstance(exc, (FormatError, EncodeError)):
        return ExitCode.BAD_INPUT
    if isinstance(exc, (RmqError, OSError)):
        return ExitCode.IO_ERROR
    return ExitCode.INTERNAL


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, RmqError):
        where = f"{exc.filename}: " if exc.filename else ""
        if exc.errno and "[errno" in str(exc.strerror):     # pyarrow's "Error writing bytes ... Detail: [errno 28] ..."
            return f"{where}{os.strerror(exc.errno)}"
        return f"{where}{exc.strerror or exc}"
    if isinstance(exc, RmqError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc} (rerun with --traceback)"


NOW_HELP = ("Take TIME as now (default: the system clock): what relative times count from, when a broker "
            "started now starts (verify, repair, timer), the month of a UNIQ_KEY without --born, the time of "
            "records put or imported without one. Findings that used it name it.")


def _pin_now(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
    if value is not None:
        clock.pin(value)


# --now TIME (rmqtool.clock), before the command's name or after it: read before any other option, so that
# --since -2h counts from it.
NOW_OPTION = {"type": CALENDAR_TIME, "metavar": "TIME", "is_eager": True, "expose_value": False, "callback": _pin_now}


class RmqCommand(click.Command):
    """A command whose options given twice are refused (click keeps the last value silently); options
    that take several values say so (``multiple=True``) and match any of them; an unknown option is
    answered with the documented options it is close to. An OSError or a PATH_ERRORS error that names no
    file names the command's path argument, or a write error (disk full, ...) the command's one output:
    every error line names its path. Every command takes the global --now too, after its name."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.params.append(click.Option(["--now"], help=NOW_HELP, **NOW_OPTION))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            try:
                _, _, order = self.make_parser(ctx).parse_args(args=list(args))
            except click.UsageError:
                order = []                          # reported by the parse below
            seen = set()
            for param in order:
                if isinstance(param, click.Option) and not (param.multiple or param.count):
                    if param.name in seen:
                        raise click.UsageError(f"option {param.opts[0]} given more than once (it takes one "
                                               "value)", ctx=ctx)
                    seen.add(param.name)
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:       # suggest documented options only, never a hidden old spelling
            shown = [name for p in self.get_params(ctx) if isinstance(p, click.Option) and not p.hidden
                     for name in (*p.opts, *p.secondary_opts)]
            raise click.NoSuchOption(exc.option_name, possibilities=shown, ctx=ctx) from None

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except OSError as exc:      # one that names no file (a read or write on an open file, a map, a
            if exc.filename is None and not isinstance(exc, RmqError):   # library): the path it worked on
                exc.filename = _path_argument(self, ctx, exc.errno in WRITE_ERRORS)
            raise
        except PATH_ERRORS as exc:  # bytes or a store its raiser could not place (a decoder, a writer's size
            raise exc.at(path=_path_argument(self, ctx))    # check): the path the command worked on
        finally:                    # a RocksDB consume queue's private directory goes with the command
            if "rmqtool.store.rocksdbcq" in sys.modules:
                sys.modules["rmqtool.store.rocksdbcq"].close_all()


# The errors about a file or a store (not about an argument, an encoding or the environment): each line names
# its path, the raiser's file or else the command's path argument.
PATH_ERRORS = (FormatError, StoreError, UnsafeWrite)


# errors only a write raises: of a command given one output (--to, --out, a new store), that output's
WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _path_argument(command: click.Command, ctx: click.Context, writing: bool = False) -> str | None:
    """The command's first path argument (its store, file or directory), as given; ``writing``: its output
    when it was given one, standard output when it was given none (a store is written only under
    ``_store(write=True)``, whose errors name what they hit, and files outside it name themselves)."""
    from rmqtool.cli.options import OUTPUTS

    outputs = ctx.meta.get(OUTPUTS, [])
    if writing and len(outputs) <= 1:
        return outputs[0] if outputs else "standard output"
    for param in command.params:
        value = ctx.params.get(param.name)
        if isinstance(param, click.Argument) and isinstance(param.type, (click.Path, click.File)) and value:
            value = value[0] if isinstance(value, tuple) else value
            return str(getattr(value, "name", value))
    return None


class RmqGroup(click.Group):
    command_class = RmqCommand

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        clock.pin(None)                 # each invocation starts on the system clock, until --now says otherwise
        clock.begin()
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("rmqtool: interrupted", err=True)
            raise click.exceptions.Exit(ExitCode.INTERRUPTED) from None
        except BrokenPipeError:
            _silence_stdout()
            raise click.exceptions.Exit(ExitCode.OK) from None
        except Exception as exc:
            if ctx.obj and ctx.obj.get("traceback"):
                raise
            raise RmqCliError(_message(exc), exit_code_for(exc)) from None


@contextlib.contextmanager
def stdout_may_close() -> Iterator[None]:
    """Output that reports work already done (or found): a reader that went away (``| grep -q``, ``| head``)
    changes nothing; the rest goes to /dev/null and the command ends with the status its work earned."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()


def _silence_stdout() -> None:
    """After the reader went away (``| head``), point stdout at /dev/null so exit is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


@click.group(cls=RmqGroup, context_settings=CONTEXT_SETTINGS, epilog=_exit_status_epilog())
@click.version_option(__version__, "-V", "--version", prog_name="rmqtool")
@click.option("--traceback", is_flag=True, help="Show the Python traceback of an error.")
@click.option("--now", help=NOW_HELP + " Also accepted after the command's name.", **NOW_OPTION)
@click.option("--store-path-commitlog", metavar="DIR;DIR...", envvar="RMQTOOL_STORE_PATH_COMMITLOG",
              help="The directories of a commit log spread over several disks, as the 5.x broker's "
                   "storePathCommitLog lists them (separated by ';'); they are read as one commit log of "
                   "the store whose root they name (an element that is the root, or the parent of the first "
                   "directory). A STORE argument may also be such a list.")
@click.pass_context
def cli(ctx: click.Context, traceback: bool, store_path_commitlog: str | None) -> None:
    """Read, verify, repair and rebuild Apache RocketMQ broker store directories offline.

    In the examples STORE is a broker's store directory (storePathRootDir: commitlog/, consumequeue/,
    index/, config/, checkpoint); CRASHED_STORE, TIMER_STORE and the like, a store with that trait. The
    first one writes a store to try the others on.

    \b
    Examples:
      rmqtool generate /tmp/demo-$$ --size 1M --seed 7 && rmqtool verify \\
        /tmp/demo-$$ -f plain
      rmqtool info STORE
      rmqtool cat-commitlog STORE --topic TopicA -n 3 -f plain
      rmqtool query-id STORE C0A8000A00002A9F0000000000000E33
    """
    ctx.ensure_object(dict)["traceback"] = traceback
    if store_path_commitlog:
        os.environ["RMQTOOL_STORE_PATH_COMMITLOG"] = store_path_commitlog   # also for worker processes
    warnings.showwarning = _show_warning             # a store's warnings: one line each, every time
    warnings.simplefilter("always", StoreWarning)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, StoreWarning):
        click.echo(f"rmqtool: warning: {message}", err=True)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


class _StatusStream(io.TextIOWrapper):
    """stderr, which carries status lines only: when its reader went away (``2>&1 | head``) the rest go to
    /dev/null and the command goes on to the exit status its work earned (a write that failed on stderr
    would end it early, as if it had succeeded)."""

    def write(self, text: str) -> int:
        try:
            return super().write(text)
        except BrokenPipeError:
            _to_devnull(2)
            return len(text)

    def flush(self) -> None:
        try:
            super().flush()
        except BrokenPipeError:
            _to_devnull(2)
            super().flush()

    def close(self) -> None:        # the buffer is sys.__stderr__'s
        self.flush()


def _to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)


def _standard_streams() -> None:
    """File descriptors 0-2 open (a closed one on /dev/null: an output file this process opens must not
    become fd 2, where the status lines, and any library's, would land in it) and stderr a _StatusStream."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            _to_devnull(fd)
    buffer = getattr(sys.stderr, "buffer", None) or open(2, "wb", closefd=False)
    sys.stderr = _StatusStream(buffer, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                               errors="backslashreplace", line_buffering=True)


def main(argv: list[str] | None = None) -> None:
    _standard_streams()
    args = list(sys.argv[1:] if argv is None else argv)
    if "--traceback" in args:   # accepted anywhere on the command line
        args.remove("--traceback")
        args.insert(0, "--traceback")
    # Start-up makes ~120,000 long-lived objects (click, numpy, pyarrow, numba's registries) that the cyclic
    # collector would walk again and again (by default every 700 allocations) and once more at exit: a tenth
    # of a bulk command's CPU time on 128 MB. Young objects are collected every 50,000 allocations, and the
    # collection at exit leaves all objects alone (frozen: the process ends, the system frees its memory).
    gc.set_threshold(50_000, 10, 10)
    # numpy's OpenBLAS starts a thread per core as numpy is imported; rmqtool does no linear algebra: with one,
    # ~0.04 CPU-s less, and on a busy machine ~0.07 s less wall time (a value the user set stays)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        cli.main(args=args, prog_name="rmqtool")
    except BrokenPipeError:
        _silence_stdout()
        sys.exit(ExitCode.OK)
    finally:
        gc.freeze()


def _register() -> None:
    # Commands register themselves on import; each module must keep heavy imports inside functions.
    from rmqtool.cli import bulk, maintain, meta, pipeline, read  # noqa: F401


_register()
