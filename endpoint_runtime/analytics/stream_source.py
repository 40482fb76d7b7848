"""A PySpark streaming data source of ``audit_log`` and ``error_log`` in ingestion order.

Its offsets are transaction horizons (:func:`~endpoint_runtime.analytics.sources.horizon`):
each micro-batch holds the rows of both tables whose ``ingest_xid`` lies in ``[start, end)``,
where ``end`` is the oldest transaction of the database still running (or the next one). A
row of a transaction that commits late has an id at or above every horizon taken while it
ran, so a later micro-batch reads it: this horizon is the stream's watermark for late rows,
and no late commit is ever missed (an IDENTITY id or a timestamp would be: concurrent
ingests commit out of order). Rows of any event time are read; what they do to their minute
is the live mode's business (:mod:`~endpoint_runtime.analytics.live`).

The reader is a simple stream reader: it runs on the driver, in the streaming query's own
long-lived Python process, and talks to PostgreSQL with asyncpg (one short connection per
micro-batch); the executors run no Python for it, as for the batch report.

Example::

    spark.dataSource.register(OperationalRows)
    rows = (spark.readStream.format(OperationalRows.name()).option("url", dsn)
            .option("schema", "public").option("start", str(horizon)).load())
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import asyncpg
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.types import LongType, StringType, StructField, StructType

from endpoint_runtime.analytics.sources import (
    AUDIT_LOG,
    ERROR_LOG,
    OWN_TRANSACTIONS,
    Table,
    horizon,
)
from endpoint_runtime.transport.addresses import QueueAddress

KIND = "kind"
"""``audit`` for a row of ``audit_log``, ``errors`` for one of ``error_log``."""
INGEST_XID = "ingest_xid"
END = "batch_end"
"""The micro-batch's end horizon, on each of its rows: the horizon the extract reaches."""
TABLES: tuple[tuple[str, Table], ...] = (("audit", AUDIT_LOG), ("errors", ERROR_LOG))


def _row_fields() -> list[StructField]:
    fields: dict[str, StructField] = {}
    for _, table in TABLES:
        for field in table.schema.fields:
            fields.setdefault(field.name, field)
    return list(fields.values())


ROW_SCHEMA = StructType([StructField(KIND, StringType()), StructField(INGEST_XID, LongType()),
                         StructField(END, LongType()), *_row_fields()])
"""Both tables' columns in one row type (a column the row's table lacks is NULL)."""


async def _current_horizon(connection: asyncpg.Connection) -> int:
    snapshot = await connection.fetchval("SELECT pg_current_snapshot()::text")
    own = {int(row["xid"]) for row in await connection.fetch(OWN_TRANSACTIONS)}
    return horizon(snapshot, own)


async def _rows(connection: asyncpg.Connection, schema: str, low: int,
                high: int) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for kind, table in TABLES:
        qualified = QueueAddress(table.name, schema).qualified
        if not await connection.fetchval("SELECT to_regclass($1) IS NOT NULL", qualified):
            continue
        names = [field.name for field in table.schema.fields]
        records = await connection.fetch(
            f"SELECT ingest_xid::text::bigint AS ingest_xid, {', '.join(names)} "
            f"FROM {qualified} WHERE ingest_xid >= $1::text::xid8 "
            f"AND ingest_xid < $2::text::xid8 ORDER BY id", str(low), str(high))
        for record in records:
            values = dict(zip(names, (record[name] for name in names), strict=True))
            rows.append((kind, record["ingest_xid"], high,
                         *(values.get(field.name) for field in ROW_SCHEMA.fields[3:])))
    return rows


async def _read(dsn: str, schema: str, low: int,
                high: int | None) -> tuple[list[tuple[Any, ...]], int]:
    """The rows of transactions in ``[low, high)`` and ``high`` (``None``: the current
    horizon), on one short connection."""
    connection = await asyncpg.connect(dsn)
    try:
        if high is None:
            high = max(low, await _current_horizon(connection))
        return (await _rows(connection, schema, low, high) if high > low else []), high
    finally:
        await connection.close()


class OperationalRowsReader(SimpleDataSourceStreamReader):
    """Offsets ``{"horizon": xid}``. A micro-batch holds the new rows of a few seconds: they
    are read on the driver, in the query's own long-lived Python process (a simple stream
    reader), so that the executors need no Python and no Python worker has to start for the
    stream's first rows (about 2 s of its first 10,000-row micro-batch)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.dsn = options["url"]
        self.schema = options.get("schema", "public")
        self.start = int(options["start"])

    def initialOffset(self) -> dict[str, int]:
        return {"horizon": self.start}

    def read(self, start: dict[str, int]) -> tuple[Iterator[tuple[Any, ...]], dict[str, int]]:
        rows, high = asyncio.run(_read(self.dsn, self.schema, start["horizon"], None))
        return iter(rows), {"horizon": high}

    def readBetweenOffsets(self, start: dict[str, int],
                           end: dict[str, int]) -> Iterator[tuple[Any, ...]]:
        """The same micro-batch again (a restarted query replays its last one)."""
        rows, _ = asyncio.run(_read(self.dsn, self.schema, start["horizon"], end["horizon"]))
        return iter(rows)


class OperationalRows(DataSource):
    """``spark.readStream.format("endpoint_runtime_operational")``: options ``url`` (the
    DSN; Spark redacts options named like ``url`` in plans and logs), ``schema`` and
    ``start`` (the horizon to read from)."""

    @classmethod
    def name(cls) -> str:
        return "endpoint_runtime_operational"

    def schema(self) -> StructType:
        return ROW_SCHEMA

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return OperationalRowsReader(dict(self.options))
