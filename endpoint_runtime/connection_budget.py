"""How many PostgreSQL connections a deployment may open, checked against the server at start.

Each receiver has a pool of up to ``2 x slots_per_receiver + 1`` connections (a slot's receive
connection, the business or immediate-dispatch connection it may take beside it, one spare)
and, with ``notify_on_send``, one LISTEN connection; the peeker has a pool of
:data:`PEEKER_POOL_SIZE` and one LISTEN connection (shared with the delayed-message mover).
With the defaults, 64 receivers of 4 slots may open 640 connections: far above PostgreSQL's
default ``max_connections`` of 100. When connections run out, receivers fail to start and the
peeker relaunches them every peek cycle, so a deployment that cannot fit fails at start
instead, with a :class:`~endpoint_runtime.errors.ConfigurationError` that names the numbers.

Example::

    budget = ConnectionBudget.of(settings)
    async with pool.acquire() as connection:  # raises when the deployment cannot fit
        await check_connection_budget(connection, settings, endpoint="sales")
"""

from __future__ import annotations

import msgspec

from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transport.connection import DatabaseConnection

PEEKER_POOL_SIZE = 4
"""Connections of the peeker's pool (peeks, the delayed-message mover, the outbox cleaner)."""


class ConnectionBudget(msgspec.Struct, frozen=True, kw_only=True):
    """The most connections one deployment of an endpoint may hold at once."""

    receivers: int
    per_receiver: int
    peeker: int

    @classmethod
    def of(cls, settings: EndpointSettings) -> ConnectionBudget:
        listen = 1 if settings.transport.notify_on_send else 0
        return cls(
            receivers=max(settings.max_receivers, settings.min_receivers),
            per_receiver=receiver_pool_size(settings.slots_per_receiver) + listen,
            peeker=PEEKER_POOL_SIZE + 1,
        )

    @property
    def worst_case(self) -> int:
        return self.receivers * self.per_receiver + self.peeker


def receiver_pool_size(slots_per_receiver: int) -> int:
    """The pool of one receiver: for each slot its receive connection and one beside it (the
    outbox's business transaction, an immediate send), and one spare."""
    return 2 * slots_per_receiver + 1


class ServerCapacity(msgspec.Struct, frozen=True, kw_only=True):
    max_connections: int
    superuser_reserved: int
    reserved: int
    """``reserved_connections`` (PostgreSQL 16 and later; 0 before)."""
    in_use: int
    """Client connections open now, the one asking excepted."""

    @property
    def available(self) -> int:
        return self.max_connections - self.superuser_reserved - self.reserved - self.in_use


CAPACITY_QUERY = """
SELECT current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int AS superuser_reserved,
       coalesce(current_setting('reserved_connections', true), '0')::int AS reserved,
       (SELECT count(*) FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())::int AS in_use
"""


async def server_capacity(connection: DatabaseConnection) -> ServerCapacity:
    """What the server has left for new client connections (``connection`` not counted)."""
    row = await connection.fetchrow(CAPACITY_QUERY)
    assert row is not None
    return ServerCapacity(**dict(row))


async def check_connection_budget(
    connection: DatabaseConnection, settings: EndpointSettings, *, endpoint: str
) -> None:
    """Raise :class:`ConfigurationError` when the deployment's worst case does not fit in what
    the server has left. Reserved slots count as taken even for a superuser: they are what
    lets an administrator in when everything else is used up."""
    budget = ConnectionBudget.of(settings)
    capacity = await server_capacity(connection)
    if budget.worst_case <= capacity.available:
        return
    slots = settings.slots_per_receiver
    listen = " + 1 LISTEN" if settings.transport.notify_on_send else ""
    fitting = max(0, (capacity.available - budget.peeker) // budget.per_receiver)
    raise ConfigurationError(
        f"endpoint {endpoint!r} may open up to {budget.worst_case} PostgreSQL connections "
        f"({budget.receivers} receivers x {budget.per_receiver} (pool of 2 x {slots} slots + 1"
        f"{listen}) + {budget.peeker} for the peeker), but the server has {capacity.available} "
        f"left (max_connections {capacity.max_connections} - superuser_reserved_connections "
        f"{capacity.superuser_reserved} - reserved_connections {capacity.reserved} - "
        f"{capacity.in_use} in use). Lower max_concurrency (at most {fitting * slots} fits "
        f"now: {fitting} receivers of {slots} slots), or raise the server's max_connections"
    )
