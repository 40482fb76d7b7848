"""On real PostgreSQL, no Spark: ingestion's retention deletes only the rows every report
extract already holds (below the lowest registered horizon), and tables made before
``ingest_xid`` existed get the column from ingestion's setup."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from endpoint_runtime.ingestion.storage import OperationalData
from tests.analytics.audit_set import insert
from tests.analytics.test_incremental import orders

START = datetime(2026, 3, 2, 10, tzinfo=UTC)


async def test_retention_keeps_rows_an_extract_does_not_hold(database_dsn: str) -> None:
    await insert(database_dsn, orders("held", START, 3))
    connection = await asyncpg.connect(database_dsn)
    try:
        await insert(database_dsn, orders("new", START, 2))
        horizon = await connection.fetchval(  # every "held" row is below it
            "SELECT min(ingest_xid)::text FROM audit_log WHERE message_id LIKE 'new-%'")
        await connection.execute("INSERT INTO report_extracts (extract, horizon) "
                                 "VALUES ('host:/report', $1::text::xid8)", horizon)
        data = OperationalData("public")
        assert await data.clean_up(connection, keep_seconds=0) == 3
        left = await connection.fetch("SELECT message_id FROM audit_log ORDER BY message_id")
        assert [row["message_id"] for row in left] == ["new-0", "new-1"]
        await connection.execute("DELETE FROM report_extracts")
        assert await data.clean_up(connection, keep_seconds=0) == 2
    finally:
        await connection.close()


async def test_setup_adds_ingest_xid_to_older_tables(database_dsn: str) -> None:
    connection = await asyncpg.connect(database_dsn)
    try:
        data = OperationalData("public")
        await data.setup(connection)
        await connection.execute("ALTER TABLE audit_log DROP COLUMN ingest_xid")
        await connection.execute("ALTER TABLE error_log DROP COLUMN ingest_xid")
        await data.setup(connection)
        await insert(database_dsn, orders("a", START, 1))
        xid = await connection.fetchval("SELECT ingest_xid::text FROM audit_log")
        assert xid is not None
        assert int(xid) > 0
    finally:
        await connection.close()
