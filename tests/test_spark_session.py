"""Session handling without starting Spark: configuration, engine choice, and one-line errors when
PySpark or Java is missing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT, store_path
from rmqtool.errors import SparkUnavailable
from rmqtool.spark import AUTO_SPARK_BYTES, pick_engine
from rmqtool.spark import session

pytestmark = pytest.mark.spark


def test_conf_pins_python_and_quiets_spark(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    conf = session.session_conf("local[2]", progress=False)
    assert conf["spark.master"] == "local[2]"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.pyspark.python"] == sys.executable
    assert "log4j2.configurationFile" in conf["spark.driver.extraJavaOptions"]


def test_master_from_option_env_or_default(monkeypatch):
    monkeypatch.delenv(session.MASTER_ENV, raising=False)
    assert session.resolve_master() == "local[*]"
    monkeypatch.setenv(session.MASTER_ENV, "spark://10.0.0.1:7077")
    assert session.resolve_master() == "spark://10.0.0.1:7077"
    assert session.resolve_master("local[2]") == "local[2]"


def test_package_zip_holds_the_package():
    import zipfile

    names = zipfile.ZipFile(session.package_zip()).namelist()
    assert "rmqtool/spark/datasource.py" in names and "rmqtool/columnar/__init__.py" in names


def test_auto_engine(monkeypatch):
    monkeypatch.delenv(session.MASTER_ENV, raising=False)
    assert pick_engine("auto", 10 << 20) == "local"
    assert pick_engine("auto", AUTO_SPARK_BYTES) == "spark"
    assert pick_engine("auto", 10 << 20, "spark://h:7077") == "spark"
    assert pick_engine("local", AUTO_SPARK_BYTES * 2) == "local"
    monkeypatch.setitem(sys.modules, "pyspark", None)          # not installed: auto stays local
    assert pick_engine("auto", AUTO_SPARK_BYTES) == "local"


def test_missing_pyspark(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspark", None)
    with pytest.raises(SparkUnavailable, match=r"install rmqtool\[spark\]"):
        session.check_pyspark()


@pytest.mark.parametrize("version, ok", [('openjdk version "17.0.15" 2025-04-15', True),
                                         ('java version "1.8.0_292"', False),
                                         ('openjdk version "11.0.2" 2019-01-15', False),
                                         ('openjdk version "21" 2023-09-19', True)])
def test_java_version(tmp_path, monkeypatch, version, ok):
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text(f"#!/bin/sh\necho '{version}' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    if ok:
        session.check_java()
    else:
        with pytest.raises(SparkUnavailable, match=r"Java 17\+ required"):
            session.check_java()


def test_cli_without_java_is_one_line(tmp_path):
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "nowhere"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "rmqtool", "stats", str(store_path("dev-sample")),
                           "--engine", "spark"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 4
    assert proc.stderr.splitlines() == [
        "rmqtool: error: Java not found (no java on PATH or in JAVA_HOME): Java 17+ required"]
    assert proc.stdout == ""
