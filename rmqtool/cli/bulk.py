"""Bulk commands: export (commit-log records to Parquet / JSON lines / CSV) and generate (a synthetic
store for benchmarks and tests). Heavy modules are imported inside the commands."""

from __future__ import annotations

import re
import shlex

import click

from rmqtool import clock
from rmqtool.cli import cli
from rmqtool.cli.exitcodes import ExitCode
from rmqtool.cli.options import (READ_ANYWAY_HELP, body_encoding_option, check_crc_option, end_partial, filter_options,
                                 output_path, read_anyway_option, recognized, record_filter)
from rmqtool.cli.pipeline import engine_options

# export prints its rate from this much input on: below it, start-up (a Spark session: seconds) is most of
# the time and a rate would say nothing about the scan
RATE_BYTES = 64 << 20
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'1G', '64M', '512K' or a byte count (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise click.BadParameter(f"not a size: {text!r} (e.g. 1G, 64M, 4096)")
    return int(m.group(1)) * _UNITS[m.group(2)]


class Size(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        return value if isinstance(value, int) else parse_size(value)


@cli.command()
@click.argument("stores", nargs=-1, required=True, type=click.Path(), callback=recognized)
@click.option("--to", "to", required=True, type=click.Path(), callback=output_path("--to"),
              help="Output file, or a dataset directory (a name without extension, a URI such as "
                   "s3://bucket/dir, or with --partition-by): one part per commit-log file.")
@click.option("--format", "-f", "fmt", type=click.Choice(["parquet", "jsonl", "csv"]), default=None,
              help="Output format [default: from the extension of --to; parquet for a directory].")
@click.option("--kind", type=click.Choice(["commitlog", "trace"]), default="commitlog", show_default=True,
              help="commitlog: a row per record; trace: a row per message-trace context and bean, the fields "
                   "of `rmqtool trace -f jsonl` (one file, this process; no record option).")
@click.option("--trace-topic", metavar="TOPIC",
              help="--kind trace: the trace topic [default: msgTraceTopicName of config/broker.properties, "
                   "else RMQ_SYS_TRACE_TOPIC].")
@click.option("--partition-by", metavar="topic,date", help="Hive-partition a dataset directory by topic and/or "
                                                              "store date (UTC).")
@filter_options
@click.option("--include-blank", is_flag=True,
              help="Also export the BLANK records that pad file ends (not with filters or --partition-by).")
@engine_options
@check_crc_option(aliases=("--crc",), help="Check every body CRC (adds the crc_ok column).")
@body_encoding_option(default="base64", aliases=(), help="How jsonl/csv carry the body (Parquet stores it as binary).")
@read_anyway_option(aliases=("--stop-at-damage",), help=READ_ANYWAY_HELP + " Without it nothing is written.")
@click.option("--commitlog-records", is_flag=True,
              help="A compaction topic named by --topic: export its commit-log records (every version of every "
                   "key) instead of what its consumers receive.")
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), metavar="N",
              help="Worker processes, one commit-log file each at a time [default: from 256 MiB of commit "
                   "log one per core, 1 GB of available memory each; else 1]. One output file holds the workers' "
                   "parts in commit-log order: the same output whatever N.")
def export(stores, to, fmt, kind, trace_topic, partition_by, topics, queue_ids, tags, keys, body_regex, since, until,
           include_blank, engine, master, check_crc, body, read_anyway, commitlog_records, force, jobs):
    """Export the commit-log messages of STORES (roots, commitlog dirs or files, globs, URIs) to one
    file, or to a dataset directory with one part per commit-log file.

    A compaction topic (5.x cleanup.policy=COMPACTION) named by --topic is exported as its consumers
    receive it (what the broker's CompactionStore.getMessage returns): the records of its compaction logs
    that its sparse queues name, the newest per key up to the compaction, each with its compaction-log
    offset as physical_offset and its compaction-log file as commitlog_file; --commitlog-records exports
    its commit-log records instead. A dataset export takes either compaction topics or others.

    --kind trace writes the message-trace contexts of the trace topic's records instead, one row per
    context and bean with every field `rmqtool trace STORE -f jsonl` prints (Parquet: time_stamp as a
    timestamp), to one file; a trace body that does not decode is an error (exit 3), skipped with a warning
    under --read-anyway.

    The filters are those of grep and cat-commitlog. BLANK padding records are left out unless
    --include-blank, so integer columns stay integers in pandas and DuckDB. A row is a commit-log record
    (an inner batch of a BatchCQ topic is one row, its messages in the body); the summary counts records
    and messages as the broker counts them (INNER_NUM per inner batch).

    With --engine spark, Spark tasks write the parts: on a cluster, give a shared target such as
    s3://bucket/dir or hdfs://namenode/dir.

    jsonl and csv hold the record fields of cat-commitlog. Parquet has one schema for a file and a
    dataset, with either engine (partition keys move into the directory names). It is written with Snappy
    compression, dictionary encoding for type, magic_code, topic, born_host, store_host, tags, store and
    commitlog_file only, delta encoding (DELTA_BINARY_PACKED) for the integer columns but body_crc and
    tags_code, min/max statistics for every column but body, properties, properties_raw, topic_raw, keys, uniq_key,
    msg_id, type, magic_code, born_host and store_host, and row groups of 65,536 records (but in Hive partitions):

    \b
    Parquet fields:
      type                         string  message, salvaged_record (repair's),
                                           blank (with --include-blank)
      physical_offset              int64   commit-log offset of the record
      total_size                   int32   record size in bytes
      magic_code                   string  hex: 0xdaa320a7 (v1), 0xdaa320ab (v2)
      body_crc                     int32   stored CRC32 of the body
      queue_id                     int32   queue the record was dispatched to
      flag                         int32   producer flag
      queue_offset                 int64   position in that consume queue
      sys_flag                     int32   MessageSysFlag bits
      born_timestamp               timestamp[ms, tz=UTC]
                                           producer time
      born_host                    string  producer ip:port
      store_timestamp              timestamp[ms, tz=UTC]
                                           broker store time
      store_host                   string  broker ip:port
      reconsume_times              int32   redeliveries so far
      prepared_transaction_offset  int64   transaction prepare offset
      topic                        string  stored topic
      properties                   map<string,string>
                                           decoded properties
      tags                         string  TAGS property
      keys                         list<string>
                                           KEYS property, split
      uniq_key                     string  client message ID (UNIQ_KEY)
      real_topic                   string  REAL_TOPIC (retry, delay, transaction)
      real_queue_id                int32   REAL_QID
      msg_id                       string  offset message ID (store host + offset)
      tags_code                    int64   tags hash code, as in the consume queue
      body_length                  int32   body size in bytes
      body                         binary  body as stored
      properties_raw               binary  properties as stored
      topic_raw                    binary  topic as stored, where not UTF-8
      crc_ok                       bool    body CRC verdict (with --check-crc)
      store                        string  the store as named on the command line
      commitlog_file               string  commit-log file the record came from

    \b
    Examples:
      rmqtool export STORE --to /tmp/rmqtool-records.parquet --force
      rmqtool export STORE --to /tmp/rmqtool-a.jsonl --topic TopicA --since \\
        2026-11-20 --force
      rmqtool export STORE --to /tmp/rmqtool-dataset --partition-by topic --force
      rmqtool export TRACE_STORE --kind trace --to /tmp/rmqtool-traces.csv --force
    """
    from rmqtool.cli.pipeline import export_to_dataset, is_dataset_target
    from rmqtool.ops.export import export as run_export

    if kind == "trace":
        return _export_trace(stores, to, fmt, trace_topic, partition_by, engine, read_anyway, force)
    if trace_topic is not None:
        raise click.UsageError("--trace-topic goes with --kind trace")
    where = record_filter(topics, queue_ids, tags, keys, body_regex, since, until)
    if include_blank and (not where.is_empty or partition_by):
        raise click.UsageError("--include-blank exports every record: it takes no filter or --partition-by")
    options = dict(check_crc=check_crc, body_encoding=body, read_anyway=read_anyway, overwrite=force,
                   where=where, include_blank=include_blank)
    if is_dataset_target(to, partition_by):
        result = export_to_dataset(stores, to, fmt or "parquet", partition_by, engine, master,
                                   commitlog_records=commitlog_records, jobs=jobs, **options)
    elif engine == "spark":
        raise click.BadParameter("the spark engine writes a dataset directory: give --to a name without "
                                 "extension", param_hint="--to")
    else:
        from rmqtool.cli.output import progress_bar, skip_pandas_probe
        from rmqtool.ops.scan import list_files

        size = sum(f.size for f in list_files(stores))      # a path that is not a store: refused first
        skip_pandas_probe()
        with progress_bar(size, "export") as progress:
            result = run_export(stores, to, fmt, progress=progress, commitlog_records=commitlog_records,
                                jobs=jobs, **options)
    seconds = clock.elapsed()          # the whole command's wall time: start-up and a Spark session too
    rate = f", {result.input_bytes / 1e6 / seconds:.0f} MB/s of commit log" if result.input_bytes >= RATE_BYTES else ""
    partial = " (partial: see the warnings)" if result.damaged or result.skipped else ""
    click.echo(f"exported {result.records} records ({result.messages} messages) to {result.path} "
               f"({result.format}) in {seconds:.2f} s{rate}{partial}", err=True)
    for exc in result.damaged:
        click.echo(f"rmqtool: warning: {exc}; the rest of that file was skipped", err=True)
    end_partial(result.skipped, f" export in {result.path}")
    if result.damaged:
        raise click.exceptions.Exit(ExitCode.BAD_INPUT)


# export options that select or shape commit-log records: none applies to --kind trace
_RECORD_OPTIONS = {"topics": "--topic", "queue_ids": "--queue-id", "tags": "--tag",
                   "keys": "--key", "body_regex": "--body-regex", "since": "--since", "until": "--until",
                   "include_blank": "--include-blank", "check_crc": "--check-crc", "body": "--body-encoding",
                   "commitlog_records": "--commitlog-records", "jobs": "--jobs"}


def _export_trace(stores, to, fmt, trace_topic, partition_by, engine, read_anyway, force) -> None:
    """export --kind trace: one file in this process (ops.export.export_trace)."""
    from click.core import ParameterSource

    from rmqtool.cli.output import progress_bar
    from rmqtool.cli.pipeline import is_dataset_target
    from rmqtool.ops.export import export_trace, format_for
    from rmqtool.ops.scan import list_files

    ctx = click.get_current_context()
    given = [flag for name, flag in _RECORD_OPTIONS.items()
             if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)]
    if given:
        raise click.UsageError(f"--kind trace takes no record option ({', '.join(given)}): to select contexts, "
                               f"use rmqtool trace STORE --topic/--group/--since/--until -f jsonl")
    if engine == "spark" or is_dataset_target(to, partition_by):
        raise click.UsageError("--kind trace writes one file in this process: give --to a .jsonl, .csv or "
                               ".parquet file, no --partition-by and no --engine spark (for a dataset or on "
                               "Spark, read the rocketmq data source's kind trace)")
    size = sum(f.size for f in list_files(stores))
    with progress_bar(size, "export") as progress:
        result = export_trace(stores, to, format_for(to, fmt), trace_topic=trace_topic, read_anyway=read_anyway,
                              overwrite=force, progress=progress)
    partial = " (partial: see the warnings)" if result.damaged or result.skipped or result.undecodable else ""
    click.echo(f"exported {result.records} trace contexts ({result.messages} trace messages) to {result.path} "
               f"({result.format}) in {clock.elapsed():.2f} s{partial}", err=True)
    for exc in result.damaged:
        click.echo(f"rmqtool: warning: {exc}; the rest of that file was skipped", err=True)
    for exc in result.undecodable:
        click.echo(f"rmqtool: warning: {exc}; that trace message skipped", err=True)
    end_partial(result.skipped, f" export in {result.path}")
    if result.damaged or result.undecodable:
        raise click.exceptions.Exit(ExitCode.BAD_INPUT)


@cli.command()
@click.argument("directory", type=click.Path(), callback=output_path("the generated store"))
@click.option("--size", type=Size(), default="1G", show_default=True, help="Commit-log bytes to write.")
@click.option("--file-size", type=Size(), default="1G", show_default=True, help="Commit-log file size.")
@click.option("--topics", type=click.IntRange(1), default=16, show_default=True, help="Number of topics.")
@click.option("--queues", type=click.IntRange(1), default=8, show_default=True, help="Queues per topic.")
@click.option("--body-size", type=(click.IntRange(0), click.IntRange(0)), default=(200, 500),
              show_default=True, metavar="MIN MAX", help="Body length range in bytes.")
@click.option("--index/--no-index", default=True, show_default=True, help="Write index files.")
@click.option("--index-geometry", default="5000000:20000000", show_default=True, metavar="SLOTS:ENTRIES",
              help="Hash slots and entries per index file.")
@click.option("--cq-file-size", type=Size(), default=str(300_000 * 20), show_default=True,
              help="Consume-queue file size (a multiple of 20).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed: the same seed writes the same "
                                                                   "store.")
def generate(directory, size, file_size, topics, queues, body_size, index, index_geometry, cq_file_size, seed):
    """Write a synthetic store into DIRECTORY (new, or an empty directory): commit log with a BLANK at each
    file end, consume queues, index files and checkpoint, all through rmqtool's own encoders. The store
    appears whole or not at all (written under a hidden name beside it, then renamed).

    \b
    Examples:
      rmqtool generate /tmp/rmqtool-gen-$$ --size 2M --file-size 1M --topics 4 \\
        --queues 2 --cq-file-size 6000 --index-geometry 64:256
      rmqtool generate /tmp/rmqtool-gen2-$$ --size 1M --topics 2 --queues 2 \\
        --cq-file-size 6000 --no-index --seed 7
    """
    from rmqtool.format.indexfile import Geometry, check_geometry
    from rmqtool.ops.generate import generate_new_store

    m = re.fullmatch(r"(\d+):(\d+)", index_geometry)
    if not m:
        raise click.BadParameter("expected SLOTS:ENTRIES, e.g. 5000000:20000000", param_hint="--index-geometry")
    geometry = Geometry(int(m.group(1)), int(m.group(2)))
    check_geometry(geometry)
    if cq_file_size % 20 or cq_file_size <= 0:
        raise click.BadParameter("must be a positive multiple of 20", param_hint="--cq-file-size")
    if body_size[0] > body_size[1]:
        raise click.BadParameter("MIN is above MAX", param_hint="--body-size")
    from rmqtool.cli.output import progress_bar

    with progress_bar(size, "generating") as progress:
        g = generate_new_store(directory, size, file_size=file_size, topics=topics, queues=queues,
                           body_min=body_size[0], body_max=body_size[1], cq_file_size=cq_file_size,
                           index=index, index_geometry=geometry, seed=seed, progress=progress)
    click.echo(f"generated {g.messages} messages in {g.files} commit-log files ({g.commitlog_bytes} bytes), "
               f"{g.consume_queues} consume queues, {g.index_files} index files in {g.root}; undo: rm -r "
               f"{shlex.quote(str(g.root))}", err=True)
