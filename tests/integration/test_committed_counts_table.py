"""A committed-counts table that cannot be written is a set-up fault wherever it shows: in a
count sent with a COMMIT and in the row a slot makes before its first count.

Before, the row's statement raised the database's bare ``UndefinedTableError``: a receiver that
opened a slot after the table was dropped backed off with it, and the circuit breaker's
critical error named a missing relation instead of the fix (``db install``), depending on which
slot failed last (tests/e2e/test_durable_counts.py saw both)."""

from __future__ import annotations

import asyncpg
import pytest

from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import CommittedCountsFailedError
from endpoint_runtime.transactions.counting import SlotCounts, counts_table, create_counts_table
from endpoint_runtime.transport.addresses import QueueAddress


def slot_counts(table: QueueAddress) -> SlotCounts:
    return SlotCounts(table, deployment_id="d1", receiver_id="sales-1", slot=0, node_id="n1")


async def test_a_slot_row_on_a_missing_table_raises_the_set_up_fault_naming_the_fix(
        transport: PostgresTransport) -> None:
    table = counts_table(QueueAddress("sales", "public"))
    async with transport.pool.acquire() as connection:
        with pytest.raises(CommittedCountsFailedError, match="db install") as caught:
            await slot_counts(table).ensure_row(connection)
    assert isinstance(caught.value.__cause__, asyncpg.UndefinedTableError)


async def test_a_slot_row_on_an_existing_table_is_made_once(
        transport: PostgresTransport) -> None:
    table = counts_table(QueueAddress("sales", "public"))
    async with transport.pool.acquire() as connection:
        await create_counts_table(connection, table)
        counts = slot_counts(table)
        await counts.ensure_row(connection)
        await counts.ensure_row(connection)
        rows = await connection.fetch(
            f"SELECT processed, failed FROM {table.qualified} WHERE slot = 0")
    assert [tuple(row) for row in rows] == [(0, 0)]


async def test_another_failure_of_the_row_stays_what_it_is(
        transport: PostgresTransport) -> None:
    """Only the counts table's refusal is translated: a closed connection is not a set-up
    fault of the table."""
    table = counts_table(QueueAddress("sales", "public"))
    connection = await transport.pool.acquire()
    await connection.close()
    try:
        with pytest.raises(asyncpg.InterfaceError):
            await slot_counts(table).ensure_row(connection)
    finally:
        await transport.pool.release(connection)
