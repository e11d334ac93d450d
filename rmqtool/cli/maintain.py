"""Commands that check or change a store: verify, repair, rebuild-cq, rebuild-index, init, put, import,
restore.

Every write: refuse while another process holds the broker's lock (unless --force), finish or drop an
interrupted earlier change, back up what is touched (one backup per invocation), stage new files and
swap them in atomically, and end by saying how to undo it (``rmqtool restore BACKUP STORE --apply``).

The write rule: a command that changes an existing store (repair, restore, rebuild-cq, rebuild-index, put,
import) only prints its plan unless ``--apply`` (``--dry-run`` says so explicitly), in one format, the rows
``action, path, detail`` ending in the plan's ``total`` (store.bounds), and exits 0 when there is nothing to
do, 1 when there is. Writing a new directory (``rebuild-cq --out``, ``init``) needs no ``--apply``. A plan
beyond its bound (store.bounds: the store plus the input) is refused, exit 4, unless ``--allow-large``.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

import click

from rmqtool.cli import cli, stdout_may_close
from rmqtool.cli.exitcodes import ExitCode
from rmqtool.cli.options import (check_crc_option, end_partial, jobs_option, option, output_path, read_anyway_option,
                                 recognized)
from rmqtool.cli.output import PEOPLE, output_options, progress_bar, resolve_format, say, write_rows
from rmqtool.cli.pipeline import choose_engine, engine_options, spark_session
from rmqtool.store import layout as L

JAVA_INT_MAX = 2**31 - 1         # the broker's sizes, queue ids and counts are Java ints
_FORCE = click.option("--force", is_flag=True, help="Write even if the store's lock file is held by another process.")
_BACKUP = click.option("--backup", "backup", type=click.Path(path_type=Path), default=None,
                       callback=output_path("the backup"),
                       help="Backup directory [default: <store>.rmqtool-backup-<time> beside the store].")


def _progress(store, label: str):
    """The progress bar over the commit log's bytes (rmqtool.cli.output.progress_bar)."""
    return progress_bar(sum(f.length for f in store.commitlog.queue), label)


PLAN_COLUMNS = ["action", "path", "detail"]
_APPLY = click.option("--apply", "apply_", is_flag=True, help="Carry the plan out (default: print it only).")
_DRY_RUN = click.option("--dry-run", is_flag=True, help="Print the plan only (the default; exit 0 when there is "
                                                        "nothing to do, 1 when there is).")


_ALLOW_LARGE = click.option(
    "--allow-large", is_flag=True,
    help="Write a plan larger than its bound (2 x the store's files and possible records plus the input's items "
         "+ 64 files; 2 x the store's bytes plus the input's + 64 MiB) instead of refusing it (exit 4).")


def _bound(root, what: str, allow: bool, given_items: int = 0, given_bytes: int = 0):
    """The check (store.bounds) an operation calls with its plan's size before it writes: exit 4 beyond it."""
    from rmqtool.store.bounds import Bound

    bound = Bound.of(Path(root), given_items, given_bytes)
    return lambda size: bound.check(size, what, allow)


def _with_total(rows: list[dict], size) -> list[dict]:
    """A plan's rows and, when there is any, its total row (store.bounds.PlanSize)."""
    return rows + [{"action": "total", "path": "", "detail": size.line()}] if rows else rows


def _refused_dry_run(check, size) -> None:
    """A dry run whose plan the write would refuse says so (exit 4)."""
    from rmqtool.store.bounds import TooLarge

    try:
        check(size)
    except TooLarge as exc:
        click.echo(f"rmqtool: error: would be refused: {exc.message.removesuffix(': nothing written')}", err=True)
        raise click.exceptions.Exit(ExitCode.IO_ERROR) from None


def plan_only(apply_: bool, dry_run: bool) -> bool:
    """The write rule: a command that changes an existing store plans unless --apply (--dry-run says so)."""
    if apply_ and dry_run:
        raise click.UsageError("use --apply or --dry-run, not both")
    return not apply_


def show_plan(rows: list[dict], fmt: str | None, tablefmt: str, title: str = "plan") -> None:
    """The plan of a write (before a dry run's exit, after a change is made), in the one format every
    write command uses; a closed stdout changes neither the change nor the exit status."""
    with stdout_may_close():
        write_rows(rows, resolve_format(fmt), columns=PLAN_COLUMNS, tablefmt=tablefmt, title=title)


def _show_limited(rows: list[dict], shown: list[dict], fmt: str | None, tablefmt: str, title: str, size) -> None:
    """The plan's first ``shown`` rows (repair --limit) and its total, and how many more rows there are."""
    show_plan(_with_total(shown, size), fmt, tablefmt, title)
    if len(shown) < len(rows):
        click.echo(f"{len(rows) - len(shown)} more action(s) not listed (--limit 0 lists all)", err=True)


def end_dry_run(rows: list[dict], how: str = "run with --apply", idle: str = "nothing to do", notes: int = 0) -> None:
    """The end of a dry run: exit 1 when the plan has something to do, else 0 (``notes``: rows that only say
    what the broker does too)."""
    todo = len(rows) - notes
    click.echo(f"{todo} action(s); {how} to carry them out" if todo else idle, err=True)
    raise click.exceptions.Exit(ExitCode.FINDINGS if todo else ExitCode.OK)


def say_undo(what: str, backup, store) -> None:
    """The last line of every write: what was done and how to undo it."""
    import shlex

    click.echo(f"{what}; backup in {backup}; undo: rmqtool restore {shlex.quote(str(backup))} "
               f"{shlex.quote(str(store))} --apply", err=True)


def _open_target(path: str):
    """The store a write command was given: its root directory, nothing else (StoreError: exit 4)."""
    from rmqtool.store.recognition import require_store_root
    from rmqtool.store.store import Store

    return Store.open(require_store_root(path))


_MULTI_PATH_READ_ONLY = "a commit log over several directories is read-only here"


@contextlib.contextmanager
def _store(path: str, *, write: bool, force: bool = False):
    """The store a command was given (its root only). To ``write``: under the broker's lock (refused while
    another process holds it, unless ``force``), with an interrupted earlier change completed (journal)
    or dropped (no journal) first."""
    from rmqtool.errors import StoreWarning, UnsafeWrite
    from rmqtool.store.store import MULTI_PATH_SPLITTER
    from rmqtool.store.atomic import complete_pending, failed, store_state
    from rmqtool.store.lock import store_write_lock
    from rmqtool.store.store import Store

    if not write:
        yield _open_target(path)
        return
    if MULTI_PATH_SPLITTER in str(path):             # checked before the root: the message says why
        raise UnsafeWrite(_MULTI_PATH_READ_ONLY, path=str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreWarning)     # the pending change is dealt with right here
        st = _open_target(path)
    if st.commitlog_dirs:
        raise UnsafeWrite(_MULTI_PATH_READ_ONLY, path=str(st.root))
    with store_write_lock(st.root, force=force):
        try:
            done = complete_pending(st.root)
            if done:
                click.echo(f"rmqtool: {done} an interrupted earlier change", err=True)
                st = Store.open(st.root)
            yield st
        except OSError as exc:                  # an I/O error of the write: its path and the store's state
            raise failed(exc, store_state(st.root), st.root) from None


@cli.command()
@click.argument("stores", metavar="STORE...", nargs=-1, required=True, type=click.Path(), callback=recognized)
@check_crc_option(aliases=("--deep",), help="Check every body's CRC, and the 5.2+ whole-record CRC property "
                                            "(__CRC32#) where the store writes it. Without it, verify checks "
                                            "the body CRCs of the files a broker start's recovery reads.")
@click.option("--strict", is_flag=True, help="Warnings count too: exit 1 when there is any finding.")
@jobs_option
@engine_options
@read_anyway_option(help="Check a store the broker refuses to load (a commit-log file of the wrong size, one named "
                         "between the others' starts, a missing one) instead of refusing it (exit 4), as every "
                         "reader reads it (each file up to its last whole record): its findings, each part not read "
                         "one skipped_part finding (the units and index entries pointing into it counted there), "
                         "then a warning naming the records and bytes skipped (exit 3).")
@output_options
def verify(stores: tuple[str, ...], check_crc: bool, strict: bool, jobs: int | None, engine: str,
           master: str | None, read_anyway: bool, fmt: str | None, tablefmt: str) -> None:
    """Check stores: every problem with its file and byte offset, at the broker's verdict level.

    error (exit 1): a broker of the store's version (of 4.9.7 and of 5.3.3 when its files do not tell)
    refuses the store, or starting it loses a message, serves a damaged body, leaves a message without
    its consume-queue unit or index entry, or puts a unit at another queue offset (a damaged record
    counts as lost, unless it is the torn tail of a crash). warning: the broker handles it on start and
    every readable message keeps its place; the finding says how (exit 0 unless --strict). broker_start
    findings say, per version, what a start does and what it costs: -f jsonl gives their counts
    (messages_lost, units_missing, units_misplaced, index_entries_missing, index_keys_missing,
    files_deleted). The last line (table, plain, record) says per version "safe to start" or what a
    start loses, and the repair command to run. A verdict that depends on when the broker starts (the
    timer store's read window: a start more than 7 days after its last read skips slots) takes the start
    from --now (default: the system clock) and names it. Commit-log files are checked in parallel: in
    worker processes, or one Spark task per file with --engine spark. A RocksDB consume queue is compared
    with what the commit log dispatches; compaction topics' logs with their commit-log records, the
    newest-per-key rule and their sparse queues. Body CRCs are checked where the broker's start checks
    them (checkCRCOnRecover): the files its recovery reads (the last three of a 4.9.7 store, from the
    queues' end on 5.x, from the checkpoint's file after a crash); --check-crc checks every file.

    \b
    Examples:
      rmqtool verify STORE
      rmqtool verify TIMER_STORE --now 2026-11-23T07:00:00Z -f plain
      rmqtool verify TIMER_STORE --now 2026-12-01T00:00:00Z -f record   # exit 1
      rmqtool verify CRASHED_STORE -f plain \\
        # exit 0: warnings (the broker recovers it)
      rmqtool verify CRASHED_STORE --strict   # exit 1
      rmqtool verify STORE STORE_5X --check-crc -f jsonl
      rmqtool verify COMPACTION_STORE ROCKSDB_STORE
    """
    deep = check_crc
    from rmqtool.store.readable import commitlog_view
    from rmqtool.store.store import Store

    opened = [(path, Store.open(path)) for path in stores]     # a path that is not a store: refused before
    skipped = [s for _, st in opened for s in commitlog_view(st.commitlog, read_anyway)[1]]
    from rmqtool.cli.output import skip_pandas_probe
    from rmqtool.ops.findings import FINDING_FIELDS             # the scan's modules are imported
    from rmqtool.ops.verify import verdict, verify_store
    from rmqtool.store.broker_model import VERSIONS

    size = sum(f.length for _, st in opened for f in st.commitlog.queue)
    skip_pandas_probe()                 # compaction topics, DLedger, whole-record CRCs: Arrow arrays, no pandas
    findings, verdicts = [], []
    spark = choose_engine(engine, size, master) == "spark"
    session = spark_session(master) if spark else None
    for path, st in opened:
        if spark:
            from rmqtool.spark.jobs import verify_spark
            rows = [f.row() for f in verify_spark(session, path, deep=deep)]
        else:
            with _progress(st, "verifying") as progress:
                rows = [f.row() for f in verify_store(path, deep=deep, progress=progress, jobs=jobs)]
        findings += rows
        says = verdict(rows, [st.broker_version] if st.broker_version in VERSIONS else list(VERSIONS))
        unsafe = any(not v.endswith("safe to start") for v in says)
        if not st.is_store_root and not unsafe:     # no queues, index or checkpoint seen: no start verdict
            says = ["the commit log reads whole (no start verdict without its store: verify the store directory)"]
        verdicts.append(f"{path}: " * (len(opened) > 1) + "; ".join(says)
                        + (f": run `rmqtool repair {path}`" if unsafe else ""))
    out = resolve_format(fmt)
    title = "findings"
    root = opened[0][1].root if len(opened) == 1 else None
    if out in PEOPLE and root and all(_in_store(f["path"], root) is not None for f in findings):
        title = f"findings in {root}"           # people read paths in the store: relative to it, named once
        findings = [{**f, "path": _in_store(f["path"], root) or f["path"]} for f in findings]
    with stdout_may_close():            # the status says what was found, whoever stopped reading
        write_rows(findings, out, columns=FINDING_FIELDS, tablefmt=tablefmt, title=title)
    errors = sum(1 for f in findings if f["severity"] == "error")
    if out in PEOPLE:
        click.echo(f"{errors} error(s), {len(findings) - errors} warning(s)" if findings else "no problems found",
                   err=True)
        for line in verdicts:
            say(line)
    end_partial(skipped)
    raise click.exceptions.Exit(ExitCode.FINDINGS if errors or (strict and findings) else ExitCode.OK)


def _in_store(path: str | None, root: Path) -> str | None:
    """``path`` relative to the store ``root`` ('' when there is no path, '.' for the root itself); None
    when it lies outside."""
    if not path:
        return ""
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return None


@cli.command()
@click.argument("store", type=click.Path())
@_APPLY
@_DRY_RUN
@click.option("--accept-loss", is_flag=True, help="Carry out a plan that deletes valid messages after a bad "
              "record (beyond the torn tail), as the broker's recovery would.")
@click.option("--salvage/--no-salvage", default=True, show_default=True,
              help="Keep every valid record after a bad one (beyond the broker; the default, since the broker's "
                   "own handling loses them): each damaged record before the torn tail becomes a placeholder the "
                   "broker steps over, and the queues and index are made whole around it. --no-salvage plans the "
                   "broker's cut instead (with --accept-loss when it deletes messages).")
@click.option("--as-broker", is_flag=True,
              help="Where the broker's recovery leaves records unreachable (a 4.9.7 DLedger recovery indexes "
                   "nothing again), leave them so too, instead of the correct state.")
@click.option("--cq-file-size", type=int, metavar="BYTES",
              help="The broker's mappedFileSizeConsumeQueue, for queue files repair creates where none tells it.")
@click.option("--slots", type=int, help="The broker's maxHashSlotNum, for index files repair creates where none "
                                        "tells it (with --max-entries).")
@click.option("--max-entries", type=int, help="The broker's maxIndexNum (with --slots).")
@click.option("--limit", type=int, default=50, show_default=True, metavar="N",
              help="List at most N actions (0: all); the count of the rest is said.")
@_BACKUP
@_FORCE
@_ALLOW_LARGE
@jobs_option
@output_options
def repair(store: str, apply_: bool, dry_run: bool, accept_loss: bool, salvage: bool, as_broker: bool,
           cq_file_size: int | None, slots: int | None, max_entries: int | None, limit: int,
           backup: Path | None, force: bool, allow_large: bool, jobs: int | None, fmt: str | None,
           tablefmt: str) -> None:
    """Do what the broker's recovery would (rmqtool.store.broker_model, per version): truncate after the
    last valid record, drop dirty consume-queue units, rebuild index entries, fix the checkpoint, remove
    abort. After a crash what is cut off is zeroed; after a clean shutdown bytes past the recovered end
    are left (the broker cuts them again, logically, on every start).

    A damaged record before the torn tail is salvaged by default: it is replaced by a placeholder record of
    its size (a rollback-type message on topic rmqtool-salvaged, which the broker's dispatch skips), its
    unit by a blank unit, every record after it keeps its place in its queue (the queues a start's
    dispatch would rebuild are written whole) and the index files from it on are rebuilt, so a broker of
    either version starts without losing what is readable. --no-salvage plans what the broker does
    (a cut that deletes every later message), refused unless --accept-loss. Queue or index files repair
    creates where none tells the broker's sizes need --cq-file-size / --slots and --max-entries (it
    says so, exit 4, nothing written).

    Without --apply only prints the plan (exit 0 when there is nothing to do, 1 when there is, or when the
    store holds what the broker refuses or loses and repair does not fix: each named with what does). With
    --apply, prints the actions once they are done, then verifies the result (CRCs included): exit 0 when
    nothing is left to fix, else 1 with each finding left named ("still: ...") and what fixes it; the
    undo line says how to put the store back.

    \b
    Examples:
      rmqtool repair STORE
      rmqtool repair CRASHED_STORE -f plain   # exit 1
      cp -r CRASHED_STORE /tmp/repair-$$ && rmqtool repair /tmp/repair-$$ --apply
    """
    plan_only(apply_, dry_run)
    _both_index_sizes(slots, max_entries)
    from rmqtool.ops.repair import LEFT_TO, NO_FIX, apply_plan, left_unrepaired, plan_repair
    from rmqtool.ops.verify import verify_store

    with _store(store, write=apply_, force=force) as st:
        with _progress(st, "scanning") as progress:
            plan = plan_repair(st, salvage=salvage, as_broker=as_broker, cq_file_size=cq_file_size,
                               index_geometry=st.index_geometry(slots, max_entries) if slots or max_entries else None,
                               progress=progress, jobs=jobs)
        try:
            rows = [a.row() for a in plan.actions]
            if plan.lost:
                rows.insert(0, {"action": "lose_messages", "path": "commitlog",
                                "detail": f"{plan.lost} valid message(s) after offset {plan.process_offset} "
                                          "deleted (a bad record before the torn tail; --accept-loss to carry it "
                                          "out; without --no-salvage repair keeps them)"})
            shown = rows[:limit] if limit > 0 else rows
            size, check = plan.size(), _bound(st.root, "repair", allow_large)
            if not apply_:
                _show_limited(rows, shown, fmt, tablefmt, f"repair plan (logical end {plan.process_offset})", size)
                plan.close()
                if rows:
                    _refused_dry_run(check, size)
                left = [] if rows else left_unrepaired(st)
                if not rows:               # what verify finds and only another command fixes (as --apply says)
                    named = [path for path, _, _ in left]
                    findings = list(verify_store(st.root, deep=True))
                    left += _left_to_dispatch(st, findings)
                    for f in findings:         # every error verify finds: "nothing to do" is no answer to it
                        if f.severity == "error" and f.kind != "broker_running":
                            rel = st.rel(f.path) if f.path and Path(f.path).is_relative_to(st.root) else f.path
                            if not rel or not any(n == rel or n.startswith(rel + "/") for n in named):
                                left.append((rel or str(st.root), f.message, LEFT_TO.get(f.kind, NO_FIX)))
                for path, problem, why in left:
                    click.echo(f"rmqtool: not repaired: {path}: {problem} [{why}]", err=True)
                if left:
                    raise click.exceptions.Exit(ExitCode.FINDINGS)
                end_dry_run(rows, "run with --apply")
            if plan.lost and not accept_loss:
                click.echo(f"rmqtool: error: refused: the plan deletes {plan.lost} valid message(s) after offset "
                           f"{plan.process_offset}; `rmqtool repair {st.root} --apply` keeps them (salvage, the "
                           "default); --accept-loss carries out the broker's cut", err=True)
                raise click.exceptions.Exit(ExitCode.IO_ERROR)
            check(size)
            saved = None if plan.empty else apply_plan(plan, backup)     # the change first, then the report
        except BaseException:
            with contextlib.suppress(OSError):   # the error being reported comes first
                plan.close()
            raise
        plan.close()
    _show_limited(rows, shown, fmt, tablefmt, f"repaired (logical end {plan.process_offset})", size)
    if saved is None:
        click.echo("nothing to repair", err=True)
    else:
        say_undo("repaired", saved, st.root)
    # its own result verified (CRCs too): an error left is named with what fixes it (exit 1)
    left = [f for f in verify_store(st.root, deep=True) if f.kind != "broker_running"]   # forced past the lock
    for f in left:
        why = LEFT_TO.get(f.kind)
        click.echo(f"rmqtool: still: {f}" + (f" [{why}]" if why else ""), err=True)
    lost = _left_to_dispatch(st, left)
    for path, problem, why in lost:
        click.echo(f"rmqtool: not repaired: {path}: {problem} [{why}]", err=True)
    raise click.exceptions.Exit(ExitCode.FINDINGS if lost or any(f.severity == "error" for f in left) else ExitCode.OK)


def _left_to_dispatch(st, findings) -> list[tuple[str, str, str]]:
    """Queues without files are the broker's dispatch's to build on start (rule reput_from): said, with
    (path, problem, what fixes it) of each unit that dispatch drops (rule reput_misplaced)."""
    if not any(f.kind == "cq_missing_queue" for f in findings):
        return []
    from rmqtool.ops.dispatch_plan import broker_version
    from rmqtool.ops.rebuild import rebuild_consume_queues

    version = broker_version(st)
    res = rebuild_consume_queues(st, dry_run=True, as_broker=version)
    skipped: dict[tuple[str, int], list[int]] = {}
    for t, qid, phy, _, at, _ in res.misplaced:
        if at is None:
            skipped.setdefault((t, qid), []).append(phy)
    lost = [(L.queue_dir(t, qid), f"a {version} broker's dispatch skips {len(phys)} unit(s) as repeated (the records "
             f"at {', '.join(map(str, phys[:3]))}{', ...' if len(phys) > 3 else ''})",
             "rebuild-cq --apply builds the queue with them") for (t, qid), phys in skipped.items()]
    if not lost:
        click.echo(f"rmqtool: queues without files are left to the broker's dispatch on start, which builds them as "
                   f"rebuild-cq does ({len(res.misplaced)} unit(s) with a damaged queue offset at their queue's end)",
                   err=True)
    return lost


_AS_BROKER = click.option("--as-broker", is_flag=True,
                          help="Build what the broker builds from this commit log (its recovery cut, its dispatch "
                               "across a bad record) instead of the correct state.")
_BROKER_VERSION = click.option("--broker-version", type=click.Choice(["4.9.7", "5.3.3"]),
                               help="The broker --as-broker mirrors [default: as the store shows].")


_REBUILD_READ_ANYWAY = read_anyway_option(
    help="Rebuild from a commit log the broker refuses to load (a file of the wrong size, one named between the "
         "others' starts, a missing one) instead of refusing it (exit 4): from the other files, then a warning "
         "naming the records and bytes left out (exit 3). --as-broker refuses such a store: the broker has no "
         "result to reproduce.")


def _rebuild_skips(st, read_anyway: bool, as_broker: bool) -> tuple:
    """The store's commit log made the one every reader reads (store.readable's view, set on ``st``), and what
    that skips: refused unless ``read_anyway``; --as-broker leaves the refusal to the rebuild, which names the
    broker's rule."""
    from rmqtool.store.readable import commitlog_view

    if as_broker:
        return ()
    st.commitlog, skipped = commitlog_view(st.commitlog, read_anyway)
    return skipped


def _both_index_sizes(slots: int | None, max_entries: int | None) -> None:
    """--slots and --max-entries go together (an index file's geometry): one alone is a usage error (exit 2)."""
    if (slots is None) != (max_entries is None):
        raise click.UsageError("give both --slots and --max-entries (an index file's maxHashSlotNum and maxIndexNum)")


def _skipped_rows(damaged: list, cut: int | None) -> list[dict]:
    """Plan rows naming the records a rebuild leaves out: never a silent drop. Notes, not actions: a rebuild
    writes the same files again (their blank units, its index without them); repair salvages them."""
    rows = [{"action": "skip_record", "path": "commitlog", "detail": f"{kind} at offset {at} ({size} bytes stepped "
             "over): no unit, no index entry"} for at, size, kind in damaged]
    if cut is not None:
        rows.append({"action": "broker_cut", "path": "commitlog", "detail": f"the broker truncates the commit log "
                     f"at {cut}: no record after it is dispatched"})
    return rows


def _misplaced_rows(misplaced: list, as_broker: bool) -> list[dict]:
    """Plan rows naming each unit whose stored queue offset is not its place (rule reput_misplaced)."""
    rows = []
    for topic, qid, phy, stored, at, first in misplaced:
        said = f"the record at {phy} stores queue offset {stored}: "
        if at is None:
            said += "below its queue's end, skipped as the broker skips it ('Build consume queue repeatedly')"
        elif as_broker:
            said += f"appended at the queue's end, offset {at}, as the broker does ('[BUG]logic queue order maybe " \
                    "wrong')"
        elif first:
            said += (f"placed at {at}, before the queue's next unit; a broker's dispatch starts this queue at {stored} "
                     "and skips every later unit of it as repeated (--as-broker builds that)")
        else:
            said += f"placed at the queue's end, offset {at}, where a broker's dispatch appends it too"
        rows.append({"action": "misplaced_unit", "path": L.queue_dir(topic, qid), "detail": said})
    return rows


@cli.command("rebuild-cq")
@click.argument("store", type=click.Path())
@click.option("--topic", "topics", multiple=True, help="Rebuild only this topic's queues (repeatable: any of them).")
@click.option("--allow-no-records", is_flag=True,
              help="Write an empty queue directory for a --topic with no record in the commit log.")
@click.option("--out", type=click.Path(path_type=Path), callback=output_path("--out"),
              help="Write the queues here instead of into the store.")
@click.option("--cq-file-size", type=click.IntRange(20, JAVA_INT_MAX),
              help="Consume-queue file size [default: that of existing queues].")
@click.option("--bcq-file-size", type=click.IntRange(46, JAVA_INT_MAX),
              help="Batch consume-queue file size [default: that of existing batch queues, else 13800000].")
@_AS_BROKER
@_BROKER_VERSION
@_APPLY
@_DRY_RUN
@_BACKUP
@_FORCE
@_ALLOW_LARGE
@jobs_option
@_REBUILD_READ_ANYWAY
@output_options
def rebuild_cq(store: str, topics: tuple[str, ...], allow_no_records: bool, out: Path | None,
               cq_file_size: int | None, bcq_file_size: int | None, as_broker: bool, broker_version: str | None,
               apply_: bool, dry_run: bool, backup: Path | None, force: bool, allow_large: bool, jobs: int | None,
               read_anyway: bool,
               fmt: str | None, tablefmt: str) -> None:
    """Regenerate consume queues from the commit log as the broker's dispatch does.

    By default every readable record gets its unit at its stored queue offset: a damaged record is
    stepped over (by its size field when its header is sound, else to the next record that decodes),
    listed as a skip_record row, and its place holds a blank unit. --as-broker builds what the broker
    (--broker-version, default as the store shows) builds after a start with no consume queues: its
    recovery's cut, its dispatch skipping the rest of a file at a bad record, units appended at each
    queue's position.

    Classic queues, LMQ queues (%LMQ%name/0, from INNER_MULTI_DISPATCH) and the batch queues of BatchCQ
    topics (batchconsumequeue/; a topic is BatchCQ when that directory or config/topics.json says so).
    Files are written sparse at full size, as the broker pre-allocates them. A --topic with no record in
    the commit log is refused (exit 1, the topics listed) unless --allow-no-records. A RocksDB consume queue
    (storeType=defaultRocksDB) is never written into: only --out DIR, which writes classic file queues.

    A record whose stored queue offset is not its place in its queue (damage) is placed at its queue's end
    and listed as a misplaced_unit row, saying what the broker's dispatch does with it (rule reput_misplaced):
    a rebuild writes for one record at most one file, as the broker. The broker appends every LMQ unit at its
    queue's end whatever offset its record asks for: those rows are notes, not actions.

    In place: without --apply only prints the queues that would change (exit 0 when none, 1 when some);
    --apply rebuilds them with a backup and ends with the undo line. --out writes a new directory (no --apply).

    \b
    Examples:
      rmqtool rebuild-cq STORE   # exit 0: the queues are as the broker wrote them
      rmqtool rebuild-cq STORE --topic TopicA --out /tmp/rmqtool-cq-$$
      rmqtool rebuild-cq BATCHCQ_STORE --out /tmp/rmqtool-bcq-$$
      rmqtool rebuild-cq STORE --topic NoSuchTopic   # exit 1
      rmqtool rebuild-cq ROCKSDB_STORE --out /tmp/rmqtool-rocksdb-cq-$$
    """
    from rmqtool.ops.dispatch_plan import broker_version as version_of
    from rmqtool.ops.rebuild import rebuild_consume_queues

    dry_run = plan_only(apply_, dry_run) and out is None
    if apply_ and out is not None:
        raise click.UsageError("--out writes a new directory: it needs no --apply")

    with _store(store, write=not (dry_run or out), force=force) as st:
        skipped = _rebuild_skips(st, read_anyway, as_broker)
        check = _bound(st.root, "rebuild-cq", allow_large)
        with _progress(st, "rebuilding consume queues") as progress:
            res = rebuild_consume_queues(st, topics=topics, out=out, cq_file_size=cq_file_size,
                                         bcq_file_size=bcq_file_size, dry_run=dry_run, backup=backup,
                                         allow_empty=allow_no_records, progress=progress, jobs=jobs,
                                         as_broker=version_of(st, broker_version) if as_broker else None,
                                         check=check)
    if res.missing and not allow_no_records:
        click.echo(f"rmqtool: error: no record of topic(s) {', '.join(map(repr, res.missing))} in the commit log; "
                   f"nothing rebuilt (--allow-no-records writes an empty queue directory). Topics: "
                   f"{', '.join(res.topics) or 'none'}", err=True)
        raise click.exceptions.Exit(ExitCode.FINDINGS)
    if dry_run:          # the queues whose files would change
        rows = [{"action": a, "path": p, "detail": d} for a, p, d in res.changes]
    else:
        rows = [{"action": "write_cq", "path": res.target,
                 "detail": f"{res.queues} queue(s), {res.files} file(s), {res.units} unit(s)"}] \
            if res.queues and (res.backup or out is not None) else []
    rows += _skipped_rows(res.damaged, res.cut) + _misplaced_rows(res.misplaced, as_broker)
    show_plan(_with_total(rows, res.size), fmt, tablefmt, "consume queues")
    if dry_run:
        _refused_dry_run(check, res.size)
        end_partial(skipped)
        end_dry_run(rows, idle="nothing to change",
                    notes=res.lmq_placed() + len(res.damaged) + (res.cut is not None))
    if res.backup:
        say_undo(f"rebuilt {res.queues} consume queue(s)", res.backup, st.root)
    elif out is None:
        click.echo("nothing to change: the queues are as rebuilt", err=True)
    end_partial(skipped)


@cli.command("rebuild-index")
@click.argument("store", type=click.Path())
@click.option("--slots", type=click.IntRange(1, JAVA_INT_MAX),
              help="Hash slots per file [default: that of existing index files].")
@click.option("--max-entries", type=click.IntRange(2, JAVA_INT_MAX),
              help="Entries per file [default: that of existing index files].")
@_AS_BROKER
@_BROKER_VERSION
@_APPLY
@_DRY_RUN
@_BACKUP
@_FORCE
@_ALLOW_LARGE
@jobs_option
@_REBUILD_READ_ANYWAY
@output_options
def rebuild_index(store: str, slots: int | None, max_entries: int | None, as_broker: bool,
                  broker_version: str | None, apply_: bool, dry_run: bool, backup: Path | None, force: bool,
                  allow_large: bool, jobs: int | None, read_anyway: bool,
                  fmt: str | None, tablefmt: str) -> None:
    """Regenerate index files from the commit log as IndexService.buildIndex does.

    By default every readable record is indexed (damaged records stepped over and listed as skip_record
    rows); --as-broker indexes what the broker's dispatch reaches (see rebuild-cq). A rebuilt file whose
    entries are those of an existing file keeps that file's name.

    Without --apply only prints the files that would change (exit 0 when none, 1 when some); --apply
    writes them with a backup and ends with the undo line.

    \b
    Examples:
      rmqtool rebuild-index STORE -f plain   # exit 0: nothing to change
      rmqtool rebuild-index STORE --slots 32 --max-entries 128   # exit 1
    """
    from rmqtool.ops.dispatch_plan import DispatchPlan
    from rmqtool.ops.dispatch_plan import broker_version as version_of
    from rmqtool.ops.rebuild import rebuild_index as run
    from rmqtool.store.bounds import PlanSize

    dry_run = plan_only(apply_, dry_run)
    _both_index_sizes(slots, max_entries)

    with _store(store, write=not dry_run, force=force) as st:
        skipped = _rebuild_skips(st, read_anyway, as_broker)
        before = {ref.name for ref in st.index_files()}
        plan = DispatchPlan(version_of(st, broker_version) if as_broker else None, jobs=jobs)
        check, size = _bound(st.root, "rebuild-index", allow_large), PlanSize()
        with _progress(st, "rebuilding index") as progress:
            files, saved = run(st, slots=slots, max_entries=max_entries, dry_run=dry_run, backup=backup,
                               plan=plan, progress=progress, size=size, check=check)
    rows = [{"action": "write_index", "path": L.index_file(name), "detail": f"{entries} entries"}
            for name, entries, same in files if not same]
    rows += [{"action": "delete_index", "path": L.index_file(name), "detail": "not among the rebuilt files"}
             for name in sorted(before - {name for name, _, _ in files})]
    notes = _skipped_rows(plan.damaged, plan.cut)
    rows += notes
    show_plan(_with_total(rows, size), fmt, tablefmt, "index files")
    if dry_run:
        _refused_dry_run(check, size)
        end_partial(skipped)
        end_dry_run(rows, idle="nothing to change", notes=len(notes))
    if saved:
        say_undo(f"rebuilt the index ({len(files)} file(s))", saved, st.root)
    else:
        click.echo("nothing to change", err=True)
    end_partial(skipped)


@cli.command()
@click.argument("store", type=click.Path(), callback=output_path("the new store"))
@click.option("--commitlog-file-size", type=click.IntRange(1024, JAVA_INT_MAX), default=1024 ** 3, show_default=True,
              metavar="BYTES", help="Commit-log file size (the broker's mappedFileSizeCommitLog).")
@click.option("--cq-file-size", type=click.IntRange(20, JAVA_INT_MAX), default=6_000_000, show_default=True,
              metavar="BYTES", help="Consume-queue file size, a multiple of 20 (mappedFileSizeConsumeQueue).")
@click.option("--slots", type=click.IntRange(1, JAVA_INT_MAX), default=5_000_000, show_default=True,
              help="Index hash slots per file (maxHashSlotNum).")
@click.option("--max-entries", type=click.IntRange(2, JAVA_INT_MAX), default=20_000_000, show_default=True,
              help="Index entries per file (maxIndexNum).")
def init(store: str, commitlog_file_size: int, cq_file_size: int, slots: int, max_entries: int) -> None:
    """Create an empty store (first commit-log file, checkpoint, lock) with the given sizes, recorded in
    config/rmqtool.json for the writes that follow. The sizes are the broker's (Java int) settings; the
    first commit-log file is created sparse at its full size, as the broker pre-allocates it.

    \b
    Examples:
      rmqtool init /tmp/rmqtool-init-$$ --commitlog-file-size 65536 \\
        --cq-file-size 160 --slots 16 --max-entries 64
    """
    from rmqtool.format.indexfile import Geometry
    from rmqtool.ops.write import init_store

    if cq_file_size % 20:
        raise click.BadParameter(f"{cq_file_size} is not a multiple of 20", param_hint="--cq-file-size")
    if Geometry(slots, max_entries).file_size > JAVA_INT_MAX:
        raise click.BadParameter(f"an index file of {slots} slots and {max_entries} entries is "
                                 f"{Geometry(slots, max_entries).file_size} bytes, more than the broker's "
                                 f"int file size {JAVA_INT_MAX}", param_hint="--slots/--max-entries")

    size = init_store(Path(store), commitlog_file_size=commitlog_file_size, cq_file_size=cq_file_size,
                      geometry=Geometry(slots, max_entries))
    import shlex
    click.echo(f"created {store}: {size.line()}; undo: rm -r {shlex.quote(store)}", err=True)


def _host(_ctx, param, value):
    from rmqtool.format.hosts import Host

    try:
        return None if value is None else Host.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from None


_STORE_HOST = click.option("--store-host", callback=_host, metavar="IP:PORT",
                           help="The store host to write (default: the store's newest record's; 127.0.0.1:10911 "
                                "in an empty store).")


_REGION = click.option("--region", metavar="REGION",
                       help="The MSG_REGION property to write (BrokerConfig regionId; default: the store's newest "
                            "record's; DefaultRegion in a 5.x store whose records have none).")
_TRACE = click.option("--trace-on/--trace-off", "trace_on", default=None,
                      help="The TRACE_ON property to write (BrokerConfig traceOn; default: the store's newest "
                           "record's; true in a 5.x store whose records have none).")


def _arg_bytes(value: str, option: str, hex_: bool) -> bytes:
    """An option's value as bytes: hex digits with --hex; else the bytes given on the command line (UTF-8
    text as such; bytes that are not UTF-8 as they were: Python hands them over surrogate-escaped)."""
    try:
        return bytes.fromhex(value) if hex_ else value.encode("utf-8", "surrogateescape")
    except ValueError:
        raise click.BadParameter(f"not hexadecimal: {value!r}", param_hint=option) from None
    except UnicodeEncodeError:
        raise click.BadParameter(f"{value!r} is neither text nor bytes; give them in hex with --hex",
                                 param_hint=option) from None


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--topic", required=True, help="The topic.")
@click.option("--queue-id", type=click.IntRange(0, JAVA_INT_MAX), default=0, show_default=True,
              help="The queue id.")
@option("--tag", "tags", aliases=("--tags",), help="The TAGS property.")
@option("--key", "keys", aliases=("--keys",), multiple=True,
        help="A key of the KEYS property (repeatable; without --hex a value with spaces holds several).")
@click.option("--property", "properties", multiple=True, metavar="K=V", help="Another property (repeatable).")
@click.option("--body", help="The body.")
@click.option("--body-file", type=click.File("rb"), help="Read the body from this file.")
@click.option("--body-stdin", is_flag=True, help="Read the body from stdin.")
@click.option("--hex", "hex_", is_flag=True,
              help="--topic, --tag, --key, --body and both sides of --property are hex digits of the bytes.")
@click.option("--born-host", callback=_host, metavar="IP:PORT",
              help="The producer's address (default: the store host's address, port 0).")
@_STORE_HOST
@_REGION
@_TRACE
@_APPLY
@_DRY_RUN
@_BACKUP
@_FORCE
@_ALLOW_LARGE
@output_options
def put(store: str, topic: str, queue_id: int, tags: str | None, keys: tuple[str, ...], properties: tuple[str, ...],
        body: str | None, body_file, body_stdin: bool, hex_: bool, born_host, store_host, region: str | None,
        trace_on: bool | None, apply_: bool,
        dry_run: bool, backup: Path | None, force: bool, allow_large: bool, fmt: str | None, tablefmt: str) -> None:
    """Append one message as a producer sends it and the broker stores it (commit log, consume queue, index,
    checkpoint), in one transaction with one backup.

    Values are written as the bytes given: text as UTF-8, bytes that are not UTF-8 as they are (or every
    value in hex with --hex); never a replaced character. As a Java producer and the store's broker would,
    put adds a new UNIQ_KEY (MessageClientIDSetter: the born host's IP, this process's pid and counter, the
    time since the UTC month start, the class-loader hash String.hashCode("rmqtool")), MSG_REGION and
    TRACE_ON as the broker's send path adds them (AbstractSendMessageProcessor.buildMsgContext: the store's
    newest record's values, --region, --trace-on/--trace-off; DefaultRegion and true in a 5.x store whose
    records have none; none in a 4.x store whose records have none: a stock 4.9.7 broker adds them only with
    a SendMessageHook) and, when the records carry one, CLUSTER, and writes the properties in the broker's
    order. The store host is the store's newest record's (--store-host sets another), the born host its
    address with port 0 (--born-host).

    Without --apply only prints the plan (exit 1: there is something to do); --apply appends with a
    backup and ends with the undo line.

    \b
    Examples:
      rmqtool put STORE --topic TopicA --tag TagA --body hello   # exit 1
      rmqtool init /tmp/rmqtool-put-$$ --commitlog-file-size 65536 \\
        --cq-file-size 160 --slots 16 --max-entries 64 && rmqtool put \\
        /tmp/rmqtool-put-$$ --topic T --body hi --apply
    """
    from rmqtool.errors import EncodeError
    from rmqtool.ops.write import broker_stamp, sent_message

    dry_run = plan_only(apply_, dry_run)

    if sum(x is not None and x is not False for x in (body, body_file, body_stdin or None)) != 1:
        raise click.UsageError("give exactly one of --body, --body-file, --body-stdin")
    data = _arg_bytes(body, "--body", hex_) if body is not None else \
        (body_file.read() if body_file else sys.stdin.buffer.read())
    key_list = [k for item in keys for k in ([_arg_bytes(item, "--key", hex_)] if hex_
                                             else _arg_bytes(item, "--key", False).split())]
    props = []
    for item in properties:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected k=v, got {item!r}", param_hint="--property")
        props.append((_arg_bytes(name, "--property", hex_), _arg_bytes(value, "--property", hex_)))
    topic_bytes = _arg_bytes(topic, "--topic", hex_)
    tag_bytes = None if tags is None else _arg_bytes(tags, "--tag", hex_)
    with _store(store, write=not dry_run, force=force) as st:
        try:
            msg = sent_message(topic_bytes, data, broker_stamp(st, region, trace_on), queue_id=queue_id,
                               tags=tag_bytes, keys=key_list, properties=props, born_host=born_host,
                               store_host=store_host)
        except EncodeError as exc:
            raise click.UsageError(exc.message) from None
        writer, msg, saved = _append_all(st, lambda: [msg], "put", backup=backup, dry_run=dry_run,
                                         allow_large=allow_large, given=lambda: (1, msg.total_size),
                                         fmt=fmt, tablefmt=tablefmt)
    with stdout_may_close():
        write_rows([{"msg_id": msg.msg_id, "uniq_key": msg.uniq_key, "topic": msg.topic, "queue_id": queue_id,
                     "physical_offset": msg.physical_offset, "queue_offset": msg.queue_offset}],
                   resolve_format(fmt), columns=APPENDED_COLUMNS, tablefmt=tablefmt, title="appended")
    say_undo("appended 1 message", saved, st.root)


APPENDED_COLUMNS = ["msg_id", "uniq_key", "topic", "queue_id", "physical_offset", "queue_offset"]


def _append_all(st, messages, what: str, *, backup: Path | None, dry_run: bool, allow_large: bool, given, fmt,
                tablefmt: str):
    """Append ``messages()`` (called once per pass) in one transaction, planned first: the plan's size against
    the free bytes and inodes (atomic.check_room) and the bound (``given()``: the input's items and bytes),
    then written. A dry run shows the plan and ends. Returns (writer, the last message as stored, backup)."""
    from rmqtool.ops.write import StoreWriter
    from rmqtool.store.atomic import check_room

    def run(writer):
        stored = None
        try:
            for msg in messages():
                stored = writer.append(msg)
        except BaseException:
            writer.abort()                     # bytes already written in place are taken back
            raise
        return stored

    planner = StoreWriter(st, dry_run=True)
    run(planner)
    rows, size = planner.planned()
    check = _bound(st.root, what, allow_large, *given())
    if dry_run:
        show_plan(_with_total(rows, size), fmt, tablefmt)
        if rows:
            _refused_dry_run(check, size)
        end_dry_run(rows)
    check_room(st.root, size.data, size.files + 2, f"the {what}")
    check(size)
    writer = StoreWriter(st, backup=backup)
    stored = run(writer)
    return writer, stored, writer.commit()


@cli.command("import")
@click.argument("store", type=click.Path())
@click.argument("file", type=click.File("r", encoding="utf-8"))
@_STORE_HOST
@_REGION
@_TRACE
@_APPLY
@_DRY_RUN
@_BACKUP
@_FORCE
@_ALLOW_LARGE
@output_options
def import_(store: str, file, store_host, region: str | None, trace_on: bool | None, apply_: bool, dry_run: bool,
            backup: Path | None, force: bool, allow_large: bool, fmt: str | None, tablefmt: str) -> None:
    """Append the messages of a jsonl file (as written by cat-commitlog --format jsonl) in one
    transaction with one backup: a failure or a kill leaves none of them.

    Each row is written as given: its topic_raw and properties_raw (the stored bytes) when it has them.
    A row without a store host gets the store's (its newest record's), one without a born host that
    address with port 0; --store-host sets every row's store host. A row without properties_raw (a message
    to send, not a stored record) and without MSG_REGION gets MSG_REGION and TRACE_ON as put adds them, its
    properties then in the broker's order.

    Without --apply only prints the plan (exit 0 when there is nothing to import, 1 when there is);
    --apply appends with a backup and ends with the undo line.

    \b
    Examples:
      rmqtool cat-commitlog STORE -n 5 -f jsonl > /tmp/rmqtool-five.jsonl && \\
        rmqtool import STORE_5X /tmp/rmqtool-five.jsonl   # exit 1
    """
    from rmqtool.errors import RmqError
    from rmqtool.ops.write import broker_stamp, message_from_row, read_rows

    dry_run = plan_only(apply_, dry_run)
    name, lines = file.name, _rereadable(file)
    rows = 0

    def messages():
        nonlocal rows
        lines.seek(0)
        rows = 0
        try:
            for n, row in read_rows(lines):
                rows += 1
                try:
                    msg = message_from_row(row, stamp.store_host, store_host, stamp)
                except RmqError as exc:
                    raise exc.at(path=f"{name}: line {n}")
                if msg is not None:
                    yield msg
        except RmqError as exc:                 # a line that is not JSON: named by the file given
            raise exc.at(path=name)

    with _store(store, write=not dry_run, force=force) as st:
        stamp = broker_stamp(st, region, trace_on)
        writer, _, saved = _append_all(st, messages, "import", backup=backup, dry_run=dry_run,
                                       allow_large=allow_large, given=lambda: (rows, lines.seek(0, 2)),
                                       fmt=fmt, tablefmt=tablefmt)
    with stdout_may_close():
        write_rows([{"imported": writer.count}], resolve_format(fmt), columns=["imported"], tablefmt=tablefmt,
                   title="imported")
    if saved:
        say_undo(f"imported {writer.count} message(s)", saved, st.root)
    else:
        click.echo("nothing to import", err=True)


def _rereadable(file):
    """``file`` (text), or a temporary copy of it when it cannot seek (stdin): import reads it twice (plan, write)."""
    import tempfile

    if file.seekable():
        return file
    copy = tempfile.TemporaryFile("w+", encoding="utf-8")
    try:
        for chunk in iter(lambda: file.read(1 << 20), ""):
            copy.write(chunk)
        copy.flush()
    except OSError as exc:          # a full temporary directory: named, not the store (the copy has no name)
        with contextlib.suppress(OSError):
            copy.close()
        raise OSError(exc.errno, f"{exc.strerror} (the copy of stdin import reads twice)",
                      tempfile.gettempdir()) from None
    return copy


@cli.command()
@click.argument("backup", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("store", required=False, type=click.Path(path_type=Path))
@_APPLY
@_DRY_RUN
@_FORCE
@_ALLOW_LARGE
@output_options
def restore(backup: Path, store: Path | None, apply_: bool, dry_run: bool, force: bool, allow_large: bool,
            fmt: str | None, tablefmt: str) -> None:
    """Put a backup made by a write command back into its store.

    STORE defaults to the one the backup's manifest names. Every backed-up file and directory comes
    back as it was; files the change created are removed.

    Checks every backup file against the SHA-256 in its manifest first. Without --apply only prints the
    plan (exit 0 when the store already matches the backup, 1 when there is something to do). With
    --apply: refuses a store whose lock a running broker holds (unless --force), writes in one atomic
    transaction, and keeps what it replaces in a backup of its own, so a restore can be undone too.

    \b
    Examples:
      cp -r CRASHED_STORE /tmp/rs-$$ && rmqtool repair /tmp/rs-$$ --apply \\
        --backup /tmp/rs-$$.bk; rmqtool restore /tmp/rs-$$.bk /tmp/rs-$$ --apply
    """
    from rmqtool.store.atomic import read_backup, restore_backup, restore_plan, restore_size, undo_dir
    from rmqtool.store.bounds import PlanSize

    plan_only(apply_, dry_run)
    manifest = read_backup(backup)
    title = f"{manifest.get('label', 'change')} of {manifest.get('created', '?')}"
    with _store(str(store or manifest["store"]), write=apply_, force=force) as st:
        root = st.root
        rows = restore_plan(backup, root)
        size, given = restore_size(backup, root, rows), PlanSize()
        given.add_tree(backup)                    # the input: the backup
        check = _bound(root, "restore", allow_large, given.files, given.data)
        if not apply_:
            show_plan(_with_total(rows, size), fmt, tablefmt, f"restore plan ({title})")
            if rows:
                _refused_dry_run(check, size)
            end_dry_run(rows, "run with --apply")
        if not rows:
            click.echo("nothing to restore: the store matches the backup", err=True)
            return
        check(size)
        saved = restore_backup(backup, root, undo_dir(backup))
    show_plan(_with_total(rows, size), fmt, tablefmt, f"restored ({title})")
    say_undo(f"restored {len(rows)} path(s) from {backup}", saved, root)
