"""Saga storage: one table per saga type, in the layout of NServiceBus's SQL persistence.

Below the chain, beside the outbox's storage: it knows tables and statements, nothing of
handlers or modes. The table of a saga type (``"<endpoint>_<SagaName>"``, the persistence's
``{tablePrefix}{TableSuffix}``):

=======================  ========================  ==========================================
column                   type                      what it holds
=======================  ========================  ==========================================
``Id``                   uuid, primary key         the saga id (the ``NServiceBus.SagaId`` of
                                                   replies and timeouts)
``Metadata``             text (JSON)               ``{"OriginalMessageId", "Originator"}``
``Data``                 jsonb                     the saga's state Struct
``PersistenceVersion``   character varying(23)     the version of this storage
``SagaTypeVersion``      character varying(23)     the version of the state type
``Concurrency``          int                       1 at insert, +1 at each update
``Correlation_<Name>``   by the state field's type  the correlation value, unique index
=======================  ========================  ==========================================

Statements as the persistence's: get by id or by correlation value (``FOR UPDATE`` with
pessimistic locking), insert with ``Concurrency`` 1, update ``WHERE "Id" = $1 AND
"Concurrency" = $2`` (0 rows: another transaction changed the instance), delete with the same
check at completion. See docs/sagas.md.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from typing import Any

import msgspec

from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.transport.addresses import (
    MAX_IDENTIFIER_BYTES,
    QueueAddress,
    quote_identifier,
)
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.queues import ddl_lock

PERSISTENCE_VERSION = "endpoint_runtime/1"
"""``PersistenceVersion`` of the rows written here (at most 23 characters, as the column)."""

CORRELATION_COLUMN_TYPES: dict[type, str] = {
    str: "character varying(200)",
    int: "bigint",
    uuid.UUID: "uuid",
}
"""The column of a correlation property by the Python type of the state field. The
persistence maps string to ``character varying(200)``, Guid to ``uuid`` and int to
``integer``; a Python int may be wider, so it is ``bigint`` here."""

COLUMNS = '"Id", "SagaTypeVersion", "Concurrency", "Metadata", "Data"'


class SagaRow(msgspec.Struct, frozen=True, kw_only=True):
    """One saga instance as stored (``data`` and ``metadata`` as JSON text)."""

    id: uuid.UUID
    saga_type_version: str | None
    concurrency: int
    metadata: str
    data: str


class SagaTable:
    """Statements on the table of one saga type correlated by ``correlation`` (a property name
    of its state; ``None``: found only by saga id) whose values are of ``correlation_type``.

    Example::

        table = SagaTable(QueueAddress("sales_OrderFulfilment"), "order_id", str)
        await table.setup(connection)
        row = await table.get_by_correlation(connection, "o-1", lock=False)
    """

    def __init__(self, address: QueueAddress, correlation: str | None,
                 correlation_type: type = str) -> None:
        if correlation is not None and correlation_type not in CORRELATION_COLUMN_TYPES:
            raise ConfigurationError(
                f"saga table {address}: a correlation property of type "
                f"{getattr(correlation_type, '__name__', correlation_type)!r} is not supported "
                f"(use one of {', '.join(t.__name__ for t in CORRELATION_COLUMN_TYPES)})")
        self.address = address
        self.correlation = correlation
        self.correlation_type = correlation_type

    @property
    def correlation_column(self) -> str | None:
        return f"Correlation_{self.correlation}" if self.correlation else None

    @functools.cached_property
    def index_name(self) -> str:
        """``<table>_i_<SHA1 of table/property>`` as the persistence names it, the hash alone
        when that would pass PostgreSQL's 63 bytes."""
        digest = hashlib.sha1(f"{self.address.table}/{self.correlation}".encode()).hexdigest()
        name = f"{self.address.table}_i_{digest.upper()}"
        return name if len(name.encode()) <= MAX_IDENTIFIER_BYTES else f"saga_i_{digest}"

    @functools.cached_property
    def sql(self) -> dict[str, str]:
        table = self.address.qualified
        statements = {
            "create_table": (
                f"CREATE TABLE IF NOT EXISTS {table} (\n"
                '    "Id" uuid NOT NULL PRIMARY KEY,\n'
                '    "Metadata" text NOT NULL,\n'
                '    "Data" jsonb NOT NULL,\n'
                '    "PersistenceVersion" character varying(23),\n'
                '    "SagaTypeVersion" character varying(23),\n'
                '    "Concurrency" int NOT NULL)'),
            "get_by_id": f'SELECT {COLUMNS} FROM {table} WHERE "Id" = $1',
            "update": (
                f'UPDATE {table} SET "Data" = $3::jsonb, "Metadata" = $4, '
                f'"PersistenceVersion" = $5, "SagaTypeVersion" = $6, '
                f'"Concurrency" = $2 + 1 WHERE "Id" = $1 AND "Concurrency" = $2'),
            "complete": f'DELETE FROM {table} WHERE "Id" = $1 AND "Concurrency" = $2',
        }
        column = self.correlation_column
        if column is None:
            statements["insert"] = (
                f'INSERT INTO {table} ("Id", "Metadata", "Data", "PersistenceVersion", '
                f'"SagaTypeVersion", "Concurrency") VALUES ($1, $2, $3::jsonb, $4, $5, 1)')
            return statements
        quoted = quote_identifier(column)
        statements.update({
            "add_column": (f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {quoted} "
                           f"{CORRELATION_COLUMN_TYPES[self.correlation_type]}"),
            "create_index": (f"CREATE UNIQUE INDEX IF NOT EXISTS "
                             f"{quote_identifier(self.index_name)} ON {table} ({quoted})"),
            "get_by_correlation": f"SELECT {COLUMNS} FROM {table} WHERE {quoted} = $1",
            "insert": (
                f'INSERT INTO {table} ("Id", "Metadata", "Data", "PersistenceVersion", '
                f'"SagaTypeVersion", "Concurrency", {quoted}) '
                f"VALUES ($1, $2, $3::jsonb, $4, $5, 1, $6)"),
        })
        return statements

    async def setup(self, connection: DatabaseConnection) -> None:
        """Create the table, its correlation column and unique index (idempotent, under the
        runtime's DDL lock)."""
        async with ddl_lock(connection):
            await connection.execute(
                f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(self.address.schema)}")
            for name in ("create_table", "add_column", "create_index"):
                if name in self.sql:
                    await connection.execute(self.sql[name])

    async def get_by_id(self, connection: DatabaseConnection, saga_id: uuid.UUID, *,
                        lock: bool) -> SagaRow | None:
        return _row(await connection.fetchrow(_locked(self.sql["get_by_id"], lock), saga_id))

    async def get_by_correlation(self, connection: DatabaseConnection, value: Any, *,
                                 lock: bool) -> SagaRow | None:
        statement = self.sql.get("get_by_correlation")
        if statement is None:
            raise ConfigurationError(f"saga table {self.address} has no correlation property")
        return _row(await connection.fetchrow(_locked(statement, lock), value))

    async def insert(self, connection: DatabaseConnection, saga_id: uuid.UUID, *,
                     metadata: str, data: str, saga_type_version: str,
                     correlation_value: Any = None) -> None:
        """A new instance with ``Concurrency`` 1; a second instance with the same correlation
        value fails on the unique index (``asyncpg.UniqueViolationError``)."""
        arguments: list[Any] = [saga_id, metadata, data, PERSISTENCE_VERSION, saga_type_version]
        if self.correlation is not None:
            arguments.append(correlation_value)
        await connection.execute(self.sql["insert"], *arguments)

    async def update(self, connection: DatabaseConnection, saga_id: uuid.UUID,
                     concurrency: int, *, metadata: str, data: str,
                     saga_type_version: str) -> bool:
        """Write the state if the row is still at ``concurrency``; ``False`` when it is not
        (changed or deleted by another transaction since it was read)."""
        status = await connection.execute(self.sql["update"], saga_id, concurrency, data,
                                          metadata, PERSISTENCE_VERSION, saga_type_version)
        return _affected(status) == 1

    async def complete(self, connection: DatabaseConnection, saga_id: uuid.UUID,
                       concurrency: int) -> bool:
        """Delete the instance if it is still at ``concurrency``; ``False`` when it is not."""
        return _affected(await connection.execute(self.sql["complete"], saga_id,
                                                  concurrency)) == 1


def _locked(statement: str, lock: bool) -> str:
    return f"{statement} FOR UPDATE" if lock else statement


def _row(record: Any) -> SagaRow | None:
    if record is None:
        return None
    return SagaRow(id=record["Id"], saga_type_version=record["SagaTypeVersion"],
                   concurrency=record["Concurrency"], metadata=record["Metadata"],
                   data=record["Data"])


def _affected(status: str) -> int:
    """The row count of a command status such as ``UPDATE 1``."""
    return int(status.rsplit(" ", 1)[-1])


FIND_SAGA_TABLES = """
    SELECT c.table_schema, c.table_name, max(c.column_name) FILTER (
        WHERE c.column_name LIKE 'Correlation\\_%') AS correlation
    FROM information_schema.columns c
    WHERE ($1::text IS NULL OR c.table_schema = $1)
    GROUP BY c.table_schema, c.table_name
    HAVING count(*) FILTER (WHERE c.column_name IN
        ('Id', 'Metadata', 'Data', 'PersistenceVersion', 'SagaTypeVersion', 'Concurrency')) = 6
    ORDER BY 1, 2"""


class StoredSagaTable(msgspec.Struct, frozen=True):
    """A saga table found in the database (any table with the persistence's columns), its
    correlation column (``None``: none) and its live instances."""

    address: QueueAddress
    correlation_column: str | None
    instances: int


async def find_saga_tables(connection: DatabaseConnection,
                           schema: str | None = None) -> list[StoredSagaTable]:
    """Every table in ``schema`` (``None``: all) laid out as a saga table."""
    found = []
    for row in await connection.fetch(FIND_SAGA_TABLES, schema):
        address = QueueAddress(row["table_name"], row["table_schema"])
        instances = await connection.fetchval(f"SELECT count(*) FROM {address.qualified}")
        found.append(StoredSagaTable(address, row["correlation"], instances))
    return found


async def stored_table(connection: DatabaseConnection, address: QueueAddress) -> SagaTable:
    """The :class:`SagaTable` of the existing saga table ``address`` (its correlation read
    from its columns); ``ConfigurationError`` when it is not one."""
    for table in await find_saga_tables(connection, address.schema):
        if table.address == address:
            column = table.correlation_column
            return SagaTable(address, column.removeprefix("Correlation_") if column else None)
    raise ConfigurationError(f"{address} is not a saga table (see: endpoint-runtime sagas list)")


async def list_instances(connection: DatabaseConnection, table: SagaTable, *, limit: int,
                         correlation: str | None = None,
                         saga_id: str | None = None) -> list[dict[str, Any]]:
    """Up to ``limit`` instances of ``table`` (only the one whose correlation value, or id,
    reads ``correlation``/``saga_id`` as text): id, correlation value (as text), concurrency,
    saga-type version, metadata and data (JSON text)."""
    column = table.correlation_column
    value = f"{quote_identifier(column)}::text" if column else "NULL::text"
    rows = await connection.fetch(
        f'SELECT "Id", {value} AS correlation, "Concurrency", "SagaTypeVersion", '
        f'"Metadata", "Data"::text AS data FROM {table.address.qualified} '
        f'WHERE ($2::text IS NULL OR {value} = $2) AND ($3::text IS NULL OR "Id"::text = $3) '
        f'ORDER BY 2, "Id" LIMIT $1', limit, correlation, saga_id)
    return [dict(row) for row in rows]
