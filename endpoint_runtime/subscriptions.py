"""Publish/subscribe: the subscription table, topics of an event type, cached subscriber lists.

A topic is the wire name of a message type (``module.QualName``, or ``__message_type_name__``,
e.g. a .NET type name). Publishing an event sends one copy to every distinct subscriber queue
of every topic in the event's type hierarchy (msgspec Struct inheritance), so a subscriber to
a base type receives the derived events too. Subscribing is an upsert of (endpoint, topic) ->
queue address, unsubscribing a delete, as in NServiceBus's PostgreSQL transport, whose table
layout (default ``"SubscriptionRouting"``) is kept.

Example::

    store = SubscriptionStore(QueueAddress("SubscriptionRouting"))
    await store.subscribe(pool, QueueAddress("billing"), "billing", topics_of(OrderPlaced)[0])
    await store.subscribers(pool, topics_of(OrderPlaced))  # [QueueAddress("billing")]
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable

import asyncpg
import msgspec
import structlog

from endpoint_runtime.messages import Headers
from endpoint_runtime.serialization import message_type_name
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import sql
from endpoint_runtime.transport.addresses import QueueAddress, quote_identifier
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.queues import ddl_lock
from endpoint_runtime.transport.sending import Executor

log = structlog.get_logger("endpoint_runtime.subscriptions")

DEFAULT_TABLE = "SubscriptionRouting"
CACHE_SECONDS = 5.0
CACHE_ENTRIES = 1_000


@functools.lru_cache(maxsize=1024)
def topics_of(event_type: type[msgspec.Struct]) -> tuple[str, ...]:
    """The topics of an event type: its own wire name, then its Struct bases', most specific
    first (the order of ``NServiceBus.EnclosedMessageTypes``)."""
    return tuple(
        message_type_name(base) for base in event_type.__mro__
        if isinstance(base, type) and issubclass(base, msgspec.Struct)
        and base is not msgspec.Struct
    )


def enclosed_types(topics: tuple[str, ...]) -> dict[str, str]:
    """The ``NServiceBus.EnclosedMessageTypes`` header of an event: its whole hierarchy, so a
    subscriber that knows only a base type decodes the event as that type."""
    return {Headers.ENCLOSED_MESSAGE_TYPES: ";".join(topics)}


class Subscription(msgspec.Struct, frozen=True):
    topic: str
    endpoint: str
    queue_address: str


class SubscriptionStore:
    """One subscription table, with subscriber lists cached for ``cache_seconds``.

    The cache is per process; a subscribe or unsubscribe through this store drops it, one made
    elsewhere is seen once the entry expires.
    """

    def __init__(self, table: QueueAddress, *, cache_seconds: float = CACHE_SECONDS) -> None:
        self.table = table
        self.cache_seconds = cache_seconds
        self._cache: dict[tuple[str, ...], tuple[float, list[QueueAddress]]] = {}

    @functools.cached_property
    def _sql(self) -> dict[str, str]:
        names = {"table": self.table.qualified, "schema": quote_identifier(self.table.schema)}
        return {name: text.format(**names) for name, text in sql.load("subscriptions.sql").items()}

    async def setup(self, connection: DatabaseConnection) -> None:
        """Create the table if it does not exist (idempotent, safe to run concurrently)."""
        async with ddl_lock(connection):
            await connection.execute(
                f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(self.table.schema)}")
            await connection.execute(self._sql["create_table"])

    async def subscribe(
        self, executor: Executor, queue: QueueAddress, endpoint: str, topic: str
    ) -> None:
        await executor.execute(self._sql["subscribe"], str(queue), topic, endpoint)
        self._cache.clear()

    async def unsubscribe(self, executor: Executor, endpoint: str, topic: str) -> bool:
        status: str = await executor.execute(self._sql["unsubscribe"], endpoint, topic)
        self._cache.clear()
        return status.endswith(" 1")

    async def subscribers(
        self, executor: Executor, topics: tuple[str, ...], schema: str = "public"
    ) -> list[QueueAddress]:
        """Distinct subscriber queues of any of ``topics`` (from the cache when fresh)."""
        now = time.monotonic()
        cached = self._cache.get(topics)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            rows = await executor.fetch(self._sql["subscribers"], list(topics))
        except asyncpg.UndefinedTableError:
            return []  # no endpoint has started here yet: nobody has subscribed
        addresses = []
        for row in rows:
            try:
                addresses.append(QueueAddress.parse(row[0], schema))
            except ValueError as exc:  # written by hand or by a peer: the others still get it
                log.warning("subscriber_address_unusable", address=row[0], error=str(exc))
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
        self._cache[topics] = (now + self.cache_seconds, addresses)
        return addresses

    async def list(self, executor: Executor, endpoint: str | None = None) -> list[Subscription]:
        rows = await executor.fetch(self._sql["list"], endpoint)
        return [Subscription(row[0], row[1], row[2]) for row in rows]


def subscription_store(settings: TransportSettings) -> SubscriptionStore:
    """The subscription table the transport settings name."""
    return SubscriptionStore(QueueAddress.parse(settings.subscription_table, settings.schema),
                             cache_seconds=settings.subscription_cache_seconds)


async def subscribe_to_handled_types(
    connection: DatabaseConnection, store: SubscriptionStore, endpoint: str,
    queue: QueueAddress, message_types: Iterable[type[msgspec.Struct]], *, install: bool = True,
) -> None:
    """Auto-subscribe (at the start of a deployment): one subscription per handled type, on
    the type's own topic, so that events of it and of types derived from it arrive.
    ``install=False``: the table exists already (no DDL; see ``endpoint_runtime.installation``)."""
    if install:
        await store.setup(connection)
    for message_type in message_types:
        await store.subscribe(connection, queue, endpoint, topics_of(message_type)[0])


async def prune_subscriptions(
    executor: Executor, store: SubscriptionStore, endpoint: str, topics: Iterable[str],
) -> list[str]:
    """Delete ``endpoint``'s own subscriptions to any of ``topics`` (at the start of a
    deployment: those to the commands it handles, which an endpoint never subscribes to but
    older versions did); other endpoints' rows stay. Returns the topics removed."""
    wanted = sorted(set(topics))
    if not wanted:
        return []
    rows = await executor.fetch(store._sql["unsubscribe_topics"], endpoint, wanted)
    store._cache.clear()
    return sorted(row[0] for row in rows)
