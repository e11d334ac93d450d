"""Which topics are BatchCQ topics: their consume queues are batch queues (``batchconsumequeue/``)."""

from __future__ import annotations

from rmqtool.errors import RmqError
from rmqtool.store.metadata import topic_table
from rmqtool.store.store import Store


def batch_cq_topics(store: Store) -> set[str]:
    """Topics with ``batchconsumequeue/`` directories, and those the topic table (config/topics.json or
    its .bak) gives ``queue.type=BatchCQ``; an unreadable table adds none."""
    out = set(store.batch_topics())
    try:
        table = topic_table(store) or {}
    except RmqError:
        return out
    return out | {name for name, conf in table.items() if conf.queue_type == "BatchCQ"}
