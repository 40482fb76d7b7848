"""The built-in delayed-message store: table ``"<schema>"."<endpoint>.delayed"``.

Beyond the original: the fetch uses SKIP LOCKED, so competing movers of a scaled-out endpoint
never block each other and never dispatch the same row twice; inserts NOTIFY, so the mover
wakes as soon as an earlier message is stored by any process.
"""

from __future__ import annotations

import functools

from endpoint_runtime.delayed.store import DelayedMessage
from endpoint_runtime.transport import sql, statements
from endpoint_runtime.transport.addresses import QueueAddress, quote_identifier
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.literals import text_literal
from endpoint_runtime.transport.queues import ddl_lock


class PostgresDelayedMessageStore:
    """Delayed messages of one endpoint in one PostgreSQL table.

    Example::

        store = PostgresDelayedMessageStore(QueueAddress("sales.delayed"))
    """

    def __init__(self, table: QueueAddress) -> None:
        self.table = table

    @classmethod
    def for_endpoint(cls, endpoint: QueueAddress) -> PostgresDelayedMessageStore:
        return cls(QueueAddress(endpoint.table + ".delayed", endpoint.schema))

    @functools.cached_property
    def _sql(self) -> dict[str, str]:
        names = {
            "table": self.table.qualified,
            "schema": quote_identifier(self.table.schema),
            "due_idx": quote_identifier(self.table.derived_name("_due_idx")),
            "notify": quote_identifier(self.table.derived_name("_notify")),
            "channel": text_literal(self.table.notify_channel),
            "table_literal": text_literal(self.table.qualified),
        }
        return {name: text.format(**names) for name, text in sql.load("delayed.sql").items()}

    @property
    def notify_channel(self) -> str | None:
        return self.table.notify_channel

    async def setup_infrastructure(self, connection: DatabaseConnection) -> None:
        async with ddl_lock(connection):
            await connection.execute(statements.for_queue(self.table)["create_schema"])
            await connection.execute(statements.for_queue(self.table)["create_notify_function"])
            await connection.execute(self._sql["create_table"])
            await connection.execute(self._sql["migrate_key"])
            await connection.execute(self._sql["create_due_index"])
            await connection.execute(self._sql["create_notify_trigger"])

    async def store(self, connection: DatabaseConnection, message: DelayedMessage) -> None:
        await connection.execute(
            self._sql["store"], message.id, message.destination, message.due, message.headers,
            message.body,
        )

    async def fetch_next_due(self, connection: DatabaseConnection) -> DelayedMessage | None:
        row = await connection.fetchrow(self._sql["fetch_next_due"])
        if row is None:
            return None
        return DelayedMessage(
            id=row["id"], destination=row["destination"], due=row["due"],
            headers=row["headers"], body=bytes(row["body"] or b""), failures=row["failures"],
        )

    async def remove(self, connection: DatabaseConnection, message: DelayedMessage) -> bool:
        status: str = await connection.execute(
            self._sql["remove"], message.id, message.destination
        )
        return status.endswith(" 1")

    async def increment_failure_count(
        self, connection: DatabaseConnection, message: DelayedMessage
    ) -> bool:
        status: str = await connection.execute(
            self._sql["increment_failure_count"], message.id, message.destination
        )
        return status.endswith(" 1")

    async def next_due_in(self, connection: DatabaseConnection) -> float | None:
        seconds: float | None = await connection.fetchval(self._sql["next_due"])
        return seconds
