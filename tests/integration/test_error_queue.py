"""Error-queue tooling against a real PostgreSQL: list, show, retry, retry all, delete."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest

from endpoint_runtime import EndpointRuntimeError, QueueNotFoundError
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.error_queue import (
    delete_failed,
    error_copy,
    list_failed,
    retry_all,
    retry_failed,
    show_failed,
)
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders, Failure
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.wire.messages import TransportMessage


class Charge(msgspec.Struct):
    amount: int


FAILURE = Failure(attempts=6, exception_type="builtins.ValueError",
                  inner_exception_type="", message="card declined", source="charge",
                  stack_trace="Traceback ...", unrecoverable=False)


async def fail_into_error_queue(transport: PostgresTransport, queue: str) -> TransportMessage:
    """Send a message to ``queue``, take it, and put its error copy in the error queue."""
    await transport.send(queue, create_outgoing(Charge(5), headers={"x-custom": "kept"}))
    received = await transport.receive(queue)
    assert isinstance(received, TransportMessage)
    await transport.send("error", error_copy(received, FAILURE, queue, "billing"))
    return received


@pytest.fixture
async def queues(transport: PostgresTransport) -> PostgresTransport:
    for name in ("billing", "shipping", "error"):
        await transport.create_queue(name)
    return transport


async def test_list_and_show_describe_the_failure(queues: PostgresTransport) -> None:
    original = await fail_into_error_queue(queues, "billing")

    [failed] = await list_failed(queues)
    shown = await show_failed(queues, original.native_id)

    assert failed.native_id == original.native_id
    assert failed.failed_queue == "billing"
    assert failed.exception_type == "builtins.ValueError"
    assert failed.exception_message == "card declined"
    assert shown is not None
    assert shown.message.body == original.body
    assert await show_failed(queues, uuid.uuid4()) is None


async def test_retry_returns_the_message_unchanged_but_for_error_headers(
    queues: PostgresTransport,
) -> None:
    original = await fail_into_error_queue(queues, "billing")

    assert await retry_failed(queues, original.native_id) == "billing"

    assert await queues.depth("error") == 0
    replayed = await queues.receive("billing")
    assert isinstance(replayed, TransportMessage)
    assert replayed.native_id == original.native_id
    assert replayed.body == original.body
    assert replayed.headers == original.headers
    assert not set(ErrorHeaders.ALL) & set(replayed.headers)


async def test_retry_to_a_missing_queue_keeps_the_message(queues: PostgresTransport) -> None:
    original = await fail_into_error_queue(queues, "billing")
    await queues.drop_queue("billing")

    with pytest.raises(QueueNotFoundError):
        await retry_failed(queues, original.native_id)

    assert await queues.depth("error") == 1


async def test_poison_rows_cannot_be_retried_and_stay(queues: PostgresTransport) -> None:
    row_id = uuid.uuid4()
    await queues.pool.execute('INSERT INTO "public"."error" (id, headers, body) '
                              "VALUES ($1, '{broken', 'x')", row_id)
    with pytest.raises(EndpointRuntimeError, match="do not parse"):
        await retry_failed(queues, row_id)
    assert await queues.depth("error") == 1


async def test_retry_all_and_delete(queues: PostgresTransport) -> None:
    for _ in range(3):
        await fail_into_error_queue(queues, "billing")
    await fail_into_error_queue(queues, "shipping")
    row_id = uuid.uuid4()
    await queues.pool.execute('INSERT INTO "public"."error" (id, headers, body) '
                              "VALUES ($1, '{broken', 'x')", row_id)

    result = await retry_all(queues)
    assert result.moved == {"billing": 3, "shipping": 1}
    assert result.skipped == 1
    assert await queues.depth("billing") == 3
    assert await queues.depth("shipping") == 1
    assert await delete_failed(queues, row_id)
    assert not await delete_failed(queues, row_id)
    assert await queues.depth("error") == 0


@pytest.mark.parametrize("endpoint_name", ["doomed", "doomed_at_most_once"])
async def test_a_native_id_already_in_the_error_queue_is_kept_and_retries_restore_it(
    transport: PostgresTransport, endpoint_name: str,
) -> None:
    """A resend that fails while the first copy still waits in the error queue: both copies
    are kept (the second under a fresh row id), in every mode, NONE included, where the row is
    gone from its queue before the handler runs."""
    from tests.support import failing_endpoints
    from tests.support.failing_endpoints import Doomed

    endpoint = getattr(failing_endpoints, endpoint_name)
    for queue in (endpoint.name, "error"):
        await transport.create_queue(queue)
    strategy = endpoint.create_strategy(endpoint.create_pipeline(), transport.pool,
                                        endpoint.settings)
    message_id = str(uuid.uuid4())
    for n in (1, 2):
        await transport.send(endpoint.name, create_outgoing(Doomed(n), message_id=message_id))
        async with transport.pool.acquire() as connection:
            slot = strategy.open_slot(connection)
            while (await slot.round()).taken:
                pass
            await slot.close()

    assert await transport.depth(endpoint.name) == 0
    failed = await list_failed(transport)
    assert [msgspec.json.decode(f.message.body, type=Doomed).n for f in failed] == [1, 2]
    first, second = failed
    assert str(first.native_id) == message_id
    assert second.native_id != first.native_id
    assert isinstance(second.message, TransportMessage)
    assert second.message.headers["EndpointRuntime.OriginalNativeId"] == message_id

    # retry --all: the first goes back; the second collides with it and stays (skipped).
    result = await retry_all(transport)
    assert result.moved == {f"public.{endpoint.name}": 1}
    assert result.skipped == 1
    assert [f.native_id for f in await list_failed(transport)] == [second.native_id]
    with pytest.raises(EndpointRuntimeError, match="native id"):
        await retry_failed(transport, second.native_id)

    # Once the first copy is taken, the second goes back under its original native id.
    assert (await transport.receive(endpoint.name)) is not None
    await retry_failed(transport, second.native_id)
    replayed = await transport.receive(endpoint.name)
    assert isinstance(replayed, TransportMessage)
    assert str(replayed.native_id) == message_id
    assert "EndpointRuntime.OriginalNativeId" not in replayed.headers
    assert msgspec.json.decode(replayed.body, type=Doomed).n == 2


async def test_none_mode_keeps_a_copy_of_a_message_whose_handler_a_stop_cancels(
    transport: PostgresTransport,
) -> None:
    """In NONE mode the row is gone before the handler runs; a receiver that stops cancels
    handlers still running at ``stop_timeout``: the message must not vanish with it."""
    from tests.support.failing_endpoints import Doomed, stalled

    for queue in (stalled.name, "error"):
        await transport.create_queue(queue)
    strategy = stalled.create_strategy(stalled.create_pipeline(), transport.pool,
                                       stalled.settings)
    await transport.send(stalled.name, create_outgoing(Doomed(7)))

    async with transport.pool.acquire() as connection:
        receiving = asyncio.create_task(strategy.open_slot(connection).round())
        deadline = asyncio.get_running_loop().time() + 10
        while await transport.depth(stalled.name):  # taken: the handler runs
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        receiving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await receiving

    [failed] = await list_failed(transport)
    assert msgspec.json.decode(failed.message.body, type=Doomed).n == 7
    assert failed.exception_type is not None
    assert failed.exception_type.endswith("HandlerCancelledError")
