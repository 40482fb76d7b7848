"""endpoint_runtime: NServiceBus-style message endpoints on PostgreSQL, run on Ray.

Example::

    import msgspec
    from endpoint_runtime import Endpoint, HandlerContext

    class PlaceOrder(msgspec.Struct):
        order_id: str

    endpoint = Endpoint("sales")

    @endpoint.handler
    async def place_order(message: PlaceOrder, context: HandlerContext) -> None:
        ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from endpoint_runtime.chain.context import HandlerContext, current_context
from endpoint_runtime.chain.pipeline import IncomingContext, Next
from endpoint_runtime.chain.recoverability.policy import Action, Decision, Failure
from endpoint_runtime.chain.routing import RouteTable
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import (
    ConfigurationError,
    ConnectionLostError,
    DiscardMessage,
    EndpointRuntimeError,
    HandlerReturnError,
    HandlerTimeoutError,
    MessageDecodeError,
    QueueNotFoundError,
    RetryLater,
    RoutingError,
    UnknownMessageTypeError,
)
from endpoint_runtime.runtime.endpoint import Endpoint, load_endpoint
from endpoint_runtime.runtime.sender import Sender
from endpoint_runtime.settings import (
    Atomic,
    EndpointSettings,
    NoTransaction,
    Outbox,
    ReceiveOnly,
    Transaction,
    TransportSettings,
    load_settings,
)
from endpoint_runtime.transactions import TransactionMode
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.message_kinds import Command, Event
from endpoint_runtime.wire.messages import Headers, MessageIntent

if TYPE_CHECKING:
    from endpoint_runtime.runtime.deployment import EndpointDeployment
    from endpoint_runtime.runtime.in_process import InProcessDeployment

__all__ = [  # noqa: RUF022 - grouped by topic, not sorted
    # endpoints and handlers
    "Endpoint",
    "HandlerContext",
    "current_context",
    "TransactionMode",
    # the transaction shape, one value (Endpoint(transaction=...))
    "Transaction",
    "Atomic",
    "ReceiveOnly",
    "Outbox",
    "NoTransaction",
    "load_endpoint",
    # steps of one's own (Endpoint.add_step)
    "IncomingContext",
    "Next",
    # running on Ray, or in process (tests of one's endpoints against PostgreSQL)
    "EndpointDeployment",
    "InProcessDeployment",
    # sending from outside handlers, routing
    "Sender",
    "RouteTable",
    # settings
    "EndpointSettings",
    "TransportSettings",
    "load_settings",
    # messages
    "Command",
    "Event",
    "Headers",
    "MessageIntent",
    # transport
    "PostgresTransport",
    "QueueAddress",
    # errors
    "EndpointRuntimeError",
    "ConfigurationError",
    "ConnectionLostError",
    "HandlerReturnError",
    "MessageDecodeError",
    "QueueNotFoundError",
    "RoutingError",
    "UnknownMessageTypeError",
    # handler control
    "RetryLater",
    "DiscardMessage",
    # a recoverability policy of one's own (Endpoint.recoverability_policy)
    "Action",
    "Decision",
    "Failure",
    "HandlerTimeoutError",
]


def __getattr__(name: str) -> Any:
    # EndpointDeployment brings Ray (about half a second to import): it is imported when
    # first asked for, so that what runs without Ray does not pay for it: the Python process
    # Spark starts for the live report's stream source, `send`, `report`, handlers' unit
    # tests.
    if name == "EndpointDeployment":
        from endpoint_runtime.runtime.deployment import EndpointDeployment

        return EndpointDeployment
    if name == "InProcessDeployment":
        from endpoint_runtime.runtime.in_process import InProcessDeployment

        return InProcessDeployment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
