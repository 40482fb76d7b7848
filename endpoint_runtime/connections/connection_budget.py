"""How many PostgreSQL connections a deployment may open, checked against the server at start.

Each receiver has a pool of up to ``2 x slots_per_receiver + 1`` connections (a slot's receive
connection, the business or immediate-dispatch connection it may take beside it, one spare)
and, with ``notify_on_send``, one LISTEN connection; the peeker has a pool of
:data:`PEEKER_POOL_SIZE` and one LISTEN connection (shared with the delayed-message mover).
Behind a transaction-mode pooler (``TransportSettings.pooler_dsn``) the pools are the
pooler's clients and only the peeker's LISTEN connection reaches the server itself: that is
what the check counts (the pooler's ``default_pool_size`` bounds the rest, see
docs/operations.md). With the defaults, 64 receivers of 4 slots may open 640 connections: far
above PostgreSQL's
default ``max_connections`` of 100. When connections run out, receivers fail to start and the
peeker relaunches them every peek cycle, so a deployment that cannot fit fails at start
instead, with a :class:`~endpoint_runtime.errors.ConfigurationError` that names the numbers.

Other deployments on the same server count with what they *may* open, not only with what
they have open now (an idle deployment holds a few connections and may scale up to its worst
case later): every connection of a deployment's peeker and receivers carries a reservation in
its ``application_name`` (:func:`reservation`: ``endpoint_runtime/<deployment id>/<worst
case>/<endpoint>``), which ``pg_stat_activity`` shows every role, and the check subtracts, for
each other deployment, the larger of its reservation and the connections it has open. The
reservation lasts as long as the deployment's connections: a deployment that stops or dies
releases it. A deployment that connects through the libpq ``PG*`` environment (no DSN) is not
tagged; its open connections count, its reservation cannot.

Example::

    budget = ConnectionBudget.of(settings)
    async with pool.acquire() as connection:  # raises when the deployment cannot fit
        await check_connection_budget(connection, settings, endpoint="sales")
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote, unquote

import msgspec
import structlog

from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transport import sql
from endpoint_runtime.transport.connection import DatabaseConnection

log = structlog.get_logger(__name__)

PEEKER_POOL_SIZE = 4
"""Connections of the peeker's pool (peeks, the delayed-message mover, the outbox cleaner)."""
BUDGET_POLL_SECONDS = 1.0
"""How often a start that waits for connections asks the server again."""
BUDGET_LOG_SECONDS = 10.0
"""How often a start that waits for connections says so."""


class ConnectionBudget(msgspec.Struct, frozen=True, kw_only=True):
    """The most connections one deployment of an endpoint may hold at once."""

    receivers: int
    per_receiver: int
    peeker: int

    pooled_per_receiver: int = 0
    """Behind a transaction-mode pooler: a receiver's pool, which connects to the pooler."""
    pooled_peeker: int = 0

    @classmethod
    def of(cls, settings: EndpointSettings) -> ConnectionBudget:
        """The connections to the server itself (``transport.dsn``). Behind a
        transaction-mode pooler (``transport.pooler_dsn``) that is only the peeker's LISTEN
        connection; the pools are the pooler's clients (:attr:`pooled_worst_case`), and the
        pooler's own pool size bounds what they take of the server."""
        receivers = max(settings.max_receivers, settings.min_receivers)
        pool = receiver_pool_size(settings.slots_per_receiver)
        if settings.transport.transaction_pooling:
            return cls(receivers=receivers, per_receiver=0, peeker=1,
                       pooled_per_receiver=pool, pooled_peeker=PEEKER_POOL_SIZE)
        listen = 1 if settings.transport.notify_on_send else 0
        return cls(receivers=receivers, per_receiver=pool + listen, peeker=PEEKER_POOL_SIZE + 1)

    @property
    def worst_case(self) -> int:
        """The most connections to the server itself."""
        return self.receivers * self.per_receiver + self.peeker

    @property
    def pooled_worst_case(self) -> int:
        """The most client connections to the pooler (0 without one): what its
        ``max_client_conn`` must leave room for."""
        return self.receivers * self.pooled_per_receiver + self.pooled_peeker


def receiver_pool_size(slots_per_receiver: int) -> int:
    """The pool of one receiver: for each slot its receive connection and one beside it (the
    outbox's business transaction, an immediate send), and one spare."""
    return 2 * slots_per_receiver + 1


APPLICATION_NAME_BYTES = 63
"""PostgreSQL keeps this much of an ``application_name`` (NAMEDATALEN - 1)."""


def reservation(deployment_id: str, worst_case: int, endpoint: str) -> str:
    """The ``application_name`` that reserves ``worst_case`` connections for a deployment;
    the endpoint's name, last, only helps a person reading ``pg_stat_activity`` (cut to fit)."""
    tag = f"endpoint_runtime/{deployment_id}/{worst_case}/{endpoint}"
    return tag.encode()[:APPLICATION_NAME_BYTES].decode(errors="ignore")


def reserving_dsn(dsn: str, application_name: str) -> str:
    """``dsn`` (a URL) with ``application_name`` in its query, replacing one given there;
    other parameters are left as written. An empty DSN (the libpq environment) and keyword
    DSNs are returned as they are."""
    if "://" not in dsn:
        return dsn
    base, _, fragment = dsn.partition("#")
    base, _, query = base.partition("?")
    kept = [pair for pair in query.split("&")
            if pair and unquote(pair.partition("=")[0]) != "application_name"]
    kept.append(f"application_name={quote(application_name, safe='')}")
    return f"{base}?{'&'.join(kept)}" + (f"#{fragment}" if fragment else "")


class ServerCapacity(msgspec.Struct, frozen=True, kw_only=True):
    max_connections: int
    superuser_reserved: int
    reserved: int
    """``reserved_connections`` (PostgreSQL 16 and later; 0 before)."""
    in_use: int
    """Client connections open now that belong to no deployment, the one asking excepted."""
    claimed: int = 0
    """What the running deployments may open: for each, the larger of its reservation and
    the connections it has open."""
    deployments: int = 0
    """Running deployments (with connections open) on the server."""

    @property
    def available(self) -> int:
        return (self.max_connections - self.superuser_reserved - self.reserved - self.in_use
                - self.claimed)


async def server_capacity(connection: DatabaseConnection) -> ServerCapacity:
    """What the server has left for a new deployment (``connection`` not counted)."""
    row = await connection.fetchrow(sql.load("connections.sql")["server_capacity"])
    assert row is not None
    return ServerCapacity(**dict(row))


async def check_connection_budget(
    connection: DatabaseConnection, settings: EndpointSettings, *, endpoint: str
) -> None:
    """Return once the deployment's worst case fits in what the server has left; raise
    :class:`ConfigurationError` when it does not. Reserved slots count as taken even for a
    superuser: they are what lets an administrator in when everything else is used up.

    When it does not fit only because other running deployments may open theirs (their
    reservations), the start waits up to ``settings.connection_budget_wait`` seconds for them
    to release connections, saying so every :data:`BUDGET_LOG_SECONDS`: on a shared server
    another deployment's start or stop is a matter of seconds, and a refusal that a second
    attempt would pass helps nobody. One that would not fit beside no other deployment is
    refused at once."""
    budget = ConnectionBudget.of(settings)
    if budget.pooled_worst_case:
        log.info("pooler_client_connections", endpoint=endpoint,
                 worst_case=budget.pooled_worst_case, direct=budget.worst_case,
                 hint="the pooler's max_client_conn must leave room for them")
    started = time.monotonic()
    said = float("-inf")
    while True:
        capacity = await server_capacity(connection)
        if budget.worst_case <= capacity.available:
            if said > float("-inf"):
                log.info("connection_budget_fits", endpoint=endpoint,
                         waited_s=round(time.monotonic() - started, 1))
            return
        waited = time.monotonic() - started
        alone = budget.worst_case <= capacity.available + capacity.claimed
        if not alone or waited >= settings.connection_budget_wait:
            raise ConfigurationError(_refusal(budget, capacity, settings, endpoint,
                                              waited if alone else None))
        if waited - said >= BUDGET_LOG_SECONDS:
            said = waited
            log.warning("connection_budget_waiting", endpoint=endpoint,
                        worst_case=budget.worst_case, available=capacity.available,
                        claimed_by_deployments=capacity.claimed,
                        running_deployments=capacity.deployments, waited_s=round(waited, 1),
                        gives_up_after_s=settings.connection_budget_wait)
        await asyncio.sleep(BUDGET_POLL_SECONDS)


def _refusal(budget: ConnectionBudget, capacity: ServerCapacity, settings: EndpointSettings,
             endpoint: str, waited: float | None) -> str:
    """The error's text; ``waited``: seconds waited for other deployments (``None``: it
    would not fit beside no other deployment, so it did not wait)."""
    slots = settings.slots_per_receiver
    if budget.per_receiver == 0:  # behind a pooler: the LISTEN connection alone
        return (f"endpoint {endpoint!r} needs {budget.worst_case} direct PostgreSQL connection "
                f"(its peeker's LISTEN; the pools go through the pooler), but the server has "
                f"{capacity.available} left (max_connections {capacity.max_connections}, "
                f"{capacity.in_use} in use, {capacity.claimed} that {capacity.deployments} "
                "running deployments may open). Raise the server's max_connections or the "
                "pooler's share of it")
    listen = " + 1 LISTEN" if settings.transport.notify_on_send else ""
    fitting = max(0, (capacity.available - budget.peeker) // budget.per_receiver)
    after = (f" after waiting {waited:.0f} s (connection_budget_wait) for them to release "
             "connections" if waited is not None else "")
    return (
        f"endpoint {endpoint!r} may open up to {budget.worst_case} PostgreSQL connections "
        f"({budget.receivers} receivers x {budget.per_receiver} (pool of 2 x {slots} slots + 1"
        f"{listen}) + {budget.peeker} for the peeker), but the server has {capacity.available} "
        f"left (max_connections {capacity.max_connections} - superuser_reserved_connections "
        f"{capacity.superuser_reserved} - reserved_connections {capacity.reserved} - "
        f"{capacity.in_use} in use - {capacity.claimed} that {capacity.deployments} running "
        f"deployments may open){after}. Lower max_concurrency (at most {fitting * slots} fits "
        f"now: {fitting} receivers of {slots} slots), or raise the server's max_connections"
    )
