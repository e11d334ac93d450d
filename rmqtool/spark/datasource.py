"""The ``rocketmq`` PySpark Python Data Source.

    spark.read.format("rocketmq").load("/data/broker-a/store")
    spark.read.format("rocketmq").option("kind", "consumequeue").load(["/data/*/store"])

Options: ``kind`` = commitlog (default) | consumequeue | index; ``checkCrc`` and ``decompress``
(true/false, commit log only); ``mode`` = failfast (default: a damaged record fails the query with its
file and offset) | permissive (a damaged record ends its file; the records before it are read). Paths: one or several, local or any URI pyarrow.fs opens, with globs.
One input partition per store file; each yields Arrow record batches, plus the columns ``store`` and
``commitlog_file`` (``cq_file`` / ``index_file`` for the other kinds).
"""

from __future__ import annotations

import json

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from rmqtool.ops import scan

MODES = ("failfast", "permissive")


def _flag(options, name: str) -> bool:
    value = str(options.get(name, options.get(name.lower(), "false"))).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {name} must be true or false, not {value!r}")
    return value == "true"


def paths_option(options) -> list[str]:
    """`load(path)` gives ``path``; `load([p, q])` gives ``paths`` as a JSON array."""
    paths = []
    if options.get("paths"):
        paths += json.loads(options["paths"])
    if options.get("path"):
        paths.append(options["path"])
    if not paths:
        raise ValueError("rocketmq data source: no path given (use .load(path) or .load([paths]))")
    return paths


class RocketMQDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def _choice(self, name: str, choices: tuple[str, ...]) -> str:
        value = str(self.options.get(name, choices[0])).lower()
        if value not in choices:
            raise ValueError(f"option {name} must be one of {', '.join(choices)}, not {value!r}")
        return value

    def schema(self):
        from rmqtool.spark.schema import spark_schema

        return spark_schema(self._choice("kind", scan.KINDS), _flag(self.options, "checkCrc"))

    def reader(self, schema):
        return RocketMQReader(paths_option(self.options), self._choice("kind", scan.KINDS),
                              _flag(self.options, "checkCrc"), _flag(self.options, "decompress"),
                              self._choice("mode", MODES) == "permissive")


class FilePartition(InputPartition):
    def __init__(self, file: scan.StoreFile):
        super().__init__(file)


class RocketMQReader(DataSourceReader):
    def __init__(self, paths: list[str], kind: str, check_crc: bool, decompress: bool, permissive: bool):
        self.paths, self.kind, self.check_crc, self.decompress = paths, kind, check_crc, decompress
        self.permissive = permissive

    def partitions(self):
        return [FilePartition(f) for f in scan.list_files(self.paths, self.kind)]

    def read(self, partition):
        from rmqtool.spark.schema import file_batches

        yield from file_batches(partition.value, self.kind, check_crc=self.check_crc, decompress=self.decompress,
                                on_damage=(lambda exc: None) if self.permissive else None)
