"""An endpoint deployed on Ray under a role with only the grants of
``endpoint-runtime db grants`` (docs/security.md): its tables made once by an admin role, it
receives, handles, sends, defers, retries, audits and fails messages and writes its heartbeat
and queue length per minute (the console's) without any DDL, while
DDL, other schemas, other queues and business tables it was not granted are refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from endpoint_runtime import Endpoint, EndpointDeployment, TransportSettings
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import EndpointTables, install
from endpoint_runtime.database.privileges import endpoint_grants
from endpoint_runtime.errors import ConfigurationError
from tests.e2e.conftest import PEEK_DELAY, STOP_TIMEOUT, count, wait_for
from tests.support import least_privilege_endpoints
from tests.support.least_privilege_endpoints import BILLING, BUSINESS_TABLE, PlaceOrder
from tests.support.roles import Role, login_role

pytestmark = pytest.mark.ray

ENDPOINTS = {"atomic": least_privilege_endpoints.atomic,
             "outbox": least_privilege_endpoints.with_outbox}

# As the endpoint's role, each of these must be refused (SQLSTATE 42501).
REFUSED = {
    "create a table": "CREATE TABLE public.sneaky (n int)",
    "create a schema": "CREATE SCHEMA sneaky",
    "create a function": "CREATE FUNCTION public.sneaky() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "index its own queue": 'CREATE INDEX ON public."{queue}" (expires)',
    "alter its own queue": 'ALTER TABLE public."{queue}" ADD COLUMN sneaky int',
    "drop its own queue": 'DROP TABLE public."{queue}"',
    "truncate its own queue": 'TRUNCATE public."{queue}"',
    "read a queue it sends to": f'SELECT * FROM public."{BILLING}"',
    "take from a queue it sends to": f'DELETE FROM public."{BILLING}"',
    "read other failed messages": 'SELECT headers, body FROM public."error"',
    "send to a queue not granted": 'INSERT INTO public."lp_shipping" (id, headers) '
                                   "VALUES (gen_random_uuid(), '{{}}')",
    "read a business table not granted": "SELECT * FROM public.payroll",
    "write a business table not granted": "INSERT INTO public.payroll VALUES ('me', 1e6)",
    "read another schema": "SELECT * FROM accounting.ledger",
    "read its business table (granted INSERT only)": f"SELECT * FROM public.{BUSINESS_TABLE}",
}


async def prepare_as_admin(transport: PostgresTransport, endpoint: Endpoint) -> None:
    """What an administrator does once: the endpoint's tables, the queues around it, the
    business tables (one granted, one not) and a schema the endpoint has nothing to do with."""
    await install(transport, endpoint, endpoint.settings)
    for queue in (BILLING, "lp_shipping"):
        await transport.create_queue(queue)
    await transport.pool.execute(
        f"CREATE TABLE {BUSINESS_TABLE} (order_id text PRIMARY KEY);"
        "CREATE TABLE payroll (name text, salary numeric);"
        "CREATE SCHEMA accounting; CREATE TABLE accounting.ledger (entry text)")


@pytest.fixture
async def endpoint_role(database_dsn: str) -> AsyncIterator[Role]:
    async with login_role(database_dsn) as role:
        yield role


async def grant(transport: PostgresTransport, endpoint: Endpoint, role: Role) -> list[str]:
    database = await transport.pool.fetchval("SELECT current_database()")
    statements = endpoint_grants(endpoint, endpoint.settings, role.name,  # what db grants prints
                                 sends_to=[BILLING], database=database)
    statements.append(f'GRANT INSERT ON public.{BUSINESS_TABLE} TO "{role.name}";')
    for statement in statements:
        await transport.pool.execute(statement)
    return statements


async def deploy(endpoint: Endpoint, role: Role, *, installers: bool) -> EndpointDeployment:
    return await EndpointDeployment.start(
        endpoint, stop_timeout=STOP_TIMEOUT,
        transport=TransportSettings(dsn=role.dsn, peek_delay=PEEK_DELAY, installers=installers))


@pytest.mark.parametrize("mode", list(ENDPOINTS))
async def test_an_endpoint_runs_with_its_grants_alone(
    transport: PostgresTransport, endpoint_role: Role, mode: str
) -> None:
    endpoint = ENDPOINTS[mode]
    await prepare_as_admin(transport, endpoint)
    statements = await grant(transport, endpoint, endpoint_role)
    grants = [s for s in statements if s.startswith("GRANT")]  # the rest: row-level security
    assert not any("CREATE ON" in s or "ALL" in s for s in grants), statements

    # With installers (the default) the start runs DDL, which the role may not.
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await deploy(endpoint, endpoint_role, installers=True)

    orders = [PlaceOrder("o1"), PlaceOrder("o2"), PlaceOrder("o3", "defer"),
              PlaceOrder("o4", "fail")]
    await transport.send_many(endpoint.name, [create_outgoing(order) for order in orders])
    deployment = await deploy(endpoint, endpoint_role, installers=False)
    try:
        async def settled() -> bool:
            handled = await count(transport.pool, f"SELECT count(*) FROM {BUSINESS_TABLE}")
            return handled == 3 and await transport.depth("error") == 1

        # o4 fails, waits 0.3 s for its delayed retry, fails again: the error queue.
        await wait_for(settled, timeout=30, what="3 orders handled and 1 in the error queue")
        assert await transport.depth(BILLING) == 3
        assert await transport.depth("lp_audit") == 4  # o3's deferral was handled too
        assert await transport.depth(endpoint.name) == 0
        status = await deployment.status(refresh=True)
        assert not status.halted, status
        assert status.replaced_receivers == 0
        await wait_for(lambda: _heartbeat_state(transport, endpoint.name), timeout=20,
                       what="the role's heartbeat")
        assert await count(transport.pool, "SELECT count(*) FROM endpoint_queue_lengths "
                           "WHERE endpoint = $1", endpoint.name) >= 1
    finally:
        await deployment.stop()
    assert await _heartbeat_state(transport, endpoint.name) == "stopped"  # its last beat

    connection = await asyncpg.connect(endpoint_role.dsn)
    try:
        assert await connection.fetchval("SELECT current_user") == endpoint_role.name
        for what, statement in REFUSED.items():
            try:
                await connection.execute(statement.format(queue=endpoint.name))
            except asyncpg.InsufficientPrivilegeError:
                continue
            raise AssertionError(f"the endpoint's role could {what}")
    finally:
        await connection.close()


async def _heartbeat_state(transport: PostgresTransport, endpoint: str) -> str | None:
    state: str | None = await transport.pool.fetchval(
        "SELECT state FROM endpoint_heartbeats WHERE endpoint = $1", endpoint)
    return state


async def test_without_installers_missing_tables_are_named(
    transport: PostgresTransport, endpoint_role: Role
) -> None:
    endpoint = least_privilege_endpoints.atomic
    await transport.create_queue(endpoint.name)  # the rest is missing
    with pytest.raises(ConfigurationError) as refused:
        await asyncio.wait_for(deploy(endpoint, endpoint_role, installers=False), 30)
    message = str(refused.value)
    tables = EndpointTables.of(endpoint, endpoint.settings)
    for what, table in tables.named()[1:]:
        if what != "waiting":  # the schema's table of waiting channels came with the queue
            assert f"{what} {table}" in message, message
    assert f"queue {tables.queue}" not in message, message  # it exists
