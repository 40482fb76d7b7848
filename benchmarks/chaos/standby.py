"""A streaming standby of the run's own server, on the same machine, and its promotion.

``pg_basebackup -R`` (the ``pgserver`` wheel's) copies the primary into a directory of its own
and writes ``standby.signal`` with the primary's connection; the standby starts on a port of
its own and replays the primary's WAL as it streams. With ``synchronous`` the primary waits,
at each commit, until the standby has the commit's WAL (``synchronous_standby_names`` names the
standby's ``application_name``; ``synchronous_commit`` stays ``on``: flushed on the standby):
nothing a client saw committed is lost when the primary dies. Without it a commit returns as
soon as the primary has it, and what the standby had not received when the primary died is lost.

Example::

    primary = ChaosServer.create(port=free_port())
    standby = Standby.of(primary, port=free_port(), synchronous=True)
    dsn = standby.failover_dsn("orders")   # both hosts, target_session_attrs=read-write
    primary.stop("immediate")              # the primary dies
    standby.promote()                      # the standby becomes the primary
    standby.destroy()
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from pgserver.utils import ensure_user_exists

from benchmarks.chaos.server import SYSTEM_USER, ChaosServer

APPLICATION_NAME = "er_standby"
STREAMING_TIMEOUT_SECONDS = 60.0


class Standby:
    """The standby server of :meth:`of` (a :class:`ChaosServer` for start, stop, destroy)."""

    def __init__(self, primary: ChaosServer, server: ChaosServer, *, synchronous: bool) -> None:
        self.primary = primary
        self.server = server
        self.synchronous = synchronous

    @classmethod
    def of(cls, primary: ChaosServer, *, port: int, synchronous: bool) -> Standby:
        """A running standby of ``primary`` on ``port``, streaming (and, with
        ``synchronous``, the primary's synchronous standby) before this returns."""
        directory = Path(tempfile.mkdtemp(prefix="er-chaos-standby-", dir="/tmp"))
        if os.geteuid() == 0:
            account = ensure_user_exists(SYSTEM_USER)
            assert account is not None
            os.chown(directory, account.pw_uid, account.pw_gid)
        server = ChaosServer(directory, port, binaries=primary.binaries)
        try:
            server._run(
                "pg_basebackup", "-D", str(server.data), "-R", "-X", "stream", "--no-sync",
                "-d", f"host=127.0.0.1 port={primary.port} user=postgres "
                      f"application_name={APPLICATION_NAME}")
            with (server.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
                # The copy's settings are the primary's; these come last, so they win.
                conf.write(f"port = {port}\nunix_socket_directories = '{directory}'\n")
            server.start()
            if synchronous:
                # After the copy, so that the standby does not inherit it: promoted, it would
                # wait at every commit for a standby of its own that does not exist.
                primary_sql(primary, f"ALTER SYSTEM SET synchronous_standby_names = "
                                     f"'{APPLICATION_NAME}'", "SELECT pg_reload_conf()")
            standby = cls(primary, server, synchronous=synchronous)
            standby.wait_until_streaming()
        except BaseException:
            server.destroy()
            raise
        return standby

    @property
    def port(self) -> int:
        return self.server.port

    def failover_dsn(self, database: str = "postgres") -> str:
        """Both servers, the primary first, and only a writable one accepted: after a
        promotion, new connections find the standby."""
        return (f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.port}/"
                f"{database}?target_session_attrs=read-write")

    def wait_until_streaming(self) -> None:
        """Until the primary shows the standby streaming (and synchronous, when it is)."""
        wanted = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + STREAMING_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            state = primary_sql(
                self.primary, "SELECT coalesce(string_agg(state || '/' || sync_state, ','), '') "
                f"FROM pg_stat_replication WHERE application_name = '{APPLICATION_NAME}'")
            if state == f"streaming/{wanted}":
                return
            time.sleep(0.1)
        raise RuntimeError(f"the standby on port {self.port} is not streaming ({wanted}) after "
                           f"{STREAMING_TIMEOUT_SECONDS:.0f} s: "
                           f"{self.server.log.read_text(errors='replace')[-2000:]}")

    def promote(self) -> None:
        """``pg_ctl promote``, returning once the standby accepts writes."""
        self.server._run("pg_ctl", "-D", str(self.server.data), "-w", "-t", "60",
                         "promote")

    def destroy(self) -> None:
        self.server.destroy()
        shutil.rmtree(self.server.directory, ignore_errors=True)


def primary_sql(server: ChaosServer, *statements: str) -> str:
    """Run ``statements`` on ``server`` with the wheel's ``psql`` (usable from inside an event
    loop, as the tests call it); the last one's output, unaligned."""
    output = ""
    for statement in statements:
        result = subprocess.run(
            [str(server.binaries / "psql"), "-h", "127.0.0.1", "-p", str(server.port), "-U",
             "postgres", "-d", "postgres", "-At", "-v", "ON_ERROR_STOP=1", "-c", statement],
            capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"psql {statement!r} failed: {result.stderr[-1000:]}")
        output = result.stdout
    return output.strip()
