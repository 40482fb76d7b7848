"""The tests' PgBouncer (``benchmarks.chaos.pooler``): started by the tests, as the embedded
server is, and a clear failure where ``bin/dev`` could not install Debian's package."""

from __future__ import annotations

import pytest

from benchmarks.chaos.pooler import Pooler, available

POOLER_SIZE = 2
"""Server connections per database behind the tests' PgBouncer: far fewer than its clients,
so that consecutive transactions of one client land in different server sessions."""


def start_pooler(server_dsn: str, *, server_user: str | None = None) -> Pooler:
    """A PgBouncer in transaction mode in front of ``server_dsn``, :data:`POOLER_SIZE`
    server connections per database (logged in as ``server_user``, default the DSN's)."""
    if available() is None:
        pytest.fail("pgbouncer is not installed: bin/dev installs Debian's package")
    return Pooler.start(server_dsn, pool_size=POOLER_SIZE, server_user=server_user)
