"""Bad input through the runtime: unparsable headers, unknown types, undecodable bodies."""

from __future__ import annotations

import uuid

import msgspec
import pytest

from endpoint_runtime import Headers
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.wire.messages import PoisonMessage, TransportMessage
from tests.e2e.conftest import (
    Deployer,
    count,
    create_queues,
    drain_queue,
    ns_in_queue,
    status_line,
    wait_for,
    wait_for_status,
)
from tests.e2e.endpoints import Typed

pytestmark = pytest.mark.in_process


async def test_poison_unknown_type_and_undecodable_body_go_to_the_error_queue_at_once(
    deployer: Deployer, transport: PostgresTransport
) -> None:
    await transport.pool.execute("CREATE TABLE business (n int NOT NULL)")
    await create_queues(transport, "strict", "attempts")
    poison_id = uuid.uuid4()
    raw_headers = '{"NServiceBus.MessageId": "broken'  # not JSON
    await transport.pool.execute(
        'INSERT INTO "public"."strict" (id, headers, body) VALUES ($1, $2, $3)',
        poison_id, raw_headers, b"\x00raw body",
    )
    unknown = create_outgoing(
        Typed(1), headers={Headers.ENCLOSED_MESSAGE_TYPES: "Somewhere.NoSuchType, Somewhere"}
    )
    await transport.send("strict", unknown)
    undecodable = msgspec.structs.replace(create_outgoing(Typed(2)), body=b'{"n": "two"}')
    await transport.send("strict", undecodable)
    good = create_outgoing(Typed(3))
    await transport.send("strict", good)

    deployment = await deployer.start("strict_endpoint")

    async def settled() -> bool:
        handled = await count(transport.pool, "SELECT count(*) FROM business")
        return handled == 1 and await transport.depth("error") == 3

    await wait_for(settled, timeout=20, what="3 messages in the error queue and 1 handled")
    # Unrecoverable: one failed attempt each (despite default retries), none reaching a handler.
    status = await wait_for_status(
        deployment, lambda s: s.moved_to_error == 3,
        timeout=5, what="the receiver's status to count 3 moves to the error queue",
    )
    assert status.failed == 2, status_line(status)
    assert await ns_in_queue(transport, "attempts") == [3]  # only the good message's
    assert await transport.depth("strict") == 0

    errors = {m.native_id: m for m in await drain_queue(transport, "error")}
    poison = errors[poison_id]
    assert isinstance(poison, PoisonMessage)
    assert poison.raw_headers == raw_headers  # kept byte for byte
    assert poison.body == b"\x00raw body"

    unknown_copy = errors[uuid.UUID(unknown.message_id)]
    assert isinstance(unknown_copy, TransportMessage)
    assert unknown_copy.headers[ErrorHeaders.EXCEPTION_TYPE] == (
        "endpoint_runtime.errors.UnknownMessageTypeError"
    )
    assert unknown_copy.headers[ErrorHeaders.FAILED_QUEUE] == "public.strict"
    assert unknown_copy.body == unknown.body

    undecodable_copy = errors[uuid.UUID(undecodable.message_id)]
    assert isinstance(undecodable_copy, TransportMessage)
    assert undecodable_copy.headers[ErrorHeaders.EXCEPTION_TYPE] == (
        "endpoint_runtime.errors.MessageDecodeError"
    )
    assert undecodable_copy.body == b'{"n": "two"}'
