"""5.x static topics: config/topicQueueMapping.json as ``TopicQueueMappingManager.encode(true)`` writes it
(remoting ``protocol/statictopic``: ``TopicQueueMappingDetail``, ``LogicQueueMappingItem``).

A static topic has ``totalQueues`` logical queues spread over brokers; each broker's file holds, per logical
queue it hosts (``hostedQueues``, keyed by the logical id, unquoted in fastjson's text), the queue's items
from the oldest generation to the newest: (broker, physical queue id, logic offset, physical start/end
offset). The last item is the leader, the one sends go to; items of this broker name its physical queues.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from rmqtool.errors import FormatError
from rmqtool.format.fastjson import DataVersion, as_int, data_version

MAPPING_FILE = "topicQueueMapping.json"
DEFAULT_SCOPE = "__global__"          # MixAll.METADATA_SCOPE_GLOBAL


class LogicQueueMappingItem(NamedTuple):
    gen: int
    queue_id: int              # the physical queue id on ``bname``
    bname: str
    logic_offset: int          # the logical offset of the physical ``start_offset`` (-1: not decided yet)
    start_offset: int = 0
    end_offset: int = -1       # the physical end, excluded (-1: open)
    time_of_start: int = -1
    time_of_end: int = -1

    def static_offset_loosely(self, physical: int) -> int:
        """LogicQueueMappingItem.computeStaticQueueOffsetLoosely: the logical offset of physical queue offset
        ``physical`` as the send path answers it (-1 while the logic offset is undecided; clamped to the end)."""
        if self.logic_offset < 0:
            return -1
        if physical < self.start_offset:
            return self.logic_offset
        if self.start_offset <= self.end_offset < physical:
            return self.logic_offset + self.end_offset - self.start_offset
        return self.logic_offset + physical - self.start_offset

    def static_offset_strictly(self, physical: int) -> int:
        """LogicQueueMappingItem.computeStaticQueueOffsetStrictly: as queryConsumerOffset and pull answer a
        physical offset (not clamped)."""
        return self.logic_offset + max(physical - self.start_offset, 0)


class TopicQueueMappingDetail(NamedTuple):
    topic: str
    total_queues: int
    bname: str                                  # the broker this file belongs to
    epoch: int
    dirty: bool
    scope: str
    hosted_queues: dict[int, list[LogicQueueMappingItem]]     # logical queue id -> items, oldest first

    def physical_queues(self) -> dict[int, tuple[int, LogicQueueMappingItem]]:
        """Physical queue id -> (logical queue id, item) for every item naming a queue of this broker, of any
        generation (TopicQueueMappingUtils.checkIfReusePhysicalQueue forbids two items on one queue; should a
        damaged file have them, the last in file order is taken and verify reports it)."""
        return {item.queue_id: (logical, item) for logical, items in self.hosted_queues.items()
                for item in items if item.bname == self.bname}


class TopicQueueMappings(NamedTuple):
    data_version: DataVersion | None
    entries: dict[str, TopicQueueMappingDetail]       # topic -> its detail, in file order


def _object(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise FormatError(f"{what} is not an object")
    return value


def _item(value: Any, what: str) -> LogicQueueMappingItem:
    v = _object(value, what)
    bname = v.get("bname")
    if not isinstance(bname, str):
        raise FormatError(f"{what}.bname is not a string")
    return LogicQueueMappingItem(
        as_int(v.get("gen", 0), f"{what}.gen"), as_int(v.get("queueId", 0), f"{what}.queueId"), bname,
        as_int(v.get("logicOffset", 0), f"{what}.logicOffset"),
        as_int(v.get("startOffset", 0), f"{what}.startOffset"), as_int(v.get("endOffset", -1), f"{what}.endOffset"),
        as_int(v.get("timeOfStart", -1), f"{what}.timeOfStart"), as_int(v.get("timeOfEnd", -1), f"{what}.timeOfEnd"))


def decode_topic_queue_mapping(value: Any) -> TopicQueueMappings:
    """topicQueueMapping.json (TopicQueueMappingSerializeWrapper): ``dataVersion`` and
    ``topicQueueMappingInfoMap`` topic -> TopicQueueMappingDetail; fastjson's defaults for absent fields."""
    table = _object(_object(value, MAPPING_FILE).get("topicQueueMappingInfoMap") or {},
                    "topicQueueMappingInfoMap")
    out = {}
    for name, d in table.items():
        d = _object(d, f"topic {name!r}")
        hosted = {}
        for key, items in _object(d.get("hostedQueues") or {}, f"{name}.hostedQueues").items():
            logical = as_int(key, f"{name}.hostedQueues key")
            if not isinstance(items, list):
                raise FormatError(f"{name}.hostedQueues[{logical}] is not a list")
            hosted[logical] = [_item(it, f"{name}.hostedQueues[{logical}][{i}]") for i, it in enumerate(items)]
        bname, scope = d.get("bname"), d.get("scope", DEFAULT_SCOPE)
        if not isinstance(bname, str) or not isinstance(scope, str):
            raise FormatError(f"{name}.bname or .scope is not a string")
        out[name] = TopicQueueMappingDetail(
            str(d.get("topic", name)), as_int(d.get("totalQueues", 0), f"{name}.totalQueues"), bname,
            as_int(d.get("epoch", 0), f"{name}.epoch"), bool(d.get("dirty", False)), scope, hosted)
    return TopicQueueMappings(data_version(value), out)
