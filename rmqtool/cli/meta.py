"""Broker metadata and the timer store: topics, groups, offsets, delay-offsets, config, timer.

Nothing here imports pyarrow or pyspark.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import click

from rmqtool import clock
from rmqtool import constants as C
from rmqtool.cli import cli
from rmqtool.cli.exitcodes import ExitCode
from rmqtool.cli.options import end_partial, read_anyway_option, recognized
from rmqtool.cli.output import (TIMESTAMP, Format, format_timestamp, output_options, resolve_format, write_record,
                                write_rows)
from rmqtool.errors import StoreError
from rmqtool.store import layout as L
from rmqtool.store.readable import commitlog_view, open_readable
from rmqtool.store.store import Store

PEOPLE = (Format.TABLE, Format.PLAIN)
TIME_FIELDS = frozenset({"slot_timestamp", "deliver_timestamp", "curr_write_timestamp", "delayed_timestamp",
                         "data_version_timestamp", "last_read_time_ms", "timestamp", "time_stamp",
                         "last_consumed_timestamp", "last_updated_timestamp", "store_timestamp"})


def _note(text: str) -> None:
    click.echo(f"rmqtool: {text}", err=True)


def _for_people(rows: Iterable[dict], fmt: Format) -> Iterator[dict]:
    """Tables show times as UTC dates; scripts get epoch milliseconds."""
    for row in rows:
        if fmt in PEOPLE:
            row = {k: format_timestamp(v) if k in TIME_FIELDS and isinstance(v, int) and v > 0 else v
                   for k, v in row.items()}
        yield row


def _write(ctx: click.Context, rows: Iterable[dict], fmt: Format, tablefmt: str, columns: list[str] | None,
           nothing: str, skipped=()) -> None:
    """The rows; exit 1 when there are none, 3 when the read skipped input (end_partial)."""
    n = write_rows(_for_people(rows, fmt), fmt, columns=columns, tablefmt=tablefmt)
    if n == 0:
        _note(nothing)
    end_partial(skipped)
    if n == 0:
        ctx.exit(ExitCode.FINDINGS)


def _loaded(store: Store, name: str):
    from rmqtool.store.metadata import consumer_offsets, load

    loaded = consumer_offsets(store) if name == "consumerOffset.json" else load(store, name)
    if loaded is None:
        also = " nor lmqConsumerOffset.json" if name == "consumerOffset.json" else ""
        raise StoreError(f"no config/{name} (nor its .bak{also})", path=str(store.path(L.CONFIG)))
    if loaded.fallback:
        _note(f"read {loaded.path.name} as the broker would: {loaded.fallback}")
    return loaded


def _crash_end(store: Store) -> int | None:
    from rmqtool.ops.metadata import crash_recovered_end

    end = crash_recovered_end(store)
    if end is not None:
        _note(f"warning: abort file present (the broker did not shut down cleanly): max offsets are what its "
              f"recovery keeps, consume-queue units at or after commit-log offset {end} left out")
    return end


# -- topics / groups --------------------------------------------------------------------------------
@cli.command()
@click.argument("store", type=click.Path())
@output_options
@click.pass_context
def topics(ctx: click.Context, store: str, fmt: str | None, tablefmt: str) -> None:
    """List the topic table (config/topics.json; on a broker with storeType=defaultRocksDB the RocksDB
    database config/topics/, read-only): queue counts, permission, queue type, order.

    perm is PermName's R/W/X (inherit); queue_type is the queue.type attribute (SimpleCQ unless BatchCQ);
    cleanup_policy the cleanup.policy attribute (DELETE unless COMPACTION: a compacted topic, whose
    consumers read its compaction logs); queues_on_disk counts the topic's consume-queue directories,
    compaction_queues its compaction logs (compaction/compactionLog/). The .bak file is read when the broker
    would read it (the main file missing, empty or unparseable). Exits 1 when the table is empty.

    \b
    Examples:
      rmqtool topics CONFIG_STORE
      rmqtool topics CONFIG_STORE -f jsonl | jq -r \\
        'select(.queue_type=="BatchCQ").topic'
    """
    from rmqtool.ops.metadata import TOPIC_FIELDS, topic_rows

    st = Store.open(store)
    out = resolve_format(fmt)
    _write(ctx, topic_rows(_loaded(st, "topics.json"), st), out, tablefmt,
           TOPIC_FIELDS[:-3] if out in PEOPLE else None, "no topics")


@cli.command()
@click.argument("store", type=click.Path())
@output_options
@click.pass_context
def groups(ctx: click.Context, store: str, fmt: str | None, tablefmt: str) -> None:
    """List the subscription groups (config/subscriptionGroup.json, or the RocksDB database
    config/subscriptionGroups/) with their settings.

    Tables show the main settings; json/jsonl/csv every stored field (in snake_case). forbidden lists the
    topics the group is forbidden on with their bits (the forbidden table: 1 << forbiddenIndex). Exits 1
    when the table is empty.

    \b
    Examples:
      rmqtool groups CONFIG_STORE
      rmqtool groups CONFIG_STORE -f json
    """
    from rmqtool.ops.metadata import group_rows

    out = resolve_format(fmt)
    rows = group_rows(_loaded(Store.open(store), "subscriptionGroup.json"))
    columns = ["group", "consume_enable", "consume_message_orderly", "consume_broadcast_enable",
               "retry_queue_nums", "retry_max_times", "broker_id", "consume_timeout_minute"]
    if out in PEOPLE:
        rows = ({**{c: r.get(c) for c in columns},
                 "forbidden": " ".join(f"{t}={bits}" for t, bits in r["forbidden"].items())} for r in rows)
    _write(ctx, rows, out, tablefmt, None, "no subscription groups")


# -- offsets ----------------------------------------------------------------------------------------
@cli.command()
@click.argument("store", type=click.Path())
@click.option("--group", "-g", "groups", multiple=True, help="Only this consumer group (repeatable: any of them).")
@click.option("--topic", "-t", "topics", multiple=True, help="Only this topic (repeatable: any of them).")
@click.option("--by", type=click.Choice(["queue", "topic", "group"]), default="queue", show_default=True,
              help="One row per queue, or lag summed per group and topic, or per group.")
@read_anyway_option()
@output_options
@click.pass_context
def offsets(ctx: click.Context, store: str, groups: tuple[str, ...], topics: tuple[str, ...], by: str,
            read_anyway: bool, fmt: str | None, tablefmt: str) -> None:
    """Consumer offsets with lag (as mqadmin consumerProgress): the committed offset of each group, topic
    and queue (config/consumerOffset.json) against the queue's max offset, read from its consume-queue
    files (batchconsumequeue for BatchCQ topics). A broker with enableLmq keeps every group's offsets in
    config/lmqConsumerOffset.json instead (LmqConsumerOffsetManager: offsetTable, and lmqOffsetTable for
    %LMQ% groups, queue 0): read whenever it (or its .bak) is there. A broker with storeType=defaultRocksDB
    keeps them in the RocksDB database config/consumerOffsets/ and its queues in the RocksDB consume
    queue: both read-only. After a crash (abort present) max_offset is what the broker's recovery keeps:
    units pointing at or after the recovered end of the commit log are left out, with a warning.

    lag = max_offset - offset; max_offset and lag are empty for a queue the store has no files for (such
    as an unused %RETRY% topic). last_consumed_timestamp is the store time of the message before the
    committed offset (mqadmin's LastTime). A static topic's queues (5.x, config/topicQueueMapping.json) add
    their logical queue id and the logical offset and max offset a consumer sees. Groups that never
    committed have no rows. Exits 1 when nothing matches. Max offsets are what the broker's load leaves,
    and times are read from the commit log: a store the broker refuses to load is refused (exit 4) unless
    --read-anyway (exit 3).

    \b
    Examples:
      rmqtool offsets CONFIG_STORE
      rmqtool offsets CONFIG_STORE --group GroupB --topic TopicA
      rmqtool offsets CONFIG_STORE --by topic -f csv
    """
    from rmqtool.ops.metadata import OFFSET_FIELDS, STATIC_OFFSET_FIELDS, offset_rows, totals
    from rmqtool.store.metadata import static_topics

    st, skipped = open_readable(store, read_anyway)
    loaded = _loaded(st, "consumerOffset.json")
    rows = offset_rows(loaded, st, groups=set(groups), topics=set(topics), phy_end=_crash_end(st))
    static = {t for t, g in loaded.value.entries if (not groups or g in groups) and (not topics or t in topics)} \
        & set(static_topics(st))
    if by != "queue":
        rows = totals(rows, ("group", "topic") if by == "topic" else ("group",))
    _write(ctx, rows, resolve_format(fmt), tablefmt,
           (OFFSET_FIELDS + (STATIC_OFFSET_FIELDS if static else [])) if by == "queue" else None,
           "no committed offsets" + (" match" if groups or topics else ""), skipped)


@cli.command("topic-status")
@click.argument("store", type=click.Path())
@click.argument("topics", metavar="[TOPIC]...", nargs=-1)
@read_anyway_option()
@output_options
@click.pass_context
def topic_status(ctx: click.Context, store: str, topics: tuple[str, ...], read_anyway: bool, fmt: str | None,
                 tablefmt: str) -> None:
    """Per queue of each topic (as mqadmin topicStatus): min and max offset and the store time of the last
    message (last_updated_timestamp), from the consume-queue files (batchconsumequeue for BatchCQ topics).
    A static topic's queues (5.x, config/topicQueueMapping.json) add their logical queue id and logical min
    and max offsets, as mqadmin topicStatus shows a static topic (MQAdminUtils.convertPhysicalTopicStats).

    Without TOPIC, every topic with queue files (or in the RocksDB consume queue). With an abort file
    present (a crash), max offsets are what the broker's recovery keeps, with a warning (as in offsets).
    Exits 1 when no queue matches. A store the broker refuses to load is refused (exit 4) unless
    --read-anyway (exit 3), as in offsets.

    \b
    Examples:
      rmqtool topic-status CONFIG_STORE TopicA
      rmqtool topic-status BATCHCQ_STORE BatchTopic -f jsonl
    """
    from rmqtool.ops.mqadmin import STATIC_STATUS_FIELDS, TOPIC_STATUS_FIELDS, topic_status_rows
    from rmqtool.store.metadata import static_topics

    st, skipped = open_readable(store, read_anyway)
    names = topics or sorted(set(st.topics()) | set(st.batch_topics()))
    static = set(static_topics(st)) & set(names)
    _write(ctx, topic_status_rows(st, names, _crash_end(st)), resolve_format(fmt), tablefmt,
           TOPIC_STATUS_FIELDS + (STATIC_STATUS_FIELDS if static else []), "no queues", skipped)


@cli.command()
@click.argument("store", type=click.Path(), callback=recognized)
@click.option("--all", "everything", is_flag=True, help="Every half message with how it ended, not only those in doubt.")
@read_anyway_option()
@output_options
@click.pass_context
def transactions(ctx: click.Context, store: str, everything: bool, read_anyway: bool, fmt: str | None,
                 tablefmt: str) -> None:
    """In-doubt transactions: half messages (RMQ_SYS_TRANS_HALF_TOPIC) with no op record
    (RMQ_SYS_TRANS_OP_HALF_TOPIC) at or after the transaction check's progress (group CID_RMQ_SYS_TRANS in
    config/consumerOffset.json): the list the broker's check asks producers about, with their age
    (age_ms, to the store's newest record). A half the check put back while its check immunity lasted is
    closed as the check closes it: by an op record naming the original half's queue offset (its
    TRAN_PREPARED_QUEUE_OFFSET property).

    With --all, every half message and its state: committed (the real message, whose
    prepared_transaction_offset names the half, is commit_offset), rolled_back (an op record and no commit),
    checked (no op record, before the check's progress: put back or discarded) or in_doubt. Exits 1 when
    nothing is listed.

    \b
    Examples:
      rmqtool transactions STORE   # exit 1: none in doubt
      rmqtool transactions STORE --all -f plain
    """
    from rmqtool.ops.mqadmin import TRANSACTION_FIELDS, transaction_rows
    from rmqtool.store.metadata import consumer_offsets

    st, skipped = open_readable(store, read_anyway)
    loaded = consumer_offsets(st)
    progress = loaded.value.entries.get((C.RMQ_SYS_TRANS_HALF_TOPIC, C.TRANS_CHECK_GROUP), {}) if loaded else {}
    _write(ctx, transaction_rows(st, progress, everything=everything), resolve_format(fmt), tablefmt,
           TRANSACTION_FIELDS, "no half messages" if everything else "no transaction in doubt", skipped)


@cli.command("delay-offsets")
@click.argument("store", type=click.Path())
@click.option("--levels", default=C.DEFAULT_DELAY_LEVELS, show_default=True, metavar="SPEC",
              help="The broker's messageDelayLevel, for delay_ms.")
@read_anyway_option()
@output_options
@click.pass_context
def delay_offsets(ctx: click.Context, store: str, levels: str, read_anyway: bool, fmt: str | None,
                  tablefmt: str) -> None:
    """Delay-level progress (config/delayOffset.json): per level, the SCHEDULE_TOPIC_XXXX queue
    (level - 1), the offset the schedule service delivered up to, the queue's max offset (after a crash:
    what the broker's recovery keeps, with a warning), and the messages still waiting (pending). Exits 1
    when the table is empty. A store the broker refuses to load is refused (exit 4) unless --read-anyway
    (exit 3), as in offsets.

    \b
    Examples:
      rmqtool delay-offsets CONFIG_STORE
      rmqtool delay-offsets STORE -f jsonl
    """
    from rmqtool.ops.metadata import DELAY_FIELDS, delay_rows

    try:
        from rmqtool.format.java import parse_delay_levels
        parse_delay_levels(levels)
    except (KeyError, ValueError, IndexError):
        raise click.BadParameter(f"not a delay-level list: {levels!r}", param_hint="--levels") from None
    st, skipped = open_readable(store, read_anyway)
    rows = delay_rows(_loaded(st, "delayOffset.json"), st, levels, _crash_end(st))
    _write(ctx, rows, resolve_format(fmt), tablefmt, DELAY_FIELDS, "no delay-level offsets", skipped)


@cli.command("config")
@click.argument("store", type=click.Path())
@output_options
@click.pass_context
def config_files(ctx: click.Context, store: str, fmt: str | None, tablefmt: str) -> None:
    """Summarise the metadata files in config/ (topics, subscription groups, consumer and delay offsets,
    timer metrics): which file the broker would read (the .bak when the main file is missing, empty or
    unparseable), their entries and data versions.

    On a broker with storeType=defaultRocksDB, topics, groups and offsets are the RocksDB databases
    config/topics/, subscriptionGroups/ and consumerOffsets/ (read_from ends in /), read-only, with their
    kvDataVersion (none for the offsets: the broker's is a fresh one at each load). A configManagerVersion=v2
    database (config/rdb/) is refused (exit 4).

    A file that does not decode (and has no usable .bak) is an error (exit 3); a database that does not
    open, or holds a value that does not decode, is refused as the broker refuses it (exit 4). Exits 1 when
    there is none.

    \b
    Examples:
      rmqtool config CONFIG_STORE
      rmqtool config TIMER_STORE -f json
    """
    from rmqtool.ops.metadata import CONFIG_FIELDS, config_rows

    _write(ctx, config_rows(Store.open(store)), resolve_format(fmt), tablefmt, CONFIG_FIELDS,
           "no metadata files in config/")


# -- timer ------------------------------------------------------------------------------------------
@cli.command()
@click.argument("store", type=click.Path())
@click.option("--units", "view", flag_value="units", help="Every timer-log unit (and file-end BLANK) as stored.")
@click.option("--slots", "view", flag_value="slots", help="Every non-empty timer-wheel slot.")
@click.option("--check", "view", flag_value="check", help="The timer checkpoint (config/timercheck).")
@click.option("--metrics", "view", flag_value="metrics",
              help="Timer messages per real topic (config/timermetrics).")
@click.option("--precision", type=click.IntRange(min=1), metavar="MS",
              help="The broker's timerPrecisionMs [default: read from the wheel, else 1000].")
@click.option("--since", type=TIMESTAMP,
              help="List slots from this time (ISO-8601 or epoch ms) [default: the checkpoint's lastReadTimeMs].")
@read_anyway_option()
@output_options
@click.pass_context
def timer(ctx: click.Context, store: str, view: str | None, precision: int | None, since: int | None,
          read_anyway: bool, fmt: str | None, tablefmt: str) -> None:
    """List the timer messages (5.x timerWheelEnable) the broker has still to deliver, in delivery order.

    Every wheel slot at or after the checkpoint's read time is walked from its last unit back, as the
    broker's dequeue does; each unit is resolved to its commit-log record (real topic and queue, UNIQ_KEY,
    TIMER_OUT_MS, roll count). state: pending; pending(roll: ...) for a message beyond the roll window
    (the slot is a stop on the way: deliver_timestamp is the real due time); delete-marker for a recall (also a
    rolling one, magic 7, which cancels nothing in this slot);
    cancelled-by-delete for the message a recall in the same slot cancels; message-missing when the record
    is gone. The wheel file is read only where it holds data. Exits 1 when nothing is listed, a slot's
    chain is broken, or a broker started now (--now) skips listed slots: its dequeue starts at most 7 days
    back (TimerMessageStore.recover), so their messages are never delivered. Listing them reads their
    commit-log records: a store the broker refuses to load is refused (exit 4) unless --read-anyway (a
    record in a part not read is message-missing; exit 3). --units, --slots, --check and --metrics read
    the timer store alone.

    \b
    Examples:
      rmqtool timer TIMER_STORE --now 2026-11-23T07:00:00Z
      rmqtool timer TIMER_STORE --now 2026-11-23T07:00:00Z --fields \\
        slot_timestamp,real_topic,real_queue_id,state
      rmqtool timer TIMER_STORE --now 2026-12-01T00:00:00Z --fields \\
        slot_timestamp,state   # exit 1
      rmqtool timer TIMER_STORE --units -f csv
      rmqtool timer TIMER_STORE --slots
      rmqtool timer TIMER_STORE --check
    """
    from rmqtool.ops import timer as T

    st = Store.open(store)
    ts = T.open_timer_store(st, precision)
    out = resolve_format(fmt)
    if view == "check":
        cp = ts.checkpoint()
        if cp is None:
            raise StoreError("no timer checkpoint", path=str(st.path(L.config_file("timercheck"))))
        row = {k: v for k, v in cp._asdict().items() if k != "rest"}
        write_record(next(_for_people([row], out)), out, tablefmt=tablefmt)
        return
    if view == "metrics":
        loaded = ts.metrics()
        if loaded is None:
            raise StoreError("no timer metrics", path=str(st.path(L.config_file("timermetrics"))))
        if loaded.fallback:
            _note(f"read {loaded.path.name} as the broker would: {loaded.fallback}")
        rows = ({"topic": t, "count": m.count, "time_stamp": m.time_stamp}
                for t, m in loaded.value.timing_count.items())
        _write(ctx, rows, out, tablefmt, None, "no timer metrics")
        return
    if view == "units":
        _write(ctx, (T.unit_row(pos, e) for pos, e in ts.iter_timerlog()), out, tablefmt, T.UNIT_FIELDS,
               "no timer-log units")
        return
    if view == "slots":
        _write(ctx, T.slot_rows(ts), out, tablefmt, T.SLOT_FIELDS, "no used timer-wheel slots")
        return
    st.commitlog, unread = commitlog_view(st.commitlog, read_anyway)      # the units' records are read
    problems: list[str] = []
    now = clock.now_ms()
    _, start = T.read_start(ts, now)
    skipped = 0

    def counted(rows: Iterator[dict]) -> Iterator[dict]:
        nonlocal skipped
        for row in rows:
            skipped += row["slot_timestamp"] < start and row["state"].startswith("pending")
            yield row

    n = write_rows(_for_people(counted(T.pending_rows(st, ts, problems, since)), out), out,
                   columns=T.PENDING_FIELDS, tablefmt=tablefmt)
    for text in problems:
        _note(f"problem: {text}")
    if skipped:
        problems.append(f"{skipped} pending message(s) listed before {start} are never delivered: a 5.3.3 broker "
                        f"started at {clock.said(now)} reads from {start} on (TimerMessageStore.recover)")
        _note(f"problem: {problems[-1]}")
    if n == 0:
        _note("no pending timer messages")
    end_partial(unread)
    if n == 0 or problems:
        ctx.exit(ExitCode.FINDINGS)
