"""A user of their own for a test: a temporary home, the ``endpoint-runtime`` command run as a
person would, from any directory, with nothing of the suite's environment.

The per-user data directory derives from ``HOME`` (``~/.local/share/endpoint-runtime``); for
root, whose default (``/var/lib/endpoint-runtime``) no variable but the overrides moves, from
``XDG_DATA_HOME``, pointed at the same place in the temporary home. Either way the real
user's server is never touched. The temporary directory is made under ``/tmp`` and open to
other users (``0755``), as a home below ``/home`` is: as root the server runs as the
``pgserver`` user, which must enter it.

Example::

    with UserHome.create() as user:
        user.command(user.directory("app"), "db", "url")
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

COMMAND = Path(sys.executable).parent / "endpoint-runtime"
# What would point the commands anywhere but the user's own embedded server and own Ray.
SUITE_VARIABLES = ("ENDPOINT_RUNTIME_DSN", "ENDPOINT_RUNTIME_DATA_DIR", "XDG_DATA_HOME",
                   "RAY_ADDRESS", "PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD",
                   "PGSERVICE", "ENDPOINT_RUNTIME_LOG_FORMAT", "ENDPOINT_RUNTIME_LOG_LEVEL",
                   # a person's shell outside a login session has none: the commands must
                   # not warn about it
                   "XDG_RUNTIME_DIR")


@dataclass
class Started:
    """A long-running command (``run``, ``ingest``), in a session of its own as in a terminal."""

    args: tuple[str, ...]
    process: subprocess.Popen[bytes]
    output: Path
    handle: IO[bytes]
    family: set[psutil.Process] = field(default_factory=set)
    """What it had started when last looked at (:func:`family`): killed at the end, even
    once the command itself has exited."""

    def text(self) -> str:
        return self.output.read_text(errors="replace")


@dataclass
class UserHome:
    root: Path
    env: dict[str, str]
    data_dir: Path
    started: list[Started] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    """What each command run to completion printed (stdout, stderr), in order."""

    @classmethod
    @contextmanager
    def create(cls) -> Iterator[UserHome]:
        root = Path(tempfile.mkdtemp(prefix="er-user-", dir="/tmp"))
        root.chmod(0o755)
        home = root / "home"
        home.mkdir()
        env = {name: value for name, value in os.environ.items()
               if name not in SUITE_VARIABLES}
        env["HOME"] = str(home)
        env["PATH"] = f"{COMMAND.parent}{os.pathsep}{env.get('PATH', '')}"
        data_dir = home / ".local" / "share" / "endpoint-runtime"
        if os.geteuid() == 0:
            env["XDG_DATA_HOME"] = str(home / ".local" / "share")
        user = cls(root, env, data_dir)
        try:
            yield user
        finally:
            user.close()

    def directory(self, name: str) -> Path:
        """A working directory of this user's (outside the checkout)."""
        path = self.root / name
        path.mkdir(exist_ok=True)
        return path

    def command(
        self, cwd: Path, *args: str, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(COMMAND), *args], cwd=cwd, env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        self.outputs.append(done.stdout + done.stderr)
        return done

    def start(self, cwd: Path, *args: str) -> Started:
        output = self.root / f"output-{len(self.started)}.txt"
        handle = output.open("wb")
        process = subprocess.Popen([str(COMMAND), *args], cwd=cwd, env=self.env,
                                   stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        started = Started(args, process, output, handle)
        self.started.append(started)
        return started

    def close(self) -> None:
        """Kill what is still running of what was started here (by process group, each one
        this object made), stop this user's embedded server, remove the directory."""
        for started in self.started:
            if started.process.poll() is None:
                with _gone_already():
                    os.killpg(started.process.pid, signal.SIGKILL)
                started.process.wait(timeout=30)
            started.handle.close()
        if (self.data_dir / "pgdata" / "postmaster.pid").exists():
            self.command(self.root, "db", "stop", timeout=60)
        kill(working_in(self.root))  # what a command that died left (Ray's agents)
        shutil.rmtree(self.root, ignore_errors=True)


def family(pid: int) -> set[psutil.Process]:
    """A process's descendants and the other processes of its session: what it started
    (Ray's daemons and workers) and would leave behind."""
    try:
        parent = psutil.Process(pid)
        members = set(parent.children(recursive=True))
        session = os.getsid(pid)
    except (psutil.NoSuchProcess, ProcessLookupError):
        return set()
    for process in psutil.process_iter():
        with _gone_already():
            if process.pid != pid and os.getsid(process.pid) == session:
                members.add(process)
    return members


def working_in(directory: Path) -> set[psutil.Process]:
    """The processes whose working directory is in ``directory``: Ray's daemons and workers
    inherit the command's, and outlive a command that died before they were looked at."""
    found = set()
    for process in psutil.process_iter():
        with _gone_already():
            if Path(process.cwd()).is_relative_to(directory):
                found.add(process)
    return found


def still_running(processes: set[psutil.Process]) -> list[str]:
    """Those of ``processes`` still alive (a zombie waiting to be reaped is not), named."""
    alive = []
    for process in processes:
        with _gone_already():
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
    return alive


def kill(processes: set[psutil.Process]) -> None:
    """SIGKILL each of ``processes`` (each one a command of this test started)."""
    for process in processes:
        with _gone_already():
            if process.is_running():
                process.kill()


def _gone_already() -> suppress:
    """Processes may end between being listed and being looked at."""
    return suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError)
