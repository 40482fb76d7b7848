"""Publish/subscribe, audit and ingestion through deployments (in process): deployments
subscribe at start, a published event reaches each subscriber's deployment, and the
ingestion endpoint turns the audit copies and the error queue into audit_log and error_log
rows."""

from __future__ import annotations

import pytest

from endpoint_runtime import Sender, TransportSettings
from endpoint_runtime.connections.connecting import PostgresTransport
from tests.e2e.conftest import Deployer, count, wait_for
from tests.integration.test_publish_subscribe import prepare
from tests.support import pubsub_endpoints
from tests.support.pubsub_endpoints import PlaceOrder

pytestmark = pytest.mark.in_process

MODULE = "tests.support.pubsub_endpoints"


async def test_deployments_subscribe_and_their_events_are_audited_and_ingested(
    deployer: Deployer, transport: PostgresTransport, database_dsn: str,
) -> None:
    await prepare(transport, pubsub_endpoints.atomic)
    await transport.pool.execute('DELETE FROM "SubscriptionRouting"')  # the deployments do it
    for name in ("billing", "analytics"):
        await deployer.start(name, module=MODULE)
    await deployer.start("atomic", module=MODULE)
    await deployer.start("endpoint", module="endpoint_runtime.ingestion")

    async with Sender("shop", TransportSettings(dsn=database_dsn)) as sender:
        for n in range(5):
            await sender.send(PlaceOrder(f"o-{n}"), destination="sales_atomic")
        await sender.send(PlaceOrder("o-failing", fail=True), destination="sales_atomic")

    async def seen_by_both() -> bool:
        return await count(transport.pool, "SELECT count(*) FROM seen") >= 10

    await wait_for(seen_by_both, timeout=30, what="5 events at each of 2 subscribers")

    async def ingested() -> bool:
        audited = await count(transport.pool, "SELECT count(*) FROM audit_log")
        failed = await count(transport.pool, "SELECT count(*) FROM error_log")
        return audited >= 5 and failed >= 1

    await wait_for(ingested, timeout=30, what="5 audit rows and 1 error row")
    rows = await transport.pool.fetch(
        "SELECT endpoint, count(*) AS n FROM seen GROUP BY 1 ORDER BY 1")
    assert [(row["endpoint"], row["n"]) for row in rows] == [
        ("analytics_sub", 5), ("billing_sub", 5)]
    audited = await transport.pool.fetch(
        "SELECT processing_endpoint, sending_endpoint FROM audit_log")
    assert {(r["processing_endpoint"], r["sending_endpoint"]) for r in audited} == {
        ("sales_atomic", "shop")}
    assert len(audited) == 5
    failed = await transport.pool.fetchrow(
        "SELECT failed_queue, exception_type FROM error_log")
    assert failed["failed_queue"] == "public.sales_atomic"
    assert failed["exception_type"] == "builtins.RuntimeError"
    assert await transport.depth("error") == 1  # recorded, still retryable
