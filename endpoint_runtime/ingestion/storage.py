"""The tables of operational data: ``audit_log``, ``error_log`` and the error queue's scan
position (``ingestion_progress``), in the transport's schema."""

from __future__ import annotations

import functools

from endpoint_runtime.ingestion.records import AuditRecord, ErrorRecord, columns, error_record
from endpoint_runtime.transport import sql
from endpoint_runtime.transport.addresses import QueueAddress, quote_identifier
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.queues import ddl_lock

AUDIT_FIELDS = tuple(AuditRecord.__struct_fields__)
ERROR_FIELDS = tuple(ErrorRecord.__struct_fields__)
SCAN_MARGIN = 1_000
"""Seqs below the last one seen that a scan looks at again (inserts that committed late)."""
SCAN_BATCH = 1_000


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
                 for name in ("audit_log", "error_log", "ingestion_progress")}
        names["progress"] = names.pop("ingestion_progress")
        for index in ("audit_ended_idx", "audit_ingested_idx", "error_row_idx",
                      "error_failed_idx", "error_ingested_idx"):
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
        ``errors retry`` still finds them); returns how many were read, or ``None`` when
        another process is at it. One transaction."""
        source = str(error_queue)
        await connection.execute(self.sql["add_progress"], source)
        async with connection.transaction():
            last_seq = await connection.fetchval(self.sql["lock_progress"], source)
            if last_seq is None:
                return None
            scan = self.sql["scan_error_queue"].replace("{error_queue}", error_queue.qualified)
            rows = await connection.fetch(scan, max(0, last_seq - SCAN_MARGIN), SCAN_BATCH,
                                          source)
            records = [error_record(source, row["id"], row["seq"], row["headers"],
                                    row["body_size"] or 0) for row in rows]
            await self.insert_errors(connection, records)
            if rows:
                await connection.execute(self.sql["set_progress"], source, rows[-1]["seq"])
            return len(rows)

    async def clean_up(self, connection: DatabaseConnection, keep_seconds: float) -> None:
        """Delete rows ingested more than ``keep_seconds`` ago (up to 10,000 per table)."""
        await connection.execute(self.sql["clean_audit_log"], keep_seconds)
        await connection.execute(self.sql["clean_error_log"], keep_seconds)
