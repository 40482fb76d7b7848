"""The run's own PostgreSQL server: its data directory in a temporary directory, its own port.

The chaos run restarts its database and terminates its backends, so it never uses a server
anyone else does: it starts one from the ``pgserver`` wheel's binaries (``initdb``,
``pg_ctl``), stops only that one (``pg_ctl -D <its directory>``), and removes its files at the
end. As root, PostgreSQL runs as the wheel's ``pgserver`` system user (``initdb`` refuses
root), as the embedded server does; the user is created (``useradd``) if it is missing.

That user must be able to run the wheel's binaries, and it cannot when the virtualenv lives
under a directory closed to other users (a virtualenv in ``/root``, mode 0700): ``initdb``
then fails with ``PermissionError``. The run checks this first (``initdb --version`` as that
user) and, if it cannot, copies the server's files (``bin``, ``lib``, ``share``: about 30 MB)
into the run's own temporary directory, which that user owns, and runs them from there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pgserver
from pgserver.utils import ensure_user_exists

from benchmarks.common import progress

BIN = Path(pgserver.__file__).resolve().parent / "pginstall" / "bin"
SYSTEM_USER = "pgserver"
SETTINGS = {
    "max_connections": "200",
    "listen_addresses": "127.0.0.1",
    "log_min_messages": "warning",
    # Batched mode's saga updates (50 instances, batches of 50 on four slots) hold their row
    # locks until the batch commits, and concurrent batches deadlock on them all the time:
    # each deadlock waited for the default 1 s before PostgreSQL ended one of them, and the
    # batched mode took 70-150 s of the CI run's ~200 s. Detected after 100 ms, the same
    # deadlocks end the same way (the victim's attempt fails and is retried).
    "deadlock_timeout": "100ms",
}


class ChaosServer:
    """A PostgreSQL server of this run only.

    Example::

        server = ChaosServer.create(port=free_port())
        dsn = server.dsn
        server.restart()
        server.destroy()
    """

    def __init__(self, directory: Path, port: int, binaries: Path | None = None) -> None:
        self.directory = directory
        self.binaries = binaries or BIN
        self.data = directory / "data"
        self.port = port
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        self.log = directory / "postgres.log"

    @classmethod
    def create(cls, port: int) -> ChaosServer:
        """initdb in a fresh temporary directory, then start the server on ``port``."""
        server = cls(Path(tempfile.mkdtemp(prefix="er-chaos-pg-", dir="/tmp")), port)
        try:
            server._initialize()
        except BaseException:
            server.destroy()  # a server that never started leaves no directory behind
            raise
        return server

    def _initialize(self) -> None:
        if os.geteuid() == 0:
            # The wheel's own helper (useradd when missing): this server may be the first
            # the machine starts, before the embedded one has created that user.
            account = ensure_user_exists(SYSTEM_USER)
            assert account is not None
            os.chown(self.directory, account.pw_uid, account.pw_gid)
            binaries = self.binaries
            if not _can_run(binaries / "initdb", SYSTEM_USER):
                self.binaries = _copy_installation(binaries.parent, self.directory)
                progress(f"chaos: the {SYSTEM_USER} user cannot run {binaries} (a directory "
                         f"above it is closed to other users); running a copy in "
                         f"{self.binaries}")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--no-sync", "-E", "UTF8")
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.writelines(f"{name} = '{value}'\n" for name, value in SETTINGS.items())
            conf.write(f"port = {self.port}\nunix_socket_directories = '{self.directory}'\n")
        self.start()

    def _run(self, program: str, *args: str) -> None:
        user = SYSTEM_USER if os.geteuid() == 0 else None
        result = subprocess.run([str(self.binaries / program), *args], capture_output=True,
                                text=True, user=user, timeout=120, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{program} failed ({result.returncode}): "
                               f"{result.stdout[-2000:]}{result.stderr[-2000:]}")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop")

    def restart(self) -> None:
        """Stop (``-m fast``: every connection is closed) and start again."""
        self.stop()
        self.start()

    def destroy(self) -> None:
        """Stop the server (at once) and remove its directory."""
        try:
            self.stop("immediate")
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
            progress(f"chaos: stopping the run's PostgreSQL: {exc}")
        shutil.rmtree(self.directory, ignore_errors=True)


def _can_run(program: Path, user: str) -> bool:
    """Whether ``user`` may execute ``program`` (tried: ``--version``)."""
    try:
        subprocess.run([str(program), "--version"], user=user, capture_output=True,
                       timeout=30, check=True)
    except (PermissionError, subprocess.CalledProcessError):
        return False
    return True


def _copy_installation(installation: Path, directory: Path) -> Path:
    """Copy the server's ``bin``, ``lib`` and ``share`` into ``directory`` (readable by its
    owner, the system user), with the wheel's shared libraries where the binaries' rpath
    (``$ORIGIN/../../../pgserver.libs``) looks for them; returns the copy's ``bin``."""
    site = directory / "site"
    copy = site / "pgserver" / "pginstall"
    for part in ("bin", "lib", "share"):
        shutil.copytree(installation / part, copy / part, symlinks=True)
    libraries = installation.parent.parent / "pgserver.libs"
    if libraries.is_dir():
        shutil.copytree(libraries, site / "pgserver.libs", symlinks=True)
    for path in (site, *site.rglob("*")):
        if not path.is_symlink():
            mode = path.stat().st_mode
            path.chmod(mode | (0o055 if path.is_dir() or mode & 0o100 else 0o044))
    return copy / "bin"
