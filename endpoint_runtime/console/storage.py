"""The console's reads and writes: failed-message groups, the archive, the operator log,
endpoints and conversations, in the transport's schema.

Failed messages are read from ``error_log`` (ingestion's typed rows, recorded here too before
a page is read, by the same code the ingestion endpoint runs), joined to the error queue's
rows still there: a retried or archived message leaves its group. By default a group is a
failure group (:mod:`endpoint_runtime.wire.failure_groups`: the exception type, its message
with ids masked and the innermost stack frames), whose key ingestion wrote into the row
(``failure_group``, indexed); a row written by an older version, without it, groups by an md5
of its exception type and raw message, as before (a partial expression index covers them).
"""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from endpoint_runtime.chain.recoverability.error_queue import retry_failed
from endpoint_runtime.chain.sagas.storage import StoredSagaTable
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.console.endpoints import (
    QueueRow,
    SubscriptionRow,
    queue_rows,
    saga_tables,
    subscription_rows,
)
from endpoint_runtime.errors import EndpointRuntimeError, QueueNotFoundError
from endpoint_runtime.ingestion.storage import OperationalData
from endpoint_runtime.transport import QueueAddress, sending, statements
from endpoint_runtime.transport.heartbeat_tables import read_heartbeats
from endpoint_runtime.transport.queues import ddl_lock

UNGROUPED_KEY = ("md5(coalesce(e.exception_type, '') || chr(10) || "
                 "coalesce(e.exception_message, ''))")
"""The key of a row without ``failure_group`` (written before it existed)."""
GROUP_KEY = f"coalesce(e.failure_group, {UNGROUPED_KEY})"
GROUPINGS = {
    "exception": GROUP_KEY,
    "queue": "md5(coalesce(e.failed_queue, ''))",
    "type": "md5(coalesce(e.message_type, ''))",
}
"""The ways failed messages are grouped (``?by=``): their key expressions over ``error_log e``."""
GROUP_FILTERS = {
    **{by: f"{key} = $2" for by, key in GROUPINGS.items()},
    # Either half can use an index: failure_group's, or the partial one of rows without it.
    "exception": f"(e.failure_group = $2 OR (e.failure_group IS NULL AND {UNGROUPED_KEY} = $2))",
}
GROUP_LABELS = {
    "exception": ("e.exception_type", "coalesce(e.failure_title, e.exception_message)"),
    "queue": ("e.failed_queue", "NULL::text"),
    "type": ("e.message_type", "NULL::text"),
}
ROWS_SHOWN = 200
LAST_CHARACTER = "\U0010ffff"
"""Above every string that starts with a prefix, in byte order: the prefix search's bound."""


class ConsoleData:
    """Every query of the console, over one transport and its error queue."""

    def __init__(self, transport: PostgresTransport, error_queue: str = "error") -> None:
        self.transport = transport
        self.error_queue = transport.address(error_queue)
        self.data = OperationalData(self.error_queue.schema)
        self.error_log = self.data.table("error_log").qualified
        self.audit_log = self.data.table("audit_log").qualified
        self.archive = self.data.table("console_archive").qualified
        self.actions = self.data.table("console_actions").qualified

    async def setup(self) -> None:
        """Ingestion's tables, the archive, the operator log and the group index."""
        async with self.transport.pool.acquire() as connection:
            await self.data.setup(connection)
            async with ddl_lock(connection):
                await connection.execute(f"""
                    CREATE TABLE IF NOT EXISTS {self.archive} (
                        id uuid PRIMARY KEY, headers text NOT NULL, body bytea,
                        error_queue text NOT NULL,
                        archived_at timestamptz NOT NULL DEFAULT clock_timestamp());
                    CREATE TABLE IF NOT EXISTS {self.actions} (
                        at timestamptz NOT NULL DEFAULT clock_timestamp(),
                        action text NOT NULL, native_ids uuid[] NOT NULL,
                        outcome text NOT NULL, client text NOT NULL);
                    CREATE INDEX IF NOT EXISTS console_audit_conversation_idx
                        ON {self.audit_log} (conversation_id);
                    CREATE INDEX IF NOT EXISTS console_audit_message_idx
                        ON {self.audit_log} (message_id);
                    CREATE INDEX IF NOT EXISTS console_error_conversation_idx
                        ON {self.error_log} (conversation_id);
                    CREATE INDEX IF NOT EXISTS console_audit_type_idx
                        ON {self.audit_log} ((message_type COLLATE "C"));
                    DROP INDEX IF EXISTS {self.data.table("console_error_group_idx").qualified};
                    CREATE INDEX IF NOT EXISTS console_error_ungrouped_idx
                        ON {self.error_log} (({UNGROUPED_KEY.replace('e.', '')}))
                        WHERE failure_group IS NULL;""")

    async def record(self) -> None:
        """Record the error queue's new rows into ``error_log`` (as ingestion does)."""
        async with self.transport.pool.acquire() as connection:
            try:
                while await self.data.record_error_queue(connection, self.error_queue):
                    pass
            except asyncpg.UndefinedTableError as exc:
                raise QueueNotFoundError(str(self.error_queue)) from exc

    def _current(self) -> str:
        """error_log rows whose queue row is still in the error queue."""
        return (f"FROM {self.error_log} e JOIN {self.error_queue.qualified} q "
                "ON q.id = e.native_id AND q.seq = e.queue_seq WHERE e.source = $1")

    async def groups(self, by: str = "exception") -> list[asyncpg.Record]:
        """One row per group (see :data:`GROUPINGS`): ``label`` and ``detail`` name it.
        Counted first per (group, queue, type) with a hash aggregate, then folded: the arrays
        are built per group, not per message."""
        label, detail = GROUP_LABELS[by]
        await self.record()
        return await self.transport.pool.fetch(
            f"WITH fine AS (SELECT {GROUPINGS[by]} AS key, {label} AS label, "
            f"{detail} AS detail, e.failed_queue, e.message_type, count(*) AS n, "
            "min(e.time_of_failure) AS first, max(e.time_of_failure) AS last "
            f"{self._current()} GROUP BY 1, 2, 3, 4, 5) "
            "SELECT key, label, detail, sum(n)::bigint AS count, min(first) AS first, "
            "max(last) AS last, array_agg(DISTINCT failed_queue) AS queues, "
            "array_agg(DISTINCT message_type) AS types FROM fine "
            "GROUP BY 1, 2, 3 ORDER BY 4 DESC, 6 DESC", str(self.error_queue))

    async def group_messages(self, key: str, by: str = "exception") -> list[asyncpg.Record]:
        await self.record()
        return await self.transport.pool.fetch(
            f"SELECT e.native_id, e.message_type, e.failed_queue, e.time_of_failure, "
            f"e.exception_type, e.exception_message {self._current()} "
            f"AND {GROUP_FILTERS[by]} "
            f"ORDER BY e.time_of_failure LIMIT {ROWS_SHOWN}", str(self.error_queue), key)

    async def group_ids(self, key: str, by: str = "exception") -> list[uuid.UUID]:
        await self.record()
        rows = await self.transport.pool.fetch(
            f"SELECT e.native_id {self._current()} AND {GROUP_FILTERS[by]}",
            str(self.error_queue), key)
        return [row["native_id"] for row in rows]

    async def message(self, native_id: uuid.UUID) -> asyncpg.Record | None:
        """A failed message: in the error queue, else in the archive (``archived`` says)."""
        pool = self.transport.pool
        row = await pool.fetchrow(
            statements.for_queue(self.error_queue)["peek_by_id"], native_id)
        if row is not None:
            return row
        return await pool.fetchrow(
            f"SELECT id, NULL::bigint AS seq, NULL::timestamptz AS expires, headers, body, "
            f"archived_at FROM {self.archive} WHERE id = $1", native_id)

    async def retry_one(self, native_id: uuid.UUID) -> str | None:
        """Back to its FailedQ, as ``errors retry`` does; returns why it stayed, or None."""
        try:
            await retry_failed(self.transport, native_id, str(self.error_queue))
        except EndpointRuntimeError as exc:
            return str(exc)
        return None

    async def archive_one(self, native_id: uuid.UUID) -> str | None:
        """Out of the error queue into the archive, in one transaction; returns why it
        stayed, or None."""
        take = statements.for_queue(self.error_queue)["take_by_id"]
        async with self.transport.pool.acquire() as connection, connection.transaction():
            row = await connection.fetchrow(take, native_id)
            if row is None:
                return f"no message {native_id} in {self.error_queue}"
            await connection.execute(
                f"INSERT INTO {self.archive} (id, headers, body, error_queue) "
                "VALUES ($1, $2, $3, $4)", row["id"], row["headers"], row["body"],
                str(self.error_queue))
        return None

    async def restore_one(self, native_id: uuid.UUID) -> str | None:
        """From the archive back into the error queue, byte for byte."""
        async with self.transport.pool.acquire() as connection, connection.transaction():
            row = await connection.fetchrow(
                f"DELETE FROM {self.archive} WHERE id = $1 RETURNING id, headers, body",
                native_id)
            if row is None:
                return f"no message {native_id} in the archive"
            await sending.send_raw(connection, self.error_queue, row["id"], row["headers"],
                                   bytes(row["body"] or b""))
        return None

    async def archived(self) -> list[asyncpg.Record]:
        return await self.transport.pool.fetch(
            f"SELECT a.id, a.archived_at, e.exception_type, e.message_type "
            f"FROM {self.archive} a LEFT JOIN LATERAL (SELECT exception_type, message_type "
            f"FROM {self.error_log} WHERE native_id = a.id LIMIT 1) e ON true "
            f"ORDER BY a.archived_at DESC LIMIT {ROWS_SHOWN}")

    async def log_action(self, action: str, native_ids: list[uuid.UUID], outcome: str,
                         client: str) -> None:
        await self.transport.pool.execute(
            f"INSERT INTO {self.actions} (action, native_ids, outcome, client) "
            "VALUES ($1, $2, $3, $4)", action, native_ids, outcome, client)

    async def action_log(self) -> list[asyncpg.Record]:
        return await self.transport.pool.fetch(
            f"SELECT at, action, cardinality(native_ids) AS messages, native_ids[1:5] AS some, "
            f"outcome, client FROM {self.actions} ORDER BY at DESC LIMIT {ROWS_SHOWN}")

    async def endpoints(self) -> list[QueueRow]:
        """Each queue's length, delayed messages, audit log's last hour and charts
        (:func:`~endpoint_runtime.console.endpoints.queue_rows`)."""
        return await queue_rows(self.transport, self.error_queue.schema, self.audit_log)

    async def subscriptions(self) -> list[SubscriptionRow]:
        return await subscription_rows(self.transport)

    async def sagas(self) -> list[StoredSagaTable]:
        return await saga_tables(self.transport, self.error_queue.schema)

    async def deployments(self) -> list[asyncpg.Record]:
        """The deployments' heartbeats (state, receivers per node, counts, last seen)."""
        async with self.transport.pool.acquire() as connection:
            return await read_heartbeats(connection, self.error_queue.schema)

    async def search(self, text: str, since: datetime | None = None,
                     until: datetime | None = None) -> list[asyncpg.Record]:
        """Audit rows whose message id, conversation or type is ``text`` (type: a prefix;
        empty: any), processed in [since, until), newest first."""
        match = ("(message_id = $1 OR conversation_id = $1 "
                 'OR (message_type COLLATE "C" >= $1 AND message_type COLLATE "C" < $2)) AND '
                 if text else "$1::text IS NOT NULL AND $2::text IS NOT NULL AND ")
        return await self.transport.pool.fetch(
            f"SELECT message_id, message_type, conversation_id, sending_endpoint, "
            f"processing_endpoint, processing_ended FROM {self.audit_log} WHERE {match}"
            "processing_ended >= coalesce($3::timestamptz, '-infinity') "
            "AND processing_ended < coalesce($4::timestamptz, 'infinity') "
            f"ORDER BY processing_ended DESC LIMIT {ROWS_SHOWN}",
            text, text + LAST_CHARACTER, since, until)

    async def conversation(self, conversation_id: str) -> list[asyncpg.Record]:
        """The conversation's audited and failed messages, oldest first."""
        return await self.transport.pool.fetch(
            f"SELECT message_id, message_type, intent, sending_endpoint, processing_endpoint, "
            "coalesce(time_sent, processing_started) AS at, false AS failed, "
            "NULL::uuid AS native_id "
            f"FROM {self.audit_log} WHERE conversation_id = $1 "
            f"UNION ALL SELECT message_id, message_type, intent, sending_endpoint, "
            f"coalesce(processing_endpoint, failed_queue), coalesce(time_sent, time_of_failure), "
            f"true, native_id FROM {self.error_log} WHERE conversation_id = $1 "
            f"ORDER BY at LIMIT {ROWS_SHOWN}", conversation_id)


__all__ = ["ConsoleData", "QueueAddress"]
