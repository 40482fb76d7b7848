"""A database outage longer than the circuit breakers' trigger time, end to end.

The outage is real: the test database refuses connections (``ALLOW_CONNECTIONS false``) and
every backend connected to it is terminated. The endpoints of
``tests/support/hardening_endpoints.py`` trigger their breakers after 2 s without success
(``circuit_breaker_time_to_trigger=2.0``, 30 s by default), so an outage of a few seconds does
what a 60 s outage does with the default settings, and the tests stay short.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import asyncpg
import pytest
import structlog

from endpoint_runtime import TransportSettings
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.cli.common import EXIT_OK
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.connections.embedded import with_database
from tests.e2e.conftest import (
    Deployer,
    count,
    fresh_status,
    queue_exists,
    wait_for,
    wait_for_status,
)
from tests.support.cli import quiet_logging, run_cli
from tests.support.hardening_endpoints import Work

pytestmark = pytest.mark.ray
MODULE = "tests.support.hardening_endpoints"
TRIGGER_SECONDS = 2.0
"""circuit_breaker_time_to_trigger of the outage endpoints."""
OUTAGE_SECONDS = 3 * TRIGGER_SECONDS + 2
"""How long each outage lasts at least: well past the trigger time."""


@asynccontextmanager
async def database_outage(dsn: str) -> AsyncIterator[None]:
    """The database of ``dsn`` refuses connections, and loses the ones it had, until exit."""
    admin = await asyncpg.connect(with_database(dsn, "postgres"))
    database = await _database_name(dsn)
    try:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = $1", database)
        yield
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()


async def _database_name(dsn: str) -> str:
    connection = await asyncpg.connect(dsn)
    try:
        name: str = await connection.fetchval("SELECT current_database()")
        return name
    finally:
        await connection.close()


async def _prepare(dsn: str) -> None:
    async with PostgresTransport.connect(TransportSettings(dsn=dsn)) as transport:
        await transport.pool.execute("CREATE TABLE handled (key text)")


async def _send(dsn: str, key: str, queue: str) -> None:
    async with PostgresTransport.connect(TransportSettings(dsn=dsn)) as transport:
        await transport.send(queue, create_outgoing(Work(key), originating_endpoint="driver"))


async def _handled(dsn: str, key: str) -> bool:
    async with PostgresTransport.connect(TransportSettings(dsn=dsn)) as transport:
        return await count(transport.pool, "SELECT count(*) FROM handled WHERE key = $1",
                           key) == 1


@pytest.mark.in_process
async def test_log_mode_resumes_by_itself_when_the_database_returns(
    deployer: Deployer, database_dsn: str
) -> None:
    """on_critical_error="log": an outage longer than the trigger time raises the critical
    error; when the database is back, the breakers disarm, processing resumes without help
    and the status says the error is over (and what it was)."""
    await _prepare(database_dsn)
    deployment = await deployer.start("outage_log", module=MODULE)
    await _send(database_dsn, "before", "outage_log")
    await wait_for(lambda: _handled(database_dsn, "before"), timeout=20, what="'before'")

    started = time.monotonic()
    async with database_outage(database_dsn):
        status = await wait_for_status(
            deployment, lambda s: s.critical_error is not None, timeout=30,
            what="the critical error during the outage",
        )
        assert "circuit breaker" in (status.critical_error or "")
        assert not status.halted
        await asyncio.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - started)))

    await _send(database_dsn, "after", "outage_log")
    await wait_for(lambda: _handled(database_dsn, "after"), timeout=30,
                   what="'after', handled once the database is back")
    status = await wait_for_status(
        deployment, lambda s: s.critical_error is None, timeout=20,
        what="the status to show the critical error is over",
    )
    assert status.last_critical_error is not None
    assert "circuit breaker" in status.last_critical_error
    assert not status.halted
    assert status.receivers
    assert all(r.receive_breaker == "disarmed" for r in status.receivers)
    assert (await fresh_status(deployment)).critical_error is None


@pytest.mark.in_process
async def test_stop_mode_halts_and_status_shows_it_with_a_live_estimate(
    deployer: Deployer, database_dsn: str
) -> None:
    """on_critical_error="stop", through the Python API: the receivers stop for good, the
    status says the deployment is halted and why, and the peek estimate keeps following the
    queue after the database is back."""
    await _prepare(database_dsn)
    deployment = await deployer.start("outage_stop", module=MODULE)
    started = time.monotonic()
    async with database_outage(database_dsn):
        await wait_for_status(deployment, lambda s: s.halted, timeout=30,
                              what="the deployment to halt")
        await asyncio.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - started)))

    for n in range(3):
        await _send(database_dsn, f"waiting-{n}", "outage_stop")
    status = await wait_for_status(
        deployment, lambda s: s.estimate == 3, timeout=20,
        what="the estimate to count the messages sent after the outage",
    )
    assert status.halted
    assert status.critical_error is not None
    assert "circuit breaker" in status.critical_error
    assert status.receivers == []
    assert not await _handled(database_dsn, "waiting-0")


@contextmanager
def _interrupt_after(seconds: float) -> Iterator[None]:
    """SIGINT to this process after ``seconds`` (a graceful stop of ``run``): the test fails
    on the exit status instead of hanging when ``run`` does not stop by itself."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def test_run_exits_non_zero_with_the_critical_error_logged_last_in_stop_mode(
    database_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`endpoint-runtime run` of an endpoint with on_critical_error="stop": an outage past the
    trigger time ends the command with a non-zero status, and the critical error is the last
    event it logs."""
    for name in list(os.environ):
        if name.startswith("ENDPOINT_RUNTIME_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", database_dsn)
    quiet_logging(monkeypatch)
    asyncio.run(_prepare(database_dsn))
    outage_over = threading.Event()

    def outage_once_running() -> None:
        async def go() -> None:
            await wait_for(lambda: queue_exists(database_dsn, "outage_stop"), timeout=60,
                           what="the deployment to create its queue")
            await _send(database_dsn, "before", "outage_stop")
            await wait_for(lambda: _handled(database_dsn, "before"), timeout=60,
                           what="the deployment to handle a message before the outage")
            async with database_outage(database_dsn):
                await asyncio.sleep(OUTAGE_SECONDS)
            outage_over.set()

        asyncio.run(go())

    driver = threading.Thread(target=outage_once_running, daemon=True)
    driver.start()
    with _interrupt_after(90), structlog.testing.capture_logs() as logs:
        outcome = run_cli(capsys, "run", f"{MODULE}:outage_stop", "--status-interval", "0.3")
    driver.join(timeout=30)

    assert outcome.code != EXIT_OK, logs[-8:]
    assert logs, outcome.err
    last = logs[-1]
    assert last["log_level"] == "critical", [(e["event"], e.get("error")) for e in logs]
    assert "circuit breaker" in last["error"], last
