"""The settings ``endpoint_runtime.analytics.session.start`` gives Spark, read from the session
builder without starting a JVM: the chmod-free local file system only where one JVM runs the
driver and the tasks and no other source of settings could replace its class path; the user's
own class path, file system and DataFrame debugging kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from endpoint_runtime.analytics import local_files, session
from endpoint_runtime.analytics.prerequisites import Prerequisites

JAR = Path("/cache/posix-local-fs.jar")
DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"


class Started(Exception):
    """Raised instead of starting Spark, once the builder holds every setting."""


@pytest.fixture
def options(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    captured: dict[str, str] = {}

    def get_or_create(builder: SparkSession.Builder) -> SparkSession:
        captured.update(builder._options)  # type: ignore[attr-defined]
        raise Started

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", get_or_create)
    monkeypatch.setattr(local_files, "jar", lambda java: JAR)
    for name in ("PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT", "SPARK_CONF_DIR", "SPARK_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON", "JAVA_HOME"):  # start() may set them
        monkeypatch.setenv(name, os.environ.get(name, "unset-by-the-test"))
    return captured


def start(master: str, conf: list[tuple[str, str]] | None = None) -> None:
    with pytest.raises(Started):
        session.start(master, Prerequisites(java="/usr/bin/java", java_version=17, jars=()),
                      conf or [])


def test_local_mode_gets_the_file_system_after_the_users_class_path(
        options: dict[str, str]) -> None:
    start("local[2]", [(local_files.CLASS_PATH_KEY, "/opt/mine.jar")])
    assert options[local_files.FILE_SYSTEM_KEY] == local_files.CLASS
    assert options[local_files.CLASS_PATH_KEY] == f"/opt/mine.jar{os.pathsep}{JAR}"
    assert options[DEBUGGING] == "false"


@pytest.mark.parametrize("master", ["local-cluster[2,1,1024]", "spark://head:7077", "yarn"])
def test_executors_in_other_jvms_keep_hadoops_file_system(
        options: dict[str, str], master: str) -> None:
    start(master)
    assert local_files.FILE_SYSTEM_KEY not in options
    assert local_files.CLASS_PATH_KEY not in options


def test_settings_from_elsewhere_keep_hadoops_file_system(
        options: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-class-path /opt/x.jar pyspark-shell")
    start("local[2]", [(local_files.CLASS_PATH_KEY, "/opt/mine.jar")])
    assert local_files.FILE_SYSTEM_KEY not in options
    assert options[local_files.CLASS_PATH_KEY] == "/opt/mine.jar"
    options.clear()
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.extraClassPath /opt/y.jar\n",
                                                  encoding="utf-8")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    start("local")
    assert local_files.FILE_SYSTEM_KEY not in options


def test_the_users_file_system_and_debugging_are_kept(options: dict[str, str]) -> None:
    start("local[2]", [(local_files.FILE_SYSTEM_KEY, "my.FileSystem"), (DEBUGGING, "true")])
    assert options[local_files.FILE_SYSTEM_KEY] == "my.FileSystem"
    assert local_files.CLASS_PATH_KEY not in options
    assert options[DEBUGGING] == "true"


def test_a_jvm_that_does_not_start_with_the_file_system_is_started_without_it(
        monkeypatch: pytest.MonkeyPatch, options: dict[str, str]) -> None:
    """A class path that lost the jar makes spark-submit fail on its first file: path (the
    JVM exits before the gateway): the session is started again with Hadoop's own."""
    tried: list[dict[str, str]] = []

    def get_or_create(builder: SparkSession.Builder) -> SparkSession:
        tried.append(dict(builder._options))  # type: ignore[attr-defined]
        if len(tried) == 1:
            raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})
        raise Started

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", get_or_create)
    start("local[2]", [(local_files.CLASS_PATH_KEY, "/opt/mine.jar")])
    assert tried[0][local_files.FILE_SYSTEM_KEY] == local_files.CLASS
    assert local_files.FILE_SYSTEM_KEY not in tried[1]
    assert tried[1][local_files.CLASS_PATH_KEY] == "/opt/mine.jar"
