"""The endpoints page over rows written by the runtime's own code: delayed messages stored by
the delayed store, subscriptions made by the subscription store (one to a queue that does not
exist), saga instances inserted by the saga storage, queue lengths kept by a deployment's
heartbeat; the page shows their figures (the audit log's charts: test_console.py)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from endpoint_runtime.chain.sagas.storage import SagaTable
from endpoint_runtime.chain.subscriptions import subscription_store
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.delayed.postgres import PostgresDelayedMessageStore
from endpoint_runtime.delayed.store import DelayedMessage
from endpoint_runtime.runtime.actors.deployment_status import DeploymentStatus
from endpoint_runtime.runtime.heartbeats import HISTORY_HOURS, Heartbeat, create_heartbeats_table
from endpoint_runtime.transport import QueueAddress
from tests.console.conftest import Console

EVENT = "Sales.OrderPlaced, Sales.Messages"


async def _page(console: Console) -> str:
    async with console.client() as client:
        response = await client.get("/endpoints")
    assert response.status_code == 200
    return response.text


def _queue_row(html: str, queue: str) -> str:
    found = re.search(rf'<td class="name">{re.escape(queue)}</td>.*?</tr>', html, re.S)
    assert found is not None, f"no row for {queue}"
    return found.group()


async def _lengths(db: PostgresTransport, values: str, *arguments: object) -> None:
    """The heartbeat tables, with the queue lengths per minute of ``values`` (SQL rows)."""
    async with db.pool.acquire() as connection:
        await create_heartbeats_table(connection, "public")
    await db.pool.execute("INSERT INTO endpoint_queue_lengths (endpoint, minute, length) "
                          f"VALUES {values}", *arguments)


async def _beat(db: PostgresTransport, *, estimate: int) -> None:
    """A heartbeat of a deployment of ``billing`` whose peeker estimates ``estimate``."""
    status = DeploymentStatus(endpoint="billing", estimate=estimate, max_concurrency=1,
                              receivers=[], replaced_receivers=0)
    await Heartbeat("public", "d1").beat(db.pool, status, force=True)


def peak(row: str, chart: str) -> float | None:
    found = re.search(rf'<svg class="chart {chart}"[^>]*data-peak="([0-9.]+)"', row)
    return None if found is None else float(found.group(1))


async def test_delayed_messages_are_counted_per_endpoint(
    console: Console, db: PostgresTransport
) -> None:
    store = PostgresDelayedMessageStore.for_endpoint(db.address("billing"))
    due = datetime.now(UTC) + timedelta(hours=1)
    async with db.pool.acquire() as connection:
        await store.setup_infrastructure(connection)
        for _ in range(3):
            await store.store(connection, DelayedMessage(
                id=uuid.uuid4(), destination="billing", due=due, headers="{}", body=b"{}"))
    html = await _page(console)
    assert '<td class="delayed">3</td>' in _queue_row(html, "public.billing")
    assert '<td class="delayed">-</td>' in _queue_row(html, "public.shipping")  # no store


async def test_subscriptions_show_those_that_point_nowhere(
    console: Console, db: PostgresTransport
) -> None:
    store = subscription_store(db.settings)
    async with db.pool.acquire() as connection:
        await store.setup(connection)
        await store.subscribe(connection, db.address("billing"), "billing", EVENT)
        await store.subscribe(connection, QueueAddress("retired_crm"), "crm", EVENT)
    html = await _page(console)
    rows = re.findall(r'<tr class="subscription( nowhere)?"><td>([^<]*)</td><td>([^<]*)</td>'
                      r'<td>([^<]*)</td>\s*<td class="points">([^<]*)</td>', html)
    assert sorted(rows) == sorted([
        ("", EVENT, "billing", "public.billing", ""),
        (" nowhere", EVENT, "crm", "public.retired_crm", "points nowhere: no such queue"),
    ]), rows


async def test_active_sagas_are_counted_per_saga_type(
    console: Console, db: PostgresTransport
) -> None:
    fulfilment = SagaTable(QueueAddress("billing_OrderFulfilment"), "order_id", str)
    refunds = SagaTable(QueueAddress("billing_Refund"), "refund_id", str)
    async with db.pool.acquire() as connection:
        for table in (fulfilment, refunds):
            await table.setup(connection)
        for i in range(4):
            await fulfilment.insert(connection, uuid.uuid4(), metadata="{}", data="{}",
                                    saga_type_version="1", correlation_value=f"o-{i}")
        await refunds.insert(connection, uuid.uuid4(), metadata="{}", data="{}",
                             saga_type_version="1", correlation_value="r-1")
    html = await _page(console)
    sagas = dict(re.findall(r'<tr class="saga"><td>([^<]*)</td><td class="instances">(\d+)',
                            html))
    assert sagas == {"public.billing_OrderFulfilment": "4", "public.billing_Refund": "1"}


async def test_queue_length_per_minute_comes_from_heartbeats(
    console: Console, db: PostgresTransport
) -> None:
    await _lengths(db, "('billing', date_trunc('minute', now()) - interval '5 minutes', 12), "
                       "('billing', date_trunc('minute', now()) - interval '2 hours', 40)")
    await _beat(db, estimate=7)
    html = await _page(console)
    row = _queue_row(html, "public.billing")
    assert peak(row, "lengths") == 12.0
    assert "peak 12 messages" in row
    assert await db.pool.fetchval(
        "SELECT length FROM endpoint_queue_lengths ORDER BY minute DESC LIMIT 1") == 7  # beat
    assert peak(_queue_row(html, "public.shipping"), "lengths") is None  # no history: '-'


async def test_a_heartbeat_deletes_the_minutes_past_their_retention(
    db: PostgresTransport,
) -> None:
    await _lengths(db, "('billing', now() - make_interval(hours => $1 + 1), 1), "
                       "('billing', now() - make_interval(hours => $1 - 1), 2), "
                       "('shipping', now() - make_interval(hours => $1 + 1), 3)", HISTORY_HOURS)
    await _beat(db, estimate=0)
    kept = await db.pool.fetch(
        "SELECT endpoint, length FROM endpoint_queue_lengths ORDER BY endpoint, minute")
    # billing's old minute went; its recent one and this minute stay; shipping's is not its
    assert [tuple(r) for r in kept] == [("billing", 2), ("billing", 0), ("shipping", 3)]
