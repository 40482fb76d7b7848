"""What a saga class declares, read once at registration: its state type, correlation, handler
methods by message type, table and concurrency. Anything that could not run fails here, with a
clear :class:`ConfigurationError`."""

from __future__ import annotations

import hashlib
import inspect
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from endpoint_runtime.chain.sagas.saga import BY_NAME, SAGA_HANDLER, HandlerMark, Saga
from endpoint_runtime.chain.sagas.storage import CORRELATION_COLUMN_TYPES, SagaTable
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.transport.addresses import QueueAddress

CONCURRENCY = ("optimistic", "pessimistic")


class SagaHandler(msgspec.Struct, frozen=True):
    """One handler method: its message type, whether it starts the saga, and how a message
    of its type yields the correlation value (``None``: found by saga id only)."""

    method: Any  # the function (self, message[, context])
    message_type: type
    starts: bool
    correlate: Any  # Callable[[message], value] | None
    takes_context: bool = True

    def correlation_value(self, message: Any) -> Any:
        return None if self.correlate is None else self.correlate(message)

    async def run(self, saga: Saga[Any], message: Any, context: Any) -> None:
        """Run the method on ``saga`` (``saga.context`` set), as it was declared."""
        saga.context = context
        if self.takes_context:
            await self.method(saga, message, context)
        else:
            await self.method(saga, message)


class SagaDefinition:
    """A registered saga type (see :class:`endpoint_runtime.sagas.Saga`).

    Attributes:
        saga_type: the class; ``type_name``: its ``NServiceBus.SagaType``.
        state_type: the state Struct; ``version``: its ``SagaTypeVersion`` (a digest of its
            fields' names and types: a changed state type has another).
        table: its :class:`SagaTable`; ``pessimistic``: a row lock at load.
        handlers: by message type.
    """

    def __init__(self, saga_type: type[Saga[Any]], endpoint: QueueAddress, *,
                 concurrency: str = "optimistic", table_name: str | None = None) -> None:
        if not (isinstance(saga_type, type) and issubclass(saga_type, Saga)):
            raise ConfigurationError(f"{saga_type!r} is not a subclass of Saga")
        if concurrency not in CONCURRENCY:
            raise ConfigurationError(
                f"saga {saga_type.__name__}: concurrency must be one of {CONCURRENCY}, "
                f"got {concurrency!r}")
        try:
            saga_type()  # an instance is made per message, with no arguments
        except TypeError as exc:
            raise ConfigurationError(
                f"saga {saga_type.__name__} must be constructible without arguments (an "
                f"instance is made for each message): {exc}") from exc
        self.saga_type = saga_type
        self.type_name = saga_type.type_name()
        self.state_type = state_type_of(saga_type)
        self.pessimistic = concurrency == "pessimistic"
        self.correlation = saga_type.correlation
        correlation_type = self._check_state()
        self.version = state_version(self.state_type)
        address = QueueAddress(table_name or f"{endpoint.table}_{saga_type.__name__}",
                               endpoint.schema)
        self.table = SagaTable(address, self.correlation, correlation_type)
        self.handlers = self._read_handlers()
        self._check_starting_messages()

    def new_state(self, message: Any, value: Any) -> msgspec.Struct:
        """The state of an instance ``message`` starts with the correlation ``value``: its
        fields without defaults set from the message's fields of the same names."""
        values = {name: getattr(message, name) for name in self.from_starting_message}
        if self.correlation is not None:
            values[self.correlation] = value
        return msgspec.convert(values, self.state_type, from_attributes=True)

    def _check_state(self) -> type:
        """The type of the correlation field; the state fields without defaults besides it
        (:attr:`from_starting_message`: each starting message type must have them)."""
        fields = {field.name: field for field in msgspec.structs.fields(self.state_type)}
        name = self.saga_type.__name__
        if self.correlation is not None and self.correlation not in fields:
            raise ConfigurationError(
                f"saga {name}: correlation {self.correlation!r} is not a field of "
                f"{self.state_type.__name__} (fields: {sorted(fields)})")
        self.from_starting_message = [f for f, field in fields.items()
                                      if f != self.correlation and field.required]
        if self.correlation is None:
            return str
        annotation = fields[self.correlation].type
        if annotation not in CORRELATION_COLUMN_TYPES:
            raise ConfigurationError(
                f"saga {name}: correlation field {self.correlation!r} is {annotation!r}; "
                f"use one of {', '.join(t.__name__ for t in CORRELATION_COLUMN_TYPES)}")
        return typing.cast(type, annotation)

    def _read_handlers(self) -> dict[type, SagaHandler]:
        handlers: dict[type, SagaHandler] = {}
        name = self.saga_type.__name__
        for attribute, method in inspect.getmembers(self.saga_type, inspect.isfunction):
            mark = getattr(method, SAGA_HANDLER, None)
            if not isinstance(mark, HandlerMark):
                continue
            where = f"saga {name}.{attribute}"
            if not inspect.iscoroutinefunction(method):
                raise ConfigurationError(f"{where} must be an async method")
            message_type, takes_context = _message_type(method, where)
            if message_type in handlers:
                raise ConfigurationError(
                    f"{where}: {message_type.__name__} is handled by another method too")
            correlate = mark.correlate
            if correlate is BY_NAME:
                correlate = self._by_name(message_type, mark.starts, where)
            correlate = _correlator(correlate, message_type, where)
            if correlate is not None and self.correlation is None:
                raise ConfigurationError(
                    f"{where}: correlate= given but the saga has no correlation field")
            handlers[message_type] = SagaHandler(method=method, message_type=message_type,
                                                 starts=mark.starts, correlate=correlate,
                                                 takes_context=takes_context)
        if not handlers:
            raise ConfigurationError(f"saga {name} has no @starts or @handles method")
        if not any(handler.starts for handler in handlers.values()):
            raise ConfigurationError(f"saga {name}: no message type starts it (@starts)")
        return handlers

    def _check_starting_messages(self) -> None:
        for handler in self.handlers.values():
            fields = handler.message_type.__struct_fields__  # type: ignore[attr-defined]
            missing = [f for f in self.from_starting_message if f not in fields]
            if handler.starts and missing:
                raise ConfigurationError(
                    f"saga {self.saga_type.__name__}: state fields {missing} have no default "
                    f"and the starting message {handler.message_type.__name__} has no field "
                    "of that name to set them from; give them defaults")


    def _by_name(self, message_type: type, starts: bool, where: str) -> str | None:
        """The message's field named as the correlation, if it has one; else ``None`` (found
        by saga id), which a starting message may not be."""
        fields = message_type.__struct_fields__  # type: ignore[attr-defined]
        if self.correlation is not None and self.correlation in fields:
            return self.correlation
        if starts:
            raise ConfigurationError(
                f"{where}: a starting message must carry the correlation value, and "
                f"{message_type.__name__} has no field {self.correlation!r}: name the field "
                "that holds it with @starts(correlate=...)")
        return None


def state_type_of(saga_type: type) -> type[msgspec.Struct]:
    """The ``S`` of ``class X(Saga[S])``."""
    for base in getattr(saga_type, "__orig_bases__", ()):
        if typing.get_origin(base) is Saga:
            (state,) = typing.get_args(base)
            if isinstance(state, type) and issubclass(state, msgspec.Struct):
                return state
            raise ConfigurationError(f"saga {saga_type.__name__}: state {state!r} is not a "
                                     "msgspec.Struct")
    raise ConfigurationError(f"saga {saga_type.__name__} must derive from Saga[StateStruct]")


def state_version(state_type: type[msgspec.Struct]) -> str:
    """``SagaTypeVersion``: 16 hex digits of the state type's field names and types."""
    fields = [(field.encode_name, repr(field.type)) for field in
              msgspec.structs.fields(state_type)]
    return hashlib.sha1(repr(fields).encode()).hexdigest()[:16]


def _message_type(method: Callable[..., Any], where: str) -> tuple[type, bool]:
    """The method's message type, and whether it takes the context too."""
    parameters = list(inspect.signature(method).parameters)
    if len(parameters) not in (2, 3):
        raise ConfigurationError(f"{where} must take (self, message) or (self, message, "
                                 "context)")
    try:
        hints = typing.get_type_hints(method)
    except Exception as exc:
        raise ConfigurationError(f"{where}: cannot resolve its annotations: {exc}") from exc
    annotation = hints.get(parameters[1])
    if not (isinstance(annotation, type) and issubclass(annotation, msgspec.Struct)):
        raise ConfigurationError(
            f"{where}: annotate the message parameter with a msgspec.Struct type "
            f"(got {annotation!r})")
    return annotation, len(parameters) == 3


def _correlator(correlate: Any, message_type: type, where: str) -> Any:
    if correlate is None or callable(correlate):
        return correlate
    if isinstance(correlate, str):
        if correlate not in message_type.__struct_fields__:  # type: ignore[attr-defined]
            raise ConfigurationError(
                f"{where}: correlate={correlate!r} is not a field of {message_type.__name__}")
        return lambda message: getattr(message, correlate)
    raise ConfigurationError(f"{where}: correlate= must be a field name or a function")
