"""The chaos run's own PostgreSQL server, started as root from binaries its system user
cannot reach (a virtualenv under a directory closed to other users, such as /root)."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import asyncpg
import pytest

from benchmarks.chaos import server
from tests.cluster.nodes import free_port

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="the server's system user is only "
                             "used when the run is root")


def _closed_installation(directory: Path) -> Path:
    """The wheel's layout (``pgserver/pginstall`` beside ``pgserver.libs``) copied under
    ``directory``, closed to every user but root; returns the copy's ``bin``."""
    directory.mkdir(mode=0o700)
    installation = server.BIN.parent
    site = directory / "site"
    shutil.copytree(installation, site / "pgserver" / "pginstall", symlinks=True,
                    ignore=shutil.ignore_patterns("include"))
    shutil.copytree(installation.parent.parent / "pgserver.libs", site / "pgserver.libs",
                    symlinks=True)
    return site / "pgserver" / "pginstall" / "bin"


@AS_ROOT
def test_a_root_run_starts_its_server_from_binaries_its_user_cannot_reach(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closed = _closed_installation(tmp_path / "closed")
    monkeypatch.setattr(server, "BIN", closed)
    chaos_server = server.ChaosServer.create(free_port())
    try:
        assert chaos_server.binaries != closed
        assert not chaos_server.binaries.is_relative_to(tmp_path)

        async def select_one() -> int:
            connection = await asyncpg.connect(chaos_server.dsn)
            try:
                value: int = await connection.fetchval("SELECT 1")
            finally:
                await connection.close()
            return value

        assert asyncio.run(select_one()) == 1
    finally:
        chaos_server.destroy()
    assert not chaos_server.directory.exists()


def test_a_server_that_cannot_start_leaves_no_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "server"
    directory.mkdir()
    monkeypatch.setattr(server, "BIN", tmp_path / "no-such-installation" / "bin")
    monkeypatch.setattr(server.tempfile, "mkdtemp", lambda **_: str(directory))
    with pytest.raises(OSError, match="no-such-installation"):
        server.ChaosServer.create(free_port())
    assert not directory.exists()


@AS_ROOT
def test_a_root_run_creates_the_system_user_when_no_server_ran_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fresh machine the chaos server (or the e2e suite's TCP server, the same class) may
    be the first PostgreSQL started: its system user does not exist yet. It once assumed
    the embedded server had created it and failed with ``KeyError: getpwnam()``."""
    user = f"er-test-{os.getpid()}"
    monkeypatch.setattr(server, "SYSTEM_USER", user)
    chaos_server = None
    try:
        chaos_server = server.ChaosServer.create(free_port())
        assert pwd.getpwnam(user).pw_uid == chaos_server.directory.stat().st_uid
    finally:
        if chaos_server is not None:
            chaos_server.destroy()
        subprocess.run(["userdel", "--remove", user], capture_output=True, check=False)
