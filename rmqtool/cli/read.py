"""Read-only commands: info, cat-commitlog, cat-cq, cat-index, query-key, query-id, decode-id, checkpoint.

Nothing here imports pyarrow or pyspark: look-ups start fast.
"""

from __future__ import annotations

import array
import sys
from pathlib import Path
from typing import Iterator

import click

from rmqtool import constants as C
from rmqtool.cli import RmqCliError, cli
from rmqtool.cli.exitcodes import ExitCode
from rmqtool.cli.output import (TIMESTAMP, Format, output_options, resolve_format, write_record,
                                write_rows)
from rmqtool.errors import FormatError, StoreError
from rmqtool.format.commitlog import Blank
from rmqtool.ops.rows import BCQ_UNIT_FIELDS, BODY_ENCODINGS, CQ_UNIT_FIELDS, INDEX_HIT_FIELDS, RECORD_FIELDS, entry_row
from rmqtool.store.commitlog import CommitLog
from rmqtool.store.store import Store

RECORD_TABLE_COLUMNS = ["physical_offset", "store_timestamp", "topic", "queue_id", "queue_offset", "tags",
                        "keys", "msg_id", "body"]
TABLE_BODY_CHARS = 60
PEOPLE = (Format.TABLE, Format.PLAIN)


# -- shared options and helpers ---------------------------------------------------------------------
def record_options(fn):
    """--body, --decompress and --fields for every command that prints records."""
    fn = click.option("--fields", metavar="A,B,...",
                      help="Only these record fields, in this order (default: all; a few in tables).")(fn)
    fn = click.option("--decompress", is_flag=True,
                      help="Decompress ZLIB/LZ4/ZSTD bodies (sysFlag COMPRESSED) before printing.")(fn)
    fn = click.option("--body", "body", type=click.Choice(BODY_ENCODINGS), default=None,
                      help="Body encoding [default: text in tables, base64 in json/jsonl/csv].")(fn)
    return fn


def _body_encoding(body: str | None, fmt: Format) -> str:
    return body or ("text" if fmt in PEOPLE else "base64")


def _fields(fields: str | None, fmt: Format, extra: tuple[str, ...] = ()) -> list[str] | None:
    if fields:
        names = [f.strip() for f in fields.split(",") if f.strip()]
        unknown = [n for n in names if n not in RECORD_FIELDS and n not in ("crc_ok",) + extra]
        if unknown:
            raise click.BadParameter(f"unknown field(s) {', '.join(unknown)}; fields are "
                                     f"{', '.join(RECORD_FIELDS)}, crc_ok", param_hint="--fields")
        return names
    if fmt in PEOPLE:
        return RECORD_TABLE_COLUMNS + list(extra)
    return None


def _shorten(rows: Iterator[dict], fmt: Format) -> Iterator[dict]:
    """Tables show the start of a text body, and no binary bytes (scripts get the body whole)."""
    for row in rows:
        body = row.get("body")
        if fmt in PEOPLE and isinstance(body, str) and row.get("body_encoding") == "text":
            if "\ufffd" in body:
                row = {**row, "body": f"({row['body_length']} bytes, not UTF-8)"}
            elif len(body) > TABLE_BODY_CHARS:
                row = {**row, "body": body[:TABLE_BODY_CHARS] + "…"}
        yield row


def _write_records(rows, fmt: Format, tablefmt: str, columns: list[str] | None) -> int:
    rows = _shorten(rows, fmt)
    if columns is not None:
        rows = ({c: r.get(c) for c in columns} for r in rows)
    return write_rows(rows, fmt, columns=columns, tablefmt=tablefmt)


def _note(text: str) -> None:
    click.echo(f"rmqtool: {text}", err=True)


def _nothing(ctx: click.Context, text: str) -> None:
    _note(text)
    ctx.exit(ExitCode.FINDINGS)


def _open_commitlog(path: str) -> tuple[Store, CommitLog]:
    """The store (or single commit-log file) at ``path``; files of the wrong size are refused."""
    st = Store.open(path)
    cl = st.commitlog
    for f in cl.queue:
        if cl.file_size and f.length not in (0, cl.file_size):
            raise StoreError(f"commit-log file is {f.length} bytes, its siblings {cl.file_size} "
                             "(the broker would refuse to load this store)", path=str(f.path))
    return st, cl


# -- info -------------------------------------------------------------------------------------------
@cli.command()
@click.argument("store", type=click.Path())
@output_options
@click.pass_context
def info(ctx: click.Context, store: str, fmt: str | None, tablefmt: str) -> None:
    """Summarise a store: commit-log files and records, topics and queues, index files, checkpoint,
    abort/lock state and hints about the broker version that wrote it.

    Exits 1 when the commit log holds a damaged record or files of the wrong size.

    \b
    Examples:
      rmqtool info /var/rocketmq/store
      rmqtool info -f json store | jq '.consume_queues[] | select(.units > 0)'
    """
    from rmqtool.ops.inspect import store_info

    out = resolve_format(fmt)
    summary = store_info(Store.open(store))
    if out in (Format.JSON, Format.JSONL, Format.CSV):
        write_record(summary, out, tablefmt=tablefmt)
    else:
        sections = {k: summary.pop(k) for k in ("commitlog_files", "consume_queues", "index_files",
                                                "checkpoint", "version_hints", "problems")}
        write_record(summary, out, tablefmt=tablefmt)
        for title, rows in (("commit-log files", sections["commitlog_files"]),
                            ("consume queues", sections["consume_queues"]),
                            ("index files", sections["index_files"])):
            _section(title, rows, out, tablefmt)
        if sections["checkpoint"]:
            _section("checkpoint", None, out, tablefmt)
            write_record(sections["checkpoint"], out, tablefmt=tablefmt)
        for title in ("version_hints", "problems"):
            _section(title.replace("_", " "), [{title[:-1]: t} for t in sections[title]], out, tablefmt)
        summary["problems"] = sections["problems"]
    for problem in summary["problems"]:
        _note(f"problem: {problem}")
    if summary["problems"]:
        ctx.exit(ExitCode.FINDINGS)


def _section(title: str, rows: list[dict] | None, fmt: Format, tablefmt: str) -> None:
    if rows == []:
        return
    out = sys.stdout
    out.write(f"\n{title}\n")
    if rows is not None:
        write_rows(rows, fmt, tablefmt=tablefmt)


# -- cat-commitlog ----------------------------------------------------------------------------------
def commitlog_rows(cl: CommitLog, *, start: int | None = None, count: int | None = None, where=None,
                   include_blank: bool = False, body: str = "base64", decompress: bool = False,
                   check_crc: bool = False, unwrap: bool = False) -> Iterator[dict]:
    """The rows of cat-commitlog, in commit-log order: the one source of records (filters applied here).

    With ``unwrap``, an inner-batch record gives one row per inner message (with ``inner_index``)."""
    from rmqtool.format.batch import inner_messages, is_inner_batch

    n = 0
    for loc in cl.iter_entries(start, include_blank=include_blank):
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
            if not isinstance(msg, Blank) and where is not None and not where.matches(msg):
                continue
            n += 1
            row = entry_row(msg, loc.offset, body_encoding=body, check_crc=check_crc and inner is None,
                            decompress=decompress)
            if unwrap:
                row["inner_index"] = inner
            yield row


def _scan_jsonl(cl: CommitLog, *, start: int | None, count: int | None, include_blank: bool, body: str,
                check_crc: bool) -> int:
    """cat-commitlog's JSON lines from the columnar decoder, streamed batch by batch."""
    import numpy as np
    import pyarrow.compute as pc

    from rmqtool.columnar import iter_record_batches
    from rmqtool.columnar.text import json_lines

    out = sys.stdout.buffer
    n = 0
    for batch in iter_record_batches(cl, check_crc=check_crc, start=start, batch_rows=16384):
        if not include_blank:
            batch = batch.filter(pc.equal(batch.column("type"), "message"))
        if count is not None:
            batch = batch.slice(0, count - n)
        if batch.num_rows == 0:
            if count is not None and n >= count:
                break
            continue
        lines = json_lines(batch, body)
        offsets = np.frombuffer(lines.buffers()[1], np.int32, len(lines) + 1, lines.offset * 4)
        out.write(memoryview(lines.buffers()[2])[offsets[0]:offsets[-1]])
        out.flush()
        n += batch.num_rows
        if count is not None and n >= count:
            break
    return n


@cli.command("cat-commitlog")
@click.argument("path", metavar="STORE|FILE", type=click.Path())
@click.option("--offset", type=click.IntRange(min=0), metavar="N",
              help="Start at this physical offset, which must be a record boundary.")
@click.option("--count", "-n", type=click.IntRange(min=0), metavar="N", help="Stop after N records.")
@click.option("--topic", help="Only records of this topic.")
@click.option("--queue-id", type=int, metavar="N", help="Only records of this queue id.")
@click.option("--tag", help="Only records with this TAGS value.")
@click.option("--key", help="Only records with this key among their KEYS.")
@click.option("--since", type=TIMESTAMP, help="Only records stored at or after TIME (ISO-8601, UTC "
                                               "unless a zone is given, or epoch ms).")
@click.option("--until", type=TIMESTAMP, help="Only records stored at or before TIME.")
@click.option("--include-blank", is_flag=True, help="Also print the BLANK records that pad file ends.")
@click.option("--check-crc", is_flag=True, help="Recompute each body CRC and add crc_ok.")
@click.option("--unwrap", is_flag=True,
              help="Show an inner-batch record (sysFlag INNER_BATCH, BatchCQ topics) as its messages, each "
                   "with the queue offset the broker gives it (INNER_BASE + i) and inner_index.")
@record_options
@output_options
@click.pass_context
def cat_commitlog(ctx: click.Context, path: str, offset: int | None, count: int | None, topic: str | None,
                  queue_id: int | None, tag: str | None, key: str | None, since: int | None,
                  until: int | None, include_blank: bool, check_crc: bool, unwrap: bool, body: str | None,
                  decompress: bool, fields: str | None, fmt: str | None, tablefmt: str) -> None:
    """Decode commit-log records in commit-log order, from a store or a single commit-log file.

    A DLedger store (dledger-<id>/data) is read through its entries: each record at the physical offset
    the broker reports (entry position + 48). Output is streamed; a damaged record stops the output with
    an error naming its file and offset. Exits 1 when no record was printed.

    \b
    Examples:
      rmqtool cat-commitlog store --count 5
      rmqtool cat-commitlog store --topic TopicA --tag TagA -f jsonl | jq .body
      rmqtool cat-commitlog store/commitlog/00000000000000000000 --offset 257 -n 1 --body hex
      rmqtool cat-commitlog store --since 2026-11-20T23:13 --until 2026-11-20T23:14 -f csv
      rmqtool cat-commitlog store --topic BatchTopic --unwrap -n 8
    """
    from rmqtool.ops.query import RecordFilter, nearest_boundaries

    out = resolve_format(fmt)
    _, cl = _open_commitlog(path)
    if offset is not None:
        before, after = nearest_boundaries(cl, offset)
        if before != offset:
            near = ", ".join(f"{name} {value}" for name, value in (("before:", before), ("after:", after))
                             if value is not None)
            f, _ = cl.queue.locate(offset)
            raise RmqCliError(f"{f.path}: offset {offset}: not a record boundary (nearest {near})",
                              ExitCode.USAGE)
    where = RecordFilter(topic, queue_id, tag, key, since, until)
    if out is Format.JSONL and where.is_empty and fields is None and not decompress and not unwrap:
        # A scan: the columnar decoder writes JSON lines column by column (same bytes as below).
        if _scan_jsonl(cl, start=offset, count=count, include_blank=include_blank,
                       body=_body_encoding(body, out), check_crc=check_crc) == 0:
            _nothing(ctx, "no records")
        return
    rows = commitlog_rows(cl, start=offset, count=count, where=None if where.is_empty else where,
                          include_blank=include_blank, body=_body_encoding(body, out),
                          decompress=decompress, check_crc=check_crc, unwrap=unwrap)
    extra = (("crc_ok",) if check_crc and fields is None and out in PEOPLE else ()) \
        + (("inner_index",) if unwrap else ())
    columns = _fields(fields, out, extra)
    if _write_records(rows, out, tablefmt, columns) == 0:
        _nothing(ctx, "no records")


# -- cat-cq -----------------------------------------------------------------------------------------
@cli.command("cat-cq")
@click.argument("store", type=click.Path())
@click.argument("topic")
@click.argument("queue_id", type=int)
@click.option("--from", "start", type=click.IntRange(min=0), default=0, metavar="N",
              help="Start at queue offset N.")
@click.option("--count", "-n", type=click.IntRange(min=0), metavar="N", help="Stop after N units.")
@click.option("--resolve", is_flag=True,
              help="Read each unit's record and flag mismatches (size, topic, queue id/offset, tagsCode); "
                   "exits 1 when any is found.")
@output_options
@click.pass_context
def cat_cq(ctx: click.Context, store: str, topic: str, queue_id: int, start: int, count: int | None,
           resolve: bool, fmt: str | None, tablefmt: str) -> None:
    """Print the units of one consume queue with their queue offsets.

    Units at the end that point past the end of the commit log (left by a crash) are left out with a
    note, as the broker drops them when it loads the store. A BatchCQ topic (batchconsumequeue/) is
    found by itself: one row per 46-byte unit, queue_offset being the first of its batch_size messages;
    --from N starts at the unit holding message N. LMQ queues (%LMQ%name, queue 0) are resolved against
    the records that dispatch to them.

    \b
    Examples:
      rmqtool cat-cq store TopicA 0
      rmqtool cat-cq store TopicA 0 --from 10 -n 5 --resolve
      rmqtool cat-cq store BatchTopic 0 --from 7 --resolve
      rmqtool cat-cq store '%LMQ%room-1' 0 -n 5 --resolve
    """
    from rmqtool.ops.query import dirty_tail_start, unit_problems

    out = resolve_format(fmt)
    st = Store.open(store)
    if topic not in st.topics() and topic in st.batch_topics():
        _cat_bcq(ctx, st, topic, queue_id, start, count, resolve, out, tablefmt)
        return
    cq = _consume_queue(st, topic, queue_id)
    cut = dirty_tail_start(cq, st.commitlog)
    bad = 0

    def rows() -> Iterator[dict]:
        nonlocal bad
        for n, (queue_offset, unit) in enumerate(cq.iter_units(start)):
            if (count is not None and n >= count) or (cut is not None and queue_offset >= cut):
                return
            row = dict(zip(CQ_UNIT_FIELDS, (topic, queue_id, queue_offset, *unit)))
            if resolve:
                problems = [] if unit.is_filler else unit_problems(st.commitlog, topic, queue_id,
                                                                    queue_offset, unit)
                bad += bool(problems)
                row["status"] = "filler" if unit.is_filler else ("mismatch" if problems else "ok")
                row["problems"] = problems
            yield row

    n = write_rows(rows(), out, tablefmt=tablefmt)
    if cut is not None:
        _note(f"units from queue offset {cut} on point past the end of the commit log and are left out "
              "(the broker drops them on load)")
    if n == 0:
        _nothing(ctx, f"no units in {topic}/{queue_id} from queue offset {start}")
    if bad:
        _note(f"{bad} unit(s) disagree with their records")
        ctx.exit(ExitCode.FINDINGS)


def _cat_bcq(ctx: click.Context, st: Store, topic: str, queue_id: int, start: int, count: int | None,
             resolve: bool, out: Format, tablefmt: str) -> None:
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
            bad += bool(problems)
            row["status"] = "mismatch" if problems else "ok"
            row["problems"] = problems
        rows.append(row)
    if write_rows(iter(rows), out, tablefmt=tablefmt) == 0:
        _nothing(ctx, f"no units in {topic}/{queue_id} from queue offset {start}")
    if bad:
        _note(f"{bad} unit(s) disagree with their records")
        ctx.exit(ExitCode.FINDINGS)


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
      rmqtool cat-index store
      rmqtool cat-index store/index/20261120231309479 --entries -f csv
      rmqtool cat-index store --slots
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

    if path.is_file():
        return index_refs([path])
    if path.is_dir() and path.name == "index" and not (path / "commitlog").exists():
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
@click.argument("store", type=click.Path())
@click.argument("topic")
@click.argument("key")
@click.option("--begin", type=TIMESTAMP, default=0, help="Earliest store time (ISO-8601 or epoch ms).")
@click.option("--end", type=TIMESTAMP, default=2**63 - 1, help="Latest store time.")
@click.option("--max", "max_num", type=click.IntRange(min=1), default=C.INDEX_MAX_MSGS_NUM_BATCH,
              show_default=True, help="Most index hits to collect (the broker caps this at 64).")
@click.option("--raw", is_flag=True, help="Print the raw index hits, hash collisions included, "
                                          "as IndexService.queryOffset returns them.")
@record_options
@output_options
@click.pass_context
def query_key(ctx: click.Context, store: str, topic: str, key: str, begin: int, end: int, max_num: int,
              raw: bool, body: str | None, decompress: bool, fields: str | None, fmt: str | None,
              tablefmt: str) -> None:
    """Find the records of TOPIC with KEY (a KEYS element or a UNIQ_KEY) through the index files.

    Looks up every index file as the broker does (newest first, by hash), then reads each hit and keeps
    only records whose topic and KEYS/UNIQ_KEY really match. Exits 1 when nothing is found.

    \b
    Examples:
      rmqtool query-key store TopicA order-42
      rmqtool query-key store TopicA order-42 --raw -f json
      rmqtool query-key store TopicA order-42 --begin 2026-11-20 --fields physical_offset,keys,body
    """
    from rmqtool.ops.query import lookup_key

    out = resolve_format(fmt)
    st = Store.open(store)
    found = lookup_key(st, topic, key, max_num=max_num, begin=begin, end=end)
    if raw:
        n = write_rows((hit.row() for hit in found.hits), out, columns=INDEX_HIT_FIELDS, tablefmt=tablefmt)
    else:
        enc = _body_encoding(body, out)
        rows = (entry_row(msg, offset, body_encoding=enc, decompress=decompress) for offset, msg in found.records)
        n = _write_records(rows, out, tablefmt, _fields(fields, out))
        if found.collisions:
            _note(f"{len(found.collisions)} index hit(s) dropped: the record there does not carry "
                  f"{topic}#{key} (hash collision)")
        if found.via_queue:
            _note(f"{topic} is an LMQ (not indexed by the broker): found by reading its consume queue")
    if n == 0:
        hint = "" if topic in st.topics() + st.batch_topics() else \
            f" (the store has no consume queue for topic {topic!r})"
        _nothing(ctx, f"no record of topic {topic!r} with key {key!r}{hint}")


@cli.command("query-id")
@click.argument("store", type=click.Path())
@click.argument("msg_id", metavar="ID")
@click.option("--kind", type=click.Choice(["auto", "msg-id", "uniq-key"]), default="auto", show_default=True,
              help="Read ID as an offsetMsgId, a UNIQ_KEY, or decide from the store.")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC",
              help="Look a UNIQ_KEY up under these topics only (default: every topic; repeatable).")
@click.option("--scan", is_flag=True, help="When the index has no UNIQ_KEY hit, read the whole commit log.")
@record_options
@output_options
@click.pass_context
def query_id(ctx: click.Context, store: str, msg_id: str, kind: str, topics: tuple[str, ...], scan: bool,
             body: str | None, decompress: bool, fields: str | None, fmt: str | None, tablefmt: str) -> None:
    """Find a message by its offsetMsgId (broker msgId) or by its UNIQ_KEY (client msgId).

    Both are 32 (IPv4) or 56 (IPv6) hex characters. The ID is taken as an offsetMsgId when the record at
    its decoded offset has exactly that msgId; otherwise as a UNIQ_KEY, looked up in the index under
    every topic (a UNIQ_KEY can match several records: retries and scheduled copies keep it).
    Exits 1 when nothing is found.

    \b
    Examples:
      rmqtool query-id store C0A8000A00002A9F0000000000000E33
      rmqtool query-id store FD00000000000000000000000000000243AE5FFD2B2766D44D8E0004 --scan
    """
    from rmqtool.ops.query import lookup_id

    out = resolve_format(fmt)
    st = Store.open(store)
    found = lookup_id(st, msg_id, kind=kind, topics=topics or None, scan=scan)
    for text in found.notes:
        _note(text)
    if not found.records:
        _nothing(ctx, f"no record with offsetMsgId or UNIQ_KEY {msg_id}"
                 + ("" if scan or kind == "msg-id" else " in the index (try --scan)"))
    enc = _body_encoding(body, out)
    rows = (entry_row(msg, offset, body_encoding=enc, decompress=decompress) for offset, msg in found.records)
    _write_records(rows, out, tablefmt, _fields(fields, out))


@cli.command("decode-id")
@click.argument("msg_id", metavar="ID")
@click.option("--born", type=TIMESTAMP, help="Anchor the UNIQ_KEY time on this born time (default: now).")
@output_options
def decode_id(msg_id: str, born: int | None, fmt: str | None, tablefmt: str) -> None:
    """Decode a 32/56 hex-character ID both ways, without a store: as an offsetMsgId (store host and
    physical offset) and as a UNIQ_KEY (client IP, pid, class-loader hash, creation time, counter).

    The UNIQ_KEY time counts from the producer's local month start; it is anchored on --born (or now).

    \b
    Examples:
      rmqtool decode-id C0A8000A00002A9F0000000000000E33
      rmqtool decode-id FD00000000000000000000000000000243AE5FFD2B2766D44D8E0004 --born 1795216389519
    """
    from rmqtool.ops.query import describe_id

    write_record(describe_id(msg_id, born), resolve_format(fmt), tablefmt=tablefmt)


# -- checkpoint -------------------------------------------------------------------------------------
@cli.command()
@click.argument("path", metavar="STORE|FILE", type=click.Path())
@output_options
def checkpoint(path: str, fmt: str | None, tablefmt: str) -> None:
    """Print the checkpoint: physic/logics/index message timestamps, masterFlushedOffset (5.0+),
    confirmPhyOffset (5.1.1+) and the derived minimum timestamps recovery uses.

    \b
    Examples:
      rmqtool checkpoint store
      rmqtool checkpoint store/checkpoint -f json
    """
    from rmqtool.errors import FormatError
    from rmqtool.format.checkpoint import decode_checkpoint
    from rmqtool.ops.inspect import checkpoint_row

    p = Path(path)
    if p.is_file():
        try:
            cp = decode_checkpoint(p.read_bytes())
        except FormatError as exc:
            raise exc.at(path=str(p)) from None
    else:
        st = Store.open(p)
        cp = st.checkpoint()
        if cp is None:
            raise StoreError("no checkpoint file", path=str(st.root / "checkpoint"))
    write_record(checkpoint_row(cp), resolve_format(fmt), tablefmt=tablefmt)
