"""Optimistic batches: the messages of a batch run without a savepoint each.

A batch (``transactions.batched``, ``batch_isolation="optimistic"``) is received in one
transaction: BEGIN; DELETE up to N rows. Its messages then go through the chain one after the
other in that transaction, with no savepoint of their own; their sends wait in memory. The end
is one simple query: a single send (several go just before it, one INSERT per destination),
the slot's committed count, ``SET CONSTRAINTS ALL IMMEDIATE`` (a deferred constraint fails
there, before COMMIT, while the transaction can still be rolled back in part), ``COMMIT;
BEGIN``. A batch without failures costs its handlers' statements plus two to four round
trips: the receive, the checkpoint (when its handlers use the database), the sends (when
several) and the end.

The **checkpoint** is a savepoint taken after the DELETE, on the first database use of the
batch's messages (handlers, recoverability's moves), and moved past work found good. When a
message fails, its attempt is not charged yet (``Unit.tentative``): the batch rolls back to
the checkpoint (the rows stay taken and locked) and runs again without the message whose own
run fails:

- **a failure that shows at the failing message** (its handler raised; a statement of its own
  failed in a healthy transaction) is its own: it is charged, its row goes back with its seq
  for the next attempt, the messages before it run again and are checked (checkpoint moved),
  and the batch goes on after it: *the others as a batch, the failed one alone*. A message
  that fails without having used the database needs no rollback at all;
- **a failure that shows elsewhere** (a statement refused because an earlier handler swallowed
  a database error; a deferred constraint or a send to a missing queue at the end) is found
  by **bisection**: each half of the suspects runs and is checked (the end without COMMIT:
  its sends, the constraint check, the checkpoint moved), a failing half is split again, until
  the one message whose own run fails is charged and put back. (A send that fails at the end
  of a run with no checkpoint, whose messages did not use the database, fails the batch,
  uncharged; the slot then goes one message at a time, ``transactions.batched``.)

Why each (N = 50, handlers of one statement; docs/handlers.md has the numbers): excluding the
message seen failing re-runs on average half of the messages since the last checkpoint, about
N/2 statements plus two round trips for one failure in a batch; bisecting the same batch runs
about 3N statements and 2·log2 N checks. So bisection is kept for the failures that cannot be
attributed where they show.

The chain's hooks stay exact: the units of a run that rolled back hear ``rolled_back()``
(uncharged) and are dropped, a replay gets new units, and only the units of the work that
commits hear ``committed()`` and are in the committed count, once each.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import NamedTuple, cast

import asyncpg

from endpoint_runtime.chain.pipeline import IncomingContext, Outcome, Pipeline, Unit
from endpoint_runtime.transactions.base import BufferedDispatcher, Round
from endpoint_runtime.transactions.counting import SlotCounts
from endpoint_runtime.transactions.receive_transaction import (
    COMMIT_AND_BEGIN,
    joined,
    queue_not_found,
    raise_if_counts_refused,
)
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import DatabaseConnection, in_transaction
from endpoint_runtime.transport.savepoints import (
    LazySavepointConnection,
    OpenTransactionConnection,
)
from endpoint_runtime.wire.messages import PoisonMessage, TransportMessage

CHECKPOINT = "endpoint_runtime_batch"
_CHECK = "endpoint_runtime_check"
CHECK_DEFERRED = (f"SAVEPOINT {_CHECK}; SET CONSTRAINTS ALL IMMEDIATE; "
                  f"ROLLBACK TO SAVEPOINT {_CHECK}; RELEASE SAVEPOINT {_CHECK}")
"""Checks the deferred constraints of the work so far and leaves them deferred (the rolled back
subtransaction marks the checked events pending again); fails in an aborted transaction."""
MOVE_CHECKPOINT = f"RELEASE SAVEPOINT {CHECKPOINT}; SAVEPOINT {CHECKPOINT}"
COMMIT_CHECKED = f"SET CONSTRAINTS ALL IMMEDIATE; {COMMIT_AND_BEGIN}"
"""Fails in an aborted transaction or on a deferred constraint, before the COMMIT."""

Received = TransportMessage | PoisonMessage


class Failed(NamedTuple):
    """How a run failed: the messages that ran since the checkpoint (``suspects``, the one it
    showed at last), those it did not reach (``rest``), and whether the failure is the last
    suspect's own (``own``)."""

    suspects: list[Received]
    rest: list[Received]
    error: BaseException
    own: bool


def shows_an_aborted_transaction(error: BaseException) -> bool:
    """Whether ``error`` (or what it came from) is a statement refused because the
    transaction was aborted before it: the failure of an earlier statement."""
    seen: BaseException | None = error
    for _ in range(16):  # causes may loop
        if seen is None:
            return False
        if isinstance(seen, asyncpg.InFailedSQLTransactionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class OptimisticBatch:
    """One batch's transaction from its received rows to its COMMIT (see the module
    docstring); used once."""

    bisect_every_failure = False
    """Search every failure by bisection, also one that shows at its own message: set only by
    the benchmark that compares the two recoveries (``benchmarks.optimistic_recovery``)."""

    def __init__(self, pipeline: Pipeline, pool: asyncpg.Pool, connection: DatabaseConnection,
                 counts: SlotCounts) -> None:
        self._pipeline = pipeline
        self._pool = pool
        self._connection = connection
        self._counts = counts
        # One proxy for the batch: its first query takes the checkpoint, every query marks
        # the work since the checkpoint as written.
        self._handler_connection = LazySavepointConnection(
            OpenTransactionConnection(connection), self._touch)
        self._executor = cast("DatabaseConnection",
                              LazySavepointConnection(connection, self._touch))
        self.checkpoint = False
        self.message_wrote = False
        """Database work by the message running."""
        self.kept: list[tuple[Unit, Outcome]] = []
        self.running: list[tuple[Received, Unit, Outcome]] = []
        self.retry: list[TransportMessage] = []
        self.charged = 0

    def _touch(self) -> Awaitable[None] | None:
        """Before each query of the batch's messages: the work since the checkpoint is
        written; the checkpoint's statement to await first if it is not taken yet."""
        self.message_wrote = True
        return None if self.checkpoint else self._take_checkpoint()

    async def _take_checkpoint(self) -> None:
        await self._connection.execute(f"SAVEPOINT {CHECKPOINT}")
        self.checkpoint = True

    async def process(self, batch: list[Received]) -> Round:
        """Run ``batch`` and commit what it keeps (raises, uncharged, what cannot be
        attributed to a message: the caller rolls back)."""
        try:
            failed = await self._run(batch, final=True)  # the common case: no failure
            if failed is not None:
                await self._recover(failed, final=True)
        except BaseException:
            for unit, _ in self.kept:
                unit.rolled_back()
            for _, unit, _ in self.running:
                unit.rolled_back()
            raise
        for unit, _ in self.kept:
            unit.committed()
        # Lists, not generators: a generator resumes once per message.
        handled = [outcome for _, outcome in self.kept].count(Outcome.HANDLED)
        return Round(taken=len(batch), handled=handled,
                     failed=len(self.kept) - handled + self.charged)

    async def _settle(self, messages: list[Received], *, final: bool) -> None:
        """Run ``messages`` from the checkpoint until each is kept or charged; ``final``:
        commit at the end, else check and move the checkpoint."""
        await self._recover(await self._run(messages, final=final), final=final)

    async def _recover(self, failed: Failed | None, *, final: bool) -> None:
        """Go on from a failed run until no run fails (see :meth:`_settle`)."""
        while failed is not None:
            suspects, messages = failed.suspects, failed.rest
            alone = failed.own or len(suspects) == 1
            await self._roll_back(failed.error if alone else None)
            if alone and len(suspects) > 1:
                await self._settle(suspects[:-1], final=False)
            elif not alone:
                half = len(suspects) // 2
                await self._settle(suspects[:half], final=False)
                await self._settle(suspects[half:], final=False)
            if not messages and not final:
                return
            failed = await self._run(messages, final=final)

    async def _run(self, messages: list[Received], *, final: bool) -> Failed | None:
        """Each message through the chain, then the end; where it failed, if it did (the
        units of the run are left in ``running`` for :meth:`_roll_back`)."""
        outgoing = BufferedDispatcher(self._pool, self._pipeline.delayed_store)
        own = BufferedDispatcher(self._pool, self._pipeline.delayed_store)  # each message's
        for index, received in enumerate(messages):
            own.pending.clear()
            own.pending_delayed.clear()
            unit = Unit(self._executor, own, self._handler_connection)
            unit.tentative = True
            self.message_wrote = False
            context = IncomingContext(received, unit)
            await self._pipeline.enter(context)
            outcome = context.outcome
            if outcome is Outcome.FAILED:
                error = unit.failure
                assert error is not None, "a tentative unit keeps its failure"
                own_failure = not (self.bisect_every_failure
                                   or shows_an_aborted_transaction(error))
                if own_failure and not self.message_wrote:
                    self._charge(received, unit, error)  # nothing of it to undo
                    continue
                self.running.append((received, unit, outcome))
                return Failed(self._suspects(), messages[index + 1:], error, own_failure)
            self.running.append((received, unit, outcome))
            if outcome is Outcome.HANDLED and (own.pending or own.pending_delayed):
                outgoing.take_from(own)
        try:
            await self._end(outgoing, final=final)
        except Exception as exc:
            if not (self.running and self.checkpoint and in_transaction(self._connection)):
                raise  # the transaction ended (or had nothing to roll back to)
            raise_if_counts_refused(exc)
            return Failed(self._suspects(), [], exc, own=False)
        self.kept.extend((unit, outcome) for _, unit, outcome in self.running)
        self.running = []
        return None

    def _suspects(self) -> list[Received]:
        return [received for received, _, _ in self.running]

    async def _end(self, outgoing: BufferedDispatcher, *, final: bool) -> None:
        """The run's sends and checks in one query; with COMMIT when ``final``."""
        connection = self._connection
        sends = ""
        if len(outgoing.pending) + len(outgoing.pending_delayed) > 1:
            # One INSERT per destination (arrays, binary): cheaper than a literal EXECUTE per
            # message, and a round trip shared by the run's messages. After the checkpoint
            # when the run's messages took one (they wrote), so that a send that fails can be
            # searched for; else no savepoint is taken for it (a round trip per batch): such a
            # send fails the batch, uncharged, and the slot's next rounds go one message at a
            # time (``transactions.batched``), which charges it. Sends rarely fail here: each
            # destination was checked to be a queue when the handler sent.
            await outgoing.flush(connection)
        else:
            sends = await outgoing.flush_before_commit(connection)
        if final:
            if self.retry:  # after the checkpoint: a rollback to it undoes them for the next end
                checkpoint = self._touch()
                if checkpoint is not None:
                    await checkpoint
                await receiving.reinsert(connection, self._pipeline.local_address, self.retry)
            units = [unit for unit, _ in self.kept] + [unit for _, unit, _ in self.running]
            count = await self._counts.statement(
                connection, processed=sum([unit.handled for unit in units]),
                failed=sum([unit.moved_to_error for unit in units]))
            tail = joined(count, COMMIT_CHECKED)
        else:
            tail = joined(CHECK_DEFERRED, MOVE_CHECKPOINT)
        first = "" if self.checkpoint else f"SAVEPOINT {CHECKPOINT}"
        self.checkpoint = True
        try:
            await connection.execute(joined(first, sends, tail))
        except asyncpg.UndefinedTableError as exc:
            raise queue_not_found(exc) from exc

    async def _roll_back(self, charged: BaseException | None) -> None:
        """Back to the checkpoint; the run's units hear it, uncharged but the last one when
        ``charged`` is its failure."""
        if self.checkpoint:  # else nothing was written since the receive
            await self._connection.execute(f"ROLLBACK TO SAVEPOINT {CHECKPOINT}")
        running, self.running = self.running, []
        for _received, unit, _ in running[:-1] if charged is not None else running:
            unit.rolled_back()
        if charged is not None:
            received, unit, _ = running[-1]
            self._charge(received, unit, charged)

    def _charge(self, received: Received, unit: Unit, error: BaseException) -> None:
        """The message's own run failed: its attempt counts, its row goes back."""
        if not isinstance(received, TransportMessage):
            raise error  # a poison row's move failed: not a message's attempt
        if error is unit.failure:
            unit.charge_failure()  # its handlers (or a step) raised
        else:
            unit.rolled_back(error)  # its work fails at the end: the commit's failure
        self.retry.append(received)
        self.charged += 1
