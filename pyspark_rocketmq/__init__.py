"""Makes ``spark.read.format("rocketmq")`` work in any SparkSession, with no rmqtool call first.

PySpark (4.0+) registers, when a session first looks up a Python data source, the ``DefaultSource`` of
every installed top-level module whose name starts with ``pyspark_`` (pyspark/sql/worker/
lookup_data_sources.py). An editable install (``pip install -e``) hides this module from that look-up
unless made with ``--config-settings editable_mode=compat``; there, call
``rmqtool.spark.session.setup(spark)`` once.
"""

from rmqtool.spark.datasource import RocketMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
