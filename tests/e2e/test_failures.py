"""A handler that sends and then fails, in each transaction mode; immediate sends; de-dup."""

from __future__ import annotations

import uuid

import pytest

from endpoint_runtime import (
    ConfigurationError,
    Endpoint,
    EndpointSettings,
    Headers,
    Sender,
    TransactionMode,
)
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.wire.messages import TransportMessage
from tests.e2e.conftest import (
    Deployer,
    count,
    create_queues,
    depths,
    drain_queue,
    ns_in_queue,
    status_line,
    wait_for,
    wait_for_status,
)
from tests.e2e.endpoints import FailAfterSend, ImmediateThenFail, SendTwice

pytestmark = pytest.mark.in_process

FAILED_TYPE = "tests.e2e.endpoints.HandlerFailedError"


async def _setup(transport: PostgresTransport) -> None:
    await transport.pool.execute("CREATE TABLE business (n int NOT NULL)")
    await create_queues(transport, "out", "attempts", "audit")


async def _wait_in_error_queue(transport: PostgresTransport) -> None:
    async def arrived() -> bool:
        return await transport.depth("error") >= 1

    await wait_for(arrived, timeout=20, what="the failed message in the error queue")


async def _the_error_copy(transport: PostgresTransport, message_id: str) -> TransportMessage:
    [copy] = await drain_queue(transport, "error")
    assert isinstance(copy, TransportMessage)
    assert copy.message_id == message_id
    assert copy.headers[ErrorHeaders.FAILED_QUEUE] == "public.failing"
    assert copy.headers[ErrorHeaders.EXCEPTION_TYPE] == FAILED_TYPE
    assert "failure after send of 1" in copy.headers[ErrorHeaders.MESSAGE]
    assert copy.body == b'{"n":1}'
    return copy


async def test_atomic_failure_after_send_rolls_back_sends_and_business_writes(
    deployer: Deployer, transport: PostgresTransport, sender: Sender
) -> None:
    await _setup(transport)
    deployment = await deployer.start("failing_atomic")
    message_id = await sender.send(FailAfterSend(1), destination="failing")

    await _wait_in_error_queue(transport)

    attempts = 1 + 1  # first attempt + immediate_retries=1
    assert await ns_in_queue(transport, "attempts") == [1] * attempts
    assert await depths(transport, "failing", "out") == {"failing": 0, "out": 0}
    assert await count(transport.pool, "SELECT count(*) FROM business") == 0
    await _the_error_copy(transport, message_id)
    status = await wait_for_status(
        deployment, lambda s: s.moved_to_error == 1,
        timeout=5, what="the receiver's status to count the move to the error queue",
    )
    assert status.failed == attempts, status_line(status)
    assert sum(r.processed for r in status.receivers) == 0, status_line(status)


async def test_receive_only_failure_keeps_the_sends_of_every_attempt(
    deployer: Deployer, transport: PostgresTransport, sender: Sender
) -> None:
    await _setup(transport)
    await deployer.start("failing_receive_only")
    message_id = await sender.send(FailAfterSend(1), destination="failing")

    await _wait_in_error_queue(transport)

    attempts = 1 + 1  # first attempt + immediate_retries=1
    assert await ns_in_queue(transport, "attempts") == [1] * attempts
    # Ghost messages: each attempt's send left at once and stays sent.
    assert await ns_in_queue(transport, "out") == [1] * attempts
    assert await transport.depth("failing") == 0
    # The handler's writes on the receive connection roll back with the receive.
    assert await count(transport.pool, "SELECT count(*) FROM business") == 0
    await _the_error_copy(transport, message_id)


async def test_none_mode_runs_the_handler_once_and_keeps_a_copy_in_the_error_queue(
    deployer: Deployer, transport: PostgresTransport, sender: Sender
) -> None:
    await _setup(transport)
    deployment = await deployer.start("failing_none")
    message_id = await sender.send(FailAfterSend(1), destination="failing")

    await _wait_in_error_queue(transport)

    assert await ns_in_queue(transport, "attempts") == [1]  # no retry
    assert await transport.depth("failing") == 0  # gone once received
    assert await ns_in_queue(transport, "out") == [1]  # sends leave at once
    # No transaction: the handler's write through context.connection stays.
    assert await count(transport.pool, "SELECT count(*) FROM business") == 1
    await _the_error_copy(transport, message_id)

    status = await wait_for_status(
        deployment, lambda s: s.moved_to_error == 1,
        timeout=5, what="the receiver's status to count the move to the error queue",
    )
    assert status.failed == 1, status_line(status)


def test_none_mode_refuses_retries() -> None:
    with pytest.raises(ConfigurationError, match="retries"):
        EndpointSettings(transaction_mode=TransactionMode.NONE, immediate_retries=2)
    with pytest.raises(ConfigurationError, match="retries"):
        Endpoint("refused", transaction_mode="none", immediate_retries=2)  # as from a file
    assert EndpointSettings(transaction_mode=TransactionMode.NONE).retries == 0


async def test_immediate_send_escapes_the_rollback_and_duplicate_sends_emit_one_row(
    deployer: Deployer, transport: PostgresTransport, sender: Sender
) -> None:
    await _setup(transport)
    await deployer.start("immediate_endpoint")
    out_id = str(uuid.uuid4())
    twice_id = await sender.send(SendTwice(n=2, out_id=out_id), destination="immediate")
    failing_id = await sender.send(ImmediateThenFail(1), destination="immediate")

    await _wait_in_error_queue(transport)

    async def send_twice_done() -> bool:
        return await transport.depth("out") >= 1

    await wait_for(send_twice_done, timeout=10, what="the SendTwice message's outgoing row")

    # The failing handler's immediate send stays; its ordinary send and write roll back.
    assert await ns_in_queue(transport, "audit") == [1, 2]
    assert await count(transport.pool, "SELECT count(*) FROM business") == 0
    [error_copy] = await drain_queue(transport, "error")
    assert error_copy.native_id == uuid.UUID(failing_id)
    # De-duplication: the same id to the same queue twice -> one row (buffered and immediate).
    out = await drain_queue(transport, "out")
    assert all(isinstance(m, TransportMessage) for m in out)
    assert [m.message_id for m in out if isinstance(m, TransportMessage)] == [out_id]
    assert isinstance(out[0], TransportMessage)
    assert out[0].headers[Headers.RELATED_TO] == twice_id
    audit = [m for m in await drain_queue(transport, "audit")
             if isinstance(m, TransportMessage) and m.message_id == out_id]
    assert len(audit) == 1
    assert await transport.depth("immediate") == 0
