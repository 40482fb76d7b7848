"""The run's own PostgreSQL server: its data directory in a temporary directory, its own port.

The chaos run restarts its database and terminates its backends, so it never uses a server
anyone else does: it starts one from the ``pgserver`` wheel's binaries (``initdb``,
``pg_ctl``), stops only that one (``pg_ctl -D <its directory>``), and removes its files at the
end. As root, PostgreSQL runs as the wheel's ``pgserver`` system user (``initdb`` refuses
root), as the embedded server does.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pgserver

from benchmarks.common import progress

BIN = Path(pgserver.__file__).resolve().parent / "pginstall" / "bin"
SYSTEM_USER = "pgserver"
SETTINGS = {
    "max_connections": "200",
    "listen_addresses": "127.0.0.1",
    "log_min_messages": "warning",
}


class ChaosServer:
    """A PostgreSQL server of this run only.

    Example::

        server = ChaosServer.create(port=free_port())
        dsn = server.dsn
        server.restart()
        server.destroy()
    """

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.data = directory / "data"
        self.port = port
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        self.log = directory / "postgres.log"

    @classmethod
    def create(cls, port: int) -> ChaosServer:
        """initdb in a fresh temporary directory, then start the server on ``port``."""
        server = cls(Path(tempfile.mkdtemp(prefix="er-chaos-pg-", dir="/tmp")), port)
        if os.geteuid() == 0:
            account = pwd.getpwnam(SYSTEM_USER)
            os.chown(server.directory, account.pw_uid, account.pw_gid)
        server._run("initdb", "-D", str(server.data), "-U", "postgres", "--auth=trust",
                    "--no-sync", "-E", "UTF8")
        with (server.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.writelines(f"{name} = '{value}'\n" for name, value in SETTINGS.items())
            conf.write(f"port = {port}\nunix_socket_directories = '{server.directory}'\n")
        server.start()
        return server

    def _run(self, program: str, *args: str) -> None:
        user = SYSTEM_USER if os.geteuid() == 0 else None
        result = subprocess.run([str(BIN / program), *args], capture_output=True, text=True,
                                user=user, timeout=120, check=False)
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
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            progress(f"chaos: stopping the run's PostgreSQL: {exc}")
        shutil.rmtree(self.directory, ignore_errors=True)
