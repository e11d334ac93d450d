"""The store's directory layout: every name below a store root, as relative POSIX paths, so that one
table serves local stores (``Store.path``) and remote ones (``rmqtool.ops.scan`` over a file system).

Names follow StorePathConfigHelper and the broker's config files (BrokerPathConfigHelper).
"""

from __future__ import annotations

import posixpath

from rmqtool import constants as C

COMMITLOG = "commitlog"
CONSUMEQUEUE = "consumequeue"
CONSUMEQUEUE_EXT = "consumequeue_ext"
BATCHCONSUMEQUEUE = "batchconsumequeue"
INDEX = "index"
CHECKPOINT = "checkpoint"
ABORT = "abort"
ABORT_BAK = "abort.bak"               # 5.x: what the restart leaves of the abort file
LOCK = "lock"
CONFIG = "config"
COMPACTION = "compaction"
COMPACTION_LOG = "compactionLog"       # below compaction/: <topic>/<queueId>/ (CompactionStore)
COMPACTION_CQ = "compactionCq"
POSITION_CHECKPOINT = "position-checkpoint"
TIMERLOG = "timerlog"
TIMERWHEEL = "timerwheel"
DLEDGER_PREFIX = "dledger-"           # dledger-<selfId>/{data,index,checkpoint,currterm}
DLEDGER_DATA = "data"
DLEDGER_INDEX = "index"
DLEDGER_CHECKPOINT = "checkpoint"
DLEDGER_CURRTERM = "currterm"
# storeType=defaultRocksDB: the broker/config/v1 managers' RocksDB databases below config/ (rocksdbConfigFilePath
# of RocksDBTopicConfigManager, RocksDBSubscriptionGroupManager, RocksDBConsumerOffsetManager), per JSON file
KV_CONFIG_DIRS = {"topics.json": "topics", "subscriptionGroup.json": "subscriptionGroups",
                  "consumerOffset.json": "consumerOffsets"}
KV_CONFIG_V2_DIR = "rdb"              # configManagerVersion=v2: one database for every table (ConfigStorage)
BROKER_PROPERTIES = "broker.properties"  # under config/: where the broker persists its configuration
SIZES_FILE = "config/rmqtool.json"    # the sizes chosen at init (the broker keeps them in its own config)

# The directories whose files the broker loads as its data (nothing else may be put there).
DATA_DIRS = (COMMITLOG, CONSUMEQUEUE, CONSUMEQUEUE_EXT, BATCHCONSUMEQUEUE, INDEX)


def join(*parts: str | int) -> str:
    return posixpath.join(*map(str, parts))


def commitlog_file(start: int) -> str:
    return join(COMMITLOG, C.offset_to_file_name(start))


def queue_dir(topic: str, queue_id: int | None = None, *, batch: bool = False) -> str:
    """``consumequeue/<topic>[/<queueId>]`` (``batchconsumequeue/`` for a BatchCQ topic)."""
    base = join(BATCHCONSUMEQUEUE if batch else CONSUMEQUEUE, topic)
    return base if queue_id is None else join(base, queue_id)


def queue_file(topic: str, queue_id: int, start: int, *, batch: bool = False) -> str:
    return join(queue_dir(topic, queue_id, batch=batch), C.offset_to_file_name(start))


def index_file(name: str) -> str:
    return join(INDEX, name)


def config_file(name: str) -> str:
    return join(CONFIG, name)
