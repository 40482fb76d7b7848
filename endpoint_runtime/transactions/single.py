"""One message per receive transaction: the shape shared by receive-only and atomic modes.

BEGIN; DELETE the lowest unlocked seq; consult the failure count (error queue when used up);
run the handlers on the receive connection; write outgoing messages (atomic mode); COMMIT.
Any failure rolls everything back, so the row is visible again for the next attempt.
"""

from __future__ import annotations

import contextlib

import asyncpg

from endpoint_runtime.context import HandlerContext
from endpoint_runtime.errors import RecoverabilityFailedError
from endpoint_runtime.messages import PoisonMessage
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
        pipeline = self._pipeline
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
            dispatcher = (
                BufferedDispatcher(self._pool, pipeline.delayed_store)
                if self._sends_atomic
                else self._immediate
            )
            context = HandlerContext(
                message=received, endpoint=pipeline.endpoint,
                local_address=pipeline.local_address, dispatcher=dispatcher,
                connection=connection,
            )
            await pipeline.handle(received, context)
            if isinstance(dispatcher, BufferedDispatcher):
                await dispatcher.flush(connection)
            await transaction.commit()
            pipeline.failures.forget(received.native_id)
            return Round(taken=1, handled=1)
        except Exception as exc:
            await _rollback_quietly(transaction)
            if (received is None or isinstance(received, PoisonMessage)
                    or isinstance(exc, RecoverabilityFailedError) or connection.is_closed()):
                # A transport or recoverability failure (a lost connection is not the
                # message's fault: it is not charged a retry), for the receive loop.
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
