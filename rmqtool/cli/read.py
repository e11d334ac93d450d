"""Read-only commands: info (more in the read-commands issue)."""

from __future__ import annotations

import click

from rmqtool.cli import cli
from rmqtool.cli.output import output_options, resolve_format, write_record
from rmqtool.store.store import Store


@cli.command()
@click.argument("store", type=click.Path())
@output_options
def info(store: str, fmt: str | None, tablefmt: str) -> None:
    """Summarise a store: commit log, consume queues, index files, checkpoint."""
    st = Store.open(store)
    cl = st.commitlog
    records = blanks = 0
    end = cl.min_offset
    topics: dict[str, int] = {}
    for loc in cl.iter_entries():
        end = loc.offset + loc.entry.total_size
        if hasattr(loc.entry, "topic"):
            records += 1
            topics[loc.entry.topic] = topics.get(loc.entry.topic, 0) + 1
        else:
            blanks += 1
    cp = st.checkpoint()
    row = {
        "store": str(st.root),
        "commitlog_files": len(cl.queue),
        "commitlog_file_size": cl.file_size,
        "min_physical_offset": cl.min_offset,
        "written_end": end,
        "messages": records,
        "blanks": blanks,
        "topics": len(topics),
        "consume_queues": len(st.consume_queues()),
        "index_files": len(st.index_files()),
        "physic_msg_timestamp": cp.physic_msg_timestamp if cp else None,
        "logics_msg_timestamp": cp.logics_msg_timestamp if cp else None,
        "index_msg_timestamp": cp.index_msg_timestamp if cp else None,
        "abort": st.abort_path.exists(),
    }
    write_record(row, resolve_format(fmt), tablefmt=tablefmt)
