"""Queue administration: create, drop, list with depth, purge.

Creation is idempotent and safe when several processes create the same queue at once: the DDL
runs under a transaction-level advisory lock, and the duplicate-object errors that concurrent
``CREATE ... IF NOT EXISTS`` can still raise (42P07, 42710, 42P06, 23505) are treated as
"someone else made it".
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
import msgspec
import structlog

from endpoint_runtime.errors import QueueNotFoundError
from endpoint_runtime.transport import statements
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection

log = structlog.get_logger(__name__)

# One key for all DDL of this runtime: creation is rare, and one lock also covers the shared
# notify function that every queue's trigger calls.
_DDL_LOCK_KEY = 0x656E6470_6F696E74  # "endpoint"
_DUPLICATE_OBJECT_ERRORS = (
    asyncpg.DuplicateTableError,  # 42P07
    asyncpg.DuplicateObjectError,  # 42710
    asyncpg.DuplicateSchemaError,  # 42P06
    asyncpg.UniqueViolationError,  # 23505 (pg_type / pg_namespace races)
)
_CREATE_ATTEMPTS = 5


@contextlib.asynccontextmanager
async def ddl_lock(connection: DatabaseConnection) -> AsyncIterator[None]:
    """A transaction holding the runtime's DDL advisory lock (released at commit)."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", _DDL_LOCK_KEY)
        yield


class QueueInfo(msgspec.Struct, frozen=True):
    """A queue table and the number of rows in it."""

    address: QueueAddress
    depth: int


async def create_queue(
    connection: DatabaseConnection,
    address: QueueAddress,
    *,
    body_string_column: bool = False,
    notify_on_send: bool = True,
) -> None:
    """Create the queue table (and its indexes and notify trigger, with the schema's table of
    waiting channels) if it does not exist."""
    address.check_room_for_suffixes()
    sql = statements.for_queue(address)
    steps = [sql["create_schema"], sql["create_queue"], sql["create_seq_index"],
             sql["create_expires_index"]]
    if body_string_column:
        steps.append(sql["add_body_string"])
    if notify_on_send:
        # The trigger notifies only a channel marked waiting (transport.waiting).
        steps += [sql["create_waiting_table"], sql["create_notify_waiting_function"],
                  sql["create_notify_trigger"]]
    else:
        steps.append(sql["drop_notify_trigger"])
    for attempt in range(1, _CREATE_ATTEMPTS + 1):
        try:
            async with ddl_lock(connection):
                for step in steps:
                    await connection.execute(step)
            return
        except _DUPLICATE_OBJECT_ERRORS as exc:
            # Another process won a race the advisory lock cannot cover (e.g. a creator that
            # does not take it, such as NServiceBus itself); the next attempt finds its work.
            log.debug("create_queue_race", queue=str(address), attempt=attempt, error=str(exc))
    raise RuntimeError(f"could not create queue {address} after {_CREATE_ATTEMPTS} attempts")


async def drop_queue(connection: DatabaseConnection | asyncpg.Pool, address: QueueAddress) -> None:
    await connection.execute(statements.for_queue(address)["drop_queue"])


async def queue_exists(
    connection: DatabaseConnection | asyncpg.Pool, address: QueueAddress
) -> bool:
    exists: bool = await connection.fetchval(statements.shared("table_exists"), address.qualified)
    return exists


async def depth(connection: DatabaseConnection | asyncpg.Pool, address: QueueAddress) -> int:
    """Exact number of rows (locked ones included)."""
    try:
        count: int = await connection.fetchval(statements.for_queue(address)["count"])
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc
    return count


async def list_queues(
    connection: DatabaseConnection | asyncpg.Pool, schema: str | None = None
) -> list[QueueInfo]:
    """Every table shaped like a queue (in ``schema``, or in all schemas), with its depth."""
    rows = await connection.fetch(statements.shared("list_queues"), schema)
    found = []
    for row in rows:
        address = QueueAddress(row["name"], row["schema"])
        found.append(QueueInfo(address, await depth(connection, address)))
    return found


async def purge_expired(
    connection: DatabaseConnection | asyncpg.Pool, address: QueueAddress, batch_size: int = 10_000
) -> int:
    """Delete expired rows in batches (each its own statement); returns how many went."""
    statement = statements.for_queue(address)["purge_expired"]
    total = 0
    while True:
        try:
            status: str = await connection.execute(statement, batch_size)
        except asyncpg.UndefinedTableError as exc:
            raise QueueNotFoundError(str(address)) from exc
        deleted = int(status.rsplit(" ", 1)[-1])
        total += deleted
        if deleted < batch_size:
            return total


async def purge(connection: DatabaseConnection | asyncpg.Pool, address: QueueAddress) -> int:
    """Delete every row; returns how many went."""
    try:
        status: str = await connection.execute(statements.for_queue(address)["purge_all"])
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc
    return int(status.rsplit(" ", 1)[-1])
