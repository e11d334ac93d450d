"""Makes ``spark.read.format("rocketmq")`` work in any SparkSession, with no rmqtool call first.

PySpark (4.0+) registers, when a session first looks up a Python data source, the ``DefaultSource`` of
every installed top-level module whose name starts with ``pyspark_`` (pyspark/sql/worker/
lookup_data_sources.py). An editable install (``pip install -e``) hides this module from that look-up
unless made with ``--config-settings editable_mode=compat``; there, call
``rmqtool.spark.session.setup(spark)`` once.

The look-up, and the planning of every Python data source, runs in a Python worker the driver's JVM
starts with ``$PYSPARK_DRIVER_PYTHON``, else ``$PYSPARK_PYTHON``, else the ``python3`` on PATH: a script
run as ``.venv/bin/python job.py`` without an activated virtualenv (cron) would get an interpreter
without rmqtool, and Spark's bare DATA_SOURCE_NOT_FOUND: the install's ``rmqtool-pyspark.pth`` pins those
workers to the interpreter that imports PySpark (rmqtool/spark/interpreter.py), and so does importing this
module before the session starts, where that file is not installed.
"""

from rmqtool.spark.datasource import RocketMQDataSource as DefaultSource
from rmqtool.spark.interpreter import pin_workers

pin_workers()

__all__ = ["DefaultSource"]
