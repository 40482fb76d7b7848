"""The e2e tests reach their server over TCP, as users do (``tests/e2e/conftest.py``); the
other folders use the embedded server's Unix socket."""

from __future__ import annotations

import os

import asyncpg
import pytest


@pytest.mark.skipif(bool(os.environ.get("ENDPOINT_RUNTIME_DSN")),
                    reason="ENDPOINT_RUNTIME_DSN names the server; it may be a socket")
async def test_the_e2e_database_is_reached_over_tcp(database_dsn: str) -> None:
    connection = await asyncpg.connect(database_dsn)
    try:
        address = await connection.fetchval("SELECT host(inet_server_addr())")
    finally:
        await connection.close()
    assert address == "127.0.0.1"  # NULL over a Unix socket
