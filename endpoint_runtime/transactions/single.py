"""One message per receive transaction: the shape shared by receive-only and atomic modes.

BEGIN; DELETE the lowest unlocked seq; consult the failure count (error queue when used up);
run the handlers on the receive connection; write outgoing messages (atomic mode); COMMIT.
Any failure rolls everything back, so the row is visible again for the next attempt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import asyncpg

from endpoint_runtime.context import HandlerContext
from endpoint_runtime.errors import RecoverabilityFailedError
from endpoint_runtime.messages import PoisonMessage, TransportMessage
from endpoint_runtime.pipeline import Pipeline
from endpoint_runtime.transactions.base import EMPTY, BufferedDispatcher, ImmediateDispatcher, Round
from endpoint_runtime.transport import receiving


class SingleMessageStrategy:
    """``sends_atomic=True``: sends are written in the receive transaction (atomic mode);
    ``False``: sends leave at once on other connections (receive-only mode)."""

    def __init__(self, pipeline: Pipeline, pool: asyncpg.Pool, *, sends_atomic: bool) -> None:
        self._pipeline = pipeline
        self._pool = pool
        self._sends_atomic = sends_atomic
        self._immediate = ImmediateDispatcher(pool, pipeline.delayed_store)

    async def slot_ended(self, connection: asyncpg.Connection) -> None:
        return None

    async def receive_round(self, connection: asyncpg.Connection) -> Round:
        return await receive_in_transaction(self._pipeline, connection, self._handle)

    async def _handle(self, connection: asyncpg.Connection, message: TransportMessage) -> None:
        pipeline = self._pipeline
        dispatcher = (
            BufferedDispatcher(self._pool, pipeline.delayed_store)
            if self._sends_atomic
            else self._immediate
        )
        context = HandlerContext(
            message=message, endpoint=pipeline.endpoint, local_address=pipeline.local_address,
            dispatcher=dispatcher, connection=connection,
        )
        await pipeline.handle(message, context)
        if isinstance(dispatcher, BufferedDispatcher):
            await dispatcher.flush(connection)


Handle = Callable[[asyncpg.Connection, TransportMessage], Awaitable[None]]


async def receive_in_transaction(
    pipeline: Pipeline, connection: asyncpg.Connection, handle: Handle
) -> Round:
    """BEGIN; receive one message; move it on if recoverability says so (poison, retries
    used up), else ``handle`` it; COMMIT. A failure rolls everything back and is charged to
    the message, unless the connection was lost or recoverability itself failed: those are
    raised to the receive loop (transport failures, for the circuit breakers)."""
    transaction = connection.transaction()
    await transaction.start()
    received = None
    try:
        received = await receiving.receive(connection, pipeline.local_address)
        if received is None:
            await transaction.commit()  # expired rows deleted on the way
            return EMPTY
        pipeline.bind_log_context(received)
        if isinstance(received, PoisonMessage):
            await pipeline.move_poison_to_error_queue(connection, received)
            await transaction.commit()
            return Round(taken=1, failed=1)
        decision = pipeline.pending_decision(received)
        if decision is not None:
            await pipeline.apply_decision(connection, received, decision)
            await transaction.commit()
            return Round(taken=1, failed=1)
        await handle(connection, received)
        await transaction.commit()
        pipeline.failures.forget(received.native_id)
        return Round(taken=1, handled=1)
    except Exception as exc:
        await _rollback_quietly(transaction)
        if (received is None or isinstance(received, PoisonMessage)
                or isinstance(exc, RecoverabilityFailedError) or connection.is_closed()):
            raise
        pipeline.record_failure(received, exc)
        return Round(taken=1, failed=1)
    except BaseException:
        await _rollback_quietly(transaction)
        raise


async def _rollback_quietly(transaction: asyncpg.transaction.Transaction) -> None:
    # Connection lost or transaction already ended: the server rolls back by itself.
    with contextlib.suppress(asyncpg.InterfaceError, asyncpg.PostgresError, OSError):
        await transaction.rollback()
