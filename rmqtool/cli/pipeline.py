"""Bulk scans of many stores: stats and grep, plus the engine choice and dataset export that the
export and verify commands share. Each has a single-process and a Spark engine.

``--engine local`` decodes in this process, ``spark`` runs one task per commit-log file on an embedded
``local[*]`` session (or ``--master URL`` / $RMQTOOL_SPARK_MASTER), ``auto`` picks by input size.
Both engines give identical output. A damaged record ends its file with a warning (exit status 3).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

import click

from rmqtool.cli import cli
from rmqtool.cli.exitcodes import ExitCode
from rmqtool.cli.output import TIMESTAMP, output_options, resolve_format, write_rows
from rmqtool.cli.read import _body_encoding, _fields, _write_records, record_options

STATS_GROUPINGS = ["topic", "queue", "hour", "store_host", "tag", "store"]
ENGINE_CHOICES = ["local", "spark", "auto"]


def engine_options(fn: Callable) -> Callable:
    """--engine and --master, shared by the bulk commands."""
    fn = click.option("--master", metavar="URL", envvar="RMQTOOL_SPARK_MASTER",
                      help="Spark master for --engine spark, e.g. spark://host:7077 "
                           "[default: $RMQTOOL_SPARK_MASTER, else an embedded local[*]].")(fn)
    fn = click.option("--engine", type=click.Choice(ENGINE_CHOICES), default="local", show_default=True,
                      help="local: this process; spark: one Spark task per commit-log file; "
                           "auto: Spark only for large inputs or a cluster master.")(fn)
    return fn


def choose_engine(engine: str, input_bytes: int, master: str | None) -> str:
    from rmqtool.spark import pick_engine

    chosen = pick_engine(engine, input_bytes, master)
    if engine == "auto":
        click.echo(f"rmqtool: engine: {chosen} ({input_bytes / 1e6:.1f} MB of commit log)", err=True)
    return chosen


def spark_session(master: str | None):
    from rmqtool.spark.session import get_session

    return get_session(master)


@contextlib.contextmanager
def byte_progress(total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar over input bytes, on stderr and only on a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from rmqtool.cli.output import stderr_console
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), transient=True, console=stderr_console()) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def is_dataset_target(to: str, partition_by: str | None) -> bool:
    """export writes a dataset directory for --partition-by, a URI, an existing directory or a name
    without extension; otherwise one file."""
    from pathlib import Path

    return bool(partition_by) or "://" in to or Path(to).is_dir() or not Path(to).suffix


def export_to_dataset(stores, to: str, fmt: str, partition_by: str | None, engine: str, master: str | None,
                      **options):
    from rmqtool.ops.dataset import export_dataset, parse_partition_by
    from rmqtool.ops.scan import list_files

    try:
        keys = parse_partition_by(partition_by)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--partition-by") from None
    files = list_files(stores)
    if choose_engine(engine, sum(f.size for f in files), master) == "spark":
        from rmqtool.spark.jobs import export_spark
        return export_spark(spark_session(master), stores, to, fmt, keys, files=files, **options)
    with byte_progress(sum(f.size for f in files), "export") as progress:
        def runner(fn, items):
            out = []
            for item in items:
                out.append(fn(item))
                if progress:
                    progress(item[1].size)
            return out
        return export_dataset(stores, to, fmt, keys, files=files, runner=runner, **options)


class Damage:
    """Collects damaged-record warnings (printed at once) for the exit status."""

    def __init__(self):
        self.count = 0

    def __call__(self, exc) -> None:
        self.count += 1
        click.echo(f"rmqtool: warning: {exc}; the rest of that file was skipped", err=True)

    def exit(self, code: ExitCode = ExitCode.OK) -> None:
        raise click.exceptions.Exit(ExitCode.BAD_INPUT if self.count else code)


@cli.command()
@click.argument("stores", nargs=-1, required=True)
@click.option("--by", type=click.Choice(STATS_GROUPINGS), default=None,
              help="One row per topic, queue (topic + queue id), hour of store time, store host, tag or "
                   "store [default: one row for everything].")
@engine_options
@output_options
def stats(stores: tuple[str, ...], by: str | None, engine: str, master: str | None, fmt: str | None,
          tablefmt: str) -> None:
    """Message counts, bytes, store-time range, retry and DLQ shares, transaction and delay counts
    of the commit-log records of STORES (store roots, commitlog dirs or files, globs, URIs).

    \b
    Columns: messages, bytes (record sizes summed), min/max_store_timestamp, retries (%RETRY% topics)
    and retry_share, dlq (%DLQ% topics) and dlq_share, transaction_half (half messages, legacy
    prepared), transaction_commit, transaction_rollback, transaction_op (op messages), delayed
    (SCHEDULE_TOPIC_XXXX). BLANK records are not counted.

    \b
    Examples:
      rmqtool stats /data/broker-*/store --by topic
      rmqtool stats store --by hour -f jsonl
      rmqtool stats 'hdfs://nn:8020/backups/*/store' --engine spark --master spark://m:7077
    """
    from rmqtool.ops.scan import list_files
    from rmqtool.ops.stats import STATS_FIELDS, stats_local

    files = list_files(stores)
    damage = Damage()
    if choose_engine(engine, sum(f.size for f in files), master) == "spark":
        from rmqtool.spark.jobs import stats_spark
        rows = stats_spark(spark_session(master), files, by, on_damage=damage)
    else:
        with byte_progress(sum(f.size for f in files), "stats") as progress:
            rows = stats_local(files, by, on_damage=damage, progress=progress)
    keys = {"queue": ["topic", "queue_id"], "tag": ["tags"]}.get(by, [by] if by else [])
    write_rows(rows, resolve_format(fmt), columns=keys + STATS_FIELDS, tablefmt=tablefmt, title="stats")
    damage.exit()


@cli.command()
@click.argument("stores", nargs=-1, required=True)
@click.option("--topic", "topics", multiple=True, help="Only this topic (repeatable: any of them).")
@click.option("--key", "keys", multiple=True, help="Only records with this key among their KEYS (repeatable).")
@click.option("--tag", "tags", multiple=True, help="Only records with this TAGS value (repeatable).")
@click.option("--body-regex", metavar="REGEX",
              help="Only records whose body (decompressed when compressed) matches this Python regex.")
@click.option("--since", type=TIMESTAMP, help="Only records stored at or after TIME (ISO-8601, UTC "
                                               "unless a zone is given, or epoch ms).")
@click.option("--until", type=TIMESTAMP, help="Only records stored at or before TIME.")
@engine_options
@record_options
@output_options
@click.pass_context
def grep(ctx: click.Context, stores: tuple[str, ...], topics, keys, tags, body_regex: str | None,
         since: int | None, until: int | None, engine: str, master: str | None, body: str | None,
         decompress: bool, fields: str | None, fmt: str | None, tablefmt: str) -> None:
    """Print the records of STORES that match every given filter, store by store in commit-log order,
    with the store and commit-log file they came from. Exits 1 when nothing matched.

    \b
    Examples:
      rmqtool grep /data/broker-*/store --topic TopicA --key order-42
      rmqtool grep store --body-regex 'error|fail' --since 2026-11-20T23:00 -f jsonl
    """
    from rmqtool.ops.grep import GrepFilter, grep_local, hit_rows
    from rmqtool.ops.scan import list_files

    where = GrepFilter(tuple(topics), tuple(keys), tuple(tags), body_regex, since, until)
    try:
        where.compiled()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--body-regex") from None
    out = resolve_format(fmt)
    files = list_files(stores)
    damage = Damage()
    if choose_engine(engine, sum(f.size for f in files), master) == "spark":
        from rmqtool.spark.jobs import grep_spark
        tables = grep_spark(spark_session(master), files, where, decompress=decompress, on_damage=damage)
    else:
        tables = grep_local(files, where, decompress=decompress, on_damage=damage)
    rows = hit_rows(tables, _body_encoding(body, out))
    columns = _fields(fields, out, ("store", "commitlog_file") if fields else ("store",))
    if _write_records(rows, out, tablefmt, columns) == 0:
        click.echo("rmqtool: no matching records", err=True)
        damage.exit(ExitCode.FINDINGS)
    damage.exit()
