"""Sends and replies write to queue tables only.

Identifiers are always quoted, so an address can never inject SQL; but a send is an INSERT of
``id, expires, headers, body``, and a crafted address (a ``ReplyToAddress`` header) could name
any table with such columns: a business table, a table in another schema. Before a process
first writes to an address on a connection, :func:`ensure_queue_table` checks that the table
has the queue layout of the original transport (``id uuid, expires timestamp, headers text,
body bytea, seq bigint or integer``, the ``list_queues`` statement, which every queue made by
this runtime or by NServiceBus has) and, when the endpoint restricts them
(``TransportSettings.allowed_schemas``), that its schema is allowed. Anything else raises
:class:`~endpoint_runtime.errors.NotAQueueError` (or ``QueueNotFoundError``), so the message
fails and, after its retries, reaches the error queue with that reason.

The hot path pays a dictionary look-up: each connection remembers the addresses it verified
(a bounded LRU, see ``transport.connection``). Failed checks are not remembered, so input that
names thousands of tables that are not queues costs a catalog query each, never memory.

Example::

    await ensure_queue_table(connection, QueueAddress("billing"), allowed_schemas=None)
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any

import asyncpg

from endpoint_runtime.errors import NotAQueueError, QueueNotFoundError
from endpoint_runtime.transport import sql, statements
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import keeps_session, raise_as_loss_if_lost


@functools.cache
def _check_statement() -> str:
    queues = statements.shared("list_queues").strip().rstrip(";")
    return sql.load("queue_tables.sql")["queue_table"].replace("{list_queues}", queues)


async def ensure_queue_table(
    connection: Any, address: QueueAddress, *, allowed_schemas: Collection[str] | None
) -> None:
    """Raise unless ``address`` is a queue table that sends may write to.

    ``connection`` is any asyncpg connection (or a proxy of one) of the database that the
    message goes to; a :class:`~endpoint_runtime.transport.connection.QueueConnection`
    remembers what it verified (any other connection checks each time) and checks on a
    connection of its pool.
    """
    if allowed_schemas is not None and address.schema not in allowed_schemas:
        raise NotAQueueError(
            address, f"its schema is not one of the allowed {', '.join(sorted(allowed_schemas))}"
        )
    verified = getattr(connection, "verified_queues", None)
    if verified is not None and address in verified:
        return
    home = getattr(connection, "home", None)
    # Through the pool when the connection has one: the check must not depend on the state of
    # the connection's transaction (a handler may have caught an error that aborted it, and
    # in receive-only mode its sends still go, on other connections).
    if home is None or home.pool is None or not keeps_session(connection):
        # Behind a transaction-mode pooler (no session kept) a second connection of the pool
        # would need a second server connection while this one may hold the receive
        # transaction: slots that all wait for one would wait for ever. The check runs here;
        # a transaction that a handler left aborted fails it, and so the send, as its COMMIT
        # would.
        row = await connection.fetchrow(_check_statement(), address.schema, address.table)
    else:
        async with home.pool.acquire() as pooled:
            try:
                row = await pooled.fetchrow(_check_statement(), address.schema, address.table)
            except asyncpg.InternalClientError as exc:
                await raise_as_loss_if_lost(pooled, exc, f"the check of queue {address}")
    if not row["found"]:
        raise QueueNotFoundError(str(address))
    if not row["queue"]:
        raise NotAQueueError(
            address, "it does not have the queue layout (id uuid, expires timestamp, headers "
            "text, body bytea, seq bigint)"
        )
    if verified is not None:
        verified.add(address)
