"""One message per receive transaction: the shape shared by receive-only and atomic modes.

BEGIN; DELETE the lowest unlocked seq; ``Pipeline.process`` (recoverability's moves, or the
handlers on the receive connection); write outgoing messages (atomic mode); COMMIT. Any failure
rolls everything back, so the row is visible again for the next attempt. The helpers below
(``begin_unless_carried``, ``commit_and_begin``, ``charge_or_raise``) are the outbox's too.

Round trips are what a receive costs, so they are saved where the guarantees allow:

- **Chained transactions.** After a message, ``COMMIT; BEGIN`` goes as one simple query, so
  the next receive already runs in a transaction. A bare BEGIN holds no snapshot and no locks.
  A receive that finds nothing commits and leaves no transaction open; a slot that ends rolls
  back what it carried (:func:`end_carried_transaction`).
- **Sends with the COMMIT.** In atomic mode, small outgoing messages are INSERTs with literal
  values sent in that same simple query; the statements run in order and the first failure
  aborts the rest, so the sends commit exactly when the receive does.
- **Counts with the COMMIT.** So does the slot's committed count (``transactions.counting``):
  processed for a handled message, failed for one moved to the error queue.
"""

from __future__ import annotations

import contextlib
import re

import asyncpg

from endpoint_runtime.errors import QueueNotFoundError, RecoverabilityFailedError
from endpoint_runtime.messages import PoisonMessage, TransportMessage
from endpoint_runtime.pipeline import Outcome, Pipeline
from endpoint_runtime.transactions.base import (
    EMPTY,
    BufferedDispatcher,
    ImmediateDispatcher,
    ReceiveSlot,
    Round,
)
from endpoint_runtime.transactions.connections import OpenTransactionConnection
from endpoint_runtime.transactions.counting import SlotCounts
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import (
    QUERY_ERRORS,
    DatabaseConnection,
    in_transaction,
    is_lost,
)

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
        self.pipeline = pipeline
        self.pool = pool
        self.sends_atomic = sends_atomic
        self.immediate = ImmediateDispatcher(pool, pipeline.delayed_store)

    def open_slot(self, connection: DatabaseConnection) -> SingleMessageSlot:
        return SingleMessageSlot(self, connection)

    def round_dispatcher(self) -> BufferedDispatcher | ImmediateDispatcher:
        """Where one round's outgoing messages go: a buffer written with the COMMIT (atomic
        mode), or straight out (receive-only mode; ``receive_only.py`` refines it)."""
        if self.sends_atomic:
            return BufferedDispatcher(self.pool, self.pipeline.delayed_store)
        return self.immediate


class SingleMessageSlot(ReceiveSlot):
    """A slot of one message per transaction; what it carries over between rounds is the
    transaction the last ``COMMIT; BEGIN`` began, rolled back at :meth:`close`."""

    def __init__(self, strategy: SingleMessageStrategy, connection: DatabaseConnection) -> None:
        super().__init__(connection)
        self._strategy = strategy

    async def release(self) -> None:
        await end_carried_transaction(self.connection)

    async def round(self) -> Round:
        """(BEGIN unless carried over;) receive one message and process it; COMMIT with the
        outgoing messages and BEGIN the next, or roll back a failed attempt."""
        strategy, connection = self._strategy, self.connection
        pipeline = strategy.pipeline
        await begin_unless_carried(connection)
        received = None
        try:
            received = await receiving.receive(connection, pipeline.local_address)
            if received is None:
                await connection.execute("COMMIT")  # expired rows deleted on the way
                return EMPTY
            dispatcher = strategy.round_dispatcher()
            outcome = await pipeline.process(received, connection, dispatcher,
                                             OpenTransactionConnection(connection))
            if outcome is Outcome.FAILED:
                await rollback_quietly(connection)
                return FAILED_ROUND
            before_commit = ""
            if outcome is Outcome.HANDLED and isinstance(dispatcher, BufferedDispatcher):
                before_commit = await dispatcher.flush_before_commit(connection)
            count = await count_statement(self.counts, connection, outcome)
            await commit_and_begin(connection, joined(before_commit, count),
                                   handled=outcome is Outcome.HANDLED)
        except BaseException as exc:
            await rollback_quietly(connection)
            charge_or_raise(pipeline, received, exc, connection)
            return FAILED_ROUND
        return settled(pipeline, received, outcome)


FAILED_ROUND = Round(taken=1, failed=1)


async def count_statement(counts: SlotCounts, connection: DatabaseConnection,
                          outcome: Outcome) -> str:
    """The statement that counts a committed message of ``outcome`` in the slot's row."""
    return await counts.statement(
        connection, processed=int(outcome is Outcome.HANDLED),
        failed=int(outcome is Outcome.MOVED_TO_ERROR))


def joined(*statements: str) -> str:
    """Statements for one simple query (empty ones left out)."""
    return "; ".join(s for s in statements if s)


async def begin_unless_carried(connection: DatabaseConnection) -> None:
    """The last round's ``COMMIT; BEGIN`` may have begun this round's transaction already."""
    if not in_transaction(connection):
        await connection.execute("BEGIN")


def charge_or_raise(
    pipeline: Pipeline, received: receiving.Received | None, exc: BaseException,
    connection: DatabaseConnection,
) -> None:
    """After a rollback: a failure of the message's own work (its commit, its sends) is
    charged to it; a lost connection, a failed recoverability step, a cancellation or a
    failure before a message was taken are raised to the receive loop."""
    if (not isinstance(exc, Exception) or not isinstance(received, TransportMessage)
            or isinstance(exc, RecoverabilityFailedError) or is_lost(connection)):
        raise exc
    pipeline.failed(received, exc)


def settled(pipeline: Pipeline, received: TransportMessage | PoisonMessage,
            outcome: Outcome) -> Round:
    """The round of a committed message (its failure count goes once its work committed)."""
    if outcome is Outcome.HANDLED:
        assert isinstance(received, TransportMessage)
        pipeline.succeeded(received)
        return HANDLED_ROUND
    return FAILED_ROUND


HANDLED_ROUND = Round(taken=1, handled=1)


async def commit_and_begin(
    connection: DatabaseConnection, before_commit: str = "", *, handled: bool = True
) -> None:
    """COMMIT (with ``before_commit`` first) and BEGIN the next, in one query. After handlers
    (``handled``), a transaction they left aborted fails at its first statement instead of
    being rolled back by a COMMIT that succeeds."""
    first = before_commit or (ABORTED_CHECK if handled else "")
    try:
        await connection.execute(f"{first}; {COMMIT_AND_BEGIN}" if first else COMMIT_AND_BEGIN)
    except asyncpg.UndefinedTableError as exc:
        missing = _MISSING_RELATION.search(str(exc))
        raise QueueNotFoundError(missing.group(1) if missing else str(exc)) from exc


async def end_carried_transaction(connection: DatabaseConnection) -> None:
    """Roll back the transaction a slot's last round began for the next (it did nothing)."""
    if in_transaction(connection):
        await rollback_quietly(connection)


async def rollback_quietly(connection: DatabaseConnection) -> None:
    # Connection lost or transaction already ended: the server rolls back by itself.
    if not in_transaction(connection):
        return
    with contextlib.suppress(*QUERY_ERRORS):
        await connection.execute("ROLLBACK")
