"""A handler that catches a database error without a savepoint leaves its transaction aborted.

PostgreSQL answers the COMMIT of an aborted transaction with ROLLBACK, not an error: counted as
processed, the message's DELETE would roll back and the message come back at once, for ever,
never reaching the error queue. Every mode must see it as a failed attempt instead (real
PostgreSQL, driven through each mode's receive strategy, no Ray).
"""

from __future__ import annotations

import pytest

from endpoint_runtime import Endpoint
from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import TransactionAbortedError
from endpoint_runtime.wire.messages import TransportMessage
from tests.support import swallowing_endpoints
from tests.support.swallowing_endpoints import Claim

ROUND_LIMIT = 50  # far more than 3 attempts and the move; a loop would use them all


async def prepare(transport: PostgresTransport, endpoint: Endpoint) -> None:
    for queue in (endpoint.name, "claimed", "error"):
        await transport.create_queue(queue)
    await transport.pool.execute("CREATE TABLE claims (key integer PRIMARY KEY);"
                                 "INSERT INTO claims VALUES (1)")
    async with transport.pool.acquire() as connection:
        if endpoint.settings.outbox is not None:
            await OutboxStorage.for_settings(endpoint.address, endpoint.settings).setup(
                connection)
        assert endpoint.delayed_store is not None
        await endpoint.delayed_store.setup_infrastructure(connection)


@pytest.mark.parametrize("name", ["atomic", "receive_only", "batched", "with_outbox"])
async def test_a_swallowed_database_error_is_a_failed_attempt_and_ends_in_the_error_queue(
    transport: PostgresTransport, name: str,
) -> None:
    endpoint: Endpoint = getattr(swallowing_endpoints, name)
    await prepare(transport, endpoint)
    await transport.send(endpoint.name, create_outgoing(Claim(1)))  # key 1 is claimed already
    strategy = endpoint.create_strategy(endpoint.create_pipeline(), transport.pool,
                                        endpoint.settings)

    rounds = 0
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        while await transport.depth("error") == 0 and rounds < ROUND_LIMIT:
            await slot.round()
            rounds += 1
        await slot.close()

    assert await transport.depth("error") == 1, f"no error-queue copy after {rounds} rounds"
    assert await transport.depth(endpoint.name) == 0
    # 1 attempt + 2 immediate retries, then the move (batched: a failed batch first)
    assert rounds <= 5
    row = await transport.receive("error")
    assert isinstance(row, TransportMessage)
    headers = row.headers
    assert headers[ErrorHeaders.EXCEPTION_TYPE].endswith(TransactionAbortedError.__name__)
    assert "savepoint" in headers[ErrorHeaders.MESSAGE]
    # Atomic, batched, outbox: no send escaped a failed attempt. Receive-only: one per attempt.
    sends = await transport.depth("claimed")
    assert sends == (3 if name == "receive_only" else 0)
