"""Routing: which queue a command goes to, by its type, so that handlers never name queues.

NServiceBus routes commands by type (``routing.RouteToEndpoint(typeof(PlaceOrder), "Sales")``,
or a whole assembly or namespace at once); here a :class:`RouteTable` maps a message type, or a
module of message types, to a queue::

    endpoint.route(PlaceOrder, to="sales")                # one type
    endpoint.route("my_app.billing.messages", to="billing")  # every type of a module (and
                                                           # of the modules below it)

and the same table comes from the settings (``routes = {"my_app.billing.messages" =
"billing"}`` in the settings file, ``ENDPOINT_RUNTIME_ROUTES=my_app.billing.messages=billing,
my_app.sales.PlaceOrder=sales`` in the environment). ``context.send(message)``,
``Sender.send(message)`` and saga sends then look the destination up; an explicit
``destination=`` still wins. Replies go to the incoming message's ``ReplyToAddress`` and
events are published, as before: neither is routed.

The most specific route wins: a type's own route over its module's, a module's over its
parent package's. Two routes for the same type or module to different queues are a
:class:`~endpoint_runtime.errors.ConfigurationError`, and so are a route to an invalid queue
name and a route for an event (events are published to their subscribers). A send with no
destination and no route raises :class:`~endpoint_runtime.errors.RoutingError`, naming the
type and the line to add.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from endpoint_runtime.errors import ConfigurationError, InvalidQueueNameError, RoutingError
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.message_kinds import MessageKind, kind_of


def type_name(message_type: type) -> str:
    """A type's full name, as routes name it: ``package.module.Class``."""
    return f"{message_type.__module__}.{message_type.__qualname__}"


class RouteTable:
    """Routes from message types and modules to queues (see the module docstring).

    Example::

        routes = RouteTable({"my_app.billing.messages": "billing"})
        routes.add(PlaceOrder, "sales")
        routes.destination_for(PlaceOrder)  # "sales"
    """

    def __init__(self, routes: Mapping[Any, str] | None = None) -> None:
        """``routes``: ``{message type or module dotted name: queue}``."""
        self._routes: dict[str, str] = {}
        self._found: dict[type, str | None] = {}
        for key, destination in (routes or {}).items():
            self.add(key, destination)

    def add(self, key: type | str, destination: str) -> None:
        """Route ``key`` (a message type, or a module's dotted name: every type defined in
        it or below it) to the queue ``destination`` (``[schema.]name``).

        Raises:
            ConfigurationError: ``key`` is an event or not a name; ``destination`` is not a
                valid queue name; ``key`` already has a route to another queue.
        """
        if isinstance(key, type):
            if kind_of(key) is MessageKind.EVENT:
                raise ConfigurationError(
                    f"cannot route {type_name(key)}: it is an event; events are published "
                    "to their subscribers, not sent (route commands and plain messages)")
            name = type_name(key)
        elif isinstance(key, str) and key.strip() and all(
                part.isidentifier() for part in key.split(".")):
            name = key
        else:
            raise ConfigurationError(
                f"a route is for a message type or a module's dotted name, not {key!r}")
        if not isinstance(destination, str):
            raise ConfigurationError(
                f"the route for {name} must name a queue, not {destination!r}")
        try:
            QueueAddress.parse(destination)  # an invalid name fails here, at configuration
        except InvalidQueueNameError as exc:
            raise InvalidQueueNameError(f"the route for {name}: {exc}") from None
        existing = self._routes.get(name)
        if existing is not None and existing != destination:
            raise ConfigurationError(
                f"two routes for {name}: to {existing!r} and to {destination!r}; "
                "a message type goes to one queue (remove one of the routes)")
        self._routes[name] = destination
        self._found.clear()

    def update(self, other: RouteTable | Mapping[Any, str]) -> None:
        """Add every route of ``other`` (the same checks as :meth:`add`)."""
        for key, destination in other.items():
            self.add(key, destination)

    def destination_for(self, message_type: type) -> str | None:
        """The queue ``message_type`` is routed to, or ``None`` (no route covers it)."""
        try:
            return self._found[message_type]
        except KeyError:
            pass
        name = type_name(message_type)
        found = None
        while name:
            found = self._routes.get(name)
            if found is not None:
                break
            name = name.rpartition(".")[0]
        self._found[message_type] = found
        return found

    def require(self, message_type: type) -> str:
        """The queue ``message_type`` is routed to.

        Raises:
            RoutingError: no route covers it (the message names the line to add).
        """
        destination = self.destination_for(message_type)
        if destination is None:
            name = type_name(message_type)
            raise RoutingError(
                f"no route for {name}: add endpoint.route({message_type.__qualname__}, "
                f'to="<queue>") (or, for a whole module, endpoint.route('
                f'"{message_type.__module__}", to="<queue>"); in the settings: routes = '
                f'{{"{name}" = "<queue>"}}), or pass destination= to this send')
        return destination

    def items(self) -> list[tuple[str, str]]:
        """``(type or module name, queue)`` of every route, sorted."""
        return sorted(self._routes.items())

    def destinations(self) -> list[str]:
        """Every queue a route names, once each, sorted."""
        return sorted(set(self._routes.values()))

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._routes))

    def __len__(self) -> int:
        return len(self._routes)

    def __repr__(self) -> str:
        return f"RouteTable({dict(self.items())!r})"
