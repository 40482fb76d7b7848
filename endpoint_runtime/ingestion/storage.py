"""The tables of operational data: ``audit_log``, ``error_log`` and the error queue's scan
position (``ingestion_progress``), in the transport's schema."""

from __future__ import annotations

import functools

import structlog

from endpoint_runtime.ingestion.records import (
    AuditRecord,
    ErrorRecord,
    columns,
    error_record,
    group_of_row,
)
from endpoint_runtime.transport import sql
from endpoint_runtime.transport.addresses import QueueAddress, quote_identifier
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.queues import ddl_lock

log = structlog.get_logger("endpoint_runtime.ingestion.storage")

AUDIT_FIELDS = tuple(AuditRecord.__struct_fields__)
ERROR_FIELDS = tuple(ErrorRecord.__struct_fields__)
SCAN_BATCH = 1_000
CLEAN_BATCH = 10_000
"""Rows one retention DELETE removes; it runs again until a batch comes back short."""


class OperationalData:
    """Writes ``audit_log`` and ``error_log`` of one schema.

    Example::

        data = OperationalData("public")
        await data.setup(connection)
    """

    def __init__(self, schema: str = "public") -> None:
        self.schema = schema

    def table(self, name: str) -> QueueAddress:
        return QueueAddress(name, self.schema)

    @functools.cached_property
    def _names(self) -> dict[str, str]:
        names = {name: self.table(name).qualified
                 for name in ("audit_log", "error_log", "ingestion_progress", "report_extracts")}
        names["progress"] = names.pop("ingestion_progress")
        names["extracts"] = names.pop("report_extracts")
        for index in ("audit_ended_idx", "audit_ingested_idx", "error_row_idx",
                      "error_failed_idx", "error_ingested_idx", "audit_xid_idx",
                      "error_xid_idx", "error_group_idx"):
            names[index] = quote_identifier(index.replace("_idx", "") + "_idx")
        return names

    @functools.cached_property
    def sql(self) -> dict[str, str]:
        names = {**self._names, "error_queue": "{error_queue}"}
        return {name: text.format(**names) for name, text in sql.load("ingestion.sql").items()}

    async def setup(self, connection: DatabaseConnection) -> None:
        """Create the tables if they do not exist (idempotent, safe to run concurrently)."""
        async with ddl_lock(connection):
            await connection.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(self.schema)}")
            await connection.execute(self.sql["create_tables"])
            if not await connection.fetchval(self.sql["has_ingest_xid"], self._names["audit_log"],
                                             self._names["error_log"]):
                await connection.execute(self.sql["add_ingest_xid"])
            await connection.execute(self.sql["ingest_xid_indexes"])
            if not await connection.fetchval(self.sql["progress_has_candidate"],
                                             self._names["progress"]):
                await connection.execute(self.sql["add_candidate"])
            if not await connection.fetchval(self.sql["has_failure_group"],
                                             self._names["error_log"]):
                await connection.execute(self.sql["add_failure_group"])
                await self.backfill_groups(connection)
            await connection.execute(self.sql["failure_group_index"])

    async def backfill_groups(self, connection: DatabaseConnection) -> int:
        """Give every ``error_log`` row without a failure group its group (rows written
        before the column existed, or by an older version since); returns how many."""
        done, after = 0, 0
        while rows := await connection.fetch(self.sql["ungrouped"], after, SCAN_BATCH):
            groups = [group_of_row(row["exception_type"], row["exception_message"],
                                   row["reason"], row["headers"]) for row in rows]
            await connection.execute(self.sql["backfill_groups"], [row["id"] for row in rows],
                                     [group.key for group in groups],
                                     [group.title for group in groups])
            done += len(rows)
            after = rows[-1]["id"]
        if done:
            log.info("failure_groups_backfilled", table=self._names["error_log"], rows=done)
        return done

    async def insert_audit(
        self, connection: DatabaseConnection, records: list[AuditRecord]
    ) -> None:
        if records:
            await connection.execute(self.sql["insert_audit"], *columns(records, AUDIT_FIELDS))

    async def insert_errors(
        self, connection: DatabaseConnection, records: list[ErrorRecord]
    ) -> None:
        if records:
            await connection.execute(self.sql["insert_errors"], *columns(records, ERROR_FIELDS))

    async def record_error_queue(
        self, connection: DatabaseConnection, error_queue: QueueAddress
    ) -> int | None:
        """Record the error queue's rows not recorded yet, leaving them where they are (so
        ``errors retry`` still finds them); returns how many were recorded, or ``None`` when
        another process is at it. One transaction.

        A row can commit long after rows with higher seqs (a batched transaction that moved
        a message to the error queue early in a long batch), so the scan starts at a floor
        below which every row has been seen, with no fixed margin: the floor moves up to a
        candidate seq once every transaction that was writing to the queue when the
        candidate was taken has ended (see ``take_candidate`` in ``ingestion.sql``). Above
        the floor, rows already recorded are skipped.
        """
        source = str(error_queue)
        sql = self.sql
        await connection.execute(sql["add_progress"], source)
        async with connection.transaction():
            progress = await connection.fetchrow(sql["lock_progress"], source)
            if progress is None:
                return None
            floor, candidate = progress["last_seq"], progress["candidate_seq"]
            holders = progress["candidate_holders"]
            settled = candidate is not None and not await connection.fetchval(
                sql["holders_alive"], holders or [])
            scan = sql["scan_error_queue"].replace("{error_queue}", error_queue.qualified)
            rows = await connection.fetch(scan, floor, SCAN_BATCH, source)
            records = [error_record(source, row["id"], row["seq"], row["headers"],
                                    row["body_size"] or 0) for row in rows]
            await self.insert_errors(connection, records)
            if settled:
                # A full batch may have stopped short of the candidate: up to its last row.
                floor = min(candidate, rows[-1]["seq"]) if len(rows) == SCAN_BATCH else candidate
                candidate = holders = None
            if candidate is None:
                taken = await connection.fetchrow(
                    sql["take_candidate"].replace("{error_queue}", error_queue.qualified),
                    error_queue.qualified)
                assert taken is not None  # a SELECT without FROM returns one row
                if taken["seq"] is not None and taken["seq"] > floor:
                    candidate, holders = taken["seq"], taken["holders"]
            await connection.execute(sql["set_progress"], source, floor, candidate, holders)
            return len(rows)

    async def clean_up(
        self, connection: DatabaseConnection, keep_seconds: float, batch: int = CLEAN_BATCH,
    ) -> int:
        """Delete every row ingested more than ``keep_seconds`` ago, ``batch`` rows per
        statement (each its own transaction: no long lock, no huge WAL record), until none is
        left; returns how many were deleted."""
        deleted = 0
        for statement in ("clean_audit_log", "clean_error_log"):
            while True:
                status = await connection.execute(self.sql[statement], keep_seconds, batch)
                count = int(status.split()[-1])  # "DELETE n"
                deleted += count
                if count < batch:
                    break
        return deleted
