"""The pipeline's steps without a database: handle, count a failure, screen the next delivery.

The executor is never reached on these paths (no move to a queue, no delayed store): a
discard and the handlers themselves need no database.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec
import pytest

from endpoint_runtime.context import HandlerContext
from endpoint_runtime.errors import DiscardMessage
from endpoint_runtime.handlers import HandlerRegistry
from endpoint_runtime.messages import OutgoingMessage, TransportMessage
from endpoint_runtime.outgoing import create_outgoing
from endpoint_runtime.pipeline import HandledAwaitingCommit, Outcome, Pipeline
from endpoint_runtime.recoverability import Action, RecoverabilityPolicy
from endpoint_runtime.transport.addresses import QueueAddress


class Ping(msgspec.Struct):
    n: int


class NoDispatcher:
    can_defer = False

    async def dispatch(self, address: QueueAddress, message: OutgoingMessage, *,
                       immediate: bool, due: datetime | None = None) -> None:
        raise AssertionError("these handlers send nothing")


def pipeline_of(*handlers: Any, immediate_retries: int = 0) -> Pipeline:
    registry = HandlerRegistry()
    for handler in handlers:
        registry.register(handler, Ping)
    return Pipeline(
        endpoint="sales", registry=registry, local_address=QueueAddress("sales"),
        error_address=QueueAddress("error"),
        policy=RecoverabilityPolicy(immediate_retries=immediate_retries),
    )


def received(n: int) -> TransportMessage:
    outgoing = create_outgoing(Ping(n))
    return TransportMessage(native_id=uuid.UUID(outgoing.message_id), seq=1,
                            headers=dict(outgoing.headers), raw_headers="{}", body=outgoing.body)


async def process(pipeline: Pipeline, message: TransportMessage) -> Outcome:
    # No executor: any step that would write to a queue fails the test at once.
    return await pipeline.process(message, None, NoDispatcher(), None)  # type: ignore[arg-type]


async def test_handlers_run_in_registration_order_and_the_message_is_handled() -> None:
    seen: list[tuple[str, int]] = []

    async def first(message: Ping, context: HandlerContext) -> None:
        seen.append(("first", message.n))

    async def second(message: Ping, context: HandlerContext) -> None:
        seen.append(("second", message.n))

    pipeline = pipeline_of(first, second)
    message = received(7)
    assert await process(pipeline, message) is Outcome.HANDLED
    assert seen == [("first", 7), ("second", 7)]
    assert pipeline.stats.processed == 0  # counted once its work commits
    pipeline.succeeded(message)
    assert pipeline.stats.processed == 1


async def test_a_failure_is_counted_and_the_next_delivery_is_handled_again_while_retries_last(
) -> None:
    runs = 0

    async def flaky(message: Ping, context: HandlerContext) -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise ValueError("first attempt fails")

    pipeline = pipeline_of(flaky, immediate_retries=1)
    message = received(1)
    assert await process(pipeline, message) is Outcome.FAILED
    assert pipeline.failures.get(message.native_id) is not None
    assert pipeline.pending_decision(message) is None  # an immediate retry: handle it again
    assert await process(pipeline, message) is Outcome.HANDLED
    pipeline.succeeded(message)
    assert pipeline.failures.get(message.native_id) is None
    assert (runs, pipeline.stats.failed, pipeline.stats.processed) == (2, 1, 1)


async def test_a_discarded_message_is_consumed_by_the_screen_without_running_handlers() -> None:
    runs = 0

    async def refusing(message: Ping, context: HandlerContext) -> None:
        nonlocal runs
        runs += 1
        raise DiscardMessage("stale order")

    pipeline = pipeline_of(refusing, immediate_retries=5)
    message = received(2)
    assert await process(pipeline, message) is Outcome.FAILED
    decision = pipeline.pending_decision(message)
    assert decision is not None
    assert decision.action is Action.DISCARD
    assert await process(pipeline, message) is Outcome.CONSUMED
    assert (runs, pipeline.stats.discarded) == (1, 1)
    assert pipeline.failures.get(message.native_id) is None


async def test_a_lost_connection_is_raised_to_the_receive_loop_not_counted() -> None:
    async def cut_off(message: Ping, context: HandlerContext) -> None:
        raise ConnectionResetError("server closed the connection")

    pipeline = pipeline_of(cut_off)
    with pytest.raises(ConnectionResetError):
        await process(pipeline, received(3))
    assert pipeline.stats.failed == 0


def test_handled_messages_awaiting_their_commit_are_bounded_oldest_first() -> None:
    awaiting = HandledAwaitingCommit(limit=2)
    first, second, third = (uuid.uuid4() for _ in range(3))
    for native_id in (first, second, third):
        awaiting.note(native_id, ("t", 0.0, 1.0))
    assert len(awaiting) == 2
    assert awaiting.take(first) is None  # dropped: the oldest
    assert awaiting.take(third) == ("t", 0.0, 1.0)
    assert awaiting.take(third) is None  # taken once
