"""The option vocabulary every command shares: one name for one thing, the old spellings as hidden
aliases.

    --since/--until TIME      (was --begin/--end)     --count/-n N        (was --max)
    --offset N                (was --from)            --body-encoding E   (was --body in read commands)
    --check-crc               (was --crc, --deep)     --tag/--key         (was --tags/--keys in put)

Filters (--topic, --queue-id, --tag, --key, --since, --until, --body-regex) mean the same in
cat-commitlog, grep, export and stats: repeated values of one filter are ORed, different filters ANDed.
"""

from __future__ import annotations

from typing import Callable

import click

from rmqtool.cli.output import TIMESTAMP, say
from rmqtool.format.rows import BODY_ENCODINGS


ALIASED = "rmqtool.aliased"       # ctx.meta: values given under an old spelling, by parameter name


class _OldSpelling(click.Option):
    @property
    def human_readable_name(self) -> str:       # click's deprecation warning names the spelling used
        return self.opts[0]


def option(*names: str, aliases: tuple[str, ...] = (), **kwargs) -> Callable:
    """click.option, and each old spelling in ``aliases`` as a hidden option that click marks deprecated
    (using it warns on stderr and names the new spelling) and whose value the documented option takes."""
    from click.core import ParameterSource

    main = next(n for n in names if n.startswith("--"))
    own = kwargs.pop("callback", None)
    alias_kwargs = {k: v for k, v in kwargs.items() if k in ("type", "is_flag", "multiple", "metavar")}

    def take_alias(ctx: click.Context, param: click.Parameter, value):
        if ctx.get_parameter_source(param.name) is ParameterSource.DEFAULT and param.name in ctx.meta.get(ALIASED, {}):
            value = ctx.meta[ALIASED][param.name]
        return own(ctx, param, value) if own else value

    def deco(fn: Callable) -> Callable:
        fn = click.option(*names, callback=take_alias, **kwargs)(fn)
        dest = fn.__click_params__[-1].name

        def remember(ctx: click.Context, param: click.Parameter, value) -> None:
            if ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
                ctx.meta.setdefault(ALIASED, {})[dest] = value

        for alias in aliases:
            fn = click.option(alias, f"{dest}_as_{alias.strip('-').replace('-', '_')}", hidden=True,
                              expose_value=False, deprecated=f"Use {main}.", callback=remember, cls=_OldSpelling,
                              **alias_kwargs)(fn)
        return fn
    return deco


TIME_HELP = "ISO-8601, epoch ms, or relative/local like -2h, yesterday, '2026-11-20 10:00' (local time)"


def since_until(*, aliases: bool = False) -> Callable:
    """--since/--until (with --begin/--end as hidden aliases where those were the names)."""
    def deco(fn: Callable) -> Callable:
        fn = option("--until", aliases=("--end",) if aliases else (), type=TIMESTAMP,
                    help="Only records stored at or before TIME.")(fn)
        return option("--since", aliases=("--begin",) if aliases else (), type=TIMESTAMP,
                      help=f"Only records stored at or after TIME ({TIME_HELP}).")(fn)
    return deco


def filter_options(fn: Callable) -> Callable:
    """The record filters of cat-commitlog, grep, export and stats."""
    fn = since_until()(fn)
    fn = click.option("--body-regex", metavar="REGEX",
                      help="Only records whose body (decompressed when compressed) matches this Python regex.")(fn)
    fn = click.option("--key", "keys", multiple=True, metavar="KEY",
                      help="Only records with this key among their KEYS or as UNIQ_KEY (repeatable: any).")(fn)
    fn = click.option("--tag", "tags", multiple=True, metavar="TAG",
                      help="Only records with this TAGS value (repeatable: any).")(fn)
    fn = click.option("--queue-id", "queue_ids", multiple=True, type=int, metavar="N",
                      help="Only records of this queue id (repeatable: any).")(fn)
    return click.option("--topic", "topics", multiple=True, metavar="TOPIC",
                        help="Only records of this topic (repeatable: any).")(fn)


def record_filter(topics=(), queue_ids=(), tags=(), keys=(), body_regex=None, since=None, until=None):
    """The RecordFilter of the filter options; a bad regex is a usage error."""
    from rmqtool.ops.filters import RecordFilter

    where = RecordFilter(tuple(topics), tuple(queue_ids), tuple(tags), tuple(keys), body_regex, since, until)
    try:
        where.compiled()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--body-regex") from None
    return where


def count_option(*, aliases: tuple[str, ...] = (), default=None, help: str = "Stop after N records.",
                 show_default: bool = False) -> Callable:
    return option("--count", "-n", "count", aliases=aliases, type=click.IntRange(min=0), metavar="N",
                  default=default, show_default=show_default, help=help)


def check_crc_option(*, aliases: tuple[str, ...] = (),
                     help: str = "Recompute every body CRC (adds crc_ok).") -> Callable:
    return option("--check-crc", "check_crc", aliases=aliases, is_flag=True, help=help)


jobs_option = click.option(
    "--jobs", "-j", type=click.IntRange(min=1), metavar="N",
    help="Worker processes, one commit-log file each [default: from 256 MiB of commit log one per core, "
         "1 GB of available memory each; else 1].")


def body_encoding_option(*, default: str | None = None, aliases: tuple[str, ...] = ("--body",),
                         help: str = "Body encoding [default: text for people, base64 in json/jsonl/csv].") -> Callable:
    return option("--body-encoding", "body", aliases=aliases, type=click.Choice(BODY_ENCODINGS), default=default,
                  show_default=default is not None, help=help)


def _charset(_ctx, _param, value: str) -> str:
    import codecs

    try:
        return codecs.lookup(value).name
    except LookupError:
        raise click.BadParameter(f"unknown character set {value!r}") from None


def record_options(fn: Callable) -> Callable:
    """How records print: --body-encoding, --charset, --body-file, --decompress."""
    fn = click.option("--body-file", "body_dir", type=click.Path(file_okay=False), metavar="DIR",
                      callback=output_path("--body-file"),
                      help="Also write each body to DIR/<msg_id>.bin (decompressed with --decompress).")(fn)
    fn = click.option("--decompress", is_flag=True,
                      help="Decompress ZLIB/LZ4/ZSTD bodies (sysFlag COMPRESSED) before printing.")(fn)
    fn = click.option("--charset", default="utf-8", show_default=True, metavar="NAME", callback=_charset,
                      help="Character set of text bodies in table, plain and record (e.g. gbk); json, jsonl "
                           "and csv carry UTF-8 text, or base64 for a body that is not UTF-8.")(fn)
    return body_encoding_option()(fn)


OUTPUTS = "rmqtool.outputs"     # ctx.meta: the output paths a command was given (a write error names them)


def output_path(what: str) -> Callable:
    """A callback refusing an output path inside a store's data directories (exit 4): the broker would
    refuse to load the store, or read the output as its own files. URIs (s3://...) pass. The path is
    noted as one of the command's outputs (``OUTPUTS``)."""
    def check(ctx, _param, value):
        if value is not None and str(value) == "-":         # not a file named '-' in the working directory
            raise click.BadParameter("'-' is not standard output here: give a path"
                                     + (" (cat-commitlog -f jsonl or csv writes records to standard output)"
                                        if what == "--to" else ""))
        if value is not None and "://" not in str(value):
            from rmqtool.store.recognition import refuse_inside_data_dir
            refuse_inside_data_dir(value, what)
        if value is not None:
            ctx.meta.setdefault(OUTPUTS, []).append(str(value))
        return value
    return check


READ_ANYWAY_HELP = ("Read what is readable of a store the broker refuses to load (a commit-log file of the wrong "
                    "size, one named between the others' starts, a missing one) instead of refusing it (exit 4), "
                    "and past a damaged record (the rest of its file skipped); the command ends with a warning "
                    "naming what it skipped: records, bytes, where (exit 3).")


def read_anyway_option(help: str = READ_ANYWAY_HELP, aliases: tuple[str, ...] = ()) -> Callable:
    """--read-anyway: the one flag of every reader for input the broker would refuse (rmqtool.store.readable)."""
    return option("--read-anyway", is_flag=True, aliases=aliases, help=help)


def end_partial(skipped, what: str = "") -> None:
    """End a read that skipped ``skipped`` (rmqtool.store.readable.Skipped): one warning line, exit 3."""
    if skipped:
        from rmqtool.cli.exitcodes import ExitCode
        from rmqtool.store.readable import skipped_line

        say(f"rmqtool: warning: {skipped_line(skipped, what)}")
        raise click.exceptions.Exit(ExitCode.BAD_INPUT)


class Damage:
    """Collects damaged-record warnings (printed at once) for the exit status: each ends its file."""

    def __init__(self):
        self.count = 0

    def __call__(self, exc) -> None:
        self.count += 1
        click.echo(f"rmqtool: warning: {exc}; the rest of that file was skipped", err=True)

    def exit(self, code: int = 0) -> None:
        from rmqtool.cli.exitcodes import ExitCode

        raise click.exceptions.Exit(ExitCode.BAD_INPUT if self.count else code)


def recognized(_ctx, _param, value):
    """A callback refusing (exit 4) a local path argument that is neither a store nor a commit-log file
    (rmqtool.store.recognition.recognize), before the command imports its heavy modules. Globs, URIs and
    ``DIR;DIR`` commit logs are left to the command."""
    from rmqtool.store.recognition import recognize

    for path in (value if isinstance(value, tuple) else (value,)):
        if path is not None and not any(ch in str(path) for ch in "*?[;") and "://" not in str(path):
            recognize(path)
    return value
