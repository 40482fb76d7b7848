"""Beginning, committing and rolling back the receive transaction: what the strategies share.

Round trips are what a receive costs, so they are saved where the guarantees allow:

- **Chained transactions.** After a message, ``COMMIT; BEGIN`` goes as one simple query, so
  the next receive already runs in a transaction. A bare BEGIN holds no snapshot and no locks.
  A receive that finds nothing commits and leaves no transaction open; a slot that ends rolls
  back what it carried (:func:`end_carried_transaction`).
- **Sends with the COMMIT.** In atomic mode, small outgoing messages are INSERTs with literal
  values sent in that same simple query; the statements run in order and the first failure
  aborts the rest, so the sends commit exactly when the receive does.
- **Counts with the COMMIT.** So does the slot's committed count (``transactions.counting``):
  processed for a message whose handlers ran, failed for one moved to the error queue (what
  the chain noted on its unit, :func:`count_statement`).

Once a message's transaction ended, its :class:`~endpoint_runtime.chain.pipeline.Unit` hears of it
(:func:`settled` after a commit, :func:`charge_or_raise` after a failed one), and the steps'
hooks run.
"""

from __future__ import annotations

import contextlib
import re

import asyncpg

from endpoint_runtime.chain.pipeline import Outcome, Unit
from endpoint_runtime.errors import (
    QueueNotFoundError,
    RecoverabilityFailedError,
)
from endpoint_runtime.transactions.base import Round
from endpoint_runtime.transactions.counting import SlotCounts, counts_refused
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import (
    QUERY_ERRORS,
    DatabaseConnection,
    in_transaction,
    is_lost,
)
from endpoint_runtime.wire.messages import TransportMessage

COMMIT_AND_BEGIN = "COMMIT; BEGIN"
# Before a handled message's COMMIT: fails in an aborted transaction, whose COMMIT PostgreSQL
# would answer with ROLLBACK instead of an error (a handler that caught a database error
# without a savepoint). Sends that go with the COMMIT fail there just the same.
ABORTED_CHECK = "SELECT 1"
_MISSING_RELATION = re.compile(r'relation "(.+)" does not exist')

FAILED_ROUND = Round(taken=1, failed=1)
HANDLED_ROUND = Round(taken=1, handled=1)


async def count_statement(counts: SlotCounts, connection: DatabaseConnection,
                          unit: Unit) -> str:
    """The statement that counts a message whose transaction is about to commit in the
    slot's row: processed when its handlers ran, failed when it went to the error queue."""
    return await counts.statement(connection, processed=int(unit.handled),
                                  failed=int(unit.moved_to_error))


def joined(*statements: str) -> str:
    """Statements for one simple query (empty ones left out)."""
    return "; ".join(s for s in statements if s)


async def begin_unless_carried(connection: DatabaseConnection) -> None:
    """The last round's ``COMMIT; BEGIN`` may have begun this round's transaction already."""
    if not in_transaction(connection):
        await connection.execute("BEGIN")


def charge_or_raise(
    unit: Unit | None, received: receiving.Received | None, exc: BaseException,
    connection: DatabaseConnection,
) -> None:
    """After a rollback: a failure of the message's own work (its commit, its sends) is
    charged to it (the unit's after-rollback hooks); a lost connection, a failed
    recoverability step, a cancellation or a failure before a message was taken are raised
    to the receive loop."""
    if (unit is None or not isinstance(exc, Exception)
            or not isinstance(received, TransportMessage)
            or isinstance(exc, RecoverabilityFailedError) or is_lost(connection)):
        raise exc
    raise_if_counts_refused(exc)
    unit.rolled_back(exc)


def raise_if_counts_refused(exc: BaseException) -> None:
    """Raise :class:`CommittedCountsFailedError` when ``exc`` is the database's refusal of
    the committed-counts table: a set-up fault, never a message's failure."""
    refusal = counts_refused(exc)
    if refusal is not None:
        raise refusal from exc


def settled(unit: Unit, outcome: Outcome) -> Round:
    """The round of a message whose transaction committed (the steps' after-commit hooks
    run: its failure count goes, it counts as processed)."""
    unit.committed()
    return HANDLED_ROUND if outcome is Outcome.HANDLED else FAILED_ROUND


async def rolled_back(connection: DatabaseConnection, unit: Unit) -> Round:
    """A ``FAILED`` attempt, already counted: roll back, the row comes back."""
    await rollback_quietly(connection)
    unit.rolled_back()
    return FAILED_ROUND


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
        raise queue_not_found(exc) from exc


def queue_not_found(exc: asyncpg.UndefinedTableError) -> QueueNotFoundError:
    """A send's "relation does not exist" as the missing queue's error."""
    missing = _MISSING_RELATION.search(str(exc))
    return QueueNotFoundError(missing.group(1) if missing else str(exc))


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
