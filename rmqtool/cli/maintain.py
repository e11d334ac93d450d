"""Commands that check or change a store: verify, repair, rebuild-cq, rebuild-index, init, put, import.

Every write: refuse while another process holds the broker's lock (unless --force), finish or drop an
interrupted earlier change, back up what is touched, stage new files and swap them in atomically.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator

import click

from rmqtool.cli import cli
from rmqtool.cli.exitcodes import ExitCode
from rmqtool.cli.output import Format, output_options, resolve_format, write_record, write_rows
from rmqtool.cli.pipeline import choose_engine, engine_options, spark_session

_FORCE = click.option("--force", is_flag=True, help="Write even if the store's lock file is held by another process.")
_BACKUP = click.option("--backup", "backup", type=click.Path(path_type=Path), default=None,
                       help="Backup directory [default: <store>.rmqtool-backup-<time> beside the store].")


@contextlib.contextmanager
def _progress(store, label: str) -> Iterator:
    """A rich progress bar over the commit log's bytes, on stderr and only on a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    total = sum(f.length for f in store.commitlog.queue)
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), transient=True, console=_stderr()) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def _stderr():
    from rmqtool.cli.output import stderr_console
    return stderr_console()


def _open_for_write(path: str):
    """The store, with an interrupted earlier change completed (journal) or dropped (no journal)."""
    from rmqtool.store.atomic import complete_pending
    from rmqtool.store.store import Store

    store = Store.open(path)
    if complete_pending(store.root):
        click.echo("rmqtool: completed an interrupted earlier change", err=True)
        store = Store.open(path)
    return store


@cli.command()
@click.argument("stores", metavar="STORE...", nargs=-1, required=True, type=click.Path())
@click.option("--deep", is_flag=True, help="Also check every body's CRC.")
@engine_options
@output_options
def verify(stores: tuple[str, ...], deep: bool, engine: str, master: str | None, fmt: str | None,
           tablefmt: str) -> None:
    """Check stores: every problem with its file and byte offset (exit 1 when any is found).
    With --engine spark the commit-log files are checked in parallel, one task per file."""
    from rmqtool.ops.findings import FINDING_FIELDS
    from rmqtool.ops.verify import verify_store
    from rmqtool.store.store import Store

    opened = [(path, Store.open(path)) for path in stores]
    size = sum(f.length for _, st in opened for f in st.commitlog.queue)
    findings = []
    if choose_engine(engine, size, master) == "spark":
        from rmqtool.spark.jobs import verify_spark
        session = spark_session(master)
        for path, _ in opened:
            findings += [f.row() for f in verify_spark(session, path, deep=deep)]
    else:
        for path, st in opened:
            with _progress(st, "verifying") as progress:
                findings += [f.row() for f in verify_store(path, deep=deep, progress=progress)]
    out = resolve_format(fmt)
    write_rows(findings, out, columns=FINDING_FIELDS, tablefmt=tablefmt, title="findings")
    if out in (Format.TABLE, Format.PLAIN):
        click.echo(f"{len(findings)} problem(s) found" if findings else "no problems found", err=True)
    raise click.exceptions.Exit(ExitCode.FINDINGS if findings else ExitCode.OK)


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--apply", "apply_", is_flag=True, help="Carry the plan out (default: print it only).")
@_BACKUP
@_FORCE
@output_options
def repair(store: str, apply_: bool, backup: Path | None, force: bool, fmt: str | None, tablefmt: str) -> None:
    """Do what the broker's crash recovery would: truncate after the last valid record (zeroing the
    rest), drop dirty consume-queue units, rebuild index entries, fix the checkpoint, remove abort.

    Without --apply only prints the plan (exit 1 when there is something to do). With --apply, exit 0
    when the store verifies clean afterwards.
    """
    from rmqtool.ops.repair import apply_plan, plan_repair
    from rmqtool.ops.verify import verify_store
    from rmqtool.store.lock import store_write_lock
    from rmqtool.store.store import Store

    st = _open_for_write(store) if apply_ else Store.open(store)
    with store_write_lock(st.root, force=force) if apply_ else contextlib.nullcontext():
        with _progress(st, "scanning") as progress:
            plan = plan_repair(st, progress=progress)
        out = resolve_format(fmt)
        write_rows([a.row() for a in plan.actions], out, columns=["action", "path", "detail"], tablefmt=tablefmt,
                   title=f"repair plan (logical end {plan.process_offset})")
        if not apply_:
            click.echo("nothing to repair" if plan.empty else
                       f"{len(plan.actions)} action(s); run with --apply to carry them out", err=True)
            raise click.exceptions.Exit(ExitCode.OK if plan.empty else ExitCode.FINDINGS)
        if plan.empty:
            click.echo("nothing to repair", err=True)
        else:
            saved = apply_plan(plan, backup)
            click.echo(f"repaired; backup of the original files in {saved}", err=True)
    left = [f for f in verify_store(st.root) if f.kind != "broker_running"]   # forced past the lock
    for f in left:
        click.echo(f"rmqtool: still: {f}", err=True)
    raise click.exceptions.Exit(ExitCode.FINDINGS if left else ExitCode.OK)


@cli.command("rebuild-cq")
@click.argument("store", type=click.Path())
@click.option("--topic", help="Rebuild only this topic's queues.")
@click.option("--out", type=click.Path(path_type=Path), help="Write the queues here instead of into the store.")
@click.option("--cq-file-size", type=int, help="Consume-queue file size [default: that of existing queues].")
@click.option("--dry-run", is_flag=True, help="Only report what would be written.")
@_BACKUP
@_FORCE
@output_options
def rebuild_cq(store: str, topic: str | None, out: Path | None, cq_file_size: int | None, dry_run: bool,
               backup: Path | None, force: bool, fmt: str | None, tablefmt: str) -> None:
    """Regenerate consume queues from the commit log as the broker's dispatch does."""
    from rmqtool.ops.rebuild import rebuild_consume_queues
    from rmqtool.store.lock import store_write_lock

    st = _open_for_write(store)
    writes = not (dry_run or out)
    with store_write_lock(st.root, force=force) if writes else contextlib.nullcontext():
        with _progress(st, "rebuilding consume queues") as progress:
            res = rebuild_consume_queues(st, topic=topic, out=out, cq_file_size=cq_file_size, dry_run=dry_run,
                                         backup=backup, progress=progress)
    write_record({"target": res.target, "queues": res.queues, "files": res.files, "units": res.units,
                  "dry_run": dry_run, "backup": res.backup}, resolve_format(fmt), tablefmt=tablefmt)


@cli.command("rebuild-index")
@click.argument("store", type=click.Path())
@click.option("--slots", type=int, help="Hash slots per file [default: that of existing index files].")
@click.option("--max-entries", type=int, help="Entries per file [default: that of existing index files].")
@click.option("--dry-run", is_flag=True, help="Only report what would be written.")
@_BACKUP
@_FORCE
@output_options
def rebuild_index(store: str, slots: int | None, max_entries: int | None, dry_run: bool, backup: Path | None,
                  force: bool, fmt: str | None, tablefmt: str) -> None:
    """Regenerate index files from the commit log as IndexService.buildIndex does."""
    from rmqtool.ops.rebuild import rebuild_index as run
    from rmqtool.store.lock import store_write_lock

    st = _open_for_write(store)
    with store_write_lock(st.root, force=force) if not dry_run else contextlib.nullcontext():
        with _progress(st, "rebuilding index") as progress:
            files, saved = run(st, slots=slots, max_entries=max_entries, dry_run=dry_run, backup=backup,
                               progress=progress)
    rows = [{"index_file": name, "entries": entries} for name, entries in files]
    write_rows(rows, resolve_format(fmt), columns=["index_file", "entries"], tablefmt=tablefmt)
    if saved:
        click.echo(f"backup of the previous index in {saved}", err=True)


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--commitlog-file-size", type=int, default=1024 ** 3, show_default=True)
@click.option("--cq-file-size", type=int, default=6_000_000, show_default=True)
@click.option("--slots", type=int, default=5_000_000, show_default=True, help="Index hash slots per file.")
@click.option("--max-entries", type=int, default=20_000_000, show_default=True, help="Index entries per file.")
def init(store: str, commitlog_file_size: int, cq_file_size: int, slots: int, max_entries: int) -> None:
    """Create an empty store (first commit-log file, checkpoint, lock) with the given sizes."""
    from rmqtool.format.indexfile import Geometry
    from rmqtool.ops.write import init_store

    init_store(Path(store), commitlog_file_size=commitlog_file_size, cq_file_size=cq_file_size,
               geometry=Geometry(slots, max_entries))
    click.echo(f"created {store}", err=True)


def _parse_property(_ctx, _param, values) -> dict[str, str]:
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected k=v, got {item!r}")
        out[name] = value
    return out


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--topic", required=True)
@click.option("--queue-id", type=int, default=0, show_default=True)
@click.option("--tags")
@click.option("--keys", help='Space-separated keys, e.g. "K1 K2".')
@click.option("--property", "properties", multiple=True, callback=_parse_property, metavar="K=V")
@click.option("--body", help="Body text (UTF-8).")
@click.option("--body-file", type=click.File("rb"))
@click.option("--body-stdin", is_flag=True, help="Read the body from stdin.")
@_BACKUP
@_FORCE
def put(store: str, topic: str, queue_id: int, tags: str | None, keys: str | None, properties: dict,
        body: str | None, body_file, body_stdin: bool, backup: Path | None, force: bool) -> None:
    """Append one message as the broker would (commit log, consume queue, index, checkpoint)."""
    from rmqtool.ops.write import StoreWriter, build_message
    from rmqtool.store.lock import store_write_lock

    if sum(x is not None and x is not False for x in (body, body_file, body_stdin or None)) != 1:
        raise click.UsageError("give exactly one of --body, --body-file, --body-stdin")
    data = body.encode("utf-8") if body is not None else (body_file.read() if body_file else sys.stdin.buffer.read())
    st = _open_for_write(store)
    with store_write_lock(st.root, force=force):
        writer = StoreWriter(st)
        msg = writer.append(build_message(topic, data, queue_id=queue_id, tags=tags, keys=keys,
                                          properties=properties))
        writer.commit(backup)
    click.echo(f"{msg.msg_id} physical_offset={msg.physical_offset} queue_offset={msg.queue_offset}")


@cli.command("import")
@click.argument("store", type=click.Path())
@click.argument("file", type=click.File("r", encoding="utf-8"))
@click.option("--batch", type=int, default=1000, show_default=True,
              help="Messages per committed batch (each batch is acknowledged on stdout).")
@_BACKUP
@_FORCE
def import_(store: str, file, batch: int, backup: Path | None, force: bool) -> None:
    """Append the messages of a jsonl file (as written by cat-commitlog --format jsonl --body base64)."""
    from rmqtool.errors import RmqError
    from rmqtool.ops.write import StoreWriter, message_from_row, read_rows
    from rmqtool.store.lock import store_write_lock

    st = _open_for_write(store)
    total = 0
    with store_write_lock(st.root, force=force):
        writer = StoreWriter(st)
        pending = 0
        for n, row in read_rows(file):
            try:
                msg = message_from_row(row)
                if msg is None:
                    continue
                writer.append(msg)
            except RmqError as exc:
                raise exc.at(path=f"{file.name}: line {n}")
            pending += 1
            if pending >= batch:
                writer.commit(backup and backup / f"batch-{total}")
                total += pending
                pending = 0
                click.echo(f"committed {total}")
        if pending:
            writer.commit(backup and backup / f"batch-{total}")
            total += pending
            click.echo(f"committed {total}")
    click.echo(f"imported {total} message(s)", err=True)
