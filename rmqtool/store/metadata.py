"""The broker's metadata in ``config/``: topics.json, subscriptionGroup.json, consumerOffset.json (or
lmqConsumerOffset.json), delayOffset.json and topicQueueMapping.json (``TopicConfigManager``,
``SubscriptionGroupManager``, ``ConsumerOffsetManager`` / ``LmqConsumerOffsetManager``,
``ScheduleMessageService``, ``TopicQueueMappingManager``), each loaded as ``ConfigManager.load`` does
(``.bak`` fallback), or, on a broker with ``storeType=defaultRocksDB``, the first three from the RocksDB
databases of the ``broker/config/v1`` managers (``load``); and the consume queues' max offsets that consumer
lag is measured against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from rmqtool import constants as C
from rmqtool.format.batchcq import decode_unit as decode_bcq_unit
from rmqtool.errors import FormatError, RmqError, StoreError
from rmqtool.format.consumequeue import UNIT
from rmqtool.format.fastjson import DataVersion, as_int, data_version
from rmqtool.format.statictopic import MAPPING_FILE, TopicQueueMappingDetail, decode_topic_queue_mapping
from rmqtool.store.config import Loaded, load_config, load_kv_config, read_config
from rmqtool.store import layout as L
from rmqtool.store.filequeue import FileQueue
from rmqtool.store.store import Store

QUEUE_TYPE_ATTRIBUTE = "queue.type"
DEFAULT_QUEUE_TYPE = "SimpleCQ"          # TopicAttributes.QUEUE_TYPE_ATTRIBUTE's default
CLEANUP_POLICY_ATTRIBUTE = "cleanup.policy"
DEFAULT_CLEANUP_POLICY = "DELETE"        # TopicAttributes.CLEANUP_POLICY_ATTRIBUTE's default
TOPIC_GROUP_SEPARATOR = "@"
PERM_READ, PERM_WRITE, PERM_INHERIT = 0x4, 0x2, 0x1


class TopicConfig(NamedTuple):
    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_filter_type: str
    topic_sys_flag: int
    order: bool
    attributes: dict[str, str]

    @property
    def queue_type(self) -> str:
        return self.attributes.get(QUEUE_TYPE_ATTRIBUTE, DEFAULT_QUEUE_TYPE)

    @property
    def cleanup_policy(self) -> str:
        """CleanupPolicyUtils.getDeletePolicy: COMPACTION makes DefaultMessageStore.getMessage read the
        topic from its compaction logs (CompactionStore); DELETE by default."""
        return self.attributes.get(CLEANUP_POLICY_ATTRIBUTE, DEFAULT_CLEANUP_POLICY)

    @property
    def perm_text(self) -> str:
        """PermName.perm2String: R, W, X (inherit) or '-'."""
        return "".join(c if self.perm & bit else "-"
                       for c, bit in (("R", PERM_READ), ("W", PERM_WRITE), ("X", PERM_INHERIT)))


class Table(NamedTuple):
    data_version: DataVersion | None
    entries: dict                      # name -> value, in file order
    forbidden: dict = {}               # subscription groups: group -> {topic: forbidden bits}


def _object(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise FormatError(f"{what} is not an object")
    return value


def decode_topics(value: Any) -> Table:
    """topics.json: ``{"dataVersion":…,"topicConfigTable":{name:TopicConfig}}``."""
    table = _object(_object(value, "topics.json").get("topicConfigTable", {}), "topicConfigTable")
    topics = {}
    for name, tc in table.items():
        tc = _object(tc, f"topic {name!r}")
        topics[name] = TopicConfig(
            tc.get("topicName", name), as_int(tc.get("readQueueNums", 16), f"{name}.readQueueNums"),
            as_int(tc.get("writeQueueNums", 16), f"{name}.writeQueueNums"), as_int(tc.get("perm", 6), f"{name}.perm"),
            str(tc.get("topicFilterType", "SINGLE_TAG")), as_int(tc.get("topicSysFlag", 0), f"{name}.topicSysFlag"),
            bool(tc.get("order", False)), dict(_object(tc.get("attributes") or {}, f"{name}.attributes")))
    return Table(data_version(value), topics)


def decode_groups(value: Any) -> Table:
    """subscriptionGroup.json: group name -> its SubscriptionGroupConfig fields as stored (camelCase), and
    the forbiddenTable (5.x; SubscriptionGroupManager.updateForbidden sets bit ``1 << forbiddenIndex``)."""
    table = _object(_object(value, "subscriptionGroup.json").get("subscriptionGroupTable", {}),
                    "subscriptionGroupTable")
    forbidden = {group: {t: as_int(bits, f"forbidden {group}/{t}") for t, bits in _object(topics, group).items()}
                 for group, topics in _object(value.get("forbiddenTable") or {}, "forbiddenTable").items()}
    return Table(data_version(value), {name: _object(g, f"group {name!r}") for name, g in table.items()}, forbidden)


def decode_consumer_offsets(value: Any) -> Table:
    """consumerOffset.json: (topic, group) -> {queueId: committed offset}; keys are ``topic@group``."""
    table = _object(_object(value, "consumerOffset.json").get("offsetTable", {}), "offsetTable")
    out = {}
    for key, queues in table.items():
        topic, sep, group = key.partition(TOPIC_GROUP_SEPARATOR)
        if not sep:
            raise FormatError(f"offsetTable key {key!r} is not topic@group")
        out[(topic, group)] = {as_int(q, f"{key} queue id"): as_int(o, f"{key} offset")
                               for q, o in _object(queues, key).items()}
    return Table(data_version(value), out)


def decode_lmq_consumer_offsets(value: Any) -> Table:
    """lmqConsumerOffset.json (5.x LmqConsumerOffsetManager, a broker with ``enableLmq``): the classic
    ``offsetTable`` plus ``lmqOffsetTable``, ``topic@group`` -> offset for ``%LMQ%`` groups, which
    LmqConsumerOffsetManager.queryOffset answers for queue 0 only (an LMQ has one queue)."""
    table = decode_consumer_offsets(_object(value, "lmqConsumerOffset.json"))
    out = dict(table.entries)
    for key, offset in _object(value.get("lmqOffsetTable") or {}, "lmqOffsetTable").items():
        topic, sep, group = key.partition(TOPIC_GROUP_SEPARATOR)
        if not sep:
            raise FormatError(f"lmqOffsetTable key {key!r} is not topic@group")
        out[(topic, group)] = {0: as_int(offset, f"{key} offset")}
    return Table(table.data_version, out)


def decode_delay_offsets(value: Any) -> Table:
    """delayOffset.json: delay level -> offset in SCHEDULE_TOPIC_XXXX queue level-1."""
    table = _object(_object(value, "delayOffset.json").get("offsetTable", {}), "offsetTable")
    return Table(data_version(value), {as_int(k, "delay level"): as_int(v, f"level {k} offset")
                                       for k, v in table.items()})


CONFIG_FILES = {"topics.json": decode_topics, "subscriptionGroup.json": decode_groups,
                "consumerOffset.json": decode_consumer_offsets,
                "lmqConsumerOffset.json": decode_lmq_consumer_offsets, "delayOffset.json": decode_delay_offsets,
                MAPPING_FILE: decode_topic_queue_mapping}


def load(store: Store, name: str) -> Loaded[Table] | None:
    """One of CONFIG_FILES, as the broker loads it; None when the store has neither it nor its .bak (nor,
    on a RocksDB-config store, its database). Topics, groups and consumer offsets come from the RocksDB
    databases when the store has them (``kv_config_store``: load_kv_config, then the JSON merge)."""
    if not store.is_store_root:
        return None
    if name in L.KV_CONFIG_DIRS and kv_config_store(store):
        return _load_kv(store, name)
    return load_config(store.path(L.config_file(name)), CONFIG_FILES[name])


def kv_config_store(store: Store) -> bool:
    """Whether the broker keeps topics, groups and offsets in RocksDB (storeType=defaultRocksDB: the
    BrokerController constructor takes RocksDBTopicConfigManager, RocksDBSubscriptionGroupManager and
    RocksDBConsumerOffsetManager): one of their databases is there. A configManagerVersion=v2 database
    (config/rdb, ConfigStorage) is refused: its tables are not read here."""
    from rmqtool.store.rocksdbcq import is_rocksdb_dir

    if not store.is_store_root:
        return False
    config = store.path(L.CONFIG)
    v2 = config / L.KV_CONFIG_V2_DIR
    if v2.is_dir() and is_rocksdb_dir(v2):
        raise StoreError("a configManagerVersion=v2 config database (ConfigStorage: TopicConfigManagerV2, "
                         "SubscriptionGroupManagerV2, ConsumerOffsetManagerV2): rmqtool does not read its topics, "
                         "groups and offsets", path=str(v2))
    return any((config / d).is_dir() and is_rocksdb_dir(config / d) for d in L.KV_CONFIG_DIRS.values())


def _load_kv(store: Store, name: str) -> Loaded[Table]:
    """RocksDB{Topic,SubscriptionGroup}Manager / RocksDBConsumerOffsetManager.load: the database, then
    merge(): when the JSON file (config/<name>) holds a dataVersion counter above the database's, the
    JSON table (ConfigManager.load, .bak fallback) is put over the database's (topics, groups and the
    forbidden table: putAll; offsets: ConsumerOffsetManager.decode replaces the table) and the counter
    becomes the JSON's + 1 (updateDataVersion; its timestamp, the load time, is left 0). Then the topic
    manager's init() puts rmq_sys_wheel_timer (timerWheelEnable, true by default) into the table alone,
    never into the database (TopicConfigManager.init: topicConfigTable.put)."""
    decode = CONFIG_FILES[name]
    path = store.path(L.config_file(L.KV_CONFIG_DIRS[name]))
    loaded = load_kv_config(path, _KV_TABLES[name], decode,
                            value=_offset_wrapper if name == "consumerOffset.json" else lambda v: v)
    if loaded is None:      # the broker creates an empty database there (setCreateIfMissing)
        loaded = Loaded(decode({}), path)
    table, reason = loaded.value, None
    json_path = store.path(L.config_file(name))
    kv_counter = table.data_version.counter if table.data_version else 0
    json_counter = _json_counter(json_path)
    if json_counter > kv_counter:
        json = load_config(json_path, decode)
        if json is not None:
            jt = json.value
            entries = jt.entries if name == "consumerOffset.json" else {**table.entries, **jt.entries}
            table = Table(DataVersion(0, 0, json_counter + 1), entries, {**table.forbidden, **jt.forbidden})
            reason = (f"{name} (dataVersion counter {json_counter}) is newer than the database (counter "
                      f"{kv_counter}): merged into the table as the broker's load does")
    if name == "topics.json":
        timer = C.RMQ_SYS_WHEEL_TIMER_TOPIC
        table = table._replace(entries={**table.entries, timer: _system_topic(timer)})
    return Loaded(table, path, reason)


_KV_TABLES = {"topics.json": "topicConfigTable", "subscriptionGroup.json": "subscriptionGroupTable",
              "consumerOffset.json": "offsetTable"}


def _offset_wrapper(value: Any) -> dict:
    """RocksDBOffsetSerializeWrapper: ``{"offsetTable":{queueId: offset}}``."""
    return _object(_object(value, "offset value").get("offsetTable", {}), "offsetTable")


def _json_counter(path: Path) -> int:
    """TopicConfigManager/SubscriptionGroupManager/ConsumerOffsetManager.loadDataVersion: the counter of the
    JSON file's dataVersion (the file alone, no .bak; 0 without one). A file that does not parse fails
    the load."""
    if not path.is_file():
        return 0
    try:
        value = read_config(path)
        dv = data_version(value) if isinstance(value, dict) else None
    except FormatError as exc:
        raise StoreError(f"{exc.message} (read for its dataVersion beside the RocksDB database: the broker's "
                         "load fails)", path=str(path), offset=exc.offset) from None
    return dv.counter if dv else 0


def _system_topic(name: str) -> TopicConfig:
    """``new TopicConfig(name)`` with 1 read and 1 write queue, as TopicConfigManager.init makes them."""
    return TopicConfig(name, 1, 1, PERM_READ | PERM_WRITE, "SINGLE_TAG", 0, False, {})


def consumer_offsets(store: Store) -> Loaded[Table] | None:
    """The consumer offsets the broker loads: BrokerController builds an LmqConsumerOffsetManager when
    ``enableLmq`` is set, whose configFilePath is config/lmqConsumerOffset.json (every group's offsets,
    and no consumerOffset.json is written), else a ConsumerOffsetManager on config/consumerOffset.json.
    Offline the setting is unknown: the LMQ file is read when it (or its .bak) exists. A RocksDB-config
    store always has RocksDBConsumerOffsetManager (the LMQ setting changes only the topic and group
    managers there)."""
    if kv_config_store(store):
        return load(store, "consumerOffset.json")
    return load(store, "lmqConsumerOffset.json") or load(store, "consumerOffset.json")


def topic_table(store: Store) -> dict[str, TopicConfig] | None:
    """Topic name -> TopicConfig from config/topics.json (or its .bak); None when there is none."""
    loaded = load(store, "topics.json")
    return loaded.value.entries if loaded is not None else None


def static_topics(store: Store) -> dict[str, TopicQueueMappingDetail]:
    """The static topics (5.x TopicQueueMappingManager, config/topicQueueMapping.json or its .bak): topic ->
    this broker's mapping; none when the file is absent or unreadable (verify reports that)."""
    try:
        loaded = load(store, MAPPING_FILE)
    except RmqError:
        return {}
    return loaded.value.entries if loaded is not None else {}


def batch_cq_topics(store: Store) -> set[str]:
    """Which topics are BatchCQ topics (their queues live in ``batchconsumequeue/``): those with such
    directories, and those the topic table gives ``queue.type=BatchCQ``; an unreadable table adds none."""
    out = set(store.batch_topics())
    try:
        table = topic_table(store) or {}
    except RmqError:
        return out
    return out | {name for name, conf in table.items() if conf.queue_type == "BatchCQ"}


def known_topics(store: Store) -> list[str]:
    """Every topic the store knows, sorted: its consume queues (``consumequeue/`` directories or the RocksDB
    consume queue, LMQs among them), ``batchconsumequeue/``, the topic table and the consumer offsets
    (``lmqConsumerOffset.json`` names LMQs); an unreadable config file adds none. A topic deleted from all
    of them (AdminBrokerProcessor.deleteTopic) keeps its records and index entries but is not known."""
    names = set(store.topics()) | set(store.batch_topics())
    try:
        names |= set(topic_table(store) or ())
    except RmqError:
        pass
    try:
        offsets = consumer_offsets(store)
    except RmqError:
        offsets = None
    if offsets is not None:
        names |= {topic for topic, _ in offsets.value.entries}
    return sorted(names)


# -- consume-queue max offsets ----------------------------------------------------------------------


def cq_max_offset(store: Store, topic: str, queue_id: int, phy_end: int | None = None) -> int | None:
    """ConsumeQueue/BatchConsumeQueue.getMaxOffsetInQueue after the broker's recovery (which walks the
    last three files up to the first invalid unit); None when the queue has no directory.

    ``phy_end``: the commit log's recovered end; units pointing at or after it are dropped, as
    ConsumeQueue/BatchConsumeQueue.truncateDirtyLogicFiles does (``offset >= phyOffset``) after
    CommitLog.recoverNormally/recoverAbnormally.
    """
    if store.consumequeue_is_rocksdb:
        db = store.rocksdb_consumequeue
        return db.queue(topic, queue_id).max_offset if queue_id in db.queue_ids(topic) else None
    classic = store.root / "consumequeue" / topic / str(queue_id)
    batch = store.root / "batchconsumequeue" / topic / str(queue_id)
    if classic.is_dir():
        queue = FileQueue.from_dir(classic)
        end = _recovered_end(queue, C.CQ_STORE_UNIT_SIZE, _classic_valid)
        return _truncated_end(queue, end, C.CQ_STORE_UNIT_SIZE, phy_end, _classic_phy) // C.CQ_STORE_UNIT_SIZE
    if batch.is_dir():
        queue = FileQueue.from_dir(batch)
        end = bcq_recovered_end(queue, phy_end)
        if end == queue.min_offset:
            return 0
        f, pos = queue.locate(end - C.BCQ_STORE_UNIT_SIZE)
        return decode_bcq_unit(f.read(), pos).next_offset
    return None


def bcq_recovered_end(queue: FileQueue, phy_end: int | None = None) -> int:
    """The byte offset after the last unit a 5.x broker keeps of a batch queue on start:
    BatchConsumeQueue.recover reads from the third-last file up to the first unit failing offset >= 0,
    size > 0, msgBaseOffset >= 0, batchSize > 0 (truncateDirtyFiles there), then truncateDirtyLogicFiles
    drops, from the last file back, the units whose record starts at or after ``phy_end`` (a last file
    whose first unit does is deleted)."""
    end = _recovered_end(queue, C.BCQ_STORE_UNIT_SIZE, _batch_valid)
    return _truncated_end(queue, end, C.BCQ_STORE_UNIT_SIZE, phy_end, _batch_phy)


def _classic_phy(buf, pos: int) -> int:
    return UNIT.unpack_from(buf, pos)[0]


def _batch_phy(buf, pos: int) -> int:
    return decode_bcq_unit(buf, pos).physical_offset


def _truncated_end(queue: FileQueue, end: int, unit: int, phy_end: int | None, phy) -> int:
    """``end`` moved back over the units whose record starts at or after ``phy_end``."""
    if phy_end is None:
        return end
    while end > queue.min_offset:
        f, pos = queue.locate(end - unit)
        if phy(f.read(), pos) < phy_end:
            break
        end -= unit
    return end


def _classic_valid(buf, pos: int) -> bool:
    phy, size, _ = UNIT.unpack_from(buf, pos)
    return phy >= 0 and size > 0


def _batch_valid(buf, pos: int) -> bool:
    return decode_bcq_unit(buf, pos).is_valid


def _recovered_end(queue: FileQueue, unit: int, valid) -> int:
    """The byte offset after the last valid unit, walking from the third-last file as recover() does."""
    files = queue.files
    if not files:
        return 0
    end = files[max(0, len(files) - 3)].start
    for f in files[max(0, len(files) - 3):]:
        buf = f.read()
        pos = 0
        while pos + unit <= len(buf) and valid(buf, pos):
            pos += unit
        end = f.start + pos
        if pos < len(buf):
            break
    return end
