"""Hostile rows through real deployments (a peeker and receiver actors on Ray), one per
transaction mode: every row is accounted for as in ``test_received_rows``, no receiver dies
or is replaced, the endpoint is not halted, and each batch settles within a deadline."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from hypothesis import given

from endpoint_runtime import Endpoint, EndpointDeployment
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import EndpointTables
from tests.e2e.conftest import Deployer, count, deployer, ray_session, wait_for
from tests.fuzz.accounting import (
    assert_conserved,
    count_ended,
    insert,
    install_fuzzed,
    least_ended,
    reset,
    where_rows_ended,
)
from tests.fuzz.conftest import examples
from tests.fuzz.endpoints import ENDPOINTS
from tests.fuzz.strategies import Row, rows

pytestmark = pytest.mark.ray
__all__ = ["deployer", "ray_session"]  # the e2e fixtures, used here too

ROWS_PER_EXAMPLE = 12
SETTLE_SECONDS = 30


class Deployed(NamedTuple):
    endpoint: Endpoint
    deployment: EndpointDeployment


@pytest.fixture(params=list(ENDPOINTS))
async def deployed(request: pytest.FixtureRequest, transport: PostgresTransport,
                   deployer: Deployer) -> Deployed:
    """A deployment of the fuzzed endpoint of one mode, kept for all the test's examples."""
    await install_fuzzed(transport)
    endpoint = ENDPOINTS[request.param]
    module, _, attribute = endpoint.import_path.partition(":")
    return Deployed(endpoint, await deployer.start(attribute, module=module))


async def settled(transport: PostgresTransport, deployed: Deployed, batch: list[Row]) -> bool:
    """Nothing left to receive, nothing waiting for a retry, and every row that must end
    somewhere ended: an empty queue alone is not the end (a ``none`` receiver deletes a row
    before its handler runs, and it is in no table until the handler or its move to the
    error queue is done; a CI run on a busy machine read the tables in between)."""
    endpoint = deployed.endpoint
    tables = EndpointTables.of(endpoint, deployed.deployment.config.settings)
    waiting = await transport.depth(tables.queue)
    if tables.delayed is not None:
        waiting += await count(transport.pool, f"SELECT count(*) FROM {tables.delayed.qualified}")
    return waiting == 0 and (
        await count_ended(transport, endpoint, batch) >= least_ended(endpoint, batch))


@examples(0.03)
@given(batch=rows(ROWS_PER_EXAMPLE))
async def test_hostile_rows_never_crash_or_stall_a_deployment(
    transport: PostgresTransport, deployed: Deployed, batch: list[Row]
) -> None:
    endpoint = deployed.endpoint
    await reset(transport, endpoint)
    await insert(transport, endpoint, batch)

    await wait_for(lambda: settled(transport, deployed, batch), timeout=SETTLE_SECONDS,
                   what="the queue and the delayed store to empty and every row to end")

    assert_conserved(endpoint, batch, await where_rows_ended(transport, endpoint, batch))
    status = await deployed.deployment.status(refresh=True)
    assert not status.halted, status
    assert status.replaced_receivers == 0, status
