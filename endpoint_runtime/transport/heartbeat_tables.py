"""The heartbeat tables: where every deployment's peeker writes its state, and what the console
reads (the writer, :class:`endpoint_runtime.runtime.heartbeats.Heartbeat`, is the runtime's).

``endpoint_heartbeats`` holds one row per deployment, ``endpoint_queue_lengths`` the queue's
length per minute. The installers create them (:func:`create_heartbeats_table`); the console
reads them (:func:`read_heartbeats`, :func:`read_queue_lengths`). Below the runtime, so that
the installers and the console need no actor module.
"""

from __future__ import annotations

import asyncpg

from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.queues import ddl_lock

BEAT_SECONDS = 5.0
SILENT_AFTER = 3 * BEAT_SECONDS
BEAT_TIMEOUT_SECONDS = 2.0
TABLE = "endpoint_heartbeats"
HISTORY_TABLE = "endpoint_queue_lengths"
HISTORY_HOURS = 24
"""How long the queue length per minute is kept."""


def heartbeat_tables(schema: str) -> tuple[QueueAddress, QueueAddress]:
    """The heartbeats and the queue lengths per minute, in ``schema``."""
    return QueueAddress(TABLE, schema), QueueAddress(HISTORY_TABLE, schema)


def heartbeats_table(schema: str) -> str:
    return QueueAddress(TABLE, schema).qualified


async def create_heartbeats_table(connection: DatabaseConnection, schema: str) -> None:
    """Both tables of :func:`heartbeat_tables` (idempotent, under the DDL lock)."""
    beats, history = (table.qualified for table in heartbeat_tables(schema))
    async with ddl_lock(connection):
        await connection.execute(f"""
            CREATE TABLE IF NOT EXISTS {beats} (
                endpoint text NOT NULL, deployment_id text NOT NULL, host text NOT NULL,
                state text NOT NULL, receivers_by_node jsonb NOT NULL,
                processed bigint NOT NULL, failed bigint NOT NULL, estimate integer NOT NULL,
                critical_error text, started_at timestamptz NOT NULL DEFAULT now(),
                last_seen timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (endpoint, deployment_id));
            CREATE TABLE IF NOT EXISTS {history} (
                endpoint text NOT NULL, minute timestamptz NOT NULL, length integer NOT NULL,
                PRIMARY KEY (endpoint, minute))""")


async def read_queue_lengths(connection: DatabaseConnection, schema: str,
                             minutes: int) -> list[asyncpg.Record]:
    """``endpoint``, ``minute`` and ``length`` of the last ``minutes`` minutes (none before
    the tables are installed)."""
    history = QueueAddress(HISTORY_TABLE, schema).qualified
    if not await connection.fetchval("SELECT to_regclass($1) IS NOT NULL", history):
        return []
    return await connection.fetch(
        f"SELECT endpoint, minute, length FROM {history} "
        "WHERE minute > date_trunc('minute', now()) - make_interval(mins => $1)", minutes)


async def read_heartbeats(connection: DatabaseConnection, schema: str) -> list[asyncpg.Record]:
    """Every deployment's row, with ``silent`` (not seen for :data:`SILENT_AFTER` seconds
    while not stopped); none when no deployment has written one yet."""
    table = heartbeats_table(schema)
    if not await connection.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
        return []
    return await connection.fetch(
        f"SELECT *, state <> 'stopped' AND last_seen < now() - make_interval(secs => $1) "
        f"AS silent FROM {table} ORDER BY endpoint, last_seen DESC", SILENT_AFTER)
