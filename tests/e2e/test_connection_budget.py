"""The connection budget: a deployment that may open more connections than the server has left
fails at start, before it creates anything, with an error that names the numbers."""

from __future__ import annotations

import re

import pytest

from endpoint_runtime import ConfigurationError, EndpointSettings, TransportSettings
from endpoint_runtime.connecting import PostgresTransport
from endpoint_runtime.connection_budget import (
    ConnectionBudget,
    ServerCapacity,
    server_capacity,
)
from tests.e2e.conftest import Deployer
from tests.support.hardening_endpoints import wide

pytestmark = pytest.mark.ray
MODULE = "tests.support.hardening_endpoints"


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
    assert re.search(r"- \d+ in use\)", text)
    assert "Lower max_concurrency" in text
    assert "raise the server's max_connections" in text
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
