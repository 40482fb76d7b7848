"""An endpoint's business tables at a deployment's start (in process) on PostgreSQL: with
installers the start creates them (twice without harm, rows kept) and the handlers write
them; without installers the start runs no DDL and names each missing business table, and
once they are installed the same start succeeds and the handlers write them."""

from __future__ import annotations

import asyncio

import pytest

from endpoint_runtime import Endpoint, Sender, TransportSettings
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import install
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.runtime.in_process import InProcessDeployment
from tests.e2e.conftest import PEEK_DELAY, STOP_TIMEOUT, Deployer, count, wait_for
from tests.support import schema_endpoints
from tests.support.schema_endpoints import LEDGER, ORDERS, Book, RecordOrder

pytestmark = pytest.mark.in_process

MODULE = "tests.support.schema_endpoints"
START_TIMEOUT = 60


async def rows(transport: PostgresTransport, table: str) -> int:
    return await count(transport.pool, f"SELECT count(*) FROM {table}")


async def table_exists(transport: PostgresTransport, table: str) -> bool:
    return await transport.pool.fetchval("SELECT to_regclass($1) IS NOT NULL", table)


async def test_a_start_with_installers_creates_the_tables_and_a_second_start_keeps_them(
    deployer: Deployer, transport: PostgresTransport, sender: Sender
) -> None:
    assert not await table_exists(transport, ORDERS)
    for round_, order in enumerate(("first", "second"), start=1):
        deployment = await deployer.start("with_sql", module=MODULE)
        assert await table_exists(transport, ORDERS)
        await sender.send(RecordOrder(order), destination="bs_sales")

        async def written(expected: int = round_) -> bool:
            return await rows(transport, ORDERS) == expected

        await wait_for(written, timeout=30, what=f"{round_} order rows")
        await deployer.stop(deployment)


async def deploy_without_installers(endpoint: Endpoint, dsn: str) -> InProcessDeployment:
    return await asyncio.wait_for(InProcessDeployment.start(
        endpoint, stop_timeout=STOP_TIMEOUT,
        transport=TransportSettings(dsn=dsn, peek_delay=PEEK_DELAY, installers=False)),
        START_TIMEOUT)


@pytest.mark.parametrize(("name", "table", "message"), [
    ("with_sql", ORDERS, RecordOrder("o1")),
    ("with_hook", LEDGER, Book("e1")),
])
async def test_without_installers_a_missing_business_table_is_named_then_installed_it_works(
    transport: PostgresTransport, sender: Sender, database_dsn: str, name: str, table: str,
    message: RecordOrder | Book,
) -> None:
    endpoint: Endpoint = getattr(schema_endpoints, name)
    settings = endpoint.settings
    await install(transport, endpoint, settings)  # everything, as `db install` does
    await transport.pool.execute(f"DROP TABLE {table}")  # but the business table

    with pytest.raises(ConfigurationError) as refused:
        await deploy_without_installers(endpoint, database_dsn)

    error = str(refused.value)
    assert f"tables do not exist: business table {table};" in error, error
    assert "endpoint-runtime db install" in error, error
    assert not await table_exists(transport, table)  # the start ran no DDL

    await install(transport, endpoint, settings)
    deployment = await deploy_without_installers(endpoint, database_dsn)
    try:
        await sender.send(message, destination=endpoint.name)

        async def written() -> bool:
            return await rows(transport, table) == 1

        await wait_for(written, timeout=30, what=f"a row in {table}")
    finally:
        await deployment.stop()
