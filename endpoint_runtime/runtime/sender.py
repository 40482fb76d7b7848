"""Sending from outside handlers: scripts, web applications, tests.

Example::

    async with Sender("web") as sender:
        await sender.send(PlaceOrder(order_id="1", amount=9.5), destination="sales")
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

from endpoint_runtime.chain.context import parse_address, route_of
from endpoint_runtime.chain.outgoing import OutgoingHook, as_delayed, create_outgoing, due_time
from endpoint_runtime.chain.routing import RouteTable
from endpoint_runtime.chain.subscriptions import (
    SubscriptionStore,
    enclosed_types,
    subscription_store,
    topics_of,
    undeliverable_copy,
)
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.delayed.store import DelayedMessageStore
from endpoint_runtime.errors import ConfigurationError, QueueNotFoundError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import sending
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import pooled
from endpoint_runtime.transport.queue_tables import ensure_queue_table
from endpoint_runtime.wire.messages import MessageIntent


class Sender:
    """Sends messages with the standard headers, each INSERT committed at once.

    ``tracing=True``: a span per send and publish, a child of the caller's current
    OpenTelemetry context, whose ``traceparent`` the message carries (docs/observability.md).

    The connection pool opens on first use in the running event loop; ``close()`` (or
    ``async with``) releases it.
    """

    def __init__(
        self,
        name: str,
        settings: TransportSettings | None = None,
        *,
        local_address: QueueAddress | None = None,
        delayed_store: DelayedMessageStore | None = None,
        error_queue: str = "error",
        tracing: bool = False,
        routes: RouteTable | Mapping[Any, str] | None = None,
    ) -> None:
        self.name = name
        self.routes = routes if isinstance(routes, RouteTable) else RouteTable(routes)
        """Where :meth:`send` without a ``destination`` sends (docs/routing.md)."""
        self.error_queue = error_queue
        """Where a publish records the copy of a subscriber whose queue does not exist."""
        self._delayed_store = delayed_store
        self._transport_settings = settings or TransportSettings()
        self._local_address = local_address
        self._transport: PostgresTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.outgoing_hooks: list[OutgoingHook] = []
        """Called with the headers of every message this sender sends or publishes (see
        :meth:`on_outgoing`)."""
        if tracing:  # imported only when on: a span per send, continuing the caller's context
            from endpoint_runtime.chain.tracing.spans import OutgoingSpans

            self.outgoing_hooks.append(OutgoingSpans.for_sender(name))

    def on_outgoing(self, hook: OutgoingHook) -> OutgoingHook:
        """Call ``hook(headers)`` for every message sent or published from here, before it is
        encoded (add a header to each, e.g. a tenant); returned unchanged."""
        self.outgoing_hooks.append(hook)
        return hook

    async def transport(self) -> PostgresTransport:
        loop = asyncio.get_running_loop()
        if self._transport is None or self._loop is not loop:
            self._transport = await PostgresTransport.connect(self._transport_settings)
            self._loop = loop
        return self._transport

    async def send(
        self,
        message: msgspec.Struct,
        destination: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        time_to_be_received: timedelta | None = None,
        message_id: str | None = None,
        delay: timedelta | None = None,
        deliver_at: datetime | None = None,
    ) -> str:
        """Send ``message`` to the queue ``destination``, else to the queue its type is
        routed to (``routes=``, or the endpoint's ``route``); returns its message id.

        ``delay`` / ``deliver_at`` defer it through the endpoint's delayed-message store (the
        endpoint's deployment dispatches it when due); a plain or send-only sender cannot.

        Raises:
            RoutingError: no ``destination`` and no route for the message's type.
        """
        if destination is None:
            destination = route_of(self.routes, message)
        due = due_time(delay, deliver_at, time_to_be_received, self._delayed_store is not None)
        transport = await self.transport()
        address = parse_address(destination, self._transport_settings.schema)
        outgoing = create_outgoing(
            message,
            originating_endpoint=self.name,
            reply_to=str(self._local_address) if self._local_address else None,
            message_id=message_id,
            headers=headers,
            time_to_be_received=time_to_be_received,
            due=due,
            hooks=self.outgoing_hooks,
            destination=address,
        )
        if due is None:
            await transport.send(address, outgoing)
        else:
            assert self._delayed_store is not None
            async with pooled(transport.pool) as connection:
                await self._delayed_store.store(connection, as_delayed(address, outgoing, due))
        return outgoing.message_id

    @functools.cached_property
    def subscriptions(self) -> SubscriptionStore:
        return subscription_store(self._transport_settings)

    async def publish(
        self, event: msgspec.Struct, *, headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Publish ``event`` to every subscriber of its type or of a base type, all copies in
        one transaction; returns its message id. No subscriber is not an error.

        Each subscriber queue passes the checks of a handler's send (a queue table, in
        ``allowed_schemas``: else :class:`~endpoint_runtime.errors.NotAQueueError` and nothing
        is sent). The copy of a subscriber whose queue table does not exist goes to
        ``error_queue`` (see :func:`~endpoint_runtime.chain.subscriptions.undeliverable_copy`).
        """
        transport = await self.transport()
        settings = self._transport_settings
        topics = topics_of(type(event))
        outgoing = create_outgoing(
            event, intent=MessageIntent.PUBLISH, originating_endpoint=self.name,
            reply_to=str(self._local_address) if self._local_address else None,
            message_id=message_id, headers={**enclosed_types(topics), **(headers or {})},
            hooks=self.outgoing_hooks,
        )
        routes = await self.subscriptions.routes(transport.pool, topics, settings.schema)
        queues, missing = list(routes.queues), list(routes.missing)
        allowed = (frozenset(settings.allowed_schemas)
                   if settings.allowed_schemas is not None else None)
        for address in routes.queues:
            try:
                await ensure_queue_table(transport.pool, address, allowed_schemas=allowed)
            except QueueNotFoundError:  # dropped since the subscriber list was read
                self.subscriptions.forget()
                queues.remove(address)
                missing.append(address)
        if not queues and not missing:
            return outgoing.message_id
        error_address = parse_address(self.error_queue, settings.schema)
        async with transport.pool.acquire() as connection, connection.transaction():
            for address in queues:
                await sending.send(connection, address, outgoing)
            for address in missing:
                await sending.send(connection, error_address,
                                   undeliverable_copy(outgoing, address, self.name))
        return outgoing.message_id

    async def send_local(self, message: msgspec.Struct, **options: Any) -> str:
        """Send ``message`` to this endpoint's own queue."""
        if self._local_address is None:
            raise ConfigurationError(f"{self.name!r} has no queue of its own")
        return await self.send(message, str(self._local_address), **options)

    async def close(self) -> None:
        if self._transport is not None:
            await self._transport.close()
            self._transport = None

    async def __aenter__(self) -> Sender:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
