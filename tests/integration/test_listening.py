"""LISTEN wake-ups survive a lost connection (the backend terminated, as on a restart)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport.listening import Listener


async def wait_until(condition: Callable[[], bool], limit_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def test_listener_reconnects_and_calls_back_after_a_lost_connection(
    transport: PostgresTransport, database_dsn: str
) -> None:
    calls: list[str] = []
    listener = Listener(database_dsn, retry_delay=0.05)
    await listener.start()
    await listener.listen("er.test", lambda: calls.append("wake"))
    try:
        await transport.pool.execute("SELECT pg_notify('er.test', '')")
        await wait_until(lambda: len(calls) == 1)

        await transport.pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid() "
            "AND datname = current_database()")  # this test's listener only
        await wait_until(lambda: listener.reconnections == 1)
        assert calls == ["wake", "wake"]  # one call after reconnecting: look for missed work

        await transport.pool.execute("SELECT pg_notify('er.test', '')")
        await wait_until(lambda: len(calls) == 3)  # listening again on the new connection
    finally:
        await listener.close()
    assert not listener.connected
