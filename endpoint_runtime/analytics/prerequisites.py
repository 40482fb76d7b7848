"""What the report needs outside Python, found or named in one line: PySpark, a Java 17+
runtime, the PostgreSQL JDBC driver and, for a server reached through a Unix socket, the
junixsocket library.

Each missing piece raises :class:`MissingPrerequisiteError` whose message names what to
install; nothing is downloaded at run time (Spark's own ``install-jdk`` fallback and
``spark.jars.packages`` need hosts these machines do not reach).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from endpoint_runtime.errors import EndpointRuntimeError

MIN_JAVA = 17
"""PySpark 4.x's launcher classes are Java 17 bytecode."""
JDBC_JAR = Path("/usr/share/java/postgresql.jar")
"""Where Debian's ``libpostgresql-jdbc-java`` puts the driver."""
JUNIXSOCKET_JAR = Path("/usr/share/java/junixsocket-common.jar")
"""Debian's ``libjunixsocket-java``: lets the JDBC driver reach a Unix socket."""
JUNIXSOCKET_NATIVE = "libjunixsocket-native-system.so"
"""Debian's ``libjunixsocket-jni``, in the JVM's default library path."""
NATIVE_DIRS = (Path("/usr/lib/x86_64-linux-gnu/jni"), Path("/usr/lib/aarch64-linux-gnu/jni"),
               Path("/usr/lib/jni"))
JDBC_JAR_VARIABLE = "ENDPOINT_RUNTIME_JDBC_JAR"


class MissingPrerequisiteError(EndpointRuntimeError):
    """Java, PySpark or the JDBC driver cannot be found; the message says what to install."""


@dataclass(frozen=True)
class Prerequisites:
    java: str
    """The ``java`` executable Spark will start."""
    java_version: int
    jars: tuple[str, ...]
    """Jars for ``spark.jars``: the JDBC driver, and junixsocket when a socket is used."""


def check(unix_socket: bool) -> Prerequisites:
    """Find everything the job needs, or raise :class:`MissingPrerequisiteError`."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise MissingPrerequisiteError(
            "PySpark is not installed: pip install 'endpoint-runtime[report]' "
            "(or pip install pyspark==4.3.0)"
        ) from None
    java, version = find_java()
    jars = [str(jdbc_jar())]
    if unix_socket:
        jars.append(str(junixsocket_jar()))
    return Prerequisites(java=java, java_version=version, jars=tuple(jars))


def find_java() -> tuple[str, int]:
    """The ``java`` Spark uses (``$JAVA_HOME/bin/java``, else the one on ``PATH``) and its
    major version, which must be at least 17."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    install = ("apt-get install --no-upgrade --no-install-recommends openjdk-17-jre-headless "
               "(or set JAVA_HOME to a Java 17 or 21)")
    if not java or not Path(java).exists():
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        raise MissingPrerequisiteError(f"Spark needs Java {MIN_JAVA}+, {where}: {install}")
    version = java_version(java)
    if version is None or version < MIN_JAVA:
        found = "an unknown version" if version is None else f"Java {version}"
        raise MissingPrerequisiteError(
            f"Spark needs Java {MIN_JAVA}+, {java} is {found}: {install}")
    return java, version


@functools.cache
def java_version(java: str) -> int | None:
    try:
        result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                                check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if not match:
        return None
    major = int(match[1])
    return int(match[2] or 0) if major == 1 else major  # "1.8.0" is Java 8


def jdbc_jar() -> Path:
    """The PostgreSQL JDBC driver: ``ENDPOINT_RUNTIME_JDBC_JAR``, else Debian's jar."""
    given = os.environ.get(JDBC_JAR_VARIABLE)
    jar = Path(given) if given else JDBC_JAR
    if not jar.is_file():
        hint = f"{JDBC_JAR_VARIABLE}={given} is not a file" if given else f"no {JDBC_JAR}"
        raise MissingPrerequisiteError(
            f"the PostgreSQL JDBC driver is missing ({hint}): apt-get install "
            f"libpostgresql-jdbc-java, or set {JDBC_JAR_VARIABLE} to its jar")
    return jar


def junixsocket_jar() -> Path:
    native = any((directory / JUNIXSOCKET_NATIVE).exists() for directory in NATIVE_DIRS)
    if not JUNIXSOCKET_JAR.is_file() or not native:
        raise MissingPrerequisiteError(
            "the database is reached through a Unix socket, which the JDBC driver needs "
            "junixsocket for: apt-get install libjunixsocket-java libjunixsocket-jni "
            "(or set ENDPOINT_RUNTIME_DSN to a host:port server)")
    return JUNIXSOCKET_JAR
