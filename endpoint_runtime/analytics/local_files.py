"""Local files written by a local-mode report without a ``chmod`` process per file.

Hadoop's local file system sets the permissions of every file and directory it creates, and
without Hadoop's native library (Spark's jars do not ship it) it does so by starting a
``chmod`` process: about 90 per report run over a few rows (a Java Flight Recording counted
1,047 in 12 runs), each a fork of the driver's JVM, on the run's critical path. The
``PosixLocalFileSystem`` beside this module (``java/``) is Hadoop's local file system with the
permissions set by a system call (``java.nio``): the same modes, the same checksum files.

It is compiled once per source and Java version into the user's cache
(``$XDG_CACHE_HOME/endpoint_runtime``, else ``~/.cache/endpoint_runtime``) by the ``javac``
beside the ``java`` Spark starts, and a report that starts its own ``local``/``local[N]``
JVM puts it on the driver's class path for ``file:`` paths (:func:`settings`), then checks
that the JVM loads it (:func:`verify`; else Hadoop's own is put back, with a warning). Spark
keeps Hadoop's own without a ``javac`` (a Java runtime without its compiler), when
``spark.hadoop.fs.file.impl`` is given, and when Spark settings come from elsewhere too
(``PYSPARK_SUBMIT_ARGS``, a ``spark-defaults.conf``), which could replace the class path. A
report over a few rows then takes about a sixth longer, a large one the same. Streaming
checkpoints (``--follow``) go through Hadoop's ``FileContext``, which keeps its own.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Any

CLASS = "endpoint_runtime.analytics.PosixLocalFileSystem"
SOURCE = Path(__file__).with_name("java") / "PosixLocalFileSystem.java"
ENTRY = CLASS.replace(".", "/") + ".class"
FILE_SYSTEM_KEY = "spark.hadoop.fs.file.impl"
CLASS_PATH_KEY = "spark.driver.extraClassPath"

log = logging.getLogger(__name__)


def applies(master: str) -> bool:
    """One JVM runs the driver and the tasks (not ``local-cluster``, whose executors would
    not have the class path)."""
    return master == "local" or master.startswith("local[")


def settings(java: str, given: dict[str, str]) -> dict[str, str]:
    """The Spark settings that make a local-mode driver use the file system, given the
    user's settings (``--conf``): none when they choose a file system, when settings may
    also come from elsewhere, or when no jar is built."""
    if FILE_SYSTEM_KEY in given or _settings_elsewhere():
        return {}
    built = jar(java)
    if built is None:
        return {}
    class_path = os.pathsep.join(part for part in (given.get(CLASS_PATH_KEY), str(built))
                                 if part)
    return {FILE_SYSTEM_KEY: CLASS, CLASS_PATH_KEY: class_path}


def verify(spark: Any) -> None:
    """If the session's JVM cannot load the file system, put Hadoop's own back (logged)
    rather than let every write fail."""
    jvm = spark._jvm
    hadoop = spark._jsc.hadoopConfiguration()
    try:
        jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), hadoop)
    except Exception as error:  # py4j's error: the class is not on the JVM's class path
        log.warning("report: Spark keeps Hadoop's chmod processes (%s did not load: %s)",
                    CLASS, str(error).splitlines()[0] if str(error) else type(error).__name__)
        hadoop.unset("fs.file.impl")


@functools.cache
def jar(java: str) -> Path | None:
    """The compiled file system for the JDK of ``java`` (built on first use), or ``None``
    when that JDK has no ``javac`` or the build fails (logged)."""
    javac = Path(os.path.realpath(java)).with_name("javac")
    hadoop = _hadoop_jar()
    if not javac.exists() or hadoop is None:
        log.debug("no javac beside %s: Spark keeps Hadoop's local file system", java)
        return None
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + os.fsencode(javac) + hadoop.name.encode()).hexdigest()[:16]
    try:
        target = _cache() / f"posix-local-fs-{key}.jar"
        if _complete(target):
            return target
        _build(javac, hadoop, target)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", None) or b""
        log.warning("report: Spark keeps Hadoop's chmod processes (%s did not build %s: %s%s)",
                    javac, SOURCE.name, error,
                    f"; {detail.decode(errors='replace').strip()}" if detail else "")
        return None
    return target


def _complete(target: Path) -> bool:
    """A jar in the cache that holds the class (a damaged one is built again)."""
    try:
        with zipfile.ZipFile(target) as archive:
            return ENTRY in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _build(javac: Path, hadoop: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="endpoint-runtime-javac-") as work:
        classes = Path(work) / "classes"
        subprocess.run([str(javac), "--release", "17", "-nowarn", "-cp", str(hadoop),
                        "-d", str(classes), str(SOURCE)],
                       check=True, capture_output=True, timeout=300)
        # Whole or absent, also with two reports building at once.
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.",
                                         delete=False) as partial:
            try:
                with zipfile.ZipFile(partial, "w") as archive:  # a jar: a zip of the classes
                    for path in sorted(classes.rglob("*.class")):
                        archive.write(path, path.relative_to(classes).as_posix())
                partial.flush()
                os.fsync(partial.fileno())
                partial.close()
                os.replace(partial.name, target)
            except BaseException:
                Path(partial.name).unlink(missing_ok=True)
                raise


def _settings_elsewhere() -> bool:
    """Spark settings from outside the command line's ``--conf``: a class path there would
    replace the one set here (or be replaced by it)."""
    if os.environ.get("PYSPARK_SUBMIT_ARGS"):
        return True
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        str(Path(os.environ["SPARK_HOME"]) / "conf") if os.environ.get("SPARK_HOME") else None)
    return conf_dir is not None and (Path(conf_dir) / "spark-defaults.conf").exists()


def _hadoop_jar() -> Path | None:
    """Hadoop's client API jar among the jars Spark starts with (in the Spark home PySpark
    launches)."""
    from pyspark.find_spark_home import _find_spark_home

    found = sorted((Path(_find_spark_home()) / "jars").glob("hadoop-client-api-*.jar"))
    return found[-1] if found else None


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "endpoint_runtime"
