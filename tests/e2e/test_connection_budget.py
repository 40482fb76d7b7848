"""The connection budget: a deployment that may open more connections than the server has left
fails at start, before it creates anything, with an error that names the numbers. What the
server has left counts what other running deployments may open (their reservations), not
only what they have open."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import asyncpg
import pytest
import structlog.testing

from endpoint_runtime import ConfigurationError, EndpointSettings, TransportSettings
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.connections.connection_budget import (
    APPLICATION_NAME_BYTES,
    ConnectionBudget,
    ServerCapacity,
    reservation,
    reserving_dsn,
    server_capacity,
)
from endpoint_runtime.connections.embedded import with_database
from endpoint_runtime.transport import quote_identifier
from tests.e2e.conftest import Deployer, wait_for
from tests.support.hardening_endpoints import wide

pytestmark = pytest.mark.ray
MODULE = "tests.support.hardening_endpoints"


@pytest.mark.in_process
async def test_a_deployment_whose_worst_case_exceeds_the_server_fails_at_start(
    deployer: Deployer, transport: PostgresTransport
) -> None:
    async with transport.pool.acquire() as connection:
        capacity = await server_capacity(connection)
    budget = ConnectionBudget.of(wide.settings)
    # 64 receivers x (pool of 2 x 4 slots + 1, plus LISTEN) + the peeker's 4 + LISTEN.
    assert (budget.receivers, budget.per_receiver, budget.peeker) == (64, 10, 5)
    assert budget.worst_case == 645 > capacity.max_connections  # the premise of this test

    with pytest.raises(ConfigurationError) as refused:
        await deployer.start("wide", module=MODULE)

    text = str(refused.value)
    assert "endpoint 'wide' may open up to 645 PostgreSQL connections" in text
    assert "64 receivers x 10" in text
    assert f"max_connections {capacity.max_connections}" in text
    assert f"superuser_reserved_connections {capacity.superuser_reserved}" in text
    assert "reserved_connections" in text
    assert re.search(r"- \d+ in use - \d+ that \d+ running deployments may open\)", text)
    assert "Lower max_concurrency" in text
    assert "raise the server's max_connections" in text
    assert "after waiting" not in text  # it would not fit beside no other deployment: no wait
    # Refused before anything was created or started.
    assert await transport.pool.fetchval("SELECT to_regclass('public.wide')") is None


async def test_the_server_capacity_is_what_the_server_says(transport: PostgresTransport) -> None:
    async with transport.pool.acquire() as connection:
        capacity = await server_capacity(connection)
        assert capacity.max_connections == int(await connection.fetchval("SHOW max_connections"))
        assert capacity.superuser_reserved == int(
            await connection.fetchval("SHOW superuser_reserved_connections"))
        version = await connection.fetchval("SHOW server_version_num")
        if int(version) >= 160000:
            assert capacity.reserved == int(await connection.fetchval(
                "SHOW reserved_connections"))
        else:
            assert capacity.reserved == 0
        assert capacity.in_use >= 0


def test_budget_arithmetic() -> None:
    atomic = EndpointSettings(max_concurrency=8, slots_per_receiver=4)
    assert ConnectionBudget.of(atomic).worst_case == 2 * (2 * 4 + 1 + 1) + 5
    quiet = EndpointSettings(max_concurrency=8, slots_per_receiver=4,
                             transport=TransportSettings(notify_on_send=False))
    assert ConnectionBudget.of(quiet).worst_case == 2 * (2 * 4 + 1) + 5
    kept = EndpointSettings(max_concurrency=2, slots_per_receiver=2, min_receivers=3)
    assert ConnectionBudget.of(kept).receivers == 3
    server = ServerCapacity(max_connections=100, superuser_reserved=3, reserved=2, in_use=10)
    assert server.available == 85


async def _capacity(transport: PostgresTransport) -> ServerCapacity:
    async with transport.pool.acquire() as connection:
        return await server_capacity(connection)


@pytest.mark.in_process
async def test_two_deployments_that_fit_alone_do_not_both_start_when_together_they_may_not(
    deployer: Deployer, transport: PostgresTransport
) -> None:
    """The first deployment, idle, holds a few connections but may open about 60% of what
    the server has left; a second of the same size is refused, naming the first's claim.
    Before the reservations, both started (only open connections counted), and scaling up
    later would have run the server out of connections."""
    available = (await _capacity(transport)).available
    receivers = int(available * 0.6 - 5) // 10  # 10 connections per receiver of 4 slots
    assert receivers >= 1, available
    size = {"max_concurrency": 4 * receivers, "slots_per_receiver": 4}
    worst_case = receivers * 10 + 5
    first = await deployer.start("wide", module=MODULE, **size)
    opened = await transport.pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1",
        f"endpoint_runtime/{first.config.deployment_id}/{worst_case}/wide")
    assert 0 < opened < worst_case  # idle: far from what it may open

    after_first = await _capacity(transport)
    assert after_first.deployments >= 1
    assert after_first.claimed >= worst_case
    with pytest.raises(ConfigurationError) as refused:
        await deployer.start("wide", module=MODULE, connection_budget_wait=0, **size)
    assert f"may open up to {worst_case} PostgreSQL connections" in str(refused.value)
    assert re.search(r"- \d+ that [1-9]\d* running deployments may open\) after waiting 0 s",
                     str(refused.value))

    await deployer.stop(first)  # its reservation goes with its connections
    second = await deployer.start("wide", module=MODULE, **size)
    await deployer.stop(second)


@pytest.mark.in_process
async def test_a_start_that_fits_only_once_another_deployment_stops_waits_for_it(
    deployer: Deployer, transport: PostgresTransport
) -> None:
    """As above, but the second start waits (connection_budget_wait): it says so in the log
    with the numbers, and starts once the first deployment has stopped and released its
    reservation, instead of a refusal that a second attempt would pass."""
    available = (await _capacity(transport)).available
    receivers = int(available * 0.6 - 5) // 10
    assert receivers >= 1, available
    size = {"max_concurrency": 4 * receivers, "slots_per_receiver": 4}
    first = await deployer.start("wide", module=MODULE, **size)
    with structlog.testing.capture_logs() as logged:
        second = asyncio.get_running_loop().create_task(
            deployer.start("wide", module=MODULE, connection_budget_wait=60, **size))
        waiting = await wait_for(
            lambda: _first(logged, "connection_budget_waiting"), timeout=30,
            what="the second start saying it waits")
        assert not second.done()
        assert waiting["worst_case"] == receivers * 10 + 5
        assert waiting["running_deployments"] >= 1
        await deployer.stop(first)
        started = await asyncio.wait_for(second, timeout=30)
        assert _entry(logged, "connection_budget_fits") is not None
    await deployer.stop(started)


def _entry(logged: list[dict[str, Any]], event: str) -> dict[str, Any] | None:
    return next((entry for entry in logged if entry["event"] == event), None)


async def _first(logged: list[dict[str, Any]], event: str) -> dict[str, Any] | None:
    return _entry(logged, event)


def test_a_negative_wait_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="connection_budget_wait cannot be negative"):
        EndpointSettings(connection_budget_wait=-1)


@pytest.mark.in_process
async def test_the_capacity_counts_a_reservation_or_the_open_connections_whichever_is_more(
    database_dsn: str, transport: PostgresTransport
) -> None:
    """Self-test of the count: sessions planted with reservations of deployments that do not
    exist are claimed as reserved (not in use), each deployment once, at the larger of its
    reservation and its sessions."""
    before = await _capacity(transport)
    small, large = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    planted = [
        await asyncpg.connect(reserving_dsn(database_dsn, reservation(small, 2, "small")))
        for _ in range(3)  # more open than reserved: 3 count
    ] + [
        await asyncpg.connect(reserving_dsn(database_dsn, reservation(large, 50, "large")))
        for _ in range(2)  # fewer open than reserved: 50 count
    ]
    try:
        during = await _capacity(transport)
    finally:
        for connection in planted:
            await connection.close()
    # Other clients of the server may come and go meanwhile; these figures are ours alone.
    assert during.deployments - before.deployments == 2
    assert during.claimed - before.claimed == 3 + 50


@pytest.mark.in_process
async def test_a_role_without_pg_read_all_stats_counts_other_roles_connections(
    server_dsn: str, database_dsn: str, transport: PostgresTransport
) -> None:
    """Other roles' sessions show no backend_type to such a role: they count all the same
    (before, a least-privilege endpoint role counted only its own connections)."""
    role = f"er_budget_{uuid.uuid4().hex[:8]}"
    await transport.pool.execute(f"CREATE ROLE {quote_identifier(role)} LOGIN")
    try:
        await _capacity(transport)  # the test's pool holds a connection of postgres
        url, replaced = re.subn(r"://[^@/]*@", f"://{role}@", database_dsn, count=1)
        assert replaced == 1, "the test expects a URL DSN with a user"
        connection = await asyncpg.connect(url)
        try:
            assert not await connection.fetchval(
                "SELECT pg_has_role('pg_read_all_stats', 'MEMBER')")  # the premise
            limited = await server_capacity(connection)
        finally:
            await connection.close()
        assert limited.in_use >= 1  # at least the pool's connection, of another role
    finally:
        admin = await asyncpg.connect(with_database(server_dsn, "postgres"))
        try:
            await admin.execute(f"DROP ROLE IF EXISTS {quote_identifier(role)}")
        finally:
            await admin.close()


def test_a_reservation_fits_application_name_and_keeps_the_dsn_as_written() -> None:
    tag = reservation("0a1b2c3d", 645, "x" * 100)
    assert tag.startswith("endpoint_runtime/0a1b2c3d/645/xxx")
    assert len(tag.encode()) == APPLICATION_NAME_BYTES
    dsn = "postgresql://u:p%40ss@/db?host=/run/pg&application_name=mine&sslmode=disable"
    assert reserving_dsn(dsn, "endpoint_runtime/0a1b2c3d/5/e") == (
        "postgresql://u:p%40ss@/db?host=/run/pg&sslmode=disable"
        "&application_name=endpoint_runtime%2F0a1b2c3d%2F5%2Fe")
    assert reserving_dsn("", "t") == ""  # the libpq environment: left alone
    assert reserving_dsn("host=h dbname=d", "t") == "host=h dbname=d"
