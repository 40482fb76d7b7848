"""A deployed publisher (in process) with a subscriber whose queue table does not exist: every
event reaches the other subscribers exactly once, each undeliverable copy waits in the error
queue, and no message fails (black-box: endpoints, queues and SQL only)."""

from __future__ import annotations

import pytest

from endpoint_runtime import Sender, TransportSettings
from endpoint_runtime.chain.recoverability.error_queue import list_failed
from endpoint_runtime.chain.subscriptions import topics_of
from endpoint_runtime.connections.connecting import PostgresTransport
from tests.e2e.conftest import Deployer, count, wait_for
from tests.integration.test_publish_subscribe import SUBSCRIBERS, prepare
from tests.support import pubsub_endpoints
from tests.support.pubsub_endpoints import OrderPlaced, PlaceOrder

pytestmark = pytest.mark.in_process

MODULE = "tests.support.pubsub_endpoints"
ORDERS = 3


@pytest.mark.parametrize("name", ["atomic", "retrying_receive_only"])
async def test_a_deployed_publisher_delivers_to_the_others_and_records_the_missing_queue(
    deployer: Deployer, transport: PostgresTransport, database_dsn: str, name: str,
) -> None:
    publisher = getattr(pubsub_endpoints, name)
    await prepare(transport, publisher, *SUBSCRIBERS)
    await transport.pool.execute(
        'INSERT INTO "SubscriptionRouting" (queueaddress, endpoint, topic) '
        "VALUES ('zz_gone_sub', 'zz_gone_sub', $1)", topics_of(OrderPlaced)[0])
    deployment = await deployer.start(name, module=MODULE)
    async with Sender("shop", TransportSettings(dsn=database_dsn)) as sender:
        for n in range(ORDERS):
            await sender.send(PlaceOrder(f"o-{n}"), destination=publisher.name)

    async def settled() -> bool:
        return (await count(transport.pool, "SELECT count(*) FROM placed") >= ORDERS
                and await transport.depth("error") >= ORDERS
                and await transport.depth(publisher.name) == 0)

    await wait_for(settled, timeout=60, what=f"{ORDERS} orders handled, {ORDERS} copies recorded")
    status = await deployer.stop(deployment)  # nothing more can arrive

    assert await count(transport.pool, "SELECT count(*) FROM placed") == ORDERS
    assert [await transport.depth(s.name) for s in SUBSCRIBERS] == [ORDERS, ORDERS]
    failed = await list_failed(transport)
    assert [f.failed_queue for f in failed] == ["public.zz_gone_sub"] * ORDERS
    assert status.failed == 0, status
