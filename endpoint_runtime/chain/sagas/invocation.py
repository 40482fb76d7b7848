"""A saga's handling of one message: find the instance, run the handler method, save.

Registered as an ordinary handler of each message type the saga handles (so it runs in
registration order with the endpoint's other handlers, with their retries), it works on the
handlers' connection, the mode's transaction: the state commits or rolls back with the
message's other business writes.

1. **Find**: a message with ``NServiceBus.SagaId`` and this saga's ``NServiceBus.SagaType``
   (a reply to the saga, a timeout) by that id; any other by its correlation value. With
   pessimistic concurrency the row is locked (``FOR UPDATE``) until the transaction ends.
2. **Not found**: a starting message makes a new instance (its correlation field set); a
   timeout is ignored (its instance completed); any other message is noted in the session:
   when no saga of the endpoint found or made an instance for it, the saga step runs the
   saga-not-found hooks once (by default: logged and consumed).
3. **Save**: a new instance is inserted (a concurrent starter with the same value fails on the
   unique index: :class:`SagaConcurrencyError`, the attempt is retried and finds the instance);
   an existing one updated with the version check, or deleted when completed (0 rows:
   :class:`SagaConcurrencyError`, retried).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import msgspec
import structlog

from endpoint_runtime.chain.context import HandlerContext
from endpoint_runtime.chain.sagas.definition import SagaDefinition, SagaHandler
from endpoint_runtime.chain.sagas.saga import Saga
from endpoint_runtime.chain.sagas.step import SESSION, InvokedSaga, SagaSession
from endpoint_runtime.chain.sagas.storage import SagaRow
from endpoint_runtime.errors import (
    EndpointRuntimeError,
    SagaConcurrencyError,
    SagaError,
    SagaStateVersionError,
)
from endpoint_runtime.wire.messages import Headers

log = structlog.get_logger("endpoint_runtime.sagas")

_metadata = msgspec.json.Encoder()
_metadata_decoder = msgspec.json.Decoder(dict[str, str])


class SagaInvocation:
    """The handler registered for one (saga, message type); see the module docstring."""

    def __init__(self, definition: SagaDefinition, handler: SagaHandler) -> None:
        self.definition = definition
        self.handler = handler

    def as_handler(self) -> Callable[[Any, HandlerContext], Awaitable[None]]:
        """An ``async def (message, context)`` for the handler registry, named after the
        saga's method (for logs and registration errors)."""

        async def handle(message: Any, context: HandlerContext) -> None:
            await self(message, context)

        saga_type = self.definition.saga_type
        handle.__qualname__ = f"{saga_type.__qualname__}.{self.handler.method.__name__}"
        handle.__module__ = saga_type.__module__
        return handle

    async def __call__(self, message: Any, context: HandlerContext) -> None:
        session = context.items.get(SESSION)
        if not isinstance(session, SagaSession):
            raise EndpointRuntimeError("a saga handler runs only in a chain with the saga step")
        definition, connection = self.definition, context.connection
        row, value = await self._find(message, context)
        if row is None:
            if not self.handler.starts or value is None:
                self._not_found(session, message, context)
                return
            saga = self._new(message, context, value)
        else:
            saga = self._loaded(row)
        correlation = definition.correlation
        before = getattr(saga.state, correlation) if correlation else None
        invoked = InvokedSaga(definition.type_name, saga.saga_id,
                              "New" if saga.is_new else "Updated")
        session.active = invoked
        try:
            await self.handler.run(saga, message, context)
        finally:
            session.active = None
        await self._save(connection, saga, row, value, before)
        if saga.completed:
            invoked.change = "New,Completed" if saga.is_new else "Completed"
        session.invoked.append(invoked)

    async def _find(self, message: Any, context: HandlerContext) -> tuple[SagaRow | None, Any]:
        """The stored instance (or ``None``) and the message's correlation value."""
        table, lock = self.definition.table, self.definition.pessimistic
        headers = context.headers
        saga_id = headers.get(Headers.SAGA_ID)
        if saga_id and headers.get(Headers.SAGA_TYPE) == self.definition.type_name:
            try:
                parsed = uuid.UUID(saga_id)
            except ValueError:
                log.warning("saga_id_not_a_uuid", saga_type=self.definition.type_name,
                            saga_id=saga_id[:100])
                return None, None
            return await table.get_by_id(context.connection, parsed, lock=lock), None
        value = self.handler.correlation_value(message)
        if value is None:
            return None, None
        if type(value) is not table.correlation_type:
            raise SagaError(
                f"saga {self.definition.type_name}: {type(message).__name__} maps to the "
                f"correlation value {value!r} ({type(value).__name__}); its correlation "
                f"field {self.definition.correlation!r} is {table.correlation_type.__name__}")
        return await table.get_by_correlation(context.connection, value, lock=lock), value

    def _new(self, message: Any, context: HandlerContext, value: Any) -> Saga[Any]:
        definition = self.definition
        saga = definition.saga_type()
        saga.state = definition.new_state(message, value)
        saga.saga_id = uuid.uuid4()
        saga.is_new = True
        saga.completed = False
        saga.originator = context.headers.get(Headers.REPLY_TO_ADDRESS)
        saga.original_message_id = context.message_id
        return saga

    def _loaded(self, row: SagaRow) -> Saga[Any]:
        definition = self.definition
        saga = definition.saga_type()
        try:
            saga.state = msgspec.json.decode(row.data, type=definition.state_type)
        except msgspec.ValidationError as exc:
            raise SagaStateVersionError(
                f"saga {definition.type_name} {row.id}: its state, stored by state type version "
                f"{row.saga_type_version}, does not decode as the current state type "
                f"{definition.state_type.__name__} (version {definition.version}): {exc}"
            ) from exc
        if row.saga_type_version != definition.version:
            log.info("saga_state_version_changed", saga_type=definition.type_name,
                     saga_id=str(row.id), stored=row.saga_type_version,
                     current=definition.version)
        metadata = _metadata_decoder.decode(row.metadata) if row.metadata else {}
        saga.saga_id = row.id
        saga.is_new = False
        saga.completed = False
        saga.originator = metadata.get("Originator")
        saga.original_message_id = metadata.get("OriginalMessageId")
        return saga

    async def _save(self, connection: Any, saga: Saga[Any], row: SagaRow | None,
                    value: Any, before: Any) -> None:
        definition = self.definition
        table = definition.table
        if saga.completed:
            if row is not None and not await table.complete(connection, row.id,
                                                            row.concurrency):
                raise self._conflict(saga.saga_id)
            return
        correlation = definition.correlation
        if correlation is not None and getattr(saga.state, correlation) != before:
            raise SagaError(
                f"saga {definition.type_name} {saga.saga_id}: a handler changed the "
                f"correlation field {correlation!r}; it is fixed when the instance starts")
        data = msgspec.json.encode(saga.state).decode()
        metadata = _metadata.encode({
            key: item for key, item in (("OriginalMessageId", saga.original_message_id),
                                        ("Originator", saga.originator)) if item}).decode()
        if row is None:
            try:
                await table.insert(connection, saga.saga_id, metadata=metadata, data=data,
                                   saga_type_version=definition.version,
                                   correlation_value=value)
            except asyncpg.UniqueViolationError as exc:
                raise SagaConcurrencyError(
                    f"saga {definition.type_name}: another message created the instance of "
                    f"{correlation} = {value!r} at the same time; this one is retried and "
                    "finds it") from exc
            return
        if not await table.update(connection, row.id, row.concurrency, metadata=metadata,
                                  data=data, saga_type_version=definition.version):
            raise self._conflict(saga.saga_id)

    def _conflict(self, saga_id: uuid.UUID) -> SagaConcurrencyError:
        return SagaConcurrencyError(
            f"saga {self.definition.type_name} {saga_id} was changed or completed by another "
            "message since this one read it; the message is retried")

    def _not_found(self, session: SagaSession, message: Any, context: HandlerContext) -> None:
        """A timeout is ignored (its instance completed); any other message is noted: the saga
        step decides once all handlers ran (see
        :class:`endpoint_runtime.chain.sagas.step.SagaStep`)."""
        type_name = self.definition.type_name
        if context.headers.get(Headers.IS_SAGA_TIMEOUT) == "True":
            log.info("saga_timeout_ignored", saga_type=type_name,
                     saga_id=context.headers.get(Headers.SAGA_ID),
                     message_type=type(message).__name__)
            return
        session.not_found(type_name, message, context)
