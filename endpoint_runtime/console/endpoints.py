"""The endpoints page's reads: each queue's length, the delayed messages waiting in its store,
the audit log's last hour, the charts per minute; the subscriptions (those pointing nowhere
marked) and the live saga instances per saga type.

Per-minute series come from the audit log (messages handled, mean processing and critical
time per minute of processing end: ingestion's rows) and from the queue lengths the
deployments' heartbeats keep per minute (``transport.heartbeat_tables``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from endpoint_runtime.chain.sagas.storage import StoredSagaTable, find_saga_tables
from endpoint_runtime.chain.subscriptions import (
    Subscription,
    dangling_subscriptions,
    subscription_store,
)
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.console.charts import MINUTES, Series, series
from endpoint_runtime.delayed.postgres import PostgresDelayedMessageStore
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.heartbeat_tables import read_queue_lengths


class QueueRow(msgspec.Struct, frozen=True, kw_only=True):
    """One queue of the endpoints page. ``delayed``: messages in its delayed store (``None``:
    it has none); ``audit``: the audit log's last hour for the endpoint of that name."""

    queue: str
    length: int
    delayed: int | None
    audit: dict[str, Any] | None
    throughput: Series
    processing: Series
    critical: Series
    lengths: Series


class SubscriptionRow(msgspec.Struct, frozen=True):
    """A subscription; ``nowhere``: its subscriber queue does not exist (or its address does
    not parse)."""

    subscription: Subscription
    nowhere: bool


async def queue_rows(transport: PostgresTransport, schema: str,
                     audit_log: str) -> list[QueueRow]:
    """Every queue table of ``schema`` with its length now, its delayed store's count and the
    per-minute series of the last :data:`~endpoint_runtime.console.charts.MINUTES`."""
    pool = transport.pool
    queues = await transport.list_queues(schema)
    audit = {row["endpoint"]: dict(row) for row in await pool.fetch(
        f"SELECT processing_endpoint AS endpoint, count(*) AS messages, "
        f"count(*) / 60.0 AS per_minute, avg(processing_time_ms) AS processing_ms, "
        f"avg(critical_time_ms) AS critical_ms, max(processing_ended) AS last "
        f"FROM {audit_log} WHERE processing_ended > now() - interval '1 hour' GROUP BY 1")}
    minutes: dict[str, list[asyncpg.Record]] = {}
    for row in await pool.fetch(
            f"SELECT processing_endpoint AS endpoint, "
            f"date_trunc('minute', processing_ended) AS minute, count(*) AS messages, "
            f"avg(processing_time_ms) AS processing_ms, avg(critical_time_ms) AS critical_ms "
            f"FROM {audit_log} WHERE processing_ended > date_trunc('minute', now()) "
            f"- interval '{MINUTES - 1} minutes' GROUP BY 1, 2"):
        minutes.setdefault(row["endpoint"], []).append(row)
    lengths: dict[str, list[asyncpg.Record]] = {}
    async with pool.acquire() as connection:
        for row in await read_queue_lengths(connection, schema, MINUTES):
            lengths.setdefault(row["endpoint"], []).append(row)
        delayed = await delayed_counts(connection, [q.address for q in queues])
    now: datetime = await pool.fetchval("SELECT now()")
    rows = []
    for queue in queues:
        name = queue.address.table
        per_minute = minutes.get(name, [])
        rows.append(QueueRow(
            queue=str(queue.address), length=queue.depth, delayed=delayed.get(queue.address),
            audit=audit.get(name),
            throughput=series(per_minute, now, "messages"),
            processing=series(per_minute, now, "processing_ms"),
            critical=series(per_minute, now, "critical_ms"),
            lengths=series(lengths.get(name, []), now, "length")))
    return rows


async def delayed_counts(connection: DatabaseConnection,
                         queues: list[QueueAddress]) -> dict[QueueAddress, int]:
    """Messages waiting in the delayed store (``"<endpoint>.delayed"``) of each of ``queues``
    that has one."""
    stores = {queue: PostgresDelayedMessageStore.for_endpoint(queue).table for queue in queues}
    existing = await connection.fetch(
        "SELECT n, to_regclass(n) IS NOT NULL AS found FROM unnest($1::text[]) AS n",
        [table.qualified for table in stores.values()])
    found = {row["n"] for row in existing if row["found"]}
    return {queue: await connection.fetchval(f"SELECT count(*) FROM {table.qualified}")
            for queue, table in stores.items() if table.qualified in found}


async def subscription_rows(transport: PostgresTransport) -> list[SubscriptionRow]:
    """Every subscription of the transport's subscription table, by topic and endpoint (none
    before the table exists)."""
    store = subscription_store(transport.settings)
    async with transport.pool.acquire() as connection:
        if not await store.exists(connection):
            return []
        every = await store.list(connection)
        dangling = {d.subscription for d in await dangling_subscriptions(
            connection, store, transport.settings.schema)}
    return [SubscriptionRow(s, s in dangling)
            for s in sorted(every, key=lambda s: (s.topic, s.endpoint, s.queue_address))]


async def saga_tables(transport: PostgresTransport, schema: str) -> list[StoredSagaTable]:
    """Every saga table of ``schema`` with its live (not completed) instances."""
    async with transport.pool.acquire() as connection:
        return await find_saga_tables(connection, schema)
