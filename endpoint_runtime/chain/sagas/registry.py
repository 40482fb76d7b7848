"""An endpoint's sagas: registration (``@endpoint.saga``), their tables, the not-found hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

from endpoint_runtime.chain.handlers import HandlerRegistry
from endpoint_runtime.chain.sagas.definition import SagaDefinition
from endpoint_runtime.chain.sagas.invocation import SagaInvocation
from endpoint_runtime.chain.sagas.saga import Saga
from endpoint_runtime.chain.sagas.step import NotFoundHook
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection

T = TypeVar("T", bound=type[Saga[Any]])


class Sagas:
    """The sagas of one endpoint (``endpoint.sagas``).

    Example::

        @endpoint.sagas.on_not_found
        async def unknown_order(message, context) -> None:
            await context.reply(OrderUnknown())
    """

    def __init__(self, endpoint: QueueAddress, registry: HandlerRegistry) -> None:
        self._endpoint = endpoint
        self._registry = registry
        self.definitions: list[SagaDefinition] = []
        self.not_found_hooks: list[NotFoundHook] = []

    @overload
    def register(self, saga_type: T) -> T: ...

    @overload
    def register(self, saga_type: None = None, *, concurrency: str = "optimistic",
                 table_name: str | None = None) -> Callable[[T], T]: ...

    def register(self, saga_type: T | None = None, *, concurrency: str = "optimistic",
                 table_name: str | None = None) -> T | Callable[[T], T]:
        """Register a saga class (bare decorator or with options); returned unchanged.

        ``concurrency``: ``"optimistic"`` (default: a version check at save; a conflict fails
        the attempt, which is retried) or ``"pessimistic"`` (the row is locked at load until
        the transaction ends). ``table_name``: instead of ``<endpoint>_<SagaClassName>``.
        """

        def decorate(cls: T) -> T:
            definition = SagaDefinition(cls, self._endpoint, concurrency=concurrency,
                                        table_name=table_name)
            for other in self.definitions:
                if other.saga_type is cls:
                    raise ConfigurationError(f"saga {cls.__name__} is already registered")
                if other.table.address == definition.table.address:
                    raise ConfigurationError(
                        f"sagas {other.saga_type.__name__} and {cls.__name__} would share "
                        f"the table {definition.table.address}; give one a table_name=")
            for handler in definition.handlers.values():
                invocation = SagaInvocation(definition, handler)
                self._registry.register(invocation.as_handler(), handler.message_type)
            self.definitions.append(definition)
            return cls

        return decorate(saga_type) if saga_type is not None else decorate

    def on_not_found(self, hook: NotFoundHook) -> NotFoundHook:
        """Call ``await hook(message, context)`` for a message that sagas of this endpoint
        handle when none of them found or made an instance for it (NServiceBus's
        ``IHandleSagaNotFound``), once, after its handlers, instead of the default (logged and
        consumed). It runs in the message's transaction: what it sends goes as the handlers'
        sends; raising fails the message like a handler. Returned unchanged."""
        self.not_found_hooks.append(hook)
        return hook

    @property
    def tables(self) -> tuple[QueueAddress, ...]:
        return tuple(definition.table.address for definition in self.definitions)

    async def setup(self, connection: DatabaseConnection) -> None:
        """Create every saga table that is missing (idempotent)."""
        for definition in self.definitions:
            await definition.table.setup(connection)

    def __len__(self) -> int:
        return len(self.definitions)
