"""The Spark session rmqtool runs on: embedded ``local[*]`` by default, or an existing cluster.

The session has the UI off, quiet logs, UTC as session time zone, Python workers pinned to the running
interpreter (PySpark otherwise starts whatever ``python3`` is on PATH), the ``rmqtool`` package shipped
to the executors as a zip, filter pushdown to Python data sources on, and the ``rocketmq`` data source
registered (other sessions find it by name: ``pyspark_rocketmq``). One session per process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import warnings
import zipfile
from pathlib import Path

from rmqtool.errors import SparkUnavailable, first_line
from rmqtool.store.output import ScratchDir

MASTER_ENV = "RMQTOOL_SPARK_MASTER"
DEFAULT_MASTER = "local[*]"
MIN_JAVA = 17
# WARN at start-up (Spark announces any other default level of its shell), ERROR once running.
_LOG4J2 = """\
rootLogger.level = warn
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""

_JVM_BANNER = b"WARNING: Using incubator modules: jdk.incubator.vector\n"
_session = None
_workdir: ScratchDir | None = None


def resolve_master(master: str | None = None) -> str | None:
    """The master to ask for; None under spark-submit, whose own --master then applies."""
    return master or os.environ.get(MASTER_ENV) or (None if under_spark_submit() else DEFAULT_MASTER)


def under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ     # the JVM started this Python process


def check_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise SparkUnavailable("PySpark is not installed: install rmqtool[spark]") from None


def java_major_version(java: str) -> int:
    """The major version `java -version` reports (8 for "1.8.0_x", 17 for "17.0.2")."""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        raise SparkUnavailable(f"cannot tell the Java version of {java}: Java {MIN_JAVA}+ required")
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check_java() -> None:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home, "bin", "java")) if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        raise SparkUnavailable(f"Java not found (no java on PATH or in JAVA_HOME): Java {MIN_JAVA}+ required")
    try:
        major = java_major_version(java)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SparkUnavailable(f"cannot run {java}: {exc}: Java {MIN_JAVA}+ required") from None
    if major < MIN_JAVA:
        raise SparkUnavailable(f"{java} is Java {major}: Java {MIN_JAVA}+ required")


def _scratch() -> Path:
    global _workdir
    if _workdir is None:          # locked while this process lives, removed when it exits (a killed
        _workdir = ScratchDir("rmqtool-spark-")     # one's goes with the next process's)
    return _workdir.path


def package_zip() -> Path:
    """The rmqtool package as a zip for ``addPyFile`` (its .py files only)."""
    root = Path(__file__).resolve().parent.parent
    target = _scratch() / "rmqtool.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*.py")):
            zf.write(path, Path("rmqtool", path.relative_to(root)).as_posix())
    return target


def session_conf(master: str | None, progress: bool) -> dict[str, str]:
    log4j = _scratch() / "log4j2.properties"
    log4j.write_text(_LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
    conf = {
        "spark.app.name": "rmqtool",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": str(progress).lower(),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.python.filterPushdown.enabled": "true",     # the rocketmq source's pushFilters (4.1+)
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
    }
    if master:
        conf["spark.master"] = master
    if not os.environ.get("PYSPARK_PYTHON"):
        # Pin every Python worker (executors, data-source planners in the driver JVM) to this
        # interpreter: otherwise Spark starts whatever `python3` is first on PATH.
        conf["spark.pyspark.python"] = sys.executable
        conf["spark.pyspark.driver.python"] = sys.executable
        conf["spark.executorEnv.PYSPARK_PYTHON"] = sys.executable
    return conf


def get_session(master: str | None = None, *, progress: bool | None = None, data_source: bool = True):
    """The process's Spark session, started on first use (``master``, else $RMQTOOL_SPARK_MASTER,
    else ``local[*]``). An already running session is reused as it is. ``data_source``: with the
    ``rocketmq`` data source registered (the commands' jobs do without it: registering starts a Python
    process in the JVM that looks for installed data sources, seconds of a small job)."""
    global _session
    if _session is not None:
        if data_source:
            register_data_source(_session)
        return _session
    check_pyspark()
    # PySpark (up to 4.3) warns that it "does not yet fully support pandas >= 3.0.0" when it meets pandas 3;
    # the spark extra pins pandas < 3, and rmqtool hands pandas nothing (Arrow batches): not the user's concern.
    warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None:
        if not under_spark_submit():
            check_java()
        if progress is None:
            progress = sys.stderr.isatty()
        conf = session_conf(resolve_master(master), progress)
        builder = SparkSession.builder
        for key, value in conf.items():
            builder = builder.config(key, value)
        try:
            _start_quiet_jvm(conf)
            active = builder.getOrCreate()
        except Exception as exc:   # the JVM did not start or the master is unreachable
            raise SparkUnavailable(f"cannot start Spark ({resolve_master(master) or 'spark-submit'}): "
                                   f"{first_line(exc)}") from None
        active.sparkContext.setLogLevel("ERROR")
    _session = setup(active, data_source)
    return active


def _start_quiet_jvm(conf: dict[str, str]) -> None:
    """Start the driver JVM (once per process) with its stderr passed through a filter that drops
    the JVM's incubator-module banner; Spark's errors and progress bar still reach stderr."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    # PySpark keeps its gateway in SparkContext._gateway (launched on demand when None); without that
    # attribute (a future PySpark) the banner is simply left alone.
    if not hasattr(SparkContext, "_gateway") or SparkContext._gateway is not None or under_spark_submit():
        return
    if "spark.pyspark.python" in conf:   # the JVM's own Python runners read the environment
        os.environ.setdefault("PYSPARK_PYTHON", conf["spark.pyspark.python"])
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", conf["spark.pyspark.python"])
    gateway = launch_gateway(SparkConf().setAll(list(conf.items())), popen_kwargs={"stderr": subprocess.PIPE})
    threading.Thread(target=_pump, args=(gateway.proc.stderr,), daemon=True).start()
    SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm


def _pump(stream) -> None:
    """Copy the JVM's stderr to ours (fd 2, as the JVM itself would); keep draining even when that
    fails, so the JVM never blocks on a full pipe."""
    while chunk := os.read(stream.fileno(), 1 << 16):
        try:
            os.write(2, chunk.replace(_JVM_BANNER, b""))
        except OSError:
            pass


def setup(spark, data_source: bool = True):
    """Ship the package to the executors (unless it already runs from a shipped zip, as under
    ``spark-submit --py-files``) and, with ``data_source``, register the ``rocketmq`` data source;
    returns ``spark``."""
    import rmqtool

    if ".zip" not in rmqtool.__file__:
        spark.sparkContext.addPyFile(str(package_zip()))
    if data_source:
        register_data_source(spark)
    return spark


_registered: list = []      # the sessions the data source is registered in


def register_data_source(spark) -> None:
    if spark in _registered:
        return
    from rmqtool.spark.datasource import RocketMQDataSource
    spark.dataSource.register(RocketMQDataSource)
    _registered.append(spark)


def stop_session() -> None:
    global _session
    if _session is not None:
        _session.stop()
        _registered.clear()
        _session = None
