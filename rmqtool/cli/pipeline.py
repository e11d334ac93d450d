"""Bulk scans of many stores: stats and grep, plus the engine choice and dataset export that the
export and verify commands share. Each has a single-process and a Spark engine.

``--engine local`` decodes in this process, ``spark`` runs one task per commit-log file on an embedded
``local[*]`` session (or ``--master URL`` / $RMQTOOL_SPARK_MASTER), ``auto`` picks by input size.
Both engines give identical output. A damaged record ends its file with a warning (exit status 3).
"""

from __future__ import annotations

import sys
from itertools import islice
from typing import Callable

import click

from rmqtool.cli import cli
from rmqtool.cli.exitcodes import ExitCode
from rmqtool.cli.options import (Damage, count_option, end_partial, filter_options, jobs_option, read_anyway_option,
                                 recognized, record_filter, record_options)
from rmqtool.cli.output import output_options, progress_bar, resolve_format, skip_pandas_probe, write_rows
from rmqtool.cli.read import (NARROW_DROPS, SCAN_COLUMNS, TABLE_BODY_CHARS, people_rows, row_encoding,
                              write_records)

STATS_GROUPINGS = ["topic", "queue", "group", "hour", "store_host", "tag", "store"]
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

    return get_session(master, data_source=False)      # the commands' jobs are RDD maps, not the data source


def is_dataset_target(to: str, partition_by: str | None) -> bool:
    """export writes a dataset directory for --partition-by, a URI, an existing directory or a name
    without extension; otherwise one file."""
    from pathlib import Path

    return bool(partition_by) or "://" in to or Path(to).is_dir() or not Path(to).suffix


def export_to_dataset(stores, to: str, fmt: str, partition_by: str | None, engine: str, master: str | None,
                      commitlog_records: bool = False, jobs: int | None = None, **options):
    from rmqtool.ops.compaction import consumer_view_split
    from rmqtool.ops.dataset import export_dataset, parse_partition_by
    from rmqtool.ops.scan import list_files, readable_files

    try:
        keys = parse_partition_by(partition_by)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--partition-by") from None
    read_cl, _, logs = (True, None, []) if commitlog_records else consumer_view_split(list(stores), options.get("where"))
    if logs and read_cl:
        raise click.UsageError("a dataset export takes compaction topics (read as their consumers see them) or "
                               "other topics, not both: export them separately, or add --commitlog-records")
    files, skipped = readable_files(list_files(stores), options.get("read_anyway", False)) if read_cl else (logs, [])
    if choose_engine(engine, sum(f.size for f in files), master) == "spark":
        from rmqtool.spark.jobs import export_spark
        result = export_spark(spark_session(master), stores, to, fmt, keys, files=files, **options)
    else:
        with progress_bar(sum(f.size for f in files), "export") as progress:
            result = export_dataset(stores, to, fmt, keys, files=files, progress=progress, jobs=jobs, **options)
    result.skipped = skipped
    return result


@cli.command()
@click.argument("stores", nargs=-1, required=True, callback=recognized)
@click.option("--by", type=click.Choice(STATS_GROUPINGS), default=None,
              help="One row per topic (retries and dead letters under their original topic), queue "
                   "(topic + queue id), consumer group (of %RETRY%/%DLQ% records), hour of store time, store "
                   "host, tag or store [default: one row for everything].")
@filter_options
@jobs_option
@engine_options
@read_anyway_option()
@output_options
def stats(stores: tuple[str, ...], by: str | None, topics, queue_ids, tags, keys, body_regex, since, until,
          jobs: int | None, engine: str, master: str | None, read_anyway: bool, fmt: str | None,
          tablefmt: str) -> None:
    """Message counts, bytes, store-time range, retry and DLQ shares, transaction and delay counts
    of the commit-log records of STORES (store roots, commitlog dirs or files, globs, URIs).

    Columns: messages (as the broker counts them: an inner-batch record of a BatchCQ topic holds
    INNER_NUM messages; the other counts are per record), bytes (record sizes summed),
    min/max_store_timestamp, retries (%RETRY% topics)
    and retry_share, dlq (%DLQ% topics) and dlq_share (--by topic counts both under the original topic
    of the message, from its RETRY_TOPIC property), transaction_half (half messages, legacy
    prepared), transaction_commit, transaction_rollback, transaction_op (op messages), delayed
    (SCHEDULE_TOPIC_XXXX). BLANK records are not counted. --by topic adds queue_type and write_queue_nums
    from the store's topic table (config/topics.json) when it has one, and for compaction topics
    compaction_kept (records in their compaction logs) and compaction_removed (keyed records compaction
    removed).

    \b
    The filters are those of grep and cat-commitlog.

    \b
    Examples:
      rmqtool stats STORE CRASHED_STORE --by store -f plain \\
        # exit 3: torn stores
      rmqtool stats STORE --by topic --since '2026-11-20 23:13:09' -f plain
      rmqtool stats STORE --by hour --topic TopicA --topic TopicB -f jsonl
      rmqtool stats STORE --by group -f plain
    """
    from rmqtool.ops.scan import list_files, readable_files

    where = record_filter(topics, queue_ids, tags, keys, body_regex, since, until)
    files, skipped = readable_files(list_files(stores), read_anyway)
    from rmqtool.ops.stats import STATS_FIELDS, stats_local
    damage = Damage()
    if choose_engine(engine, sum(f.size for f in files), master) == "spark":
        from rmqtool.spark.jobs import stats_spark
        rows = stats_spark(spark_session(master), files, by, on_damage=damage, where=where)
    else:
        skip_pandas_probe()
        with progress_bar(sum(f.size for f in files), "stats") as progress:
            rows = stats_local(files, by, on_damage=damage, progress=progress, where=where, jobs=jobs)
    keys = {"queue": ["topic", "queue_id"], "tag": ["tags"]}.get(by, [by] if by else [])
    extra = []
    if by == "topic":                     # the topic table, where a store has one
        from rmqtool.ops.stats import TOPIC_CONFIG_FIELDS, with_topic_config
        rows, extra = with_topic_config(rows, sorted({f.store for f in files})), TOPIC_CONFIG_FIELDS
        from rmqtool.ops.compaction import with_compaction
        rows, more = with_compaction(rows, sorted({f.store for f in files}))
        extra += more
    # on a narrow terminal the shares, transaction counts and topic-table columns go first (-f record has all)
    narrow_drops = tuple(reversed(extra)) + ("delayed", "transaction_op", "transaction_rollback", "transaction_commit",
                                             "transaction_half", "dlq_share", "retry_share", "min_store_timestamp",
                                             "max_store_timestamp")
    write_rows(rows, resolve_format(fmt), columns=keys + STATS_FIELDS + extra, tablefmt=tablefmt, title="stats",
               optional=narrow_drops)
    end_partial(skipped)
    damage.exit()


@cli.command()
@click.argument("stores", nargs=-1, required=True, callback=recognized)
@filter_options
@count_option()
@jobs_option
@engine_options
@read_anyway_option()
@record_options
@output_options
@click.pass_context
def grep(ctx: click.Context, stores: tuple[str, ...], topics, queue_ids, tags, keys, body_regex: str | None,
         since: int | None, until: int | None, count: int | None, jobs: int | None, engine: str, master: str | None,
         read_anyway: bool, body: str | None, charset: str, decompress: bool, body_dir: str | None, fmt: str | None,
         tablefmt: str) -> None:
    """Print the records of STORES that match every given filter, store by store in commit-log order,
    with the store and commit-log file they came from. Repeated values of one filter are alternatives.
    A row is a commit-log record: an inner batch (BatchCQ topic) is one row holding its INNER_NUM messages
    in its body, matched on the record's own fields (cat-commitlog --unwrap lists its messages); its
    messages column counts them as the broker, stats and export do (1 for any other message).
    Exits 1 when nothing matched.

    \b
    Examples:
      rmqtool grep STORE CRASHED_STORE --key key-95 --body-regex rocket -f plain \\
        # exit 3: torn stores
      rmqtool grep STORE --topic TopicA --topic TopicB --tag Tag3 -n 2 -f jsonl
      rmqtool grep STORE --body-regex 'order-4[0-9]' --since 2026-11-20 -n 2 -f \\
        csv
    """
    from rmqtool.ops.scan import list_files, readable_files

    where = record_filter(topics, queue_ids, tags, keys, body_regex, since, until)
    out = resolve_format(fmt)
    files, skipped = readable_files(list_files(stores), read_anyway)
    from rmqtool.ops.grep import grep_local, hit_rows
    damage = Damage()
    if choose_engine(engine, sum(f.size for f in files), master) == "spark":
        from rmqtool.spark.jobs import grep_spark
        tables = grep_spark(spark_session(master), files, where, decompress=decompress, on_damage=damage)
        n = write_records(islice(hit_rows(tables, row_encoding(body, out, body_dir)), count), out, tablefmt,
                          ["store"] + SCAN_COLUMNS, body=body, charset=charset, body_dir=body_dir)
    else:
        skip_pandas_probe()
        from rmqtool.cli import batch_output

        with progress_bar(sum(f.size for f in files), "grep", streaming=True) as progress:
            tables = grep_local(files, where, decompress=decompress, on_damage=damage, progress=progress, jobs=jobs)
            if batch_output.table_supported(out, tablefmt, body, charset, body_dir):   # a batch at a time
                n = batch_output.write_table_batches(batch_output.first_rows(tables, count), out,
                                                     ["store"] + SCAN_COLUMNS, tablefmt, sys.stdout, body=body,
                                                     body_chars=TABLE_BODY_CHARS, optional=NARROW_DROPS,
                                                     records=lambda bs: people_rows(bs, out, body))
            else:
                n = write_records(islice(hit_rows(tables, row_encoding(body, out, body_dir)), count), out,
                                  tablefmt, ["store"] + SCAN_COLUMNS, body=body, charset=charset, body_dir=body_dir)
    if n == 0:
        click.echo("rmqtool: no matching records", err=True)
    end_partial(skipped)
    damage.exit(ExitCode.FINDINGS if n == 0 else ExitCode.OK)
