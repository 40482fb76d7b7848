"""The Spark session of a report: local mode by default, any master unchanged.

Settings the job depends on (UTC session time zone, the JDBC jars) are always set; the rest
are defaults that ``spark-submit --conf`` overrides.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable, Sequence

from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from endpoint_runtime.analytics import local_files
from endpoint_runtime.analytics.prerequisites import Prerequisites

log = logging.getLogger(__name__)

APP_NAME = "endpoint-runtime report"
LOCAL_MASTER = "local[*]"
SHUFFLE_PARTITIONS = "8"
"""Until the job sizes them from its input (adaptive execution coalesces further)."""
LOCAL_DRIVER_MEMORY = "2g"
LOG4J2 = """\
# Written by endpoint_runtime.analytics.session: warnings and errors only, and not the one
# about Hadoop's native library (Spark works without it).
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""


def _log_configuration() -> str:
    """A log4j2 file for the driver JVM this process starts (one per process)."""
    with tempfile.NamedTemporaryFile("w", prefix="endpoint-runtime-log4j2-",
                                     suffix=".properties", delete=False) as file:
        file.write(LOG4J2)
    return file.name


def under_spark_submit() -> bool:
    """Launched by ``spark-submit`` (it starts the JVM and hands the gateway to Python)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def ui_address(spark: SparkSession) -> str | None:
    """The Spark UI's address when the UI is on."""
    if spark.conf.get("spark.ui.enabled", "true") != "true":
        return None
    return spark.sparkContext.uiWebUrl


def job_names(spark: SparkSession) -> Callable[[str], None]:
    """Name the Spark jobs this thread submits after the report's stage (``report: minutes``):
    the Spark UI and the event log say which stage each job belongs to."""
    return lambda key: spark.sparkContext.setJobDescription(f"report: {key}")


def start(master: str | None, prerequisites: Prerequisites,
          conf: Sequence[tuple[str, str]] = ()) -> SparkSession:
    """Start (or join) the session; ``master=None`` means ``local[*]`` unless
    ``spark-submit`` chose one. ``conf``: Spark settings (``--conf key=value``), which win
    over every default here."""
    submitted = under_spark_submit()
    if master is None and not submitted:
        master = LOCAL_MASTER
    local = master is not None and master.startswith("local")
    if local:
        # Without it Spark warns that the hostname resolves to a loopback address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # The Python processes Spark starts (the live mode's data source) run this
        # interpreter, whose environment has this package, rather than the first python3
        # on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if "JAVA_HOME" not in os.environ:
        os.environ["JAVA_HOME"] = os.path.dirname(os.path.dirname(
            os.path.realpath(prerequisites.java)))
    user = dict(conf)  # the --conf settings, which win over the defaults here
    settings: dict[str, str] = {"spark.app.name": APP_NAME}
    if master is not None:
        settings["spark.master"] = master
    jars = [*prerequisites.jars]
    if "spark.jars" in user:
        jars.insert(0, user["spark.jars"])
    settings["spark.jars"] = ",".join(jar for jar in jars if jar)
    settings["spark.sql.session.timeZone"] = "UTC"
    defaults = {
        "spark.sql.shuffle.partitions": SHUFFLE_PARTITIONS,
        "spark.ui.showConsoleProgress": str(sys.stderr.isatty()).lower(),
        "spark.sql.adaptive.enabled": "true",
        # PySpark's DataFrame debugging captures the Python call site of every column
        # function through py4j (about five calls each): it is for users' own DataFrame code
        # and about half the py4j calls of a run (5,808 against 3,019 over a few rows; 2.02 s
        # against 1.68 s, alternating in one session). Read once per process, at first use.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    }
    if local:
        defaults["spark.ui.enabled"] = "false"  # no port taken on a laptop or in tests
        if not submitted:
            defaults["spark.driver.memory"] = LOCAL_DRIVER_MEMORY
    if not submitted:  # under spark-submit the driver's JVM already runs
        defaults["spark.driver.extraJavaOptions"] = (
            f"-Dlog4j2.configurationFile=file:{_log_configuration()}")
    settings.update((key, value) for key, value in defaults.items() if key not in user)
    settings.update((key, value) for key, value in user.items() if key != "spark.jars")
    files = (local_files.settings(prerequisites.java, user)  # no chmod per file
             if master is not None and local_files.applies(master) and not submitted else {})
    if not files:
        return _started(settings)
    try:
        spark = _started({**settings, **files})  # the class path holds the user's own first
    except PySparkRuntimeError as error:  # its JVM did not start: once more without
        log.warning("report: Spark keeps Hadoop's chmod processes (its JVM did not start "
                    "with %s: %s)", local_files.CLASS, error)
        return _started(settings)
    local_files.verify(spark)
    return spark


def _started(settings: dict[str, str]) -> SparkSession:
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
