"""Local files written by a local-mode report without a ``chmod`` process per file.

Hadoop's local file system sets the permissions of every file and directory it creates, and
without Hadoop's native library (Spark's jars do not ship it) it does so by starting a
``chmod`` process: about 90 per report run over a few rows (a Java Flight Recording counted
1,047 in 12 runs), each a fork of the driver's JVM, on the run's critical path. The
``PosixLocalFileSystem`` beside this module (``java/``) is Hadoop's local file system with the
permissions set by a system call (``java.nio``): the same modes, the same checksum files.

It is compiled once per source and Java version into the user's cache
(``$XDG_CACHE_HOME/endpoint_runtime``, else ``~/.cache/endpoint_runtime``) by the ``javac``
beside the ``java`` Spark starts, and a report that starts its own local-mode JVM puts it on
the driver's class path for ``file:`` paths (:func:`settings`). Without a ``javac`` (a Java
runtime without its compiler), or when ``spark.hadoop.fs.file.impl`` is given, Spark keeps
Hadoop's own; a report over a few rows then takes about a sixth longer, a large one the same.
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

CLASS = "endpoint_runtime.analytics.PosixLocalFileSystem"
SOURCE = Path(__file__).with_name("java") / "PosixLocalFileSystem.java"
FILE_SYSTEM_KEY = "spark.hadoop.fs.file.impl"
CLASS_PATH_KEY = "spark.driver.extraClassPath"

log = logging.getLogger(__name__)


def settings(java: str, given: dict[str, str]) -> dict[str, str]:
    """The Spark settings that make a local-mode driver use the file system, given the
    user's settings (``--conf``): none when they choose a file system or no jar is built."""
    if FILE_SYSTEM_KEY in given:
        return {}
    built = jar(java)
    if built is None:
        return {}
    class_path = os.pathsep.join(part for part in (given.get(CLASS_PATH_KEY), str(built))
                                 if part)
    return {FILE_SYSTEM_KEY: CLASS, CLASS_PATH_KEY: class_path}


@functools.cache
def jar(java: str) -> Path | None:
    """The compiled file system for the JDK of ``java`` (built on first use), or ``None``
    when that JDK has no ``javac`` or the build fails (logged)."""
    javac = Path(os.path.realpath(java)).with_name("javac")
    hadoop = _hadoop_jar()
    if not javac.exists() or hadoop is None:
        return None
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + os.fsencode(javac) + hadoop.name.encode()).hexdigest()[:16]
    target = _cache() / f"posix-local-fs-{key}.jar"
    if target.exists():
        return target
    try:
        _build(javac, hadoop, target)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("report: Spark keeps Hadoop's chmod processes (%s did not build %s: %s)",
                    javac, SOURCE.name, error)
        return None
    return target


def _build(javac: Path, hadoop: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="endpoint-runtime-javac-") as work:
        classes = Path(work) / "classes"
        subprocess.run([str(javac), "--release", "17", "-nowarn", "-cp", str(hadoop),
                        "-d", str(classes), str(SOURCE)],
                       check=True, capture_output=True, timeout=300)
        staged = Path(work) / target.name
        with zipfile.ZipFile(staged, "w") as archive:  # a jar is a zip of the classes
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        partial.write_bytes(staged.read_bytes())
        os.replace(partial, target)  # whole or absent, also with two reports starting


def _hadoop_jar() -> Path | None:
    """Hadoop's client API jar among the jars Spark starts with."""
    import pyspark

    homes = [Path(os.environ["SPARK_HOME"])] if os.environ.get("SPARK_HOME") else []
    homes.append(Path(pyspark.__file__).parent)
    for home in homes:
        found = sorted((home / "jars").glob("hadoop-client-api-*.jar"))
        if found:
            return found[-1]
    return None


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "endpoint_runtime"
