"""Read-only commands: info, cat-commitlog, cat-cq, cat-index, query-key, query-id, decode-id, trace, checkpoint.

Nothing here imports pyarrow or pyspark: look-ups start fast.
"""

from __future__ import annotations

import array
import sys
import warnings
from pathlib import Path
from typing import Iterator

import click

from rmqtool import constants as C
from rmqtool.cli import RmqCliError, cli
from rmqtool.cli.exitcodes import ExitCode
from rmqtool.cli.options import (TIME_HELP, Damage, check_crc_option, count_option, end_partial, filter_options,
                                 jobs_option, option, read_anyway_option, recognized, record_filter, record_options,
                                 since_until)
from rmqtool.cli.output import (CALENDAR_TIME, FIELDS_META, NO_HEADERS_META, PEOPLE, TIMESTAMP, Format, check_fields,
                                format_timestamp, output_options, progress_bar, resolve_format, skip_pandas_probe,
                                write_record, write_rows)
from rmqtool.errors import FormatError, StoreError, StoreWarning
from rmqtool.format.commitlog import Blank
from rmqtool.format.rows import BCQ_UNIT_FIELDS, CQ_UNIT_FIELDS, INDEX_HIT_FIELDS, encode_body, entry_row
from rmqtool.ops import scan
from rmqtool.store import layout as L
from rmqtool.store.commitlog import CommitLog
from rmqtool.store.readable import open_readable
from rmqtool.store.store import Store

# Default columns for people, per command: IDs, offsets and times whole, a row fits a wide terminal.
SCAN_COLUMNS = ["physical_offset", "store_timestamp", "topic", "queue_id", "queue_offset", "tags", "keys", "body"]
KEY_COLUMNS = ["physical_offset", "store_timestamp", "topic", "queue_id", "queue_offset", "keys", "msg_id", "body"]
ID_COLUMNS = ["physical_offset", "store_timestamp", "topic", "queue_id", "queue_offset", "msg_id", "uniq_key"]
STATIC_COLUMNS = ["logical_queue_id", "logical_queue_offset"]        # records and units of static topics
TABLE_BODY_CHARS = 60
NARROW_DROPS = ("queue_offset", "queue_id", "tags", "keys", "store", "uniq_key")   # left out first when narrow


# -- shared helpers ---------------------------------------------------------------------------------
def row_encoding(body: str | None, fmt: Format, body_dir: str | None) -> str:
    """The encoding rows are made with: base64 whenever present_bodies decodes them again."""
    wanted = body or ("text" if fmt in PEOPLE else "base64")
    return "base64" if wanted == "text" or body_dir else wanted


def present_bodies(rows: Iterator[dict], fmt: Format, body: str | None, charset: str = "utf-8",
                   body_dir: str | None = None) -> Iterator[dict]:
    """Bodies as asked: text in ``charset`` (a body that does not decode stays base64 for scripts and
    is noted for people; tables show the start of long ones), written to ``body_dir`` too."""
    import base64

    wanted = body or ("text" if fmt in PEOPLE else "base64")
    if wanted != "text" and not body_dir:
        yield from rows
        return
    if fmt not in PEOPLE:
        charset = "utf-8"                  # body_encoding "text" means UTF-8 to every reader of the rows
    if body_dir:
        Path(body_dir).mkdir(parents=True, exist_ok=True)
    for row in rows:
        if row.get("type") != "message" or row.get("body") is None:
            yield row
            continue
        raw = base64.b64decode(row["body"])
        if body_dir:
            (Path(body_dir) / f"{row['msg_id']}.bin").write_bytes(raw)
        row = dict(row)
        if wanted != "text":
            row["body"] = encode_body(raw, wanted)
            row["body_encoding"] = None if wanted == "none" else wanted
            yield row
            continue
        try:
            text = raw.decode(charset)
        except UnicodeDecodeError:
            text = None
        if text is None:
            if fmt in PEOPLE:
                row["body"] = f"({len(raw)} bytes, not {'UTF-8' if charset.lower() in ('utf-8', 'utf8') else charset})"
            yield row                                   # scripts: exact bytes, labelled base64
            continue
        if fmt in (Format.TABLE, Format.PLAIN) and len(text) > TABLE_BODY_CHARS:
            text = text[:TABLE_BODY_CHARS] + "…"
        row["body"], row["body_encoding"] = text, "text"
        yield row


def write_records(rows, fmt: Format, tablefmt: str, people_columns: list[str], *, body: str | None,
                  charset: str = "utf-8", body_dir: str | None = None, title: str | None = None) -> int:
    """Record rows in any format: the per-command columns for tables and plain (all fields in the
    record view and machine formats) unless --fields says otherwise."""
    columns = people_columns if fmt in (Format.TABLE, Format.PLAIN) else None
    return write_rows(present_bodies(iter(rows), fmt, body, charset, body_dir), fmt, columns=columns,
                      tablefmt=tablefmt, title=title, optional=NARROW_DROPS)


def write_record_batches(batches, fmt: Format, tablefmt: str, people_columns: list[str], *, body: str | None,
                         charset: str = "utf-8", body_dir: str | None = None) -> int:
    """``write_records`` of the columnar scan's record batches: built a batch at a time (jsonl, csv,
    json, plain, table) where the options allow, else row by row; the same text either way."""
    skip_pandas_probe()
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx else {}
    enc = row_encoding(body, fmt, body_dir)
    machine = (body or "base64") != "text" and not body_dir and FIELDS_META not in meta
    if fmt in (Format.JSONL, Format.CSV) and machine:
        return _write_text_batches(batches, enc, fmt, NO_HEADERS_META not in meta)
    from rmqtool.cli import batch_output

    if fmt is Format.JSON and machine:
        return batch_output.write_json_batches(batches, enc, sys.stdout)
    if batch_output.table_supported(fmt, tablefmt, body, charset, body_dir):
        return batch_output.write_table_batches(batches, fmt, people_columns, tablefmt, sys.stdout, body=body,
                                                body_chars=TABLE_BODY_CHARS, optional=NARROW_DROPS,
                                                records=lambda bs: people_rows(bs, fmt, body))
    from rmqtool.ops.grep import hit_rows
    return write_records(hit_rows(batches, enc), fmt, tablefmt, people_columns, body=body, charset=charset,
                         body_dir=body_dir)


def people_rows(batches, fmt: Format, body: str | None) -> Iterator[dict]:
    """The rows the row path prints for people (bodies as ``present_bodies`` gives them) of record batches."""
    from rmqtool.ops.grep import hit_rows
    return present_bodies(hit_rows(batches, row_encoding(body, fmt, None)), fmt, body)


def _note(text: str) -> None:
    click.echo(f"rmqtool: {text}", err=True)


def _nothing(ctx: click.Context, text: str, skipped=()) -> None:
    """Nothing found: a note, and exit 1 (3 when the read skipped input: end_partial)."""
    _note(text)
    end_partial(skipped)
    ctx.exit(ExitCode.FINDINGS)


# -- info -------------------------------------------------------------------------------------------
@cli.command()
@click.argument("store", type=click.Path(), callback=recognized)
@jobs_option
@read_anyway_option()
@output_options
@click.pass_context
def info(ctx: click.Context, store: str, jobs: int | None, read_anyway: bool, fmt: str | None, tablefmt: str) -> None:
    """Summarise a store: commit-log files and records, topics and queues, index files, checkpoint,
    abort/lock state and hints about the broker version that wrote it. messages counts as the broker
    does (an inner-batch record of a BatchCQ topic holds INNER_NUM messages; repair's placeholder for a
    damaged record is none, as in stats).

    Exits 1 when the commit log holds a damaged record (the counts stop there; with --read-anyway the rest
    of its file is skipped and the count goes on, exit 3); a store the broker refuses to load is refused
    (exit 4) unless --read-anyway. What the broker ignores as it starts (a compaction position checkpoint that
    does not decode) is a warning on stderr and under "warnings" in JSON, with exit 0.

    \b
    Examples:
      rmqtool info STORE
      rmqtool info STORE -f json | head -20
      rmqtool info CRASHED_STORE -f plain   # exit 1
    """
    from rmqtool.ops.inspect import store_info

    skip_pandas_probe()                 # a large store's compaction topics: Arrow arrays, no pandas
    out = resolve_format(fmt)
    st, skipped = open_readable(store, read_anyway)
    with progress_bar(sum(f.length for f in st.commitlog.queue), "reading") as progress:
        summary = store_info(st, progress, jobs, read_anyway=read_anyway)
    if out in (Format.JSON, Format.JSONL, Format.CSV, Format.TSV):
        write_record(summary, out, tablefmt=tablefmt)
    else:
        problems = summary["problems"]
        chosen = ctx.meta.get(FIELDS_META)
        if chosen:
            check_fields(chosen, summary)
            summary = {k: summary[k] for k in chosen}
        tables = (("commitlog_files", "commit-log files"), ("consume_queues", "consume queues"),
                  ("batch_consume_queues", "batch consume queues"),
                  ("compaction_queues", "compaction queues (compaction/)"), ("topic_config", "topics (config/topics.json)"),
                  ("index_files", "index files"))
        sections = {k: summary.pop(k) for k in [t for t, _ in tables] + ["checkpoint", "dledger", "version_hints",
                                                                         "problems", "warnings"] if k in summary}
        if summary:
            write_record(summary, out, tablefmt=tablefmt, select=False)
        for key, title in tables:
            _section(title, sections.get(key, []), out, tablefmt)
        for key in ("checkpoint", "dledger"):
            if sections.get(key):
                _section(key, None, out, tablefmt)
                write_record(sections[key], out, tablefmt=tablefmt, select=False)
        for key in ("version_hints", "problems"):
            _section(key.replace("_", " "), [{key[:-1]: t} for t in sections.get(key, [])], out, tablefmt)
        summary["problems"], summary["warnings"] = problems, sections.get("warnings", [])
    for warning in summary.get("warnings", []):
        _note(f"warning: {warning}")
    for problem in summary["problems"]:
        _note(f"problem: {problem}")
    end_partial(skipped)
    if summary["problems"]:
        ctx.exit(ExitCode.BAD_INPUT if read_anyway else ExitCode.FINDINGS)     # read on past damage: partial


def _section(title: str, rows: list[dict] | None, fmt: Format, tablefmt: str) -> None:
    if rows == []:
        return
    out = sys.stdout
    out.write(f"\n{title}\n")
    if rows is not None:
        write_rows(rows, fmt, tablefmt=tablefmt, select=False)


# -- cat-commitlog ----------------------------------------------------------------------------------
def record_rows(cl: CommitLog, *, start: int | None = None, count: int | None = None, where=None,
                include_blank: bool = False, body: str = "base64", decompress: bool = False,
                check_crc: bool = False, unwrap: bool = False) -> Iterator[dict]:
    """cat-commitlog's record-at-a-time path (a few records, or --unwrap): ``unwrap`` gives an inner-batch
    record as one row per inner message (with ``inner_index``; the queue offset the broker gives it),
    filters applied to each message."""
    from rmqtool.format.batch import inner_messages, is_inner_batch

    n = 0
    for loc in cl.iter_entries(start, include_blank=include_blank, reader=True):
        entry = loc.entry
        parts = [(None, entry)]
        if unwrap and not isinstance(entry, Blank) and is_inner_batch(entry):
            try:
                parts = list(enumerate(inner_messages(entry)))
            except FormatError as exc:
                raise exc.at(path=str(loc.file.path), offset=loc.offset) from None
        for inner, msg in parts:
            if count is not None and n >= count:
                return
            if not isinstance(msg, Blank) and where is not None and not where.matches(msg, loc.offset):
                continue
            n += 1
            row = entry_row(msg, loc.offset, body_encoding=body, check_crc=check_crc and inner is None,
                            decompress=decompress)
            if unwrap:
                row["inner_index"] = inner
            yield row


def _write_text_batches(batches, body: str, fmt: Format, headers: bool = True) -> int:
    """JSON lines or CSV straight from the columnar decoder, a batch at a time (the same bytes as the row
    path)."""
    from rmqtool.columnar.text import csv_header, text_chunks

    out = sys.stdout.buffer
    n = 0
    for batch in batches:
        if fmt is Format.CSV and n == 0 and headers:
            out.write(csv_header(batch).encode())
        for chunk in text_chunks(batch, body, "csv" if fmt is Format.CSV else "json"):
            out.write(chunk)
        out.flush()
        n += batch.num_rows
    return n


def _commitlog_total(cl: CommitLog, start: int | None) -> int:
    files = cl.queue.files
    return sum(f.length for f in files) - ((start - files[0].start) if start is not None and files else 0)


# cat-commitlog -n up to this, or over a commit log of up to FEW_BYTES: the record-at-a-time decoder
FEW_RECORDS = 2000
FEW_BYTES = scan.FEW_BYTES


@cli.command("cat-commitlog")
@click.argument("path", metavar="STORE|FILE", type=click.Path(), callback=recognized)
@option("--offset", type=click.IntRange(min=0), metavar="N",
        help="Start at this physical offset, which must be a record boundary.")
@count_option()
@filter_options
@click.option("--include-blank", is_flag=True, help="Also print the BLANK records that pad file ends "
                                                    "(only without filters).")
@check_crc_option()
@click.option("--unwrap", is_flag=True,
              help="Show an inner-batch record (sysFlag INNER_BATCH, BatchCQ topics) as its messages, each "
                   "with the queue offset the broker gives it (INNER_BASE + i) and inner_index.")
@read_anyway_option()
@record_options
@output_options
@click.pass_context
def cat_commitlog(ctx: click.Context, path: str, offset: int | None, count: int | None, topics, queue_ids, tags,
                  keys, body_regex, since: int | None, until: int | None, include_blank: bool, check_crc: bool,
                  unwrap: bool, read_anyway: bool, body: str | None, charset: str, decompress: bool, body_dir: str | None, fmt: str | None,
                  tablefmt: str) -> None:
    """Decode commit-log records in commit-log order, from a store or a single commit-log file.

    A DLedger store (dledger-<id>/data) is read through its entries: each record at the physical offset
    the broker reports (entry position + 48). A compaction log (compaction/compactionLog/<topic>/<queueId>)
    is walked across its name gap and zero-filled file ends, each record at its compaction-log offset.
    Rows print as they are decoded, in every format; a damaged
    record stops the output with an error
    naming its file and offset (with --read-anyway: a warning, the rest of that file skipped, exit 3; not
    with --unwrap). Repeated values of one filter are alternatives (--topic A --topic B:
    either); different filters must all match. Exits 1 when no record was printed.

    \b
    Examples:
      rmqtool cat-commitlog STORE --count 3 -f plain
      rmqtool cat-commitlog STORE --topic TopicA --topic TopicB --tag Tag3 -n 2 \\
        -f jsonl
      rmqtool cat-commitlog STORE --offset 257 -n 1 -f record
      rmqtool cat-commitlog STORE --key key-82 -f plain
      rmqtool cat-commitlog STORE --since '2026-11-20 23:13:09' --until \\
        '2026-11-20 23:13:10' -n 2 -f csv
      rmqtool cat-commitlog STORE --topic NoSuchTopic   # exit 1
      rmqtool cat-commitlog BATCHCQ_STORE --topic BatchTopic --unwrap -n 8 -f \\
        plain
      rmqtool cat-commitlog DLEDGER_STORE -n 3 -f plain
      rmqtool cat-commitlog \\
        COMPACTION_STORE/compaction/compactionLog/CompactTopic/0 -f plain
    """
    from rmqtool.ops.filters import filtered_batches
    from rmqtool.ops.query import nearest_boundaries

    out = resolve_format(fmt)
    st, skipped = open_readable(path, read_anyway)
    cl = st.commitlog
    if offset is not None:
        before, after = nearest_boundaries(cl, offset)
        if before != offset:
            near = ", ".join(f"{name} {value}" for name, value in (("before:", before), ("after:", after))
                             if value is not None)
            f, _ = cl.queue.locate(offset)
            raise RmqCliError(f"{f.path}: offset {offset}: not a record boundary (nearest {near})",
                              ExitCode.USAGE)
    where = record_filter(topics, queue_ids, tags, keys, body_regex, since, until)
    if include_blank and not where.is_empty:
        raise click.UsageError("--include-blank prints every record: it takes no filter")
    enc = row_encoding(body, out, body_dir)
    columns = SCAN_COLUMNS + (["crc_ok"] if check_crc else [])
    damage = Damage() if read_anyway else None
    if unwrap or (count is not None and count <= FEW_RECORDS and where.is_empty and not read_anyway) or \
            (_commitlog_total(cl, offset) <= FEW_BYTES and not read_anyway):
        # a few records print without the columnar scan (nor numpy, pyarrow and the kernel to import)
        rows = record_rows(cl, start=offset, count=count, where=None if where.is_empty else where,
                           include_blank=include_blank, body=enc, decompress=decompress, check_crc=check_crc,
                           unwrap=unwrap)
        n = write_records(rows, out, tablefmt, columns + ["inner_index"] * unwrap, body=body, charset=charset,
                          body_dir=body_dir)
    else:
        with progress_bar(_commitlog_total(cl, offset), "scanning", streaming=True) as progress:
            batches = filtered_batches(cl, where, start=offset, count=count, include_blank=include_blank,
                                       check_crc=check_crc, decompress=decompress, progress=progress, on_damage=damage)
            n = write_record_batches(batches, out, tablefmt, columns, body=body, charset=charset, body_dir=body_dir)
    if n == 0:
        _nothing(ctx, "no records", skipped)
    end_partial(skipped)
    if damage is not None:
        damage.exit()


# -- cat-cq -----------------------------------------------------------------------------------------
@cli.command("cat-cq")
@click.argument("store", metavar="STORE|QUEUE_FILE", type=click.Path())
@click.argument("topic", required=False)
@click.argument("queue_id", type=int, required=False)
@option("--offset", "start", aliases=("--from",), type=click.IntRange(min=0), default=0, metavar="N",
        help="Start at queue offset N.")
@count_option()
@click.option("--resolve", is_flag=True,
              help="Read each unit's record and flag mismatches (size, topic, queue id/offset, tagsCode); "
                   "exits 1 when any is found.")
@click.option("--message", is_flag=True,
              help="Print the records the units point at (as cat-commitlog does), e.g. --offset N -n 1 "
                   "for the message at queue offset N.")
@click.option("--compaction", is_flag=True,
              help="A compaction topic as its consumers read it: the compaction queue (compaction/), not "
                   "its consume queue.")
@read_anyway_option()
@record_options
@output_options
@click.pass_context
def cat_cq(ctx: click.Context, store: str, topic: str, queue_id: int, start: int, count: int | None,
           resolve: bool, message: bool, compaction: bool, read_anyway: bool, body: str | None, charset: str,
           decompress: bool, body_dir: str | None, fmt: str | None, tablefmt: str) -> None:
    """Print the units of one consume queue with their queue offsets, or with --message the records
    they point at (mqadmin queryMsgByOffset).

    Give the store, the topic and the queue id, or just a queue file (that file's units) or queue
    directory (consumequeue/, batchconsumequeue/ or compaction/compactionCq/<topic>/<queueId>/): the path
    says which queue and which kind.

    Units at the end that point past the end of the commit log (left by a crash) are left out with a
    note, as the broker drops them when it loads the store. A BatchCQ topic (batchconsumequeue/) is
    found by itself: one row per 46-byte unit, queue_offset being the first of its batch_size messages;
    --offset N starts at the unit holding message N. LMQ queues (%LMQ%name, queue 0) are resolved against
    the records that dispatch to them. A compaction topic's consume queue is listed like any other; with
    --compaction, what its consumers read: the sparse compaction queue's units (physical_offset: the
    compaction-log offset), with --message the compaction-log records from the first retained offset at
    or after --offset. A RocksDB consume queue (storeType=defaultRocksDB) is read from the database,
    read-only (needs the rocksdb extra).

    Reading records (--resolve, --message, and a consume queue's trailing units, checked against the
    commit log), a store the broker refuses to load is refused (exit 4) unless --read-anyway: then a unit
    whose record lies in a part not read is listed as unread (with --message left out), exit 3.

    \b
    Examples:
      rmqtool cat-cq STORE TopicA 0
      rmqtool cat-cq STORE TopicA 0 --offset 2 -n 3 --resolve -f plain
      rmqtool cat-cq STORE TopicA 0 --offset 1 -n 1 --message -f record
      rmqtool cat-cq STORE TopicA 0 --offset 1000   # exit 1
      rmqtool cat-cq BATCHCQ_STORE BatchTopic 0 --offset 7 --resolve -f plain
      rmqtool cat-cq LMQ_STORE '%LMQ%room-1' 0 -n 5 --resolve -f plain
      rmqtool cat-cq STORE/consumequeue/TopicA/0/00000000000000000000 -n 3
      rmqtool cat-cq BATCHCQ_STORE/batchconsumequeue/BatchTopic/0 -n 2
      rmqtool cat-cq COMPACTION_STORE CompactTopic 0 --offset 27 -n 3 --message \\
        --compaction -f plain
      rmqtool cat-cq ROCKSDB_STORE TopicB 1 -n 3 --resolve -f plain
    """
    from click.core import ParameterSource

    from rmqtool.format.commitlog import Blank
    from rmqtool.ops.mqadmin import static_queues, with_logical
    from rmqtool.ops.query import dirty_tail_start, unit_problems
    from rmqtool.store.readable import commitlog_view, is_unread
    from rmqtool.store.store import queue_of_path

    if message and resolve:
        raise click.UsageError("use --resolve or --message, not both")
    out = resolve_format(fmt)
    qfile, kind = None, None
    if topic is None or queue_id is None:
        found = queue_of_path(store) if topic is None else None
        if found is None:
            raise click.UsageError("give TOPIC and QUEUE_ID, or a queue file or directory as STORE")
        qfile = Path(store) if Path(store).is_file() else None
        store, kind, topic, queue_id = found
    st = Store.open(store)
    batch = topic not in st.topics() and topic in st.batch_topics() if kind is None else kind == L.BATCHCONSUMEQUEUE
    compaction_topic = st.compaction is not None and topic in st.compaction.topics()
    if kind == L.COMPACTION_CQ and compaction_topic:
        compaction = True
    elif compaction and (not compaction_topic or kind is not None):
        raise click.UsageError(f"--compaction: {topic!r} is not a compaction topic (compaction/)"
                               if not compaction_topic else "--compaction reads the compaction queue: give "
                               "STORE TOPIC QUEUE_ID or a compaction/compactionCq/ path")
    if compaction and qfile is not None:
        _cat_compaction_file(ctx, st, topic, queue_id, qfile, count, out, tablefmt)
        return
    if qfile is not None and ctx.get_parameter_source("start") is ParameterSource.DEFAULT:
        size = C.BCQ_STORE_UNIT_SIZE if batch else C.CQ_STORE_UNIT_SIZE      # from the file's first unit
        start = int(qfile.name) // size if qfile.name.isdigit() else 0
        if batch:
            units = st.batch_consume_queue(topic, queue_id).units()
            start = units[start].msg_base_offset if start < len(units) else 2**63 - 1
        count = qfile.stat().st_size // size if count is None else count
    if compaction:
        _cat_compaction(ctx, st, topic, queue_id, start, count, resolve, message, out, tablefmt,
                        (body, charset, decompress, body_dir))
        return
    skipped = ()
    if resolve or message or not (batch or st.consumequeue_is_rocksdb):     # commit-log records are read
        st.commitlog, skipped = commitlog_view(st.commitlog, read_anyway)
    if compaction_topic and qfile is None:
        _note(f"{topic} is a compaction topic: its consumers read the compaction log (--compaction shows it)")
    if batch:
        _cat_bcq(ctx, st, topic, queue_id, start, count, resolve, out, tablefmt, skipped)
        return
    if st.consumequeue_is_rocksdb:
        cq, cut = st.rocksdb_consumequeue.existing_queue(topic, queue_id), None
    else:
        cq = _consume_queue(st, topic, queue_id)
        cut = dirty_tail_start(cq, st.commitlog)
        if cut is not None and skipped and is_unread(skipped, next(cq.iter_units(cut))[1].physical_offset):
            cut = None              # its records lie in a part not read, not past the commit log's end
    bad = 0
    static = static_queues(st).get((topic, queue_id))

    def units() -> Iterator[tuple[int, object]]:
        for n, (queue_offset, unit) in enumerate(cq.iter_units(start)):
            if (count is not None and n >= count) or (cut is not None and queue_offset >= cut):
                return
            yield queue_offset, unit

    def rows() -> Iterator[dict]:
        nonlocal bad
        for queue_offset, unit in units():
            row = dict(zip(CQ_UNIT_FIELDS, (topic, queue_id, queue_offset, *unit)))
            with_logical(row, static)
            if resolve:
                problems = [] if unit.is_filler else unit_problems(st.commitlog, topic, queue_id,
                                                                    queue_offset, unit)
                unread = bool(problems) and is_unread(skipped, unit.physical_offset)
                bad += bool(problems) and not unread
                row["status"] = "filler" if unit.is_filler else "unread" if unread else \
                    ("mismatch" if problems else "ok")
                row["problems"] = problems
            yield row

    def messages() -> Iterator[dict]:
        enc = row_encoding(body, out, body_dir)
        for queue_offset, unit in units():
            if unit.is_filler or is_unread(skipped, unit.physical_offset):
                continue
            entry = st.commitlog.read_at(unit.physical_offset)
            if not isinstance(entry, Blank):
                yield with_logical(entry_row(entry, unit.physical_offset, body_encoding=enc, decompress=decompress),
                                   static)

    if message:
        n = write_records(messages(), out, tablefmt, SCAN_COLUMNS + (STATIC_COLUMNS if static else []), body=body,
                          charset=charset, body_dir=body_dir)
    else:
        n = write_rows(rows(), out, tablefmt=tablefmt)
    if cut is not None:
        _note(f"units from queue offset {cut} on point past the end of the commit log and are left out "
              "(the broker drops them on load)")
    if n == 0:
        _nothing(ctx, f"no units in {topic}/{queue_id} from queue offset {start}", skipped)
    if bad:
        _note(f"{bad} unit(s) disagree with their records")
    end_partial(skipped)
    if bad:
        ctx.exit(ExitCode.FINDINGS)


def _cat_bcq(ctx: click.Context, st: Store, topic: str, queue_id: int, start: int, count: int | None,
             resolve: bool, out: Format, tablefmt: str, skipped) -> None:
    from rmqtool.store.readable import is_unread

    from rmqtool.ops.query import batch_unit_problems

    queues = [q.queue_id for q in st.batch_consume_queues(topic)]
    if queue_id not in queues:
        raise StoreError(f"BatchCQ topic {topic!r} has no queue {queue_id} (queues: "
                         f"{', '.join(map(str, queues)) or 'none'})", path=str(st.batch_consumequeue_dir / topic))
    units = st.batch_consume_queue(topic, queue_id).units()
    first = next((i for i, u in enumerate(units) if u.next_offset > start), len(units))
    chosen = units[first:] if count is None else units[first:first + count]
    bad = 0
    rows = []
    for u in chosen:
        row = dict(zip(BCQ_UNIT_FIELDS, (topic, queue_id, u.msg_base_offset, u.batch_size, u.physical_offset,
                                         u.size, u.tags_code, u.store_time, u.compacted_offset)))
        if resolve:
            problems = batch_unit_problems(st.commitlog, topic, queue_id, u)
            unread = bool(problems) and is_unread(skipped, u.physical_offset)
            bad += bool(problems) and not unread
            row["status"] = "unread" if unread else "mismatch" if problems else "ok"
            row["problems"] = problems
        rows.append(row)
    if write_rows(iter(rows), out, tablefmt=tablefmt) == 0:
        _nothing(ctx, f"no units in {topic}/{queue_id} from queue offset {start}", skipped)
    if bad:
        _note(f"{bad} unit(s) disagree with their records")
    end_partial(skipped)
    if bad:
        ctx.exit(ExitCode.FINDINGS)


def _cat_compaction(ctx: click.Context, st: Store, topic: str, queue_id: int, start: int, count: int | None,
                    resolve: bool, message: bool, out: Format, tablefmt: str, record_args: tuple) -> None:
    """A compaction topic as its consumers read it (CompactionStore.getMessage): the sparse queue's units
    (physical_offset: the compaction-log offset), or with --message their records, from the first retained
    offset at or after ``start``, with the queue offsets the broker gives."""
    import itertools

    from rmqtool.ops.compaction import unit_problems

    q = st.compaction.queue(topic, queue_id)
    chosen = list(itertools.islice(q.consumer_view(start), count))
    _note(f"{topic} is a compaction topic: its consumers read the compaction log (queue offsets "
          f"{q.min_offset}..{q.max_offset - 1}, compacted up to "
          f"{st.compaction.loaded_position()[0].get((topic, queue_id), 'none')})")
    bad = 0
    if message:
        body, charset, decompress, body_dir = record_args
        enc = row_encoding(body, out, body_dir)
        n = write_records((entry_row(rec, unit.physical_offset, body_encoding=enc, decompress=decompress)
                           for _, unit, rec in chosen), out, tablefmt, SCAN_COLUMNS, body=body, charset=charset,
                          body_dir=body_dir)
    else:
        rows = []
        for _, u, rec in chosen:
            row = dict(zip(BCQ_UNIT_FIELDS, (topic, queue_id, u.msg_base_offset, u.batch_size, u.physical_offset,
                                             u.size, u.tags_code, u.store_time, u.compacted_offset)))
            if resolve:
                problems = unit_problems(u, rec)
                bad += bool(problems)
                row["status"], row["problems"] = ("mismatch" if problems else "ok"), problems
            rows.append(row)
        n = write_rows(iter(rows), out, tablefmt=tablefmt)
    if n == 0:
        _nothing(ctx, f"no units in {topic}/{queue_id} from queue offset {start}")
    if bad:
        _note(f"{bad} unit(s) disagree with their records")
        ctx.exit(ExitCode.FINDINGS)


def _cat_compaction_file(ctx: click.Context, st: Store, topic: str, queue_id: int, qfile: Path, count: int | None,
                         out: Format, tablefmt: str) -> None:
    """The units of one file of a compaction topic's sparse queue, as SparseConsumeQueue.recover reads them."""
    q = st.compaction.queue(topic, queue_id)
    units = next((u for f, u, _ in q.files if f.path.samefile(qfile)), None)
    if units is None:
        raise StoreError("not a file of the compaction queue", path=str(qfile))
    rows = [dict(zip(BCQ_UNIT_FIELDS, (topic, queue_id, u.msg_base_offset, u.batch_size, u.physical_offset, u.size,
                                       u.tags_code, u.store_time, u.compacted_offset))) for u in units[:count]]
    if write_rows(iter(rows), out, tablefmt=tablefmt) == 0:
        _nothing(ctx, f"no units in {qfile}")


def _consume_queue(st: Store, topic: str, queue_id: int):
    topics = st.topics()
    if topic not in topics:
        shown = ", ".join(topics[:10]) + (", ..." if len(topics) > 10 else "")
        raise StoreError(f"unknown topic {topic!r} (the store has {len(topics)} topics: {shown or 'none'})",
                         path=str(st.consumequeue_dir))
    queues = [cq.queue_id for cq in st.consume_queues(topic)]
    if queue_id not in queues:
        raise StoreError(f"topic {topic!r} has no queue {queue_id} (queues: "
                         f"{', '.join(map(str, queues)) or 'none'})", path=str(st.consumequeue_dir / topic))
    return st.consume_queue(topic, queue_id)


# -- cat-index --------------------------------------------------------------------------------------
@cli.command("cat-index")
@click.argument("path", metavar="STORE|FILE", type=click.Path())
@click.option("--entries", is_flag=True, help="Every entry: key hash, slot, physical offset, time, chain link.")
@click.option("--slots", is_flag=True, help="Every non-empty hash slot with its newest entry and chain length.")
@output_options
@click.pass_context
def cat_index(ctx: click.Context, path: str, entries: bool, slots: bool, fmt: str | None,
              tablefmt: str) -> None:
    """Print index-file headers and geometry (slot count and entry capacity, inferred from the bytes).

    PATH is a store, its index/ directory or one index file.

    \b
    Examples:
      rmqtool cat-index STORE
      rmqtool cat-index STORE/index/20261120231309479 --entries -f csv
      rmqtool cat-index STORE --slots -f plain
    """
    from rmqtool.ops.inspect import index_file_row

    if entries and slots:
        raise click.UsageError("use --entries or --slots, not both")
    out = resolve_format(fmt)
    refs = _index_refs(Path(path))
    if not refs:
        _nothing(ctx, "no index files")
    if entries:
        rows = (row for ref in refs for row in _index_entries(ref))
    elif slots:
        rows = (row for ref in refs for row in _index_slots(ref))
    else:
        rows = (index_file_row(ref) for ref in refs)
    if write_rows(rows, out, tablefmt=tablefmt) == 0:
        _nothing(ctx, "no entries" if entries else "no used slots")


def _index_refs(path: Path):
    from rmqtool.store.store import index_refs

    if path.is_file():                      # one file: refused unless it can be an index file
        from rmqtool.errors import FormatError
        from rmqtool.format.indexfile import header_problem

        refs = index_refs([path])
        problem = header_problem(refs[0].header, refs[0].geometry)
        if problem:
            raise FormatError(f"not an index file: {problem}", path=str(path), offset=0)
        return refs
    if path.is_dir() and path.name == L.INDEX and not (path / L.COMMITLOG).exists():
        return index_refs(sorted(p for p in path.iterdir() if p.is_file()))
    return Store.open(path).index_files()


def _index_entries(ref) -> Iterator[dict]:
    from rmqtool.format.indexfile import ENTRY

    buf, g, h = ref.read(), ref.geometry, ref.header
    for number in range(1, min(max(h.index_count, 1), g.index_num)):
        key_hash, phy, time_diff, prev = ENTRY.unpack_from(buf, g.entry_pos(number))
        yield {"index_file": ref.name, "entry": number, "key_hash": key_hash, "slot": key_hash % g.hash_slot_num,
               "physical_offset": phy, "time_diff": time_diff,
               "store_timestamp": h.begin_timestamp + time_diff * 1000, "prev_index": prev}


def _index_slots(ref) -> Iterator[dict]:
    from rmqtool.format.indexfile import iter_chain

    buf, g, h = ref.read(), ref.geometry, ref.header
    table = array.array("i", buf[g.slot_pos(0):g.slot_pos(g.hash_slot_num)])
    if sys.byteorder == "little":
        table.byteswap()
    for slot, head in enumerate(table):
        if head:
            yield {"index_file": ref.name, "slot": slot, "entry": head,
                   "chain_length": sum(1 for _ in iter_chain(buf, g, slot, h.index_count))}


# -- query-key / query-id / decode-id ---------------------------------------------------------------
@cli.command("query-key")
@click.argument("store", type=click.Path(), callback=recognized)
@click.argument("topic")
@click.argument("key")
@since_until(aliases=True)
@count_option(aliases=("--max",), default=C.INDEX_MAX_MSGS_NUM_BATCH, show_default=True,
              help="Most index hits to collect (the broker caps this at 64).")
@click.option("--raw", is_flag=True, help="Print the raw index hits, hash collisions included, "
                                          "as IndexService.queryOffset returns them.")
@click.option("--scan", is_flag=True, help="Read the whole commit log instead of the index (for stores whose "
                                           "index is missing or does not cover the records).")
@read_anyway_option()
@record_options
@output_options
@click.pass_context
def query_key(ctx: click.Context, store: str, topic: str, key: str, since: int | None, until: int | None,
              count: int, raw: bool, scan: bool, read_anyway: bool, body: str | None, charset: str, decompress: bool,
              body_dir: str | None, fmt: str | None, tablefmt: str) -> None:
    """Find the records of TOPIC with KEY (a KEYS element or a UNIQ_KEY) through the index files.

    Looks up every index file as the broker does (newest first, by hash), then reads each hit and keeps
    only records whose topic and KEYS/UNIQ_KEY really match. --since/--until apply to each record's store
    time: the index keeps an entry's time only to the second after its file's begin time
    (IndexFile.selectPhyOffset compares begin + timeDiff * 1000), so the index is asked for the window
    widened by 999 ms and each record kept by its own store time (--raw shows the index's own answer for
    the window). When nothing is found, says whether the
    index covers the store; --scan reads the commit log instead (the scan of cat-commitlog --key).
    Exits 1 when nothing is found.

    \b
    Examples:
      rmqtool query-key STORE Order_Topic-1 key-82
      rmqtool query-key STORE Order_Topic-1 key-82 --raw -f json
      rmqtool query-key STORE TopicA key-37 --since 2026-11-20 -f record
      rmqtool query-key STORE TopicA key-37 --scan -f plain
      rmqtool query-key STORE TopicA no-such-key   # exit 1
    """
    from rmqtool.ops.query import lookup_key

    if raw and scan:
        raise click.UsageError("use --raw or --scan, not both")
    out = resolve_format(fmt)
    st, skipped = open_readable(store, read_anyway)
    begin, end = since or 0, until if until is not None else 2**63 - 1
    enc = row_encoding(body, out, body_dir)
    if scan:
        from rmqtool.ops.filters import filtered_batches

        where = record_filter((topic,), keys=(key,), since=since, until=until)
        damage = Damage() if read_anyway else None
        with progress_bar(_commitlog_total(st.commitlog, None), "scanning", streaming=True) as progress:
            batches = filtered_batches(st.commitlog, where, decompress=decompress, progress=progress,
                                       on_damage=damage)
            n = write_record_batches(batches, out, tablefmt, KEY_COLUMNS, body=body, charset=charset,
                                     body_dir=body_dir)
        if n == 0:
            _note(f"no record of topic {topic!r} with key {key!r} in the commit log")
        end_partial(skipped)
        if damage is not None:
            damage.exit(ExitCode.FINDINGS if n == 0 else ExitCode.OK)
        if n == 0:
            ctx.exit(ExitCode.FINDINGS)
        return
    found = lookup_key(st, topic, key, max_num=count, begin=begin, end=end)
    if raw:
        n = write_rows((hit.row() for hit in found.hits), out, columns=INDEX_HIT_FIELDS, tablefmt=tablefmt)
    else:
        rows = (entry_row(msg, offset, body_encoding=enc, decompress=decompress) for offset, msg in found.records)
        n = write_records(rows, out, tablefmt, KEY_COLUMNS, body=body, charset=charset, body_dir=body_dir)
        if found.collisions:
            _note(f"{len(found.collisions)} index hit(s) dropped: the record there does not carry "
                  f"{topic}#{key} (hash collision)")
        if found.via_queue:
            _note(f"{topic} is an LMQ (not indexed by the broker): found by reading its consume queue")
    if n == 0:
        hint = _index_coverage(st, begin, end) if topic in st.topics() + st.batch_topics() else \
            f" (the store has no consume queue for topic {topic!r})"
        _nothing(ctx, f"no record of topic {topic!r} with key {key!r}{hint}", skipped)
    end_partial(skipped)


def _index_coverage(st: Store, begin: int, end: int) -> str:
    """What the index does not cover, as a hint to use --scan ('' when it covers the window)."""
    refs = st.index_files()
    if not refs:
        return "; the store has no index files: --scan reads the commit log"
    first = min(r.header.begin_timestamp for r in refs)
    last_ts = max(r.header.end_timestamp for r in refs)
    last_offset = max(r.header.end_phy_offset for r in refs)
    if end < first or begin > last_ts:
        return (f"; the index covers {format_timestamp(first)} to {format_timestamp(last_ts)} only, "
                "not this time window: --scan reads the commit log")
    return (f" in the index (it covers records up to offset {last_offset}, {format_timestamp(last_ts)}; "
            "--scan reads the whole commit log)")


@cli.command("query-id")
@click.argument("store", type=click.Path(), callback=recognized)
@click.argument("msg_ids", metavar="[ID[,ID...]]...", nargs=-1)
@click.option("--id", "-i", "more_ids", multiple=True, metavar="ID[,ID...]",
              help="IDs to find (as mqadmin queryMsgById -i; repeatable, comma-separated).")
@click.option("--track", is_flag=True,
              help="Instead of the records: per consumer group with a committed offset on each record's queue, "
                   "whether it consumed the record (offset beyond its queue offset), as mqadmin's track.")
@click.option("--kind", type=click.Choice(["auto", "msg-id", "uniq-key"]), default="auto", show_default=True,
              help="Read ID as an offsetMsgId, a UNIQ_KEY, or decide from the store.")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC",
              help="Look a UNIQ_KEY up under these topics only (default: every topic the store knows; "
                   "repeatable).")
@click.option("--scan", is_flag=True, help="When the index has no UNIQ_KEY hit, read the whole commit log.")
@read_anyway_option()
@record_options
@output_options
@click.pass_context
def query_id(ctx: click.Context, store: str, msg_ids: tuple[str, ...], more_ids: tuple[str, ...], track: bool,
             kind: str, topics: tuple[str, ...], scan: bool, read_anyway: bool, body: str | None, charset: str, decompress: bool,
             body_dir: str | None, fmt: str | None, tablefmt: str) -> None:
    """Find a message by its offsetMsgId (broker msgId) or by its UNIQ_KEY (client msgId).

    Both are 32 (IPv4) or 56 (IPv6) hex characters. The ID is taken as an offsetMsgId when the record at
    its decoded offset has exactly that msgId; otherwise as a UNIQ_KEY, looked up in the index under
    every topic the store knows: consumequeue/ (or the RocksDB consume queue, LMQs among them),
    batchconsumequeue/, config/topics.json and the consumer offsets (a UNIQ_KEY can match several
    records: retries and scheduled copies keep it); a miss names the topics searched. Several IDs
    print their records in the order given; an ID with no record is noted on stderr. With --track, rows of
    (msg_id, group, offset, consumed) from config/consumerOffset.json (lmqConsumerOffset.json when the
    broker ran with enableLmq). Exits 1 when an ID is not found.

    \b
    Examples:
      rmqtool query-id STORE C0A8000A00002A9F0000000000000E33
      rmqtool query-id STORE \\
        FD00000000000000000000000000000243AE5FFD2B2766D44D8E0004 --scan
      rmqtool query-id STORE C0A8000A00002A9F0000000000000E33 -f record \\
        --body-file /tmp/rmqtool-bodies
      rmqtool query-id CONFIG_STORE -i \\
        FD000000000000000000000000000002519430946E0972E0FF9C001E --track
    """
    from rmqtool.ops.mqadmin import static_queues, with_logical
    from rmqtool.ops.query import lookup_id

    ids = [i.strip() for text in msg_ids + more_ids for i in text.split(",") if i.strip()]
    if not ids:
        raise click.UsageError("give at least one ID (as an argument or with -i)")
    for msg_id in ids:
        _check_id(msg_id)
    out = resolve_format(fmt)
    st, skipped = open_readable(store, read_anyway)
    damage = Damage() if read_anyway else None
    records, missing = [], []
    for msg_id in dict.fromkeys(ids):
        with progress_bar(sum(f.length for f in st.commitlog.queue) if scan else 0, f"scanning for {msg_id}") \
                as progress:
            found = lookup_id(st, msg_id, kind=kind, topics=topics or None, scan=scan, progress=progress,
                              on_damage=damage)
        for text in found.notes:
            _note(text)
        if not found.records:
            missing.append(msg_id)
            _note(f"no record with offsetMsgId or UNIQ_KEY {msg_id}" + _searched(found.searched, scan, kind,
                                                                                   bool(topics)))
        records += found.records
    enc = row_encoding(body, out, body_dir)
    mapped = static_queues(st) if records else {}
    rows = (with_logical(entry_row(msg, offset, body_encoding=enc, decompress=decompress),
                         mapped.get((msg.topic, msg.queue_id))) for offset, msg in records)
    if track:
        from rmqtool.ops.mqadmin import TRACK_FIELDS, track_rows
        from rmqtool.store.metadata import consumer_offsets

        loaded = consumer_offsets(st)
        n = write_rows(track_rows(rows, loaded.value.entries if loaded else {}), out, columns=TRACK_FIELDS,
                       tablefmt=tablefmt)
        if records and not n:
            _note("no consumer group has a committed offset on these records' queues")
    elif records:
        static = any((msg.topic, msg.queue_id) in mapped for _, msg in records)
        write_records(rows, out, tablefmt, ID_COLUMNS + (STATIC_COLUMNS if static else []), body=body,
                      charset=charset, body_dir=body_dir)
    end_partial(skipped)
    if damage is not None:
        damage.exit(ExitCode.FINDINGS if missing else ExitCode.OK)
    if missing:
        ctx.exit(ExitCode.FINDINGS)


def _searched(topics: list[str], scan: bool, kind: str, given: bool) -> str:
    """Where a missed UNIQ_KEY was looked for (the topics the store knows, or those --topic gave), and what
    else there is."""
    if kind == "msg-id":
        return ""
    shown = ", ".join(topics[:12]) + (f" and {len(topics) - 12} more" if len(topics) > 12 else "")
    where = f" in the index under {len(topics)} topic(s) ({shown or 'none'})"
    if scan:
        return where + " nor in the commit log"
    return where + ("; --scan reads the whole commit log" if given else "; a deleted topic is not among them: "
                    "--topic names it, --scan reads the whole commit log")


@cli.command("decode-id")
@click.argument("msg_id", metavar="ID")
@click.option("--born", type=CALENDAR_TIME, help="Anchor the UNIQ_KEY time on this born time (default: the month of "
                                             "now, see --now).")
@output_options
def decode_id(msg_id: str, born: int | None, fmt: str | None, tablefmt: str) -> None:
    """Decode a 32/56 hex-character ID both ways, without a store: as an offsetMsgId (store host and
    physical offset) and as a UNIQ_KEY (client IP, pid, class-loader hash, creation time, counter).

    The UNIQ_KEY time counts from the producer's local month start; it is anchored on --born, else on the
    latest month start whose time is not after now (--now, else the system clock), as the client's
    MessageClientIDSetter.getNearlyTimeFromID does.

    \b
    Examples:
      rmqtool decode-id C0A8000A00002A9F0000000000000E33 --now \\
        2026-11-26T12:00:00Z
      rmqtool decode-id FD00000000000000000000000000000243AE5FFD2B2766D44D8E0004 \\
        --born 1795216389519
    """
    from rmqtool.ops.query import describe_id

    write_record(describe_id(_check_id(msg_id), born), resolve_format(fmt), tablefmt=tablefmt)


def _check_id(msg_id: str) -> str:
    """A message ID argument: 32 or 56 hex characters, else a usage error (exit 2)."""
    from rmqtool.errors import FormatError
    from rmqtool.format.msgid import decode_message_id

    try:
        decode_message_id(msg_id.strip().upper())
    except FormatError as exc:
        raise click.BadParameter(str(exc), param_hint="ID") from None
    return msg_id


# -- trace ------------------------------------------------------------------------------------------
TRACE_COLUMNS = ["trace_type", "time_stamp", "group", "msg_id", "region_id", "cost_time", "success", "status",
                 "store_host", "client_host", "retry_times", "request_id"]


@cli.command("trace")
@click.argument("store", type=click.Path(), callback=recognized)
@click.argument("msg_ids", metavar="[ID]...", nargs=-1)
@click.option("--id", "-i", "more_ids", multiple=True, metavar="ID",
              help="An ID to trace (as mqadmin queryMsgTraceById -i; repeatable).")
@click.option("--topic", metavar="TOPIC", help="Only contexts of messages of this topic.")
@click.option("--group", metavar="GROUP", help="Only contexts of this producer or consumer group.")
@click.option("--since", type=TIMESTAMP, help=f"Only contexts at or after TIME (their timeStamp; {TIME_HELP}).")
@click.option("--until", type=TIMESTAMP, help="Only contexts at or before TIME (their timeStamp).")
@click.option("--trace-topic", metavar="TOPIC",
              help="The trace topic [default: msgTraceTopicName of config/broker.properties, else "
                   "RMQ_SYS_TRACE_TOPIC].")
@count_option(default=C.INDEX_MAX_MSGS_NUM_BATCH, show_default=True,
              help="Most index hits to collect per ID (as mqadmin queryMsgTraceById -c).")
@click.option("--scan", is_flag=True, help="Read the trace topic's records from the commit log instead of the index.")
@read_anyway_option()
@output_options
@click.pass_context
def trace(ctx: click.Context, store: str, msg_ids: tuple[str, ...], more_ids: tuple[str, ...], topic: str | None,
          group: str | None, since: int | None, until: int | None, trace_topic: str | None, count: int, scan: bool,
          read_anyway: bool, fmt: str | None, tablefmt: str) -> None:
    """Print the message-trace contexts (client enableMsgTrace) that name a message: Pub (sent), SubBefore /
    SubAfter (consumed: group, cost, success and ConsumeReturnType status), EndTransaction, Recall.

    An ID is a UNIQ_KEY (the client's msgId), an offsetMsgId (of a record of the store: its UNIQ_KEY is
    traced) or a key. The trace messages are found through the index, as mqadmin queryMsgTraceById finds
    them (their KEYS hold every traced msgId and key), or by reading the trace topic's records from the
    commit log when the index has none (or with --scan); each body (decompressed when compressed) is
    decoded as TraceDataEncoder.decoderFromTraceDataString does, one row per context and bean, and a
    context is printed when its msgId, offsetMsgId or one of its keys is the ID. Without an ID, every
    context of the trace topic is listed; --topic, --group, --since and --until select contexts either
    way (SubBefore/SubAfter lines carry no topic: a message's topic comes from its Pub context or the
    index). client_host is the trace message's born host (TraceView). Exits 1 when an ID has no context,
    or nothing is listed; a trace body that does not decode is an error (exit 3), skipped with a warning
    under --read-anyway.

    \b
    Examples:
      rmqtool trace TRACE_STORE \\
        FD00000000000000000000000000000273E75FFD2B271A98829A0006 --fields \\
        trace_type,time_stamp,group,cost_time,status -f plain
      rmqtool trace TRACE_STORE C0A8000A00002A9F00000000000003A4 -f jsonl \\
        --fields trace_type,group,status
      rmqtool trace TRACE_STORE 键-45 --scan -f csv \\
        --fields trace_type,group,msg_id
      rmqtool trace TRACE_STORE --group CG_Trace1 --topic TopicA -f csv \\
        --fields time_stamp,msg_id,status | grep -E 'FAILED|EXCEPTION'
      rmqtool trace TRACE_STORE no-such-key   # exit 1
    """
    from rmqtool.ops.trace import (ContextFilter, context_row, index_trace_records, names_message, names_of,
                                   record_contexts, topic_resolver, trace_records)
    from rmqtool.ops.trace import trace_topic as topic_of_traces

    ids = list(dict.fromkeys(i.strip() for i in msg_ids + more_ids if i.strip()))
    out = resolve_format(fmt)
    st, skipped = open_readable(store, read_anyway)
    damage = Damage() if read_anyway else None
    traces, source = topic_of_traces(st, trace_topic)
    if source not in ("given", "default"):
        _note(f"trace topic {traces} ({source})")
    published: dict[str, str] = {}                    # msgId -> topic of the Pub contexts read (for --topic)
    where = ContextFilter(topic, group, since, until,
                          topic_resolver(st, topic, published) if topic is not None else None)
    undecodable: list[int] = []                       # trace records skipped under --read-anyway
    filtered = " that matches" if topic or group or since is not None or until is not None else ""

    def contexts(records):
        for offset, msg in records:
            try:
                decoded = record_contexts(offset, msg)
            except FormatError as exc:
                if damage is None:
                    raise
                undecodable.append(offset)
                click.echo(f"rmqtool: warning: {exc}; that trace message skipped", err=True)
                continue
            if topic is not None:
                published.update((c.bean.msg_id, c.bean.topic) for c in decoded if c.trace_type == "Pub")
            yield from ((c, offset, msg) for c in decoded if where(c))

    def scanning():
        return progress_bar(sum(f.length for f in st.commitlog.queue), f"reading {traces}", streaming=True)

    if not ids:
        with scanning() as progress:
            records = trace_records(st, traces, progress=progress, on_damage=damage)
            n = write_rows((context_row(*found) for found in contexts(records)), out, columns=TRACE_COLUMNS,
                           tablefmt=tablefmt)
        if n == 0:
            _note(f"no trace context in topic {traces!r}{filtered}{_unknown_topic(st, traces)}")
        missing = []
    else:
        rows: dict[str, list[dict]] = {}
        unanswered: dict[str, set[str]] = {}          # IDs the index has no trace record for: one scan for all
        for msg_id in ids:
            names = names_of(st, msg_id)
            records, capped = ([], []) if scan else index_trace_records(st, traces, names, max_num=count)
            for name in capped:
                _note(f"{name}: {count} index hits, the --count limit: raise it to see more")
            if not records:
                unanswered[msg_id] = names
            rows[msg_id] = [context_row(*found) for found in contexts(records) if names_message(found[0], names)]
        if unanswered:
            with scanning() as progress:
                for found in contexts(trace_records(st, traces, progress=progress, on_damage=damage)):
                    for msg_id, names in unanswered.items():
                        if names_message(found[0], names):
                            rows[msg_id].append(context_row(*found))
        missing = [msg_id for msg_id in ids if not rows[msg_id]]
        for msg_id in missing:
            _note(f"no trace context names {msg_id} in topic {traces!r}{filtered}{_unknown_topic(st, traces)}")
        n = write_rows([row for msg_id in ids for row in rows[msg_id]], out, columns=TRACE_COLUMNS,
                       tablefmt=tablefmt)
    end_partial(skipped)
    if undecodable:
        ctx.exit(ExitCode.BAD_INPUT)
    if damage is not None:
        damage.exit(ExitCode.FINDINGS if n == 0 or missing else ExitCode.OK)
    if n == 0 or missing:
        ctx.exit(ExitCode.FINDINGS)


def _unknown_topic(st: Store, topic: str) -> str:
    """A hint when the store knows no such topic: a client can trace to a customizedTraceTopic, or with
    AccessChannel.CLOUD to rmq_sys_TRACE_DATA_<region> (TraceConstants.TRACE_TOPIC_PREFIX)."""
    from rmqtool.ops.trace import CLOUD_TRACE_TOPIC_PREFIX
    from rmqtool.store.metadata import known_topics

    known = known_topics(st)
    if topic in known:
        return ""
    cloud = [t for t in known if t.startswith(CLOUD_TRACE_TOPIC_PREFIX)]
    also = f", as {', '.join(cloud)} may be" if cloud else ""
    return f" (the store has no topic {topic!r}: --trace-topic names another{also})"


# -- checkpoint -------------------------------------------------------------------------------------
@cli.command()
@click.argument("path", metavar="STORE|FILE", type=click.Path())
@output_options
def checkpoint(path: str, fmt: str | None, tablefmt: str) -> None:
    """Print the checkpoint: physic/logics/index message timestamps, masterFlushedOffset (5.0+),
    confirmPhyOffset (5.1.1+) and the derived minimum timestamps recovery uses.

    \b
    Examples:
      rmqtool checkpoint STORE
      rmqtool checkpoint STORE_5X/checkpoint -f json
    """
    from rmqtool.errors import FormatError
    from rmqtool.format.checkpoint import decode_checkpoint_file
    from rmqtool.ops.inspect import checkpoint_row

    p = Path(path)
    if p.is_file() and p.name != L.CHECKPOINT:      # any other file is a checkpoint only at the broker's size
        try:
            cp = decode_checkpoint_file(p.read_bytes())
        except FormatError as exc:
            raise exc.at(path=str(p)) from None
    else:
        st = Store.open(p.parent if p.is_file() else p)
        cp = st.checkpoint()
        if cp is None:
            raise StoreError("no checkpoint file", path=str(st.path(L.CHECKPOINT)))
        length = st.checkpoint_length()
        if length < C.CHECKPOINT_FILE_SIZE:     # the fields past its end are shown as the broker reads them: 0
            from rmqtool.store.broker_model import level_of
            warnings.warn(StoreWarning(f"{st.path(L.CHECKPOINT)}: checkpoint is {length} bytes, not "
                                       f"{C.CHECKPOINT_FILE_SIZE}: {level_of('checkpoint_short')[1]}"))
    write_record(checkpoint_row(cp), resolve_format(fmt), tablefmt=tablefmt)
