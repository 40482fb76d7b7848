"""The live mode's stream source on its own, against real PostgreSQL (no Spark): what each read
returns, the horizon it moves to, a transaction still open holding the horizon back until it
commits, and the replay of a micro-batch between two offsets."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import asyncpg

from endpoint_runtime.analytics.stream_source import (
    END,
    INGEST_XID,
    KIND,
    ROW_SCHEMA,
    OperationalRowsReader,
)
from endpoint_runtime.ingestion.storage import AUDIT_FIELDS
from tests.analytics.audit_set import error_row, insert
from tests.analytics.test_incremental import orders

START = datetime(2026, 4, 6, 10, tzinfo=UTC)
NAMES = [field.name for field in ROW_SCHEMA.fields]


async def read(reader: OperationalRowsReader,
               horizon: int) -> tuple[list[dict[str, Any]], int]:
    # The reader runs its own event loop (asyncio.run), as in Spark's Python process.
    rows, end = await asyncio.to_thread(reader.read, {"horizon": horizon})
    return [dict(zip(NAMES, row, strict=True)) for row in rows], end["horizon"]


async def test_reads_move_the_horizon_hold_at_an_open_transaction_and_replay(
        database_dsn: str) -> None:
    await insert(database_dsn, [])  # the tables, empty
    reader = OperationalRowsReader({"url": database_dsn, "schema": "public", "start": "0"})
    nothing, first = await read(reader, 0)
    assert nothing == []
    await insert(database_dsn, orders("a", START, 3),
                 [error_row(1, "Orders.PlaceOrder", "web", "sales", START, "E", "x")])
    rows, second = await read(reader, first)
    assert second > first
    assert sorted((row[KIND], row["message_id"]) for row in rows) == [
        ("audit", "a-0"), ("audit", "a-1"), ("audit", "a-2"), ("errors", "e-1")]
    assert all(first <= row[INGEST_XID] < second and row[END] == second for row in rows)
    replayed = await asyncio.to_thread(reader.readBetweenOffsets, {"horizon": first},
                                       {"horizon": second})
    assert [dict(zip(NAMES, row, strict=True)) for row in replayed] == rows

    # A transaction that began before a later commit and is still open holds the horizon:
    # neither its row nor the later one is read until it ends, then both are.
    late = await asyncpg.connect(database_dsn)
    try:
        transaction = late.transaction()
        await transaction.start()
        # Another database's transaction takes an id first, as the suite's other worker's do.
        other = await asyncpg.connect(database_dsn, database="postgres")
        try:
            await other.fetchval("SELECT pg_current_xact_id()")
        finally:
            await other.close()
        await late.copy_records_to_table("audit_log", records=orders("late", START, 1),
                                         columns=AUDIT_FIELDS)
        late_xid = int(await late.fetchval("SELECT pg_current_xact_id()::text"))
        await insert(database_dsn, orders("b", START, 1), setup=False)
        held, third = await read(reader, second)
        assert held == []
        # Held at the open transaction's id. Other databases of the server (the suite's
        # other worker) take ids too, so that id may be past ``second``: the horizon may move
        # up to it, never past it.
        assert second <= third <= late_xid
        await transaction.commit()
    finally:
        await late.close()
    rows, fourth = await read(reader, third)
    assert sorted(row["message_id"] for row in rows) == ["b-0", "late-0"]
    assert fourth > third
    assert (await read(reader, fourth))[0] == []
