"""Messages that expire while a receive transaction is open (time to be received).

A receive must judge expiry by the time of its own statement (``statement_timestamp()``),
never by the start of its transaction (``now()``): receive transactions can be old (a BEGIN
carried from the previous COMMIT, the outbox's grouped acks). These helpers send a message
that expires after such a transaction began, and wait, by the database's clock, until it has.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import msgspec

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport import QueueAddress

SHORT_LIFE = timedelta(milliseconds=50)


async def send_expiring(
    transport: PostgresTransport, queue: str | QueueAddress, message: msgspec.Struct,
    life: timedelta = SHORT_LIFE,
) -> str:
    """Send ``message`` with a short time to be received; its message id."""
    outgoing = create_outgoing(message, time_to_be_received=life)
    await transport.send(queue, outgoing)
    return outgoing.message_id


async def wait_until_expired(
    transport: PostgresTransport, queue: str | QueueAddress, count: int, limit_s: float = 10.0
) -> None:
    """Wait, by the database's own clock, until ``count`` rows of ``queue`` have expired."""
    address = transport.address(queue)
    query = (f"SELECT count(*) FROM {address.qualified} "
             "WHERE expires < (clock_timestamp() AT TIME ZONE 'UTC')")
    deadline = asyncio.get_running_loop().time() + limit_s
    while (expired := await transport.pool.fetchval(query)) < count:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{expired} of {count} rows expired within {limit_s} s")
        await asyncio.sleep(0.01)
