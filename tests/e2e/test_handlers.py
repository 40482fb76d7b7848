"""Handler dispatch through the runtime: several handlers of one type, replies."""

from __future__ import annotations

import pytest

from endpoint_runtime import Headers, MessageIntent, QueueAddress, Sender, TransportSettings
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.wire.messages import TransportMessage
from tests.e2e.conftest import Deployer, count, create_queues, drain_queue, wait_for
from tests.e2e.endpoints import Ordered, Request, Unrelated

pytestmark = pytest.mark.in_process


async def test_handlers_of_one_type_run_in_registration_order_in_one_attempt(
    deployer: Deployer, transport: PostgresTransport, sender: Sender
) -> None:
    await transport.pool.execute(
        "CREATE TABLE handler_calls (id bigserial PRIMARY KEY, n int, handler text, "
        "txid bigint, message_id text)"
    )
    await deployer.start("ordered_endpoint")
    ids = {n: await sender.send(Ordered(n), destination="ordered") for n in (1, 2)}
    ids[3] = await sender.send(Unrelated(3), destination="ordered")

    async def all_called() -> bool:
        return await count(transport.pool, "SELECT count(*) FROM handler_calls") >= 7

    await wait_for(all_called, timeout=15, what="3 handler calls for each Ordered, 1 for Unrelated")

    rows = await transport.pool.fetch("SELECT * FROM handler_calls ORDER BY id")
    assert len(rows) == 7
    for n in (1, 2):
        calls = [row for row in rows if row["n"] == n]
        assert [row["handler"] for row in calls] == ["first", "second", "third"]
        assert len({row["txid"] for row in calls}) == 1  # one transaction: one attempt
        assert {row["message_id"] for row in calls} == {ids[n]}
    assert [(row["n"], row["handler"]) for row in rows if row["handler"] == "unrelated"] == [
        (3, "unrelated")
    ]
    assert await transport.depth("ordered") == 0


async def test_reply_goes_to_the_senders_reply_address_with_reply_intent_and_correlation(
    deployer: Deployer, transport: PostgresTransport, database_dsn: str
) -> None:
    await create_queues(transport, "client")
    await deployer.start("replier_endpoint")
    async with Sender(
        "client", TransportSettings(dsn=database_dsn), local_address=QueueAddress("client")
    ) as client:
        plain_id = await client.send(Request(1), destination="replier")
        correlated_id = await client.send(
            Request(2), destination="replier",
            headers={Headers.CORRELATION_ID: "saga-42", Headers.CONVERSATION_ID: "talk-7"},
        )

    async def both_replied() -> bool:
        return await transport.depth("client") >= 2

    await wait_for(both_replied, timeout=15, what="two replies in the client's queue")

    replies = await drain_queue(transport, "client")
    assert all(isinstance(r, TransportMessage) for r in replies)
    by_request = {r.headers[Headers.RELATED_TO]: r for r in replies
                  if isinstance(r, TransportMessage)}
    assert set(by_request) == {plain_id, correlated_id}

    plain = by_request[plain_id]
    assert plain.headers[Headers.MESSAGE_INTENT] == MessageIntent.REPLY
    assert plain.headers[Headers.CORRELATION_ID] == plain_id  # the request's id by default
    assert plain.headers[Headers.CONVERSATION_ID] == plain_id
    assert plain.headers[Headers.ORIGINATING_ENDPOINT] == "replier"
    assert plain.headers[Headers.REPLY_TO_ADDRESS] == "public.replier"
    assert plain.headers[Headers.ENCLOSED_MESSAGE_TYPES] == "tests.e2e.endpoints.Response"
    assert plain.body == b'{"n":10}'

    correlated = by_request[correlated_id]
    assert correlated.headers[Headers.MESSAGE_INTENT] == MessageIntent.REPLY
    assert correlated.headers[Headers.CORRELATION_ID] == "saga-42"
    assert correlated.headers[Headers.CONVERSATION_ID] == "talk-7"
    assert correlated.body == b'{"n":20}'
    assert await transport.depth("replier") == 0
    assert await transport.depth("error") == 0
