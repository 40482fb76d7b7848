"""A heartbeat never stops its peeker's loop nor holds it up (the CI run where a connection
an outage left broken raised asyncpg's InternalClientError out of the heartbeat: the peek loop
died, the deployment never halted and its stop re-raised the error)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import structlog

from endpoint_runtime.runtime.actors.deployment_status import DeploymentStatus
from endpoint_runtime.runtime.heartbeats import BEAT_TIMEOUT_SECONDS, Heartbeat

STATUS = DeploymentStatus(endpoint="sales", estimate=0, max_concurrency=1, receivers=[],
                          replaced_receivers=0)


class BrokenConnectionPool:
    """Stands in for a pool only to raise what asyncpg raised in that run (not a test of the
    database: the next test uses a real pool)."""

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        raise asyncpg.exceptions.InternalClientError(
            "cannot switch to state 11; another operation (2) is in progress")
        yield


async def test_a_heartbeat_survives_whatever_its_write_raises() -> None:
    heartbeat = Heartbeat("public", "d1")
    with structlog.testing.capture_logs() as logs:
        await heartbeat.beat(BrokenConnectionPool(), STATUS, force=True)  # type: ignore[arg-type]
        await heartbeat.beat(BrokenConnectionPool(), STATUS, force=True)  # type: ignore[arg-type]
    failures = [e for e in logs if e["event"] == "heartbeat_failed"]
    assert len(failures) == 1, logs  # logged once, not at every beat
    assert "InternalClientError" in failures[0]["error"]


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """A TCP server that accepts connections and never answers (a database that hangs)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()


async def test_a_heartbeat_gives_up_on_a_database_that_does_not_answer(
    silent_server: int,
) -> None:
    pool = await asyncpg.create_pool(f"postgresql://postgres@127.0.0.1:{silent_server}/x",
                                     min_size=0, max_size=1, timeout=60)
    heartbeat = Heartbeat("public", "d1")
    started = time.monotonic()
    try:
        with structlog.testing.capture_logs() as logs:
            await asyncio.wait_for(heartbeat.beat(pool, STATUS, force=True), 30)
    finally:
        pool.terminate()
    assert time.monotonic() - started < BEAT_TIMEOUT_SECONDS + 5
    assert [e["event"] for e in logs] == ["heartbeat_failed"]
