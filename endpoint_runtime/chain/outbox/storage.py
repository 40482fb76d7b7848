"""The outbox: exactly-once effect on business data (NServiceBus SQL persistence outbox).

Table ``"<endpoint>_OutboxData"`` (message_id primary key, dispatched, dispatched_at,
persistence_version, operations jsonb) lives beside the business tables, so a handler's writes
and the record of its outgoing messages commit in one transaction. :class:`OutboxStorage` holds
the statements; the flow is in :mod:`endpoint_runtime.chain.outbox.step` (the step) and
:mod:`endpoint_runtime.transactions.outbox_receive` (the receive and the acks); the cleaner below
deletes old dispatched records.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib

import asyncpg
import msgspec
import structlog

from endpoint_runtime.delayed.store import DelayedMessage
from endpoint_runtime.settings import EndpointSettings, OutboxSettings
from endpoint_runtime.transport import sql, statements
from endpoint_runtime.transport.addresses import QueueAddress, quote_identifier
from endpoint_runtime.transport.connection import DatabaseConnection, prepared_name
from endpoint_runtime.transport.literals import inline_parameters, text_literal
from endpoint_runtime.transport.queues import ddl_lock
from endpoint_runtime.wire.messages import OutgoingMessage

log = structlog.get_logger("endpoint_runtime.chain.outbox.storage")

PERSISTENCE_VERSION = "endpoint_runtime/1"
MAX_CLEANUP_FAILURES = 10


class TransportOperation(msgspec.Struct, kw_only=True):
    """One outgoing message as the outbox keeps it (bodies base64 in JSON)."""

    message_id: str
    destination: str
    headers: dict[str, str]
    body: bytes
    time_to_be_received: float | None = None
    due: str | None = None  # ISO time when the operation is a delayed send


_operations_encoder = msgspec.json.Encoder()
_operations_decoder = msgspec.json.Decoder(list[TransportOperation])


def encode_operations(operations: list[TransportOperation]) -> str:
    return _operations_encoder.encode(operations).decode()


def decode_operations(text: str | None) -> list[TransportOperation]:
    return _operations_decoder.decode(text) if text else []


def operation_of(address: QueueAddress, message: OutgoingMessage) -> TransportOperation:
    return TransportOperation(
        message_id=message.message_id, destination=str(address), headers=message.headers,
        body=message.body, time_to_be_received=message.time_to_be_received,
    )


def delayed_operation_of(message: DelayedMessage) -> TransportOperation:
    from endpoint_runtime.wire.messages import decode_headers

    return TransportOperation(
        message_id=str(message.id), destination=message.destination,
        headers=decode_headers(message.headers), body=message.body, due=message.due.isoformat(),
    )


class OutboxStorage:
    """Statements on one endpoint's outbox table."""

    def __init__(self, table: QueueAddress) -> None:
        self.table = table
        self._dispatch_statements: dict[QueueAddress, str] = {}
        self._receive_statements: dict[QueueAddress, str] = {}

    @classmethod
    def for_settings(cls, endpoint: QueueAddress, settings: EndpointSettings) -> OutboxStorage:
        """The outbox table of an endpoint whose settings enable the outbox."""
        assert settings.outbox is not None, "the settings do not enable the outbox"
        return cls.for_endpoint(endpoint, settings.outbox.table_name)

    @classmethod
    def for_endpoint(cls, endpoint: QueueAddress, table_name: str | None) -> OutboxStorage:
        return cls(QueueAddress(table_name or f"{endpoint.table}_OutboxData", endpoint.schema))

    @functools.cached_property
    def sql(self) -> dict[str, str]:
        names = {
            "table": self.table.qualified,
            "schema": quote_identifier(self.table.schema),
            "dispatched_at_idx": quote_identifier(_index_name(self.table, "dispatched_at")),
            "dispatched_idx": quote_identifier(_index_name(self.table, "dispatched")),
            "queue": "{queue}",  # filled per destination by dispatch_and_mark()
            "receive": "{receive}",  # filled per queue by receive_and_look_up()
        }
        return {name: text.format(**names) for name, text in sql.load("outbox.sql").items()}

    async def setup(self, connection: DatabaseConnection) -> None:
        async with ddl_lock(connection):
            await connection.execute(statements.for_queue(self.table)["create_schema"])
            await connection.execute(self.sql["create_table"])
            await connection.execute(self.sql["create_dispatched_at_index"])
            await connection.execute(self.sql["create_dispatched_index"])

    def receive_and_look_up(self, queue: QueueAddress) -> str:
        """The receive of ``queue`` that also says whether the message id is recorded."""
        statement = self._receive_statements.get(queue)
        if statement is None:
            receive = statements.for_queue(queue)["receive_past"].strip().rstrip(";")
            statement = self.sql["receive_and_look_up"].replace("{receive}", receive)
            self._receive_statements[queue] = statement
        return statement

    async def look_up(self, connection: DatabaseConnection, message_id: str, *,
                      begin: str | None) -> bool:
        """Whether ``message_id`` is recorded; ``begin`` (if any) goes in the same query."""
        return await self._execute(connection, "look_up", [message_id], before=begin) \
            == "SELECT 1"

    async def claim(self, connection: DatabaseConnection, message_id: str, *,
                    begin: str) -> bool:
        """Pessimistic: ``begin`` and insert the placeholder record of ``message_id``; a
        concurrent duplicate blocks until the first commits. ``False`` when it was recorded."""
        status = await self._execute(connection, "claim", [message_id, PERSISTENCE_VERSION],
                                     before=begin)
        return status == "INSERT 0 1"

    async def record_and_commit(
        self, connection: DatabaseConnection, message_id: str, operations: str, *,
        pessimistic: bool, dispatched: bool = False, then: str = "COMMIT",
    ) -> None:
        """Store (optimistic) or complete (pessimistic) the record, then ``then`` (COMMIT,
        and perhaps the next BEGIN). ``dispatched``: there is nothing to dispatch, the record
        is stored dispatched."""
        flag = "true" if dispatched else "false"
        if pessimistic:
            await self._execute(connection, "complete", [message_id, operations, flag],
                                then=then)
        else:
            await self._execute(connection, "store",
                                [message_id, PERSISTENCE_VERSION, operations, flag], then=then)

    async def _execute(
        self, connection: DatabaseConnection, block: str, values: list[str], *,
        before: str | None = None, then: str | None = None,
    ) -> str:
        """``before``; the statement ``block`` with ``values``; ``then``: as one simple query,
        the statement prepared once per session (see ``transport.connection``) or, on a
        connection that keeps no prepared statements (behind a transaction-mode pooler), with
        its values written in."""
        statement = self.sql[block]
        literals = [text_literal(value) for value in values]
        name = await prepared_name(connection, statement, ", ".join(["text"] * len(values)))
        execute = (inline_parameters(statement, literals).strip().rstrip(";") if name is None
                   else f"EXECUTE {name}({', '.join(literals)})")
        status: str = await connection.execute(
            "; ".join(part for part in (before, execute, then) if part is not None)
        )
        return status

    def dispatch_and_mark(self, destination: QueueAddress) -> str:
        """The one-round-trip dispatch into ``destination`` (statement cached per queue)."""
        statement = self._dispatch_statements.get(destination)
        if statement is None:
            statement = self.sql["dispatch_and_mark"].replace("{queue}", destination.qualified)
            self._dispatch_statements[destination] = statement
        return statement

    @property
    def lock_key(self) -> int:
        """Advisory-lock key of this table's cleanup (one cleaner at a time)."""
        digest = hashlib.sha1(str(self.table).encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)



def _index_name(table: QueueAddress, column: str) -> str:
    name = f"{table.table}_{column}_idx"
    if len(name.encode()) <= 63:
        return name
    return "outbox_" + hashlib.sha1(name.encode()).hexdigest()[:20] + f"_{column}_idx"


class OutboxCleaner:
    """Deletes dispatched records older than the retention, in batches until none are left.

    Scaled-out deployments compete for an advisory lock per outbox table, taken by each
    batch's transaction, so only one instance cleans at a time (the others skip that round).
    Ten failed rounds in a row raise the critical error.
    """

    def __init__(
        self, storage: OutboxStorage, pool: asyncpg.Pool, settings: OutboxSettings,
        on_critical_error: object,
    ) -> None:
        self.storage = storage
        self._pool = pool
        self.settings = settings
        self._on_critical_error = on_critical_error
        self._stopping = asyncio.Event()
        self.deleted = 0
        self.failures_in_a_row = 0

    async def clean_once(self) -> int | None:
        """One cleanup round; ``None`` when another instance holds the cleanup lock.

        Each batch is a transaction of its own that takes the lock for itself (a
        transaction-level advisory lock, released at its commit): nothing stays in the server
        session, so the cleanup works the same behind a transaction-mode pooler, and a
        cleaner that dies holds nothing."""
        total = 0
        async with self._pool.acquire() as connection:
            while True:
                async with connection.transaction():
                    if not await connection.fetchval("SELECT pg_try_advisory_xact_lock($1)",
                                                     self.storage.lock_key):
                        if total == 0:
                            return None
                        break  # another instance goes on from here
                    status: str = await connection.execute(
                        self.storage.sql["cleanup_batch"],
                        self.settings.keep_deduplication_data_for,
                        self.settings.cleanup_batch_size,
                    )
                deleted = int(status.rsplit(" ", 1)[-1])
                total += deleted
                if deleted < self.settings.cleanup_batch_size:
                    break
        self.deleted += total
        return total

    async def run(self) -> None:
        while not self._stopping.is_set():
            try:
                deleted = await self.clean_once()
                self.failures_in_a_row = 0
                if deleted:
                    log.info("outbox_cleanup", deleted=deleted)
            except Exception as exc:
                self.failures_in_a_row += 1
                log.warning("outbox_cleanup_failed", error=f"{type(exc).__name__}: {exc}",
                            failures_in_a_row=self.failures_in_a_row)
                if self.failures_in_a_row >= MAX_CLEANUP_FAILURES:
                    self.failures_in_a_row = 0
                    self._on_critical_error(  # type: ignore[operator]
                        f"outbox cleanup failed {MAX_CLEANUP_FAILURES} times in a row", exc
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.settings.cleanup_interval)

    def stop(self) -> None:
        self._stopping.set()
