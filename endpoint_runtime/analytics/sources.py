"""The input: ``audit_log`` and ``error_log`` read over JDBC in parallel partitions.

Each table is read as ``id`` ranges (its primary key, so each partition is an index range
scan), limited either to the rows new since the extract's horizon (:meth:`Reader.read_new`:
``ingest_xid`` between two horizons, indexed) or to an ad-hoc time window
(:meth:`Reader.read`: ``processing_ended`` for audit copies, ``time_of_failure`` for failed
messages, both indexed). Only the columns the report uses are read, never ``headers``. A
table that does not exist yet reads as empty.

The horizon (:meth:`Reader.survey`) is the oldest transaction of this database still running
(from ``pg_current_snapshot()`` and the transaction-id locks of this database's sessions), or
the next transaction id: every transaction of this database with a lower id has ended, so a
later read sees every row it committed. A row of a transaction still running (however early
its id, or its ``processing_ended``) is at or above the horizon and is read by a later run:
late commits are never missed. Transactions of other databases on the same server do not
hold it back (``pg_snapshot_xmin`` alone would count them).
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg
from pyspark import StorageLevel
from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from endpoint_runtime.analytics.jdbc import JdbcTarget
from endpoint_runtime.transport.addresses import QueueAddress

ROWS_PER_PARTITION = 250_000
MIN_ROWS_TO_SPLIT = 50_000
MAX_PARTITIONS = 256
FETCH_SIZE = "10000"

AUDIT_SCHEMA = StructType([
    StructField("id", LongType()),
    StructField("message_id", StringType()),
    StructField("message_type", StringType()),
    StructField("sending_endpoint", StringType()),
    StructField("processing_endpoint", StringType()),
    StructField("conversation_id", StringType()),
    StructField("related_to", StringType()),
    StructField("time_sent", TimestampType()),
    StructField("processing_started", TimestampType()),
    StructField("processing_ended", TimestampType()),
    StructField("processing_time_ms", DoubleType()),
    StructField("critical_time_ms", DoubleType()),
    StructField("retries", IntegerType()),
])
ERROR_SCHEMA = StructType([
    StructField("id", LongType()),
    StructField("message_id", StringType()),
    StructField("message_type", StringType()),
    StructField("sending_endpoint", StringType()),
    StructField("processing_endpoint", StringType()),
    StructField("failed_queue", StringType()),
    StructField("conversation_id", StringType()),
    StructField("time_sent", TimestampType()),
    StructField("time_of_failure", TimestampType()),
    StructField("retries", IntegerType()),
    StructField("exception_type", StringType()),
    StructField("exception_message", StringType()),
    # Written by ingestion (endpoint_runtime.wire.failure_groups); NULL in extracts made
    # before they existed (failures.py falls back to the message's first line).
    StructField("failure_group", StringType()),
    StructField("failure_title", StringType()),
])


@dataclass(frozen=True)
class Table:
    name: str
    time_column: str
    schema: StructType
    nullable_times: tuple[str, ...]
    """Timestamp columns whose NULLs are counted (a row without ``time_column`` is
    skipped)."""


AUDIT_LOG = Table("audit_log", "processing_ended", AUDIT_SCHEMA,
                  ("time_sent", "processing_started", "processing_ended"))
ERROR_LOG = Table("error_log", "time_of_failure", ERROR_SCHEMA, ("time_sent", "time_of_failure"))


@dataclass(frozen=True)
class Source:
    """One table as read: the (cached) rows, how many, in how many partitions, and how
    many have a NULL in each of the table's nullable timestamp columns."""

    frame: DataFrame
    rows: int
    partitions: int
    null_counts: dict[str, int] = field(default_factory=dict)


OWN_TRANSACTIONS = """SELECT l.transactionid::text AS xid FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
  AND a.datname = current_database()
UNION SELECT transaction::text FROM pg_prepared_xacts WHERE database = current_database()"""
"""The (32-bit) ids of this database's transactions running now, prepared ones included:
each running transaction holds an exclusive lock on its own id."""
XID_WRAP = 2 ** 32


def horizon(snapshot: str, own: set[int]) -> int:
    """The lowest of ``snapshot``'s running transactions (``xmin:xmax:xip,...``, 64-bit ids)
    that is one of ``own`` (32-bit ids listed after the snapshot was taken), else its
    ``xmax``. A transaction of another database never holds the horizon back; one of this
    database that was running at the snapshot is still running when ``own`` is listed, or
    has ended (its rows are then visible to any later read)."""
    _, xmax, xip = snapshot.split(":")
    running = [int(x) for x in xip.split(",") if x and int(x) % XID_WRAP in own]
    return min(running, default=int(xmax))


@dataclass(frozen=True)
class XidRange:
    """Rows whose ``ingest_xid`` is in ``[low, high)``; ``low=None``: from the first row
    (rows written before the column existed have NULL: older than any horizon)."""

    low: int | None
    high: int

    def condition(self) -> str:
        below = f"ingest_xid < '{int(self.high)}'::xid8"
        if self.low is None:
            return f"(ingest_xid IS NULL OR {below})"
        return f"ingest_xid >= '{int(self.low)}'::xid8 AND {below}"


class Reader:
    """Reads the tables of one schema through one JDBC target.

    Example::

        reader = Reader(spark, jdbc_target(dsn), "public", since, until)
        audit = reader.read(AUDIT_LOG)
    """

    def __init__(self, spark: SparkSession, target: JdbcTarget, dsn: str, schema: str,
                 since: datetime | None, until: datetime | None,
                 partitions: int | None = None) -> None:
        self.spark = spark
        self.target = target
        self.dsn = dsn
        self.schema = schema
        self.since = since
        self.until = until
        self.partitions = partitions

    def _jdbc(self) -> DataFrameReader:
        # The driver class named: without it, a jar added by spark.jars is not found.
        return (self.spark.read.format("jdbc").option("url", self.target.url)
                .option("driver", "org.postgresql.Driver").options(**self.target.properties))

    def query(self, *statements: str) -> list[list[asyncpg.Record]]:
        """Small queries (bounds, existence, the horizon), in order on one connection, from
        the driver: no Spark job each (a JDBC read would be one)."""

        async def fetch() -> list[list[asyncpg.Record]]:
            connection = await asyncpg.connect(self.dsn)
            try:
                return [await connection.fetch(sql) for sql in statements]
            finally:
                await connection.close()

        # A thread of its own: the command line calls the report on its event loop's thread.
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, fetch()).result()

    def qualified(self, table: Table) -> str:
        return QueueAddress(table.name, self.schema).qualified

    def survey(self, *tables: Table) -> tuple[set[str], set[str], int]:
        """The tables that exist, those with ``ingest_xid``, and the horizon: the oldest
        transaction of this database still running, or the next one (see the module's
        text). Two queries: the snapshot first, then who holds its running ids."""
        checks = []
        for i, table in enumerate(tables):
            name = _literal(self.qualified(table))
            checks.append(f"to_regclass({name}) IS NOT NULL AS c{i}")
            checks.append(f"EXISTS (SELECT FROM pg_attribute WHERE attrelid = "
                          f"to_regclass({name}) AND attname = 'ingest_xid' "
                          f"AND NOT attisdropped) AS x{i}")
        (row,), owners = self.query(f"SELECT {', '.join(checks)}, "
                                    f"pg_current_snapshot()::text AS snapshot", OWN_TRANSACTIONS)
        present = {t.name for i, t in enumerate(tables) if row[f"c{i}"]}
        with_xid = {t.name for i, t in enumerate(tables) if row[f"x{i}"]}
        own = {int(r["xid"]) for r in owners}
        return present, with_xid, horizon(row["snapshot"], own)

    def read_new(self, table: Table, xids: XidRange, exists: bool = True) -> Source:
        """The table's rows of transactions in ``xids`` (not cached: written once)."""
        return self._load(table, xids.condition(), exists, cache=False)

    def where(self, table: Table) -> str:
        conditions = []
        if self.since is not None:
            conditions.append(f"{table.time_column} >= {_timestamp(self.since)}")
        if self.until is not None:
            conditions.append(f"{table.time_column} < {_timestamp(self.until)}")
        return " AND ".join(conditions) or "true"

    def existing(self, *tables: Table) -> set[str]:
        checks = ", ".join(f"to_regclass({_literal(self.qualified(t))}) IS NOT NULL AS c{i}"
                           for i, t in enumerate(tables))
        row = self.query(f"SELECT {checks}")[0][0]
        return {t.name for t, present in zip(tables, row.values(), strict=True) if present}

    def read(self, table: Table, exists: bool = True) -> Source:
        """The table's rows in the window, cached, in parallel id-range partitions."""
        return self._load(table, self.where(table), exists, cache=True)

    def _load(self, table: Table, where: str, exists: bool, cache: bool) -> Source:
        if not exists:
            return Source(self.spark.createDataFrame([], table.schema), 0, 0)
        nulls = ", ".join(f"count(*) FILTER (WHERE {column} IS NULL) AS {column}"
                          for column in table.nullable_times)
        bounds = self.query(f"SELECT min(id) AS low, max(id) AS high, count(*) AS rows, "
                            f"{nulls} FROM {self.qualified(table)} WHERE {where}")[0][0]
        low, high, count = bounds["low"], bounds["high"], int(bounds["rows"] or 0)
        null_counts = {f"{table.name}.{column}": int(bounds[column])
                       for column in table.nullable_times if bounds[column]}
        if count == 0 or low is None or high is None:
            return Source(self.spark.createDataFrame([], table.schema), 0, 0)
        partitions = self.partitions or self._partitions(count)
        columns = ", ".join(field.name for field in table.schema.fields)
        subquery = f"(SELECT {columns} FROM {self.qualified(table)} WHERE {where}) AS rows"
        reader = (self._jdbc().option("dbtable", subquery).option("fetchsize", FETCH_SIZE)
                  .option("partitionColumn", "id").option("lowerBound", str(low))
                  .option("upperBound", str(int(high) + 1))
                  .option("numPartitions", str(partitions)))
        frame = reader.load().select(
            *(F.col(field.name).cast(field.dataType) for field in table.schema.fields))
        if cache:
            frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
            frame.count()  # read once, here: later stages use the cache
        return Source(frame, count, partitions, null_counts)

    def _partitions(self, rows: int) -> int:
        if rows < MIN_ROWS_TO_SPLIT:
            return 1
        cores = self.spark.sparkContext.defaultParallelism
        return max(1, min(MAX_PARTITIONS, max(cores, math.ceil(rows / ROWS_PER_PARTITION))))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _timestamp(moment: datetime) -> str:
    return f"{_literal(moment.isoformat())}::timestamptz"
