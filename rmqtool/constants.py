"""Layout constants of the RocketMQ store, in one place for every decoder (record-at-a-time and columnar).

Names follow the Java sources (``CommitLog``, ``MessageDecoder``, ``MessageSysFlag``, ``ConsumeQueue``,
``IndexHeader``/``IndexFile``, ``StoreCheckpoint``); see the store-format reference for byte-level detail.
"""

from __future__ import annotations

import enum

# -- commit-log record (CommitLog / MessageDecoder) ------------------------------------------------
MESSAGE_MAGIC_CODE = 0xDAA320A7       # V1: 1-byte topic length
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB    # V2 (5.1+): 2-byte topic length
BLANK_MAGIC_CODE = 0xCBD43194         # end-of-file filler
END_FILE_MIN_BLANK_LENGTH = 8         # a message is written only if 8 bytes remain after it

# Fixed-position fields (same for every record).
TOTALSIZE_POS = 0
MAGICCODE_POS = 4
BODYCRC_POS = 8
QUEUEID_POS = 12
FLAG_POS = 16
QUEUEOFFSET_POS = 20
PHYSICALOFFSET_POS = 28
SYSFLAG_POS = 36
BORNTIMESTAMP_POS = 40
BORNHOST_POS = 48
# From BORNHOST on, positions depend on the host widths: see host_lengths().
IPV4_HOST_LEN = 8                     # 4-byte address + 4-byte port
IPV6_HOST_LEN = 20                    # 16-byte address + 4-byte port
# Sizes of the fixed part: 4+4+4+4+4+8+8+4+8 (up to BORNHOST) + 8 (STORETIMESTAMP) + 4 (RECONSUMETIMES)
# + 8 (PREPARED_TX_OFFSET) + 4 (BODYLEN) + 2 (PROPERTIESLEN) = 74, plus hosts and the topic-length field.
FIXED_WITHOUT_HOSTS = 74
MAX_PROPERTIES_LEN = 32767

NAME_VALUE_SEPARATOR = b"\x01"
PROPERTY_SEPARATOR = b"\x02"


class SysFlag(enum.IntFlag):
    """MessageSysFlag bits. Transaction type (bits 2-3) and compression type (bits 8-10) are fields."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    BORNHOST_V6 = 0x10
    STOREHOSTADDRESS_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80


TRANSACTION_MASK = 0xC
COMPRESSION_TYPE_MASK = 0x700


# rmqtool repair's placeholder for a damaged record it salvages: a rollback-type message on this topic
SALVAGED_TOPIC = "rmqtool-salvaged"


class TransactionType(enum.IntEnum):
    NOT_TYPE = 0x0
    PREPARED = 0x4
    COMMIT = 0x8
    ROLLBACK = 0xC


class CompressionType(enum.IntEnum):
    """(sysFlag & 0x700) >> 8; 0 also means ZLIB (CompressionType.findByValue)."""

    LZ4 = 1
    ZSTD = 2
    ZLIB = 3


def transaction_type(sys_flag: int) -> TransactionType:
    return TransactionType(sys_flag & TRANSACTION_MASK)


def compression_type(sys_flag: int) -> CompressionType:
    value = (sys_flag & COMPRESSION_TYPE_MASK) >> 8
    return CompressionType.ZLIB if value in (0, 3) else CompressionType(value)


def host_lengths(sys_flag: int) -> tuple[int, int]:
    """(born host length, store host length) chosen independently by the two v6 bits."""
    born = IPV6_HOST_LEN if sys_flag & SysFlag.BORNHOST_V6 else IPV4_HOST_LEN
    store = IPV6_HOST_LEN if sys_flag & SysFlag.STOREHOSTADDRESS_V6 else IPV4_HOST_LEN
    return born, store


def topic_length_size(magic_code: int) -> int:
    return 2 if magic_code == MESSAGE_MAGIC_CODE_V2 else 1


def record_length(sys_flag: int, magic_code: int, body_len: int, topic_len: int, properties_len: int) -> int:
    """CommitLog.calMsgLength: the TOTALSIZE a record with these parts must have."""
    born, store = host_lengths(sys_flag)
    return (FIXED_WITHOUT_HOSTS + born + store + topic_length_size(magic_code)
            + body_len + topic_len + properties_len)


# -- property keys (MessageConst) ------------------------------------------------------------------
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_CRC32 = "__CRC32#"                         # 5.2+ whole-record CRC (enabledAppendPropCRC)
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"      # the original topic of a retry / DLQ message
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_MSG_REGION = "MSG_REGION"                   # the broker's regionId (BrokerConfig)
PROPERTY_TRACE_SWITCH = "TRACE_ON"                   # the broker's traceOn, "true" / "false"
DEFAULT_TRACE_REGION_ID = "DefaultRegion"            # MixAll.DEFAULT_TRACE_REGION_ID: BrokerConfig.regionId's default
PROPERTY_INNER_NUM = "INNER_NUM"                     # inner batch: message count
PROPERTY_INNER_BASE = "INNER_BASE"                   # inner batch: first queue offset
PROPERTY_INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"          # LMQ: queue names
PROPERTY_INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"  # LMQ: one queue offset per name
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"  # a re-put half: the original's queue offset
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
MULTI_DISPATCH_QUEUE_SPLITTER = ","
LMQ_PREFIX = "%LMQ%"
KEY_SEPARATOR = " "

# -- system topics (TopicValidator) ----------------------------------------------------------------
RMQ_SYS_SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
RMQ_SYS_TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
RMQ_SYS_TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_OP_REMOVE_TAG = "d"                      # TransactionalMessageUtil.REMOVE_TAG: an op record closing halves
TRANS_CHECK_GROUP = "CID_RMQ_SYS_TRANS"        # MixAll.CID_SYS_RMQ_TRANS: the check's progress in the half queue
RMQ_SYS_WHEEL_TIMER_TOPIC = "rmq_sys_wheel_timer"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
TOPIC_MAX_LENGTH_V1 = 127

# MessageStoreConfig.messageDelayLevel default
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

# -- consume queue (ConsumeQueue / ConsumeQueueExt) ------------------------------------------------
CQ_STORE_UNIT_SIZE = 20
CQ_FILLER_SIZE = 0x7FFFFFFF           # fillPreBlank units: (0, 0x7FFFFFFF, 0)
CQ_EXT_MAX_ADDR = -2147483649         # ConsumeQueueExt.MAX_ADDR = Integer.MIN_VALUE - 1
CQ_EXT_MIN_UNIT_SIZE = 20
CQ_EXT_END_BLANK_DATA_LENGTH = 4

# -- batch consume queue (BatchConsumeQueue, 5.x) --------------------------------------------------
BCQ_STORE_UNIT_SIZE = 46
BCQ_INVALID_POS = -1                  # compactedOffset as written
DEFAULT_BCQ_FILE_SIZE = 300_000 * BCQ_STORE_UNIT_SIZE   # MessageStoreConfig.mapperFileSizeBatchConsumeQueue

# -- index file (IndexHeader / IndexFile) ----------------------------------------------------------
INDEX_HEADER_SIZE = 40
INDEX_HASH_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20
INDEX_MAX_MSGS_NUM_BATCH = 64         # IndexService.queryOffset caps maxNum at maxMsgsNumBatch
DEFAULT_MAX_HASH_SLOT_NUM = 5_000_000
DEFAULT_MAX_INDEX_NUM = 5_000_000 * 4

# -- checkpoint (StoreCheckpoint) ------------------------------------------------------------------
CHECKPOINT_FILE_SIZE = 4096

# -- default file sizes (MessageStoreConfig) -------------------------------------------------------
DEFAULT_COMMITLOG_FILE_SIZE = 1024 * 1024 * 1024
DEFAULT_CQ_FILE_SIZE = 300_000 * CQ_STORE_UNIT_SIZE
FILE_NAME_DIGITS = 20


def offset_to_file_name(offset: int) -> str:
    """UtilAll.offset2FileName: 20 zero-padded decimal digits."""
    return f"{offset:020d}"
