"""Batched atomic receive: one failing message in a batch does not touch the others."""

from __future__ import annotations

import collections

import pytest

from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.wire.messages import TransportMessage
from tests.e2e.conftest import (
    Deployer,
    create_queues,
    drain_queue,
    ns_in_queue,
    send_batch,
    status_line,
    wait_for,
    wait_for_status,
)
from tests.e2e.endpoints import Work

pytestmark = pytest.mark.in_process

TOTAL = 30
POISONED = 13
RETRIES = 2  # immediate_retries of batched_endpoint


async def test_batched_receive_isolates_the_failing_message(
    deployer: Deployer, transport: PostgresTransport
) -> None:
    await transport.pool.execute("CREATE TABLE business (n int NOT NULL, txid bigint)")
    await create_queues(transport, "batched", "attempts", "done")
    ids = await send_batch(
        transport, "batched", [Work(n, fail=n == POISONED) for n in range(TOTAL)]
    )
    deployment = await deployer.start("batched_endpoint")

    async def settled() -> bool:
        handled = await transport.pool.fetchval("SELECT count(*) FROM business")
        return handled == TOTAL - 1 and await transport.depth("error") == 1

    await wait_for(settled, timeout=30, what=f"{TOTAL - 1} handled and 1 in the error queue")
    # A receiver counts a message after its COMMIT returns, and the peeker's status is
    # refreshed at each peek: wait for both counts, the rows above may be seen first.
    status = await wait_for_status(
        deployment, lambda s: (s.moved_to_error == 1
                               and sum(r.processed for r in s.receivers) == TOTAL - 1),
        timeout=10, what="the receiver's status to count the processed and the moved",
    )

    expected = [n for n in range(TOTAL) if n != POISONED]
    business = sorted(await transport.pool.fetchval("SELECT array_agg(n) FROM business"))
    assert business == expected  # each once; the failing one's write never committed
    assert await ns_in_queue(transport, "done") == expected  # each outgoing message once
    attempts = collections.Counter(await ns_in_queue(transport, "attempts"))
    assert attempts[POISONED] == 1 + RETRIES, "the failing one ran 1 + immediate_retries times"
    # An optimistic batch that failed ran again without the failing message: the messages
    # before it in its batch ran twice (their writes and sends committed once, above).
    replayed = {n for n in expected if attempts[n] != 1}
    assert set(attempts) == set(range(TOTAL))
    assert all(attempts[n] == 2 and n < POISONED for n in replayed), attempts
    [failed] = await drain_queue(transport, "error")
    assert isinstance(failed, TransportMessage)
    assert failed.message_id == ids[POISONED]
    assert failed.headers[ErrorHeaders.FAILED_QUEUE] == "public.batched"
    assert failed.headers[ErrorHeaders.EXCEPTION_TYPE] == "tests.e2e.endpoints.HandlerFailedError"
    # Batches really were used: up to batch_size messages committed per transaction.
    per_transaction = await transport.pool.fetch(
        "SELECT count(*) AS messages FROM business GROUP BY txid"
    )
    assert max(row["messages"] for row in per_transaction) == 10
    # Nothing lost: input + handled + error accounts for every message sent.
    left = await transport.depth("batched")
    assert left == 0
    assert left + len(business) + 1 == TOTAL
    assert sum(r.processed for r in status.receivers) == TOTAL - 1, status_line(status)
    assert status.failed == 1 + RETRIES, "only it was charged"
