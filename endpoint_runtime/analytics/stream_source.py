"""A PySpark streaming data source of ``audit_log`` and ``error_log`` in ingestion order.

Its offsets are transaction horizons (:func:`~endpoint_runtime.analytics.sources.horizon`):
each micro-batch holds the rows of both tables whose ``ingest_xid`` lies in ``[start, end)``,
where ``end`` is the oldest transaction of the database still running (or the next one). A
row of a transaction that commits late has an id at or above every horizon taken while it
ran, so a later micro-batch reads it: this horizon is the stream's watermark for late rows,
and no late commit is ever missed (an IDENTITY id or a timestamp would be: concurrent
ingests commit out of order). Rows of any event time are read; what they do to their minute
is the live mode's business (:mod:`~endpoint_runtime.analytics.live`).

The reader runs in Spark's Python workers and talks to PostgreSQL with asyncpg (one short
connection per call): a cluster's executors need Python and this package for the live mode,
unlike the batch report, whose executors run no Python.

Example::

    spark.dataSource.register(OperationalRows)
    rows = (spark.readStream.format(OperationalRows.name()).option("url", dsn)
            .option("schema", "public").option("start", str(horizon)).load())
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import asyncpg
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
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


class XidPartition(InputPartition):
    """The rows of transactions in ``[low, high)``."""

    def __init__(self, low: int, high: int) -> None:
        super().__init__((low, high))
        self.low = low
        self.high = high


async def _current_horizon(dsn: str) -> int:
    connection = await asyncpg.connect(dsn)
    try:
        snapshot = await connection.fetchval("SELECT pg_current_snapshot()::text")
        own = {int(row["xid"]) for row in await connection.fetch(OWN_TRANSACTIONS)}
    finally:
        await connection.close()
    return horizon(snapshot, own)


async def _rows(dsn: str, schema: str, low: int, high: int) -> list[tuple[Any, ...]]:
    connection = await asyncpg.connect(dsn)
    rows: list[tuple[Any, ...]] = []
    try:
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
    finally:
        await connection.close()
    return rows


class OperationalRowsReader(DataSourceStreamReader):
    """Offsets ``{"horizon": xid}``; one partition per micro-batch (the new rows of a few
    seconds)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.dsn = options["url"]
        self.schema = options.get("schema", "public")
        self.start = int(options["start"])

    def initialOffset(self) -> dict[str, int]:
        return {"horizon": self.start}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return {"horizon": max(start["horizon"], asyncio.run(_current_horizon(self.dsn)))}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        if end["horizon"] <= start["horizon"]:
            return []
        return [XidPartition(start["horizon"], end["horizon"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, XidPartition)
        yield from asyncio.run(_rows(self.dsn, self.schema, partition.low, partition.high))


class OperationalRows(DataSource):
    """``spark.readStream.format("endpoint_runtime_operational")``: options ``url`` (the
    DSN; Spark redacts options named like ``url`` in plans and logs), ``schema`` and
    ``start`` (the horizon to read from)."""

    @classmethod
    def name(cls) -> str:
        return "endpoint_runtime_operational"

    def schema(self) -> StructType:
        return ROW_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return OperationalRowsReader(dict(self.options))
