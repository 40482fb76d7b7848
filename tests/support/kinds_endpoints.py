"""Endpoints for the wire-compatibility tests: commands, events and plain messages, the
correlation id of what handlers send, publish and reply (importable by path)."""

from __future__ import annotations

import msgspec

from endpoint_runtime import Command, Endpoint, Event, HandlerContext, Headers, TransactionMode
from endpoint_runtime.settings import OutboxSettings


class PlaceOrder(msgspec.Struct, Command):
    order: str
    publish_itself: bool = False
    """Also publish this command (refused: the message goes to the error queue)."""


class OrderPlaced(msgspec.Struct, Event):
    order: str


class OrderNote(msgspec.Struct):
    """Declares neither: a plain message, subscribed to like an event."""

    order: str


class Forward(msgspec.Struct, Command):
    order: str


class Forwarded(msgspec.Struct, Command):
    order: str


class Announced(msgspec.Struct, Event):
    order: str


class Answer(msgspec.Struct):
    order: str


# -- deployed (e2e): subscriptions at start, a publish of a command refused ----------------

orders = Endpoint("kinds_orders", immediate_retries=0, delayed_retries=0)


@orders.handler
async def place(message: PlaceOrder, context: HandlerContext) -> None:
    await context.publish(OrderPlaced(message.order))
    if message.publish_itself:
        await context.publish(message)


@orders.handler
async def placed(message: OrderPlaced, context: HandlerContext) -> None:
    await context.connection.execute(
        "INSERT INTO kinds_seen (order_id, type_name, correlation_id, related_to) "
        "VALUES ($1, $2, $3, $4)",
        message.order, type(message).__name__, context.headers.get(Headers.CORRELATION_ID),
        context.headers.get(Headers.RELATED_TO))


@orders.handler
async def noted(message: OrderNote, context: HandlerContext) -> None:
    await context.connection.execute(
        "INSERT INTO kinds_seen (order_id, type_name) VALUES ($1, $2)",
        message.order, type(message).__name__)


# -- through each mode's receive strategy (integration): correlation ids -------------------

def correlator(name: str, mode: TransactionMode, **options: object) -> Endpoint:
    """On a Forward: a send, a publish and a reply, whose correlation ids the tests read."""
    endpoint = Endpoint(name, transaction_mode=mode, immediate_retries=0, delayed_retries=0,
                        **options)  # type: ignore[arg-type]

    @endpoint.handler
    async def forward(message: Forward, context: HandlerContext) -> None:
        await context.send(Forwarded(message.order), destination="forwarded")
        await context.publish(Announced(message.order))
        await context.reply(Answer(message.order))

    return endpoint


correlators = {
    "atomic": correlator("corr_atomic", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE),
    "receive_only": correlator("corr_receive_only", TransactionMode.RECEIVE_ONLY),
    "batched": correlator("corr_batched", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE,
                          batch_size=3),
    "none": correlator("corr_none", TransactionMode.NONE),
    "outbox": correlator("corr_outbox", TransactionMode.RECEIVE_ONLY, outbox=OutboxSettings()),
}
