"""HandlerContext: what a handler sees of the message it handles and how it sends.

Example::

    @endpoint.handler
    async def place_order(message: PlaceOrder, context: HandlerContext) -> None:
        await context.connection.execute("INSERT INTO orders VALUES ($1)", message.order_id)
        await context.send(OrderAccepted(order_id=message.order_id), destination="billing")
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast

import msgspec
import structlog

from endpoint_runtime.chain.metrics import Metrics
from endpoint_runtime.chain.outgoing import OutgoingHook, create_outgoing, due_time
from endpoint_runtime.chain.routing import RouteTable
from endpoint_runtime.chain.subscriptions import (
    SubscriptionStore,
    enclosed_types,
    topics_of,
    undeliverable_copy,
)
from endpoint_runtime.errors import EndpointRuntimeError, QueueNotFoundError
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection, is_lost
from endpoint_runtime.transport.queue_tables import ensure_queue_table
from endpoint_runtime.wire.messages import (
    Headers,
    MessageIntent,
    OutgoingMessage,
    TransportMessage,
)
from endpoint_runtime.wire.serialization import message_type_name

if TYPE_CHECKING:  # the savepoint proxies the transaction strategies give handlers
    from endpoint_runtime.transport.savepoints import (
        LazySavepointConnection,
        OpenTransactionConnection,
    )

log = structlog.get_logger("endpoint_runtime.chain.context")


class OutgoingDispatcher(Protocol):
    """Where a handler's outgoing messages go; each transaction mode has its own.

    ``due`` set: the message goes to the delayed-message store until then.
    """

    can_defer: bool

    async def dispatch(
        self, address: QueueAddress, message: OutgoingMessage, *, immediate: bool,
        due: datetime | None = None,
    ) -> None: ...


def route_of(routes: RouteTable | None, message: msgspec.Struct) -> str:
    """The queue ``message`` is routed to (:class:`RoutingError` when none is; a context
    without a table has no routes)."""
    return (routes if routes is not None else RouteTable()).require(type(message))


CURRENT_CONTEXT: ContextVar[HandlerContext | None] = ContextVar(
    "endpoint_runtime_handler_context", default=None)
"""The context of the message whose handlers run in this task (set by the chain around
them)."""


def current_context() -> HandlerContext:
    """The :class:`HandlerContext` of the message being handled, for handlers that take the
    message alone and for code they call::

        @endpoint.handler
        async def place_order(message: PlaceOrder) -> OrderAccepted:
            await current_context().connection.execute("INSERT ...", message.order_id)
            return OrderAccepted(order_id=message.order_id)

    Raises:
        EndpointRuntimeError: called outside a handler.
    """
    context = CURRENT_CONTEXT.get()
    if context is None:
        raise EndpointRuntimeError(
            "current_context() is only available while a handler runs (in the handler's "
            "task, or tasks it starts)")
    return context


@functools.lru_cache(maxsize=1024)
def parse_address(destination: str, schema: str) -> QueueAddress:
    return QueueAddress.parse(destination, schema)


@functools.lru_cache(maxsize=1024)
def _address_text(address: QueueAddress) -> str:
    return str(address)


class HandlerContext:
    """The incoming message's envelope, the transaction's connection, and sending.

    Attributes:
        message_id: the incoming message's id.
        correlation_id: the correlation id of every message the handlers send, publish or
            reply: the incoming message's, else its message id.
        headers: the incoming message's headers (read-only by convention).
        endpoint: name of the endpoint handling the message.
    """

    def __init__(
        self,
        *,
        message: TransportMessage,
        endpoint: str,
        local_address: QueueAddress,
        dispatcher: OutgoingDispatcher,
        connection: HandlerConnection | None,
        subscriptions: SubscriptionStore | None = None,
        allowed_schemas: frozenset[str] | None = None,
        error_address: QueueAddress | None = None,
        metrics: Metrics | None = None,
        outgoing_hooks: list[OutgoingHook] | None = None,
        items: dict[str, Any] | None = None,
        routes: RouteTable | None = None,
    ) -> None:
        self.transport_message = message
        self._routes = routes
        self.items: dict[str, Any] = {} if items is None else items
        """The chain's room for per-message state (``IncomingContext.items``): what steps
        leave for handlers, such as the saga step's session."""
        self.headers: Mapping[str, str] = message.headers
        self.endpoint = endpoint
        self._local_address = local_address
        self._dispatcher = dispatcher
        self._connection = connection
        self._subscriptions = subscriptions
        self._allowed_schemas = allowed_schemas
        self._error_address = error_address
        """Where a publish records the copy of a subscriber whose queue does not exist."""
        self._metrics = metrics
        self._outgoing_hooks = outgoing_hooks
        """The chain's steps' hooks: they see the headers of every message sent here."""
        self._sent: set[tuple[str, QueueAddress]] | None = None
        """(message id, queue) of what the handlers sent: made on the first send."""

    @property
    def message_id(self) -> str:
        """The incoming message's id (read from its headers when asked: most handlers never
        do, and this context is made for every message)."""
        return self.transport_message.message_id

    @property
    def correlation_id(self) -> str:
        """What every message the handlers send, publish or reply carries as its
        ``NServiceBus.CorrelationId``: the incoming message's, else the incoming message's id
        (NServiceBus's rule; a ``headers=`` entry of a send overrides it)."""
        return self.headers.get(Headers.CORRELATION_ID) or self.message_id

    @property
    def connection(self) -> DatabaseConnection:
        """The receive transaction's connection: write business data here so it commits or
        rolls back with the message. Never commit or roll it back yourself."""
        if self._connection is None:
            raise EndpointRuntimeError("this context has no database connection")
        # The transactions package's savepoint proxies forward every connection method.
        return cast("DatabaseConnection", self._connection)

    def connection_lost(self) -> bool:
        """Whether the handlers' database connection is gone: a failure of the transport,
        not of the message."""
        return self._connection is not None and is_lost(
            cast("DatabaseConnection", self._connection))

    async def send(
        self,
        message: msgspec.Struct,
        destination: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        immediate: bool = False,
        time_to_be_received: timedelta | None = None,
        message_id: str | None = None,
        delay: timedelta | None = None,
        deliver_at: datetime | None = None,
    ) -> str:
        """Send ``message`` to the queue ``destination``, else to the queue its type is
        routed to (``endpoint.route``, docs/routing.md); returns its message id.

        ``immediate=True`` dispatches at once on another connection, escaping the receive
        transaction: the message stays sent even if the handler fails afterwards.
        ``delay`` or ``deliver_at`` defers delivery (a due time in the past delivers at once).

        Raises:
            RoutingError: no ``destination`` and no route for the message's type.
        """
        if destination is None:
            destination = route_of(self._routes, message)
        return await self._send(
            message, destination, MessageIntent.SEND, headers, immediate,
            time_to_be_received, message_id, delay, deliver_at,
        )

    async def send_local(
        self,
        message: msgspec.Struct,
        *,
        headers: Mapping[str, str] | None = None,
        immediate: bool = False,
        time_to_be_received: timedelta | None = None,
        message_id: str | None = None,
        delay: timedelta | None = None,
        deliver_at: datetime | None = None,
    ) -> str:
        """Send ``message`` to this endpoint's own queue (optionally deferred)."""
        return await self._send(
            message, self._local_address, MessageIntent.SEND, headers, immediate,
            time_to_be_received, message_id, delay, deliver_at,
        )

    async def reply(
        self,
        message: msgspec.Struct,
        *,
        headers: Mapping[str, str] | None = None,
        immediate: bool = False,
        destination: str | None = None,
    ) -> str:
        """Send ``message`` to the incoming message's ``ReplyToAddress`` (``destination``:
        to that queue instead, as a saga replies to its originator).

        A reply to a message a saga sent carries that saga's id back
        (``NServiceBus.OriginatingSagaId`` -> ``NServiceBus.SagaId``), so the reply finds
        its instance."""
        reply_to = destination or self.headers.get(Headers.REPLY_TO_ADDRESS)
        if not reply_to:
            raise EndpointRuntimeError(
                f"cannot reply to message {self.message_id}: it has no "
                f"{Headers.REPLY_TO_ADDRESS} header"
            )
        saga_id = self.headers.get(Headers.ORIGINATING_SAGA_ID) if destination is None else None
        if saga_id:
            headers = {Headers.SAGA_ID: saga_id,
                       Headers.SAGA_TYPE: self.headers.get(Headers.ORIGINATING_SAGA_TYPE, ""),
                       **(headers or {})}
        return await self._send(
            message, reply_to, MessageIntent.REPLY, headers, immediate, None, None,
        )

    async def publish(
        self,
        event: msgspec.Struct,
        *,
        headers: Mapping[str, str] | None = None,
        immediate: bool = False,
        message_id: str | None = None,
    ) -> str:
        """Publish ``event``: one copy to every subscriber queue of its type or of any of its
        base types (``MessageIntent`` Publish), with the transaction mode's guarantees, as a
        send. No subscriber is not an error. Returns the event's message id.

        The copy of a subscriber whose queue table does not exist goes to the error queue
        instead, the same way (see
        :func:`~endpoint_runtime.chain.subscriptions.undeliverable_copy`);
        the other subscribers get theirs."""
        if self._subscriptions is None:
            raise EndpointRuntimeError("this endpoint cannot publish (no subscription table)")
        topics = topics_of(type(event))
        # Built first: a command fails here, before the transaction reads the subscriptions.
        outgoing = self._outgoing(
            event, MessageIntent.PUBLISH, {**enclosed_types(topics), **(headers or {})},
            None, message_id)
        routes = await self._subscriptions.routes(
            self.connection, topics, self._local_address.schema)
        if not routes.queues and not routes.missing:
            log.debug("published_without_subscribers", topics=topics)
        missing = list(routes.missing)
        for address in routes.queues:
            try:
                await self._dispatch(address, outgoing, immediate, None)
            except QueueNotFoundError:  # dropped since the subscriber list was read
                self._subscriptions.forget()
                missing.append(address)
        for address in missing:
            await self._record_undeliverable(event, outgoing, address, immediate)
        return outgoing.message_id

    async def _record_undeliverable(
        self, event: msgspec.Struct, outgoing: OutgoingMessage, address: QueueAddress,
        immediate: bool,
    ) -> None:
        """The copy for a subscriber queue that does not exist, to the error queue."""
        if self._error_address is None:
            raise QueueNotFoundError(str(address))
        key = (outgoing.message_id, address)
        if self._sent is not None and key in self._sent:
            return
        await self._dispatcher.dispatch(
            self._error_address, undeliverable_copy(outgoing, address, self.endpoint),
            immediate=immediate)
        self._sent_once(key)
        if self._metrics is not None:
            self._metrics.publish_undeliverable(message_type_name(type(event)))

    async def _send(
        self,
        message: msgspec.Struct,
        destination: str | QueueAddress,
        intent: MessageIntent,
        headers: Mapping[str, str] | None,
        immediate: bool,
        time_to_be_received: timedelta | None,
        message_id: str | None,
        delay: timedelta | None = None,
        deliver_at: datetime | None = None,
    ) -> str:
        due = due_time(delay, deliver_at, time_to_be_received, self._dispatcher.can_defer)
        address = (
            destination
            if isinstance(destination, QueueAddress)
            else parse_address(destination, self._local_address.schema)
        )
        outgoing = self._outgoing(message, intent, headers, time_to_be_received, message_id, due,
                                  address)
        await self._dispatch(address, outgoing, immediate, due)
        return outgoing.message_id

    def _outgoing(
        self, message: msgspec.Struct, intent: MessageIntent, headers: Mapping[str, str] | None,
        time_to_be_received: timedelta | None, message_id: str | None,
        due: datetime | None = None, destination: QueueAddress | None = None,
    ) -> OutgoingMessage:
        return create_outgoing(
            message,
            intent=intent,
            originating_endpoint=self.endpoint,
            reply_to=_address_text(self._local_address),
            conversation_id=self.headers.get(Headers.CONVERSATION_ID),
            correlation_id=self.correlation_id,
            message_id=message_id,
            headers={Headers.RELATED_TO: self.message_id, **(headers or {})},
            time_to_be_received=time_to_be_received,
            due=due,
            hooks=self._outgoing_hooks,
            destination=destination,
        )

    async def _dispatch(
        self, address: QueueAddress, outgoing: OutgoingMessage, immediate: bool,
        due: datetime | None,
    ) -> None:
        key = (outgoing.message_id, address)
        if self._sent is not None and key in self._sent:
            return  # the same message to the same queue goes once
        if self._connection is not None:  # a queue table, verified once per connection
            await ensure_queue_table(self._connection, address,
                                     allowed_schemas=self._allowed_schemas)
        await self._dispatcher.dispatch(address, outgoing, immediate=immediate, due=due)
        self._sent_once(key)  # only once written (or buffered): a failed send may be repeated

    def _sent_once(self, key: tuple[str, QueueAddress]) -> None:
        if self._sent is None:
            self._sent = set()
        self._sent.add(key)


HandlerConnection: TypeAlias = (
    "DatabaseConnection | LazySavepointConnection | OpenTransactionConnection"
)
