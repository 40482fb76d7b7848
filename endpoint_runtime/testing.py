"""Testing handlers without a database or Ray: a handler context that records what they send.

:class:`TestableHandlerContext` is a real :class:`~endpoint_runtime.chain.context.HandlerContext`
(the same header logic: message ids, correlation and conversation ids, ``RelatedTo``, the
command/event checks of :mod:`endpoint_runtime.wire.message_kinds`, due times of deferrals) whose
outgoing messages are recorded instead of written to queue tables, and whose publishes go to
an in-memory subscriber list. :func:`invoke` runs every handler an endpoint registered for a
message, in registration order, as a receiver would, after the message went through the
wire format and back.

Example::

    from endpoint_runtime.testing import invoke

    async def test_place_order_bills_and_publishes() -> None:
        context = await invoke(sales.endpoint, PlaceOrder(order_id="1", amount=10.0),
                               subscribers={OrderPlaced: ["billing"]})
        assert [sent.message for sent in context.sent] == [OrderAccepted(order_id="1")]
        assert context.published[0].destinations == ("billing",)

A handler that uses ``context.connection`` gets a clear error, unless the test gives it a
connection (``connection=``, e.g. an asyncpg connection in a transaction the test rolls back).
Destination queues are not checked to exist here (a deployment checks each one on first use).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, NoReturn, cast

import msgspec

from endpoint_runtime.chain.context import CURRENT_CONTEXT, HandlerContext
from endpoint_runtime.chain.handlers import cascade
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.routing import RouteTable
from endpoint_runtime.chain.subscriptions import Routes, SubscriptionStore, topics_of
from endpoint_runtime.errors import ConfigurationError, EndpointRuntimeError
from endpoint_runtime.runtime.endpoint import Endpoint
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.wire.messages import (
    Headers,
    MessageIntent,
    OutgoingMessage,
    TransportMessage,
    encode_headers,
)

TEST_CLIENT = "test-client"
"""The originating endpoint, and default reply-to queue, of the incoming test message."""


class Recorded(msgspec.Struct, frozen=True, kw_only=True):
    """One send, send_local, reply or publish a handler made.

    Attributes:
        message: the message object the handler passed.
        intent: ``Send``, ``Reply`` or ``Publish``.
        destinations: the queues it went to, as a handler names them (``billing``; with the
            schema when it is not the endpoint's); a publish: one per subscriber (none is
            not an error).
        message_id: its message id.
        headers: its headers, as they would be on the wire.
        immediate: ``immediate=True`` was asked (it would escape the receive transaction).
        due: when a deferred message is due (``delay=``/``deliver_at=``), else ``None``.
    """

    message: msgspec.Struct
    intent: MessageIntent
    destinations: tuple[str, ...]
    message_id: str
    headers: dict[str, str]
    immediate: bool = False
    due: datetime | None = None

    @property
    def destination(self) -> str:
        """The one queue of a send or reply."""
        if len(self.destinations) != 1:
            raise EndpointRuntimeError(
                f"{self.intent} of {type(self.message).__name__} went to "
                f"{len(self.destinations)} queues; read .destinations")
        return self.destinations[0]


class _Dispatched(msgspec.Struct, frozen=True):
    address: QueueAddress
    message: OutgoingMessage
    immediate: bool
    due: datetime | None


class RecordingDispatcher:
    """An outgoing dispatcher that keeps what it is given, in order (nothing is written)."""

    def __init__(self, *, can_defer: bool = True) -> None:
        self.can_defer = can_defer
        self.dispatched: list[_Dispatched] = []

    async def dispatch(self, address: QueueAddress, message: OutgoingMessage, *,
                       immediate: bool, due: datetime | None = None) -> None:
        self.dispatched.append(_Dispatched(address, message, immediate, due))


class InMemorySubscriptions(SubscriptionStore):
    """Subscriber queues by event type, in memory: a publish routes as the subscription
    table would (to the subscribers of the event's type and of its base types)."""

    def __init__(self, subscribers: Mapping[type[msgspec.Struct], Iterable[str]],
                 schema: str = "public") -> None:
        super().__init__(QueueAddress("SubscriptionRouting", schema))
        self._queues: dict[str, list[QueueAddress]] = {}
        for event_type, queues in subscribers.items():
            if isinstance(queues, str):
                raise ConfigurationError(f"subscribers of {event_type.__name__}: give a list "
                                         "of queue names, not one string")
            topic = topics_of(event_type)[0]
            self._queues.setdefault(topic, []).extend(
                QueueAddress.parse(queue, schema) for queue in queues)

    async def routes(self, executor: Any, topics: tuple[str, ...],
                     schema: str = "public") -> Routes:
        addresses = dict.fromkeys(a for topic in topics for a in self._queues.get(topic, ()))
        return Routes(queues=tuple(addresses))


class NoDatabase:
    """What ``context.connection`` is in a test that gave none: any use fails clearly."""

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint

    def __getattr__(self, name: str) -> NoReturn:
        raise EndpointRuntimeError(
            f"the handler of endpoint {self._endpoint!r} used context.connection.{name}, but "
            "this TestableHandlerContext has no database connection: pass connection= (an "
            "asyncpg connection, e.g. in a transaction the test rolls back), or test the "
            "handler deployed against PostgreSQL"
        )


class TestableHandlerContext(HandlerContext):
    """A :class:`HandlerContext` for unit tests of handlers: records sends, replies,
    publishes and deferrals; needs no database, transport or Ray.

    Args:
        message: the incoming message (its wire headers are made as a sender's would be);
            ``None``: an empty incoming message with those headers.
        endpoint: the endpoint under test (its name, schema and whether it can defer), or
            just a name.
        headers: incoming headers to add or override (e.g. a ``NServiceBus.CorrelationId``).
        reply_to: the incoming ``ReplyToAddress`` (``None``: none, so a reply fails as it
            would in production).
        subscribers: subscriber queue names by event type, for publishes.
        connection: what ``context.connection`` is; by default a :class:`NoDatabase`.
        routes: where sends without a destination go (``{type or module: queue}``); by
            default the endpoint's routes (``endpoint.route``, its settings), else none.
    """

    __test__ = False  # not a test class, whatever pytest's name pattern says

    def __init__(
        self,
        message: msgspec.Struct | None = None,
        *,
        endpoint: Endpoint | str = "endpoint",
        headers: Mapping[str, str] | None = None,
        reply_to: str | None = TEST_CLIENT,
        subscribers: Mapping[type[msgspec.Struct], Iterable[str]] | None = None,
        connection: DatabaseConnection | None = None,
        routes: RouteTable | Mapping[Any, str] | None = None,
    ) -> None:
        if routes is None:
            routes = endpoint.routes if isinstance(endpoint, Endpoint) else RouteTable()
        if isinstance(endpoint, Endpoint):
            name, address, can_defer = endpoint.name, endpoint.address, not endpoint.send_only
            error_queue = endpoint.settings.error_queue
        else:
            name, address, can_defer, error_queue = endpoint, QueueAddress.parse(endpoint), True, \
                "error"
        self.dispatcher = RecordingDispatcher(can_defer=can_defer)
        super().__init__(
            message=incoming_message(message, headers, reply_to),
            endpoint=name,
            local_address=address,
            dispatcher=self.dispatcher,
            connection=None,  # the test's own connection is handed out by the property below
            subscriptions=InMemorySubscriptions(subscribers or {}, address.schema),
            error_address=QueueAddress.parse(error_queue, address.schema),
            routes=routes if isinstance(routes, RouteTable) else RouteTable(routes),
        )
        self._test_connection = connection
        self._built: list[tuple[OutgoingMessage, msgspec.Struct]] = []

    @property
    def connection(self) -> DatabaseConnection:
        """The connection the test gave, else a :class:`NoDatabase` that fails on use."""
        if self._test_connection is not None:
            return self._test_connection
        return cast("DatabaseConnection", NoDatabase(self.endpoint))

    def _outgoing(
        self, message: msgspec.Struct, intent: MessageIntent, headers: Mapping[str, str] | None,
        time_to_be_received: Any, message_id: str | None, due: datetime | None = None,
        destination: QueueAddress | None = None,
    ) -> OutgoingMessage:
        # The one place where a message object becomes an outgoing message: remember which.
        outgoing = super()._outgoing(message, intent, headers, time_to_be_received, message_id,
                                     due, destination)
        self._built.append((outgoing, message))
        return outgoing

    # -- what the handlers did ---------------------------------------------------------------

    @property
    def recorded(self) -> list[Recorded]:
        """Every send, reply and publish, in the order the handlers made them."""
        records = []
        for outgoing, message in self._built:
            copies = [d for d in self.dispatcher.dispatched if d.message is outgoing]
            intent = MessageIntent(outgoing.headers[Headers.MESSAGE_INTENT])
            if not copies and intent is not MessageIntent.PUBLISH:
                continue  # its dispatch raised: nothing was sent
            records.append(Recorded(
                message=message, intent=intent,
                destinations=tuple(self._name(d.address) for d in copies),
                message_id=outgoing.message_id, headers=dict(outgoing.headers),
                immediate=any(d.immediate for d in copies),
                due=copies[0].due if copies else None,
            ))
        return records

    @property
    def sent(self) -> list[Recorded]:
        """Sends and send_locals, deferred ones included (NServiceBus's ``SentMessages``)."""
        return [r for r in self.recorded if r.intent is MessageIntent.SEND]

    @property
    def replied(self) -> list[Recorded]:
        return [r for r in self.recorded if r.intent is MessageIntent.REPLY]

    @property
    def published(self) -> list[Recorded]:
        """One record per publish, whatever the number of subscribers."""
        return [r for r in self.recorded if r.intent is MessageIntent.PUBLISH]

    @property
    def deferred(self) -> list[Recorded]:
        """The sends with a due time in the future (``delay=``, ``deliver_at=``)."""
        return [r for r in self.sent if r.due is not None]

    def _name(self, address: QueueAddress) -> str:
        return address.table if address.schema == self._local_address.schema else str(address)


def incoming_message(message: msgspec.Struct | None, headers: Mapping[str, str] | None = None,
                     reply_to: str | None = TEST_CLIENT) -> TransportMessage:
    """``message`` as a receiver would take it off its queue: body and headers as
    :func:`~endpoint_runtime.chain.outgoing.create_outgoing` makes them for a send from
    ``test-client``, with ``headers`` on top."""
    if message is None:
        wire = {Headers.MESSAGE_ID: str(uuid.uuid4())}
        if reply_to:
            wire[Headers.REPLY_TO_ADDRESS] = reply_to
        wire.update(headers or {})
        body = b"{}"
    else:
        outgoing = create_outgoing(message, originating_endpoint=TEST_CLIENT,
                                   reply_to=reply_to, headers=headers)
        wire, body = dict(outgoing.headers), outgoing.body
    return TransportMessage(native_id=uuid.uuid4(), seq=1, headers=wire,
                            raw_headers=encode_headers(wire), body=body)


async def invoke(endpoint: Endpoint, message: msgspec.Struct,
                 **options: Any) -> TestableHandlerContext:
    """Run every handler ``endpoint`` registered for ``message``'s type, in registration
    order, with one :class:`TestableHandlerContext` (``options`` are its keyword
    arguments), and return it. The handlers get the message decoded from its wire form, as
    a receiver would give it to them; an exception of a handler propagates.

    Raises:
        ConfigurationError: the endpoint has no handler for the message's type.
    """
    handlers = endpoint.registry.handlers_for(type(message))
    if not handlers:
        raise ConfigurationError(
            f"endpoint {endpoint.name!r} has no handler for {type(message).__name__}")
    context = TestableHandlerContext(message, endpoint=endpoint, **options)
    received = context.transport_message
    message_type = endpoint.registry.message_types.resolve(
        received.headers[Headers.ENCLOSED_MESSAGE_TYPES])
    decoded = endpoint.registry.message_types.decode(message_type, received.body)
    token = CURRENT_CONTEXT.set(context)
    try:
        for handler in handlers:  # either shape; what a handler returns is sent as it returns
            returned = await endpoint.registry.start(handler, decoded, context)
            if returned is not None:
                await cascade(context, returned, handler)
    finally:
        CURRENT_CONTEXT.reset(token)
    return context


__all__ = ["InMemorySubscriptions", "NoDatabase", "Recorded", "RecordingDispatcher",
           "TestableHandlerContext", "incoming_message", "invoke"]
