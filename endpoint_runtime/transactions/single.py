"""One message per receive transaction: the shape shared by receive-only and atomic modes.

BEGIN (unless the last COMMIT began it); DELETE the lowest unlocked seq; one call into the chain
(``pipeline.run``: recoverability's moves, or the handlers on the receive connection); the
outgoing messages (atomic mode) and the slot's committed count go with the COMMIT; BEGIN. Any
failure rolls everything back, so the row is visible again for the next attempt (see
``receive_transaction``).
"""

from __future__ import annotations

import asyncpg

from endpoint_runtime.chain.pipeline import IncomingContext, Outcome, Pipeline, Unit
from endpoint_runtime.transactions.base import (
    EMPTY,
    BufferedDispatcher,
    ImmediateDispatcher,
    ReceiveSlot,
    Round,
)
from endpoint_runtime.transactions.receive_transaction import (
    FAILED_ROUND,
    begin_unless_carried,
    charge_or_raise,
    commit_and_begin,
    count_statement,
    end_carried_transaction,
    joined,
    rollback_quietly,
    rolled_back,
    settled,
)
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.savepoints import OpenTransactionConnection


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
        """(BEGIN unless carried over;) receive one message and run the chain; COMMIT with
        the outgoing messages and BEGIN the next, or roll back a failed attempt."""
        strategy, connection = self._strategy, self.connection
        await begin_unless_carried(connection)
        received = unit = None
        try:
            received = await receiving.receive(connection, strategy.pipeline.local_address)
            if received is None:
                await connection.execute("COMMIT")  # expired rows deleted on the way
                return EMPTY
            dispatcher = strategy.round_dispatcher()
            unit = Unit(connection, dispatcher, OpenTransactionConnection(connection))
            context = IncomingContext(received, unit)
            await strategy.pipeline.enter(context)
            outcome = context.outcome
            if outcome is Outcome.FAILED:
                return await rolled_back(connection, unit)
            before_commit = ""
            if outcome is Outcome.HANDLED and isinstance(dispatcher, BufferedDispatcher):
                before_commit = await dispatcher.flush_before_commit(connection)
            count = await count_statement(self.counts, connection, unit)
            await commit_and_begin(connection, joined(before_commit, count),
                                   handled=outcome is Outcome.HANDLED)
        except BaseException as exc:
            await rollback_quietly(connection)
            charge_or_raise(unit, received, exc, connection)
            return FAILED_ROUND
        return settled(unit, outcome)
