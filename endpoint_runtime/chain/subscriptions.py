"""Publish/subscribe: the subscription table, topics of an event type, cached subscriber lists.

A topic is the wire name of a message type (``module.QualName``, or ``__message_type_name__``,
e.g. a .NET type name). Publishing an event sends one copy to every distinct subscriber queue
of every topic in the event's type hierarchy (msgspec Struct inheritance), so a subscriber to
a base type receives the derived events too. Subscribing is an upsert of (endpoint, topic) ->
queue address, unsubscribing a delete, as in NServiceBus's PostgreSQL transport, whose table
layout (default ``"SubscriptionRouting"``) is kept.

A subscriber row may name a queue table that does not exist (an endpoint decommissioned, a
typo): :meth:`SubscriptionStore.routes` tells those apart, and the publish records their copy
in the error queue (:func:`undeliverable_copy`) while the other subscribers get theirs.

Example::

    store = SubscriptionStore(QueueAddress("SubscriptionRouting"))
    await store.subscribe(pool, QueueAddress("billing"), "billing", topics_of(OrderPlaced)[0])
    await store.subscribers(pool, topics_of(OrderPlaced))  # [QueueAddress("billing")]
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable

import msgspec
import structlog

from endpoint_runtime.errors import QueueNotFoundError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import sql
from endpoint_runtime.transport.addresses import QueueAddress, quote_identifier
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.queues import ddl_lock
from endpoint_runtime.transport.sending import Executor
from endpoint_runtime.wire.messages import (
    MACHINE,
    ErrorHeaders,
    Headers,
    OutgoingMessage,
    new_message_id,
    to_wire_time,
    utc_now,
)
from endpoint_runtime.wire.serialization import message_type_name

log = structlog.get_logger("endpoint_runtime.chain.subscriptions")

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


class Routes(msgspec.Struct, frozen=True):
    """Where the copies of one event go: the subscriber queues whose table exists, and those
    whose table does not (each distinct address once, in the table's order)."""

    queues: tuple[QueueAddress, ...] = ()
    missing: tuple[QueueAddress, ...] = ()


NO_ROUTES = Routes()


class DanglingSubscription(msgspec.Struct, frozen=True):
    """A subscription that points nowhere: its queue table does not exist (``address`` is
    where it was looked for), or its address does not parse (``address`` is ``None``)."""

    subscription: Subscription
    address: QueueAddress | None


class SubscriptionStore:
    """One subscription table, with subscriber lists cached for ``cache_seconds``.

    The cache is per process; a subscribe or unsubscribe through this store drops it, one made
    elsewhere is seen once the entry expires.
    """

    def __init__(self, table: QueueAddress, *, cache_seconds: float = CACHE_SECONDS) -> None:
        self.table = table
        self.cache_seconds = cache_seconds
        self._cache: dict[tuple[tuple[str, ...], str], tuple[float, Routes]] = {}

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

    def forget(self) -> None:
        """Drop the cached subscriber lists (a copy found its queue gone)."""
        self._cache.clear()

    async def subscribers(
        self, executor: Executor, topics: tuple[str, ...], schema: str = "public"
    ) -> list[QueueAddress]:
        """Distinct subscriber queues of any of ``topics``, their tables existing or not (from
        the cache when fresh; see :meth:`routes`)."""
        routes = await self.routes(executor, topics, schema)
        return [*routes.queues, *routes.missing]

    async def routes(
        self, executor: Executor, topics: tuple[str, ...], schema: str = "public"
    ) -> Routes:
        """The subscriber queues of any of ``topics``, split by whether their table exists
        (from the cache when fresh). No statement here can fail for a missing table, so the
        look-up never aborts the caller's transaction: without a subscription table there is
        no subscriber. Addresses without a schema are in ``schema``."""
        now = time.monotonic()
        key = (topics, schema)
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        routes = await self._look_up(executor, topics, schema)
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
        self._cache[key] = (now + self.cache_seconds, routes)
        return routes

    async def _look_up(
        self, executor: Executor, topics: tuple[str, ...], schema: str
    ) -> Routes:
        if not await self.exists(executor):
            return NO_ROUTES  # no endpoint has started here yet: nobody has subscribed
        rows = await executor.fetch(self._sql["subscribers"], list(topics))
        addresses: dict[QueueAddress, None] = {}
        for row in rows:
            try:
                addresses[QueueAddress.parse(row[0], schema)] = None
            except ValueError as exc:  # written by hand or by a peer: the others still get it
                log.warning("subscriber_address_unusable", address=row[0], error=str(exc))
        missing = await self.missing_queues(executor, list(addresses))
        return Routes(queues=tuple(a for a in addresses if a not in missing),
                      missing=tuple(a for a in addresses if a in missing))

    async def exists(self, executor: Executor) -> bool:
        """Whether the subscription table exists (from the catalog: never fails)."""
        return bool(await executor.fetchval(self._sql["table_exists"], self.table.schema,
                                            self.table.table))

    async def missing_queues(
        self, executor: Executor, addresses: Iterable[QueueAddress]
    ) -> set[QueueAddress]:
        """Those of ``addresses`` whose table does not exist. A table the role may not use
        exists all the same (writing to it is then refused: a configuration error)."""
        wanted = list(addresses)
        if not wanted:
            return set()
        rows = await executor.fetch(self._sql["missing_queues"], [a.schema for a in wanted],
                                    [a.table for a in wanted])
        return {QueueAddress(row[1], row[0]) for row in rows}

    async def list(self, executor: Executor, endpoint: str | None = None) -> list[Subscription]:
        rows = await executor.fetch(self._sql["list"], endpoint)
        return [Subscription(row[0], row[1], row[2]) for row in rows]


async def dangling_subscriptions(
    executor: Executor, store: SubscriptionStore, schema: str = "public"
) -> list[DanglingSubscription]:
    """Every subscription of ``store`` that points nowhere (none without its table)."""
    if not await store.exists(executor):
        return []
    found: list[tuple[Subscription, QueueAddress | None]] = []
    for subscription in await store.list(executor):
        try:
            found.append((subscription, QueueAddress.parse(subscription.queue_address, schema)))
        except ValueError:
            found.append((subscription, None))
    missing = await store.missing_queues(executor, {a for _, a in found if a is not None})
    return [DanglingSubscription(subscription, address) for subscription, address in found
            if address is None or address in missing]


async def prune_dangling(
    executor: Executor, store: SubscriptionStore, dangling: Iterable[DanglingSubscription]
) -> list[Subscription]:
    """Delete the subscriptions of ``dangling`` that still point nowhere; returns those
    deleted. Under row-level security (docs/security.md) a role deletes only the rows of the
    endpoints it may change; the others stay (and are not returned)."""
    rows_of = list(dangling)
    if not rows_of:
        return []
    rows = await executor.fetch(
        store._sql["prune"],
        [d.subscription.endpoint for d in rows_of], [d.subscription.topic for d in rows_of],
        [d.subscription.queue_address for d in rows_of],
        [d.address.schema if d.address else None for d in rows_of],
        [d.address.table if d.address else None for d in rows_of])
    store.forget()
    return [Subscription(row[0], row[1], row[2])
            for row in sorted(rows, key=lambda row: (row[0], row[1], row[2]))]


MISSING_QUEUE_EXCEPTION = f"{QueueNotFoundError.__module__}.{QueueNotFoundError.__qualname__}"


def undeliverable_copy(event: OutgoingMessage, queue: QueueAddress, publisher: str
                       ) -> OutgoingMessage:
    """The copy of a published ``event`` for a subscriber whose queue table does not exist,
    as it goes to the error queue instead: the event's headers and body, the failure headers
    with ``NServiceBus.FailedQ`` = that queue (so ``endpoint-runtime errors retry`` delivers
    it once the queue exists), under a row id of its own. Logs a warning."""
    log.warning("subscriber_queue_missing", queue=str(queue), event_id=event.message_id,
                publisher=publisher)
    headers = dict(event.headers)
    headers.pop(Headers.TIME_TO_BE_RECEIVED, None)
    headers.update({
        ErrorHeaders.FAILED_QUEUE: str(queue),
        ErrorHeaders.EXCEPTION_TYPE: MISSING_QUEUE_EXCEPTION,
        ErrorHeaders.MESSAGE: (
            f"the subscriber queue {queue} does not exist: this copy of a published event "
            f"waits here; retry it once the queue exists, or remove the subscription "
            f"(endpoint-runtime subscriptions prune)"),
        ErrorHeaders.TIME_OF_FAILURE: to_wire_time(utc_now()),
        Headers.PROCESSING_MACHINE: MACHINE,
        Headers.PROCESSING_ENDPOINT: publisher,
    })
    return OutgoingMessage(message_id=new_message_id(), headers=headers, body=event.body,
                           time_to_be_received=None)


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
    ``install=False``: the table exists already (no DDL; see
    ``endpoint_runtime.database.installation``)."""
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
