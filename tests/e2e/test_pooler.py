"""A deployment on Ray behind PgBouncer in transaction mode (``TransportSettings.pooler_dsn``):
its eight slots share the pooler's two server connections, its receivers do not LISTEN (the
peeker, on the one direct connection, wakes them through Ray), and a message sent to an idle
endpoint is handled at once although its periodic peek is a minute away. Endpoints in
``tests/support/pooler_endpoints.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest

from endpoint_runtime import Sender, TransportSettings
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.transport.waiting import Waiting
from tests.e2e.conftest import Deployer, count, wait_for
from tests.support.pooler_endpoints import Ping
from tests.support.poolers import POOLER_SIZE, start_pooler

MODULE = "tests.support.pooler_endpoints"
LONG_PEEK_DELAY = 60.0
"""A periodic peek that never comes during a test: only a wake-up can start the work."""
SERVER_ROLE = "er_pooler"
"""The role of the pooler's server connections: they are told apart by it."""
MESSAGES = 200


@pytest.fixture(scope="module")
def pooler(server_dsn: str) -> Iterator[object]:
    """The module's PgBouncer, logging in to the server as :data:`SERVER_ROLE`."""
    async def create_role() -> None:
        connection = await asyncpg.connect(server_dsn)
        try:
            await connection.execute(
                f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = "
                f"'{SERVER_ROLE}') THEN CREATE ROLE {SERVER_ROLE} LOGIN SUPERUSER; END IF; "
                "END $$")
        finally:
            await connection.close()

    asyncio.run(create_role())
    pooler = start_pooler(server_dsn, server_user=SERVER_ROLE)
    yield pooler
    pooler.stop()


@pytest.fixture
async def db(transport: PostgresTransport) -> PostgresTransport:
    # Each handler's insert notes the application_name its server session had for it.
    await transport.pool.execute("CREATE TABLE handled (key text, application text NOT NULL "
                                 "DEFAULT current_setting('application_name'))")
    await transport.create_queue("pongs")
    return transport


async def _server_connections(db: PostgresTransport) -> int:
    return await count(db.pool, "SELECT count(*) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND usename = $1", SERVER_ROLE)


async def _listening(db: PostgresTransport) -> int:
    return await count(db.pool, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND query LIKE 'LISTEN%'")


@pytest.fixture
async def pooled_sender(pooler: object, database_dsn: str) -> AsyncIterator[Sender]:
    """A sender through the pooler, as a web application behind it would send."""
    settings = TransportSettings(dsn=database_dsn,
                                 pooler_dsn=pooler.for_dsn(database_dsn))  # type: ignore[attr-defined]
    async with Sender("e2e-driver", settings) as sender:
        yield sender


# The minute-long peek delay is the point (only a wake-up can start the work in time).
@pytest.mark.filterwarnings("ignore:peek_delay .* is above the recommended:UserWarning")
async def test_a_deployment_behind_the_pooler_drains_on_its_server_connections_and_wakes(
    db: PostgresTransport, deployer: Deployer, pooler: object, database_dsn: str,
    pooled_sender: Sender,
) -> None:
    deployment = await deployer.start(
        "pooled", module=MODULE, peek_delay=LONG_PEEK_DELAY,
        pooler_dsn=pooler.for_dsn(database_dsn))  # type: ignore[attr-defined]
    address = QueueAddress.parse("pooled")
    waiting = Waiting(address)
    # Idle at start: the kept receiver's empty slot (or the peeker) marks the queue waiting.
    await wait_for(lambda: waiting.is_waiting(db.pool), timeout=30, what="the waiting mark")

    seen: list[int] = []

    async def watch() -> None:
        while True:
            seen.append(await _server_connections(db))
            await asyncio.sleep(0.02)

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        for n in range(MESSAGES):
            await pooled_sender.send(Ping(f"m{n}"), "pooled")
        await wait_for(lambda: _handled(db, MESSAGES), timeout=60,
                       what=f"{MESSAGES} messages handled")
    finally:
        watcher.cancel()
    # Handled once each, their replies sent once each, on at most the pooler's connections.
    assert await count(db.pool, "SELECT count(DISTINCT key) FROM handled") == MESSAGES
    # The pooler ran every handler's transaction under the deployment's application_name
    # (its reservation tag), as on direct connections: operators tell its work apart.
    applications = {row["application"] for row in await db.pool.fetch(
        "SELECT DISTINCT application FROM handled")}
    tag = parse_qs(urlsplit(str(deployment.config.dsn)).query)["application_name"][0]
    assert tag.startswith("endpoint_runtime/"), tag
    assert applications == {tag}, applications
    assert await db.depth("pongs") == MESSAGES
    assert seen
    assert max(seen) <= POOLER_SIZE, seen
    assert max(seen) >= 1  # the watcher did see the pooler's connections
    status = await deployment.status()
    assert len(status.receivers) >= 1
    # Only the peeker listens, on its direct connection; the receivers do not.
    assert await _listening(db) == 1

    # Idle again: one more message is handled long before the minute-long periodic peek.
    await wait_for(lambda: waiting.is_waiting(db.pool), timeout=30, what="the waiting mark")
    loop = asyncio.get_running_loop()
    sent_at = loop.time()
    await pooled_sender.send(Ping("after"), "pooled")
    await wait_for(lambda: _handled(db, MESSAGES + 1), timeout=20,
                   what="the message sent to the idle endpoint handled", interval=0.01)
    assert loop.time() - sent_at < LONG_PEEK_DELAY / 3


async def _handled(db: PostgresTransport, expected: int) -> bool:
    return await count(db.pool, "SELECT count(*) FROM handled") >= expected
