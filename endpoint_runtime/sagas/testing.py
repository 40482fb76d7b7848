"""Testing a saga's handler methods without a database or Ray.

:func:`invoke_saga` runs the method of a saga class for one message, on an instance with the
state the test gives (or a new one, as a starting message makes it), with a
:class:`~endpoint_runtime.testing.TestableHandlerContext` that records what the method sends,
replies and defers (timeouts included). It returns the saga instance, whose ``state`` and
``completed`` the test reads, and the context.

Example::

    from endpoint_runtime.sagas.testing import invoke_saga

    async def test_payment_after_placement_ships() -> None:
        saga, context = await invoke_saga(
            OrderFulfilment, PaymentReceived(order_id="1"),
            state=FulfilmentState(order_id="1", placed=True))
        assert saga.completed
        assert [s.message for s in context.sent] == [ShipOrder(order_id="1")]

Finding the instance (by correlation value or saga id), the version check and the row are
the storage's and are not run here: test those deployed against PostgreSQL.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

import msgspec

from endpoint_runtime.chain.sagas.definition import SagaDefinition
from endpoint_runtime.chain.sagas.saga import Saga
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.testing import TestableHandlerContext
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.messages import Headers

G = TypeVar("G", bound=Saga[Any])


async def invoke_saga(saga_type: type[G], message: msgspec.Struct, *,
                      state: msgspec.Struct | None = None, saga_id: uuid.UUID | None = None,
                      originator: str | None = None, **options: Any,
                      ) -> tuple[G, TestableHandlerContext]:
    """Run ``saga_type``'s method for ``message`` (decoded from its wire form, as a receiver
    gives it) and return the saga instance after it and the context.

    ``state``: the state of an existing instance; ``None``: a new instance of the message's
    correlation value (the message type must start the saga). ``saga_id``, ``originator``:
    the instance's (a new instance's originator is the message's ``ReplyToAddress``).
    ``options``: keyword arguments of :class:`TestableHandlerContext` (``endpoint``,
    ``headers``, ``reply_to``, ``connection``, ...).

    Raises:
        ConfigurationError: the saga does not handle the message's type, or a new instance
            is asked of a type that does not start it.
    """
    definition = SagaDefinition(saga_type, QueueAddress("saga_test"))
    handler = definition.handlers.get(type(message))
    if handler is None:
        raise ConfigurationError(f"saga {saga_type.__name__} has no method for "
                                 f"{type(message).__name__}")
    context = TestableHandlerContext(message, **options)
    decoded = msgspec.json.decode(context.transport_message.body, type=type(message))
    saga = saga_type()
    saga.saga_id = saga_id or uuid.uuid4()
    saga.completed = False
    saga.is_new = state is None
    saga.original_message_id = context.message_id if state is None else None
    if state is None:
        if not handler.starts:
            raise ConfigurationError(f"{type(message).__name__} does not start saga "
                                     f"{saga_type.__name__}: give state= of an instance")
        saga.state = definition.new_state(decoded, handler.correlation_value(decoded))
        saga.originator = originator or context.headers.get(Headers.REPLY_TO_ADDRESS)
    else:
        saga.state = state
        saga.originator = originator
    await handler.run(saga, decoded, context)
    return saga, context
