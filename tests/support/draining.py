"""Driving an endpoint without Ray: its mode's receive strategy on one slot, and reading what
it sent (for integration tests that check messages in and rows out)."""

from __future__ import annotations

import collections

from endpoint_runtime import Endpoint
from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.pipeline import Pipeline
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transactions.base import ReceiveStrategy
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.messages import TransportMessage


async def drain(transport: PostgresTransport, endpoint: Endpoint,
                pipeline: Pipeline | None = None) -> ReceiveStrategy:
    """Receive until the endpoint's queue is empty, on one slot of its mode's strategy (which
    it returns, for its counts), with ``pipeline`` (default: the endpoint's chain)."""
    strategy = endpoint.create_strategy(pipeline or endpoint.create_pipeline(), transport.pool,
                                        endpoint.settings)
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        while (await slot.round()).taken:
            pass
        await slot.close()
    return strategy


async def received_all(
    transport: PostgresTransport, queue: str | QueueAddress
) -> list[TransportMessage]:
    """Receive every message of ``queue`` (in seq order); a poison row fails the test."""
    messages = []
    while (message := await transport.receive(queue)) is not None:
        assert isinstance(message, TransportMessage)
        messages.append(message)
    return messages


async def prepare(transport: PostgresTransport, endpoint: Endpoint, *queues: str,
                  tables: str = "") -> None:
    """The endpoint's ``queues``, its outbox table when it has an outbox, and ``tables``
    (DDL), before a :func:`drain`."""
    for queue in queues:
        await transport.create_queue(queue)
    if tables:
        await transport.pool.execute(tables)
    if endpoint.settings.outbox is not None:
        async with transport.pool.acquire() as connection:
            await OutboxStorage.for_settings(endpoint.address, endpoint.settings).setup(connection)


ATTEMPTS_TABLES = "CREATE TABLE attempts (n int); CREATE TABLE handled (n int)"
"""Where test handlers note each attempt (outside the message's transaction: every attempt is
seen, rolled back or not) and each success (inside it), by message number."""


async def attempts_by_message(transport: PostgresTransport) -> collections.Counter[int]:
    """The attempts of :data:`ATTEMPTS_TABLES`, per message number."""
    rows = await transport.pool.fetch("SELECT n FROM attempts")
    return collections.Counter(row["n"] for row in rows)
