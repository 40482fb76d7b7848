"""Committed counts: what a receive slot processed, written in the transaction that commits it.

Each receive slot of a receiver owns one row of its endpoint's ``<endpoint>_CommittedCounts``
table (``transport/sql/committed_counts.sql``): (deployment, receiver, slot) with the Ray node,
``processed`` (messages whose handlers ran and whose work committed) and ``failed`` (messages
moved to the error queue). A strategy adds to the row with the statement
:meth:`SlotCounts.statement` returns, sent in the same simple query as the COMMIT of the work it
counts: the count commits exactly when that work does, and costs no round trip. Rows of one
deployment are summed by :func:`endpoint_runtime.runtime.actors.committed_counts.read_committed`.

A row per slot, not per receiver: a row is locked from its update until the COMMIT has been
flushed, and slots sharing a row would wait for each other's flushes. The row is made before
the slot's first count (:meth:`SlotCounts.ensure_row`, once per slot number and hour in a
receiver: see ``actors.committed_counts.ReceiverCounts``); the counts are plain UPDATEs of it.

Without a deployment (a strategy driven directly, as the integration tests do) a slot counts
nothing: :data:`NO_COUNTS`.

Example::

    counts = SlotCounts(counts_table(endpoint.address), deployment_id="d1",
                        receiver_id="sales-1a2b", slot=0, node_id="local")
    await counts.ensure_row(connection)
    statement = await counts.statement(connection, processed=1)
    await connection.execute(f"{statement}; COMMIT")
"""

from __future__ import annotations

import functools

import asyncpg

from endpoint_runtime.errors import CommittedCountsFailedError
from endpoint_runtime.transport import sql
from endpoint_runtime.transport.addresses import QueueAddress, quote_identifier
from endpoint_runtime.transport.connection import DatabaseConnection, prepared_name
from endpoint_runtime.transport.literals import inline_parameters, text_literal
from endpoint_runtime.transport.queues import ddl_lock

COUNT_PARAMETER_TYPES = "text, text, integer, bigint, bigint"
COUNTS_TABLE_SUFFIX = "_CommittedCounts"
def counts_table(endpoint: QueueAddress) -> QueueAddress:
    """The committed-counts table of the endpoint whose queue is ``endpoint``."""
    return QueueAddress(endpoint.derived_name(COUNTS_TABLE_SUFFIX), endpoint.schema)


@functools.lru_cache(maxsize=64)
def statements(table: QueueAddress) -> dict[str, str]:
    """Every statement of ``committed_counts.sql`` with the table's names filled in (and its
    comment lines left out: the count travels with every COMMIT)."""
    names = {"table": table.qualified, "schema": quote_identifier(table.schema)}
    return {name: "\n".join(line for line in text.format(**names).splitlines()
                            if not line.lstrip().startswith("--"))
            for name, text in sql.load("committed_counts.sql").items()}


async def create_counts_table(connection: DatabaseConnection, table: QueueAddress) -> None:
    """Create ``table`` if it does not exist (idempotent, safe to run concurrently)."""
    async with ddl_lock(connection):
        await connection.execute(statements(table)["create_schema"])
        await connection.execute(statements(table)["create_table"])


class SlotCounts:
    """The row of one receive slot and the statement that adds to it."""

    def __init__(self, table: QueueAddress, *, deployment_id: str, receiver_id: str,
                 slot: int, node_id: str) -> None:
        self.table = table
        self._count = statements(table)["count"]
        self._ensure_row = statements(table)["ensure_row"]
        self._key = [deployment_id, receiver_id, int(slot)]
        self._node_id = node_id
        self._literals = [text_literal(deployment_id), text_literal(receiver_id), str(int(slot))]

    async def ensure_row(self, connection: DatabaseConnection) -> None:
        """Make the row (counting nothing) unless it exists, and mark it alive: one
        statement, outside any transaction, before the slot's first count. A table that is
        missing or not granted raises :class:`CommittedCountsFailedError`, as a count does."""
        try:
            await connection.execute(self._ensure_row, *self._key, self._node_id)
        except Exception as exc:
            refusal = counts_refused(exc)
            if refusal is None:
                raise
            raise refusal from exc

    async def statement(self, connection: DatabaseConnection, *, processed: int = 0,
                        failed: int = 0) -> str:
        """The statement that adds ``processed`` and ``failed`` to the row (made by
        :meth:`ensure_row`), to send before the COMMIT; ``""`` when there is nothing to add.
        The first call on a connection prepares the statement in its session (one round trip,
        once per session)."""
        if not processed and not failed:
            return ""
        name = await prepared_name(connection, self._count, COUNT_PARAMETER_TYPES)
        literals = [*self._literals, str(int(processed)), str(int(failed))]
        if name is None:  # a connection that keeps no prepared statements (a pooler)
            return inline_parameters(self._count, literals).strip().rstrip(";")
        return f"EXECUTE {name}({', '.join(literals)})"


class NoCounts(SlotCounts):
    """A slot that counts nothing durably (no deployment)."""

    def __init__(self) -> None:
        pass

    async def ensure_row(self, connection: DatabaseConnection) -> None:
        return None

    async def statement(self, connection: DatabaseConnection, *, processed: int = 0,
                        failed: int = 0) -> str:
        return ""


NO_COUNTS = NoCounts()


class PendingCounts:
    """Counts not committed yet (none mode: messages handled outside any transaction), to go
    with the next statement the slot sends anyway. :meth:`sent` takes off what a committed
    statement carried; what a failed one carried stays."""

    def __init__(self) -> None:
        self.processed = 0
        self.failed = 0

    def add(self, *, processed: int = 0, failed: int = 0) -> None:
        self.processed += processed
        self.failed += failed

    def snapshot(self) -> tuple[int, int]:
        return self.processed, self.failed

    def sent(self, carried: tuple[int, int]) -> None:
        self.processed -= carried[0]
        self.failed -= carried[1]


def counts_refused(exc: BaseException) -> CommittedCountsFailedError | None:
    """The error to raise when ``exc`` (or what it was raised from) is the database's refusal
    of the committed-counts table (missing, or not granted), else None. It is a set-up fault,
    never charged to a message: charged, the message would head for the error queue, whose
    move carries a count too and fails the same way, and it would go round for ever."""
    cause: BaseException | None = exc
    while cause is not None:
        if (isinstance(cause, asyncpg.UndefinedTableError | asyncpg.InsufficientPrivilegeError)
                and COUNTS_TABLE_SUFFIX.lower() in str(cause).lower()):
            return CommittedCountsFailedError(
                f"the committed counts could not be written ({cause}): run `endpoint-runtime "
                f"db install` for this endpoint, or grant its role the table (db grants)")
        cause = cause.__cause__
    return None
