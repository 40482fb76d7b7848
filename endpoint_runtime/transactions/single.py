"""One message per receive transaction: the shape shared by receive-only and atomic modes.

BEGIN; DELETE the lowest unlocked seq; consult the failure count (error queue when used up);
run the handlers on the receive connection; write outgoing messages (atomic mode); COMMIT.
Any failure rolls everything back, so the row is visible again for the next attempt.

Round trips are what a receive costs, so they are saved where the guarantees allow:

- **Chained transactions.** After a message, ``COMMIT; BEGIN`` goes as one simple query, so
  the next receive already runs in a transaction. A bare BEGIN holds no snapshot and no locks.
  A receive that finds nothing commits and leaves no transaction open; a slot that ends rolls
  back what it carried (:func:`end_carried_transaction`).
- **Sends with the COMMIT.** In atomic mode, small outgoing messages are INSERTs with literal
  values sent in that same simple query; the statements run in order and the first failure
  aborts the rest, so the sends commit exactly when the receive does.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable

import asyncpg

from endpoint_runtime.context import OpenTransactionConnection
from endpoint_runtime.errors import (
    QueueNotFoundError,
    RecoverabilityFailedError,
    TransactionAbortedError,
)
from endpoint_runtime.messages import PoisonMessage, TransportMessage
from endpoint_runtime.pipeline import Pipeline
from endpoint_runtime.transactions.base import EMPTY, BufferedDispatcher, ImmediateDispatcher, Round
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.addresses import QueueAddress

COMMIT_AND_BEGIN = "COMMIT; BEGIN"
# Before a handled message's COMMIT: fails in an aborted transaction, whose COMMIT PostgreSQL
# would answer with ROLLBACK instead of an error (a handler that caught a database error
# without a savepoint). Sends that go with the COMMIT fail there just the same.
ABORTED_CHECK = "SELECT 1"
_MISSING_RELATION = re.compile(r'relation "(.+)" does not exist')


class SingleMessageStrategy:
    """``sends_atomic=True``: sends are written in the receive transaction (atomic mode);
    ``False``: sends leave at once on other connections (receive-only mode)."""

    def __init__(self, pipeline: Pipeline, pool: asyncpg.Pool, *, sends_atomic: bool) -> None:
        self._pipeline = pipeline
        self._pool = pool
        self._sends_atomic = sends_atomic
        self._immediate = ImmediateDispatcher(pool, pipeline.delayed_store)

    async def slot_ended(self, connection: asyncpg.Connection) -> None:
        await end_carried_transaction(connection)

    async def receive_round(self, connection: asyncpg.Connection) -> Round:
        return await receive_in_transaction(self._pipeline, connection, self._handle)

    async def _handle(self, connection: asyncpg.Connection, message: TransportMessage) -> str:
        pipeline = self._pipeline
        dispatcher = (
            BufferedDispatcher(self._pool, pipeline.delayed_store)
            if self._sends_atomic
            else self._immediate
        )
        context = pipeline.new_context(message, dispatcher, OpenTransactionConnection(connection))
        await pipeline.handle(message, context)
        if isinstance(dispatcher, BufferedDispatcher):
            return await dispatcher.flush_before_commit(connection)
        return ""


Handle = Callable[[asyncpg.Connection, TransportMessage], Awaitable[str | None]]
"""Processes a received message in the open transaction; returns statements (literal SQL,
possibly empty) to run just before its COMMIT, in the same simple query; or ``None``: the
transaction stays open, for the strategy to commit later (``transactions.ack_group``)."""

Receive = Callable[[asyncpg.Connection, QueueAddress], Awaitable[receiving.Received | None]]


async def receive_in_transaction(
    pipeline: Pipeline, connection: asyncpg.Connection, handle: Handle,
    receive: Receive = receiving.receive,
) -> Round:
    """(BEGIN unless carried over;) receive one message; move it on if recoverability says
    so (poison, retries used up), else ``handle`` it; COMMIT and BEGIN the next. A failure
    rolls everything back and is charged to the message, unless the connection was lost or
    recoverability itself failed: those are raised to the receive loop (transport failures,
    for the circuit breakers)."""
    if not connection.is_in_transaction():
        await connection.execute("BEGIN")
    received = None
    try:
        received = await receive(connection, pipeline.local_address)
        if received is None:
            await connection.execute("COMMIT")  # expired rows deleted on the way
            return EMPTY
        pipeline.bind_log_context(received)
        if isinstance(received, PoisonMessage):
            await pipeline.move_poison_to_error_queue(connection, received)
            await connection.execute(COMMIT_AND_BEGIN)
            return Round(taken=1, failed=1)
        decision = pipeline.pending_decision(received)
        if decision is not None:
            await pipeline.apply_decision(connection, received, decision)
            await connection.execute(COMMIT_AND_BEGIN)
            return Round(taken=1, failed=1)
        before_commit = await handle(connection, received)
        if before_commit is not None:
            await _commit_and_begin(connection, before_commit)
        pipeline.failures.forget(received.native_id)
        return Round(taken=1, handled=1)
    except Exception as exc:
        await _rollback_quietly(connection)
        if (received is None or isinstance(received, PoisonMessage)
                or isinstance(exc, RecoverabilityFailedError) or connection.is_closed()):
            raise
        pipeline.record_failure(received, charged_exception(exc))
        return Round(taken=1, failed=1)
    except BaseException:
        await _rollback_quietly(connection)
        raise


async def _commit_and_begin(connection: asyncpg.Connection, before_commit: str) -> None:
    """COMMIT what a handler did (with ``before_commit`` first) and BEGIN the next, in one
    query; in a transaction the handler left aborted, the first statement fails."""
    try:
        await connection.execute(f"{before_commit or ABORTED_CHECK}; {COMMIT_AND_BEGIN}")
    except asyncpg.UndefinedTableError as exc:
        missing = _MISSING_RELATION.search(str(exc))
        raise QueueNotFoundError(missing.group(1) if missing else str(exc)) from exc


def charged_exception(exc: Exception) -> Exception:
    """The exception a failed attempt is charged with: "current transaction is aborted" from
    any statement after a handler caught a database error says too little, so it becomes a
    :class:`TransactionAbortedError` that says what to do."""
    if isinstance(exc, asyncpg.InFailedSQLTransactionError):
        aborted = TransactionAbortedError()
        aborted.__cause__ = exc
        return aborted
    return exc


async def end_carried_transaction(connection: asyncpg.Connection) -> None:
    """Roll back the transaction a slot's last round began for the next (it did nothing)."""
    if not connection.is_closed() and connection.is_in_transaction():
        await _rollback_quietly(connection)


async def _rollback_quietly(connection: asyncpg.Connection) -> None:
    # Connection lost or transaction already ended: the server rolls back by itself.
    if connection.is_closed() or not connection.is_in_transaction():
        return
    with contextlib.suppress(asyncpg.InterfaceError, asyncpg.PostgresError, OSError):
        await connection.execute("ROLLBACK")
