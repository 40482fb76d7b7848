"""The chain without a database: its steps in order, one entry per message, a failure counted,
the next delivery screened, the hooks at the end of the transaction, user steps.

The executor is never reached on these paths (no move to a queue, no delayed store): a
discard and the handlers themselves need no database.
"""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping
from datetime import datetime
from typing import Any

import msgspec
import pytest

from endpoint_runtime import Endpoint, Outbox
from endpoint_runtime.chain.context import HandlerContext
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.pipeline import IncomingContext, Next, Outcome, Pipeline, Unit
from endpoint_runtime.chain.recoverability.policy import Action
from endpoint_runtime.errors import ConfigurationError, DiscardMessage
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.messages import Headers, OutgoingMessage, TransportMessage


class Ping(msgspec.Struct):
    n: int


class NoDispatcher:
    can_defer = False

    async def dispatch(self, address: QueueAddress, message: OutgoingMessage, *,
                       immediate: bool, due: datetime | None = None) -> None:
        raise AssertionError("these handlers send nothing")


class Recording:
    can_defer = False

    def __init__(self) -> None:
        self.sent: list[tuple[QueueAddress, OutgoingMessage]] = []

    async def dispatch(self, address: QueueAddress, message: OutgoingMessage, *,
                       immediate: bool, due: datetime | None = None) -> None:
        self.sent.append((address, message))


def endpoint_of(*handlers: Any, immediate_retries: int = 0) -> Endpoint:
    endpoint = Endpoint("sales", immediate_retries=immediate_retries)
    for handler in handlers:
        endpoint.register(handler, Ping)
    return endpoint


def pipeline_of(*handlers: Any, immediate_retries: int = 0) -> Pipeline:
    return endpoint_of(*handlers, immediate_retries=immediate_retries).create_pipeline()


def received(n: int, headers: dict[str, str] | None = None) -> TransportMessage:
    outgoing = create_outgoing(Ping(n), headers=headers)
    return TransportMessage(native_id=uuid.UUID(outgoing.message_id), seq=1,
                            headers=dict(outgoing.headers), raw_headers="{}", body=outgoing.body)


def unit(dispatcher: Any = None) -> Unit:
    # No executor: any step that would write to a queue fails the test at once.
    return Unit(None, dispatcher or NoDispatcher(), None)  # type: ignore[arg-type]


async def process(pipeline: Pipeline, message: TransportMessage,
                  committed: bool = True) -> Outcome:
    """One call into the chain; then the end of the transaction, as a strategy does it."""
    attempt = unit()
    outcome = await pipeline.run(message, attempt)
    if outcome is Outcome.FAILED or not committed:
        attempt.rolled_back()
    else:
        attempt.committed()
    return outcome


def test_the_built_in_steps_in_their_order() -> None:
    assert list(pipeline_of().steps) == [
        "log_context", "recoverability", "metrics", "invoke_handlers"]
    audited = Endpoint("sales", audit_queue="audit", transaction=Outbox())
    assert list(audited.create_pipeline().steps) == [
        "log_context", "recoverability", "metrics", "outbox", "audit", "invoke_handlers"]


async def test_handlers_run_in_registration_order_and_count_once_their_work_commits() -> None:
    seen: list[tuple[str, int]] = []

    async def first(message: Ping, context: HandlerContext) -> None:
        seen.append(("first", message.n))

    async def second(message: Ping, context: HandlerContext) -> None:
        seen.append(("second", message.n))

    pipeline = pipeline_of(first, second)
    attempt = unit()
    assert await pipeline.run(received(7), attempt) is Outcome.HANDLED
    assert seen == [("first", 7), ("second", 7)]
    assert pipeline.stats.processed == 0  # counted once its work commits
    attempt.committed()
    assert pipeline.stats.processed == 1
    attempt.committed()  # the hooks run once
    assert pipeline.stats.processed == 1


async def test_a_rolled_back_commit_is_charged_to_the_message_and_not_counted_processed(
) -> None:
    async def fine(message: Ping, context: HandlerContext) -> None:
        pass

    pipeline = pipeline_of(fine, immediate_retries=1)
    message, attempt = received(1), unit()
    assert await pipeline.run(message, attempt) is Outcome.HANDLED
    attempt.rolled_back(RuntimeError("the COMMIT failed"))
    assert (pipeline.stats.processed, pipeline.stats.failed) == (0, 1)
    failure = pipeline.failures.get(message.native_id)
    assert failure is not None
    assert failure.exception_type == "builtins.RuntimeError"


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
    assert await process(pipeline, message) is Outcome.HANDLED  # an immediate retry
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
    decision = pipeline.step("recoverability").pending_decision(message)
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


# -- user steps ---------------------------------------------------------------------------


async def test_user_steps_run_in_their_places_between_recoverability_and_the_handlers() -> None:
    order: list[str] = []

    def step(name: str) -> Any:
        async def run(context: IncomingContext, next: Next) -> None:
            order.append(name)
            await next(context)
        return run

    async def handler(message: Ping, context: HandlerContext) -> None:
        order.append("handler")

    endpoint = endpoint_of(handler)
    endpoint.add_step("b", step("b"))
    endpoint.add_step("c", step("c"), before="invoke_handlers")
    endpoint.add_step("a", step("a"), after="recoverability")
    endpoint.add_step("b2", step("b2"), after="b")
    endpoint.add_step("a2", step("a2"), before="b")
    pipeline = endpoint.create_pipeline()
    assert list(pipeline.steps) == ["log_context", "recoverability", "metrics",
                                    "a", "a2", "b", "b2", "c", "invoke_handlers"]
    assert await process(pipeline, received(1)) is Outcome.HANDLED
    assert order == ["a", "a2", "b", "b2", "c", "handler"]


@pytest.mark.parametrize(("options", "error"), [
    ({"before": "recoverability"}, "user steps run after recoverability"),
    ({"after": "invoke_handlers"}, "user steps run after recoverability"),
    ({"before": "log_context"}, "user steps run after recoverability"),
    ({"after": "outbox"}, "user steps run after recoverability"),
    ({"before": "later"}, "user steps run after recoverability"),
    ({"before": "invoke_handlers", "after": "recoverability"}, "not both"),
])
def test_a_step_outside_the_documented_positions_fails_at_once(
        options: dict[str, str], error: str) -> None:
    async def step(context: IncomingContext, next: Next) -> None:
        await next(context)

    with pytest.raises(ConfigurationError, match=error):
        endpoint_of().add_step("mine", step, **options)


def test_a_step_name_is_taken_once() -> None:
    async def step(context: IncomingContext, next: Next) -> None:
        await next(context)

    endpoint = endpoint_of()
    endpoint.add_step("mine", step)
    for name in ("mine", "audit", "recoverability"):
        with pytest.raises(ConfigurationError, match="exists already"):
            endpoint.add_step(name, step)


async def test_a_step_that_raises_fails_the_attempt_like_a_handler() -> None:
    runs = 0

    async def strict(context: IncomingContext, next: Next) -> None:
        if Headers.CORRELATION_ID in context.headers:
            raise PermissionError("no tenant")
        await next(context)

    async def handler(message: Ping, context: HandlerContext) -> None:
        nonlocal runs
        runs += 1

    endpoint = endpoint_of(handler, immediate_retries=2)
    endpoint.add_step("strict", strict)
    pipeline = endpoint.create_pipeline()
    message = received(1)
    assert await process(pipeline, message) is Outcome.FAILED
    failure = pipeline.failures.get(message.native_id)
    assert failure is not None
    assert (failure.attempts, failure.exception_type) == (1, "builtins.PermissionError")
    assert (runs, pipeline.stats.failed) == (0, 1)


async def test_a_step_that_does_not_call_next_consumes_the_message() -> None:
    runs = 0

    async def skip(context: IncomingContext, next: Next) -> None:
        context.items["skipped"] = True

    async def handler(message: Ping, context: HandlerContext) -> None:
        nonlocal runs
        runs += 1

    endpoint = endpoint_of(handler)
    endpoint.add_step("skip", skip)
    pipeline = endpoint.create_pipeline()
    assert await process(pipeline, received(1)) is Outcome.HANDLED
    assert (runs, pipeline.stats.processed, pipeline.stats.failed) == (0, 0, 0)


async def test_an_outgoing_hook_of_a_step_sees_every_message_the_handlers_send() -> None:
    async def tenant(context: IncomingContext, next: Next) -> None:
        value = context.headers.get("Acme.Tenant")
        if value is not None:
            def stamp(headers: MutableMapping[str, str]) -> None:
                headers.setdefault("Acme.Tenant", value)
            context.on_outgoing(stamp)
        await next(context)

    async def handler(message: Ping, context: HandlerContext) -> None:
        await context.send(Ping(message.n + 1), destination="billing")
        await context.send_local(Ping(0), headers={"Acme.Tenant": "own"})
        await context.reply(Ping(-1))

    endpoint = endpoint_of(handler)
    endpoint.add_step("tenant", tenant)
    pipeline = endpoint.create_pipeline()
    dispatcher = Recording()
    message = received(1, headers={"Acme.Tenant": "north", Headers.REPLY_TO_ADDRESS: "web"})
    assert await pipeline.run(message, unit(dispatcher)) is Outcome.HANDLED
    assert [(str(a), m.headers["Acme.Tenant"]) for a, m in dispatcher.sent] == [
        ("public.billing", "north"), ("public.sales", "own"), ("public.web", "north")]


async def test_after_commit_and_after_rollback_hooks_run_once_for_the_end_that_came() -> None:
    ended: list[str] = []

    async def watch(context: IncomingContext, next: Next) -> None:
        context.unit.after_commit(lambda: ended.append("committed"))
        context.unit.after_rollback(lambda charged: ended.append(f"rolled back {charged!r}"))
        await next(context)

    async def handler(message: Ping, context: HandlerContext) -> None:
        pass

    endpoint = endpoint_of(handler, immediate_retries=1)
    endpoint.add_step("watch", watch)
    pipeline = endpoint.create_pipeline()
    await process(pipeline, received(1))
    await process(pipeline, received(2), committed=False)
    assert ended == ["committed", "rolled back None"]


async def test_the_unit_says_whether_the_handlers_ran_for_the_strategy_to_count() -> None:
    async def skip_odd(context: IncomingContext, next: Next) -> None:
        if context.headers.get("Skip"):
            return
        await next(context)

    async def handler(message: Ping, context: HandlerContext) -> None:
        pass

    endpoint = endpoint_of(handler)
    endpoint.add_step("skip", skip_odd)
    pipeline = endpoint.create_pipeline()
    ran, skipped = unit(), unit()
    assert await pipeline.run(received(1), ran) is Outcome.HANDLED
    assert await pipeline.run(received(2, headers={"Skip": "yes"}), skipped) is Outcome.HANDLED
    assert (ran.handled, skipped.handled) == (True, False)
    assert (ran.moved_to_error, skipped.moved_to_error) == (False, False)


async def test_only_the_attempt_that_may_be_the_last_formats_its_stack_trace() -> None:
    """Formatting a trace costs ~0.1-0.2 ms: attempts retried at once keep none; the one
    whose next step is the error queue keeps its own (what the error-queue copy carries)."""
    runs = 0

    def failing_in_attempt(n: int) -> None:
        raise ValueError(f"attempt {n} fails")

    async def always(message: Ping, context: HandlerContext) -> None:
        nonlocal runs
        runs += 1
        failing_in_attempt(runs)

    pipeline = pipeline_of(always, immediate_retries=2)
    message = received(1)
    for attempt in (1, 2):
        assert await process(pipeline, message) is Outcome.FAILED
        failure = pipeline.failures.get(message.native_id)
        assert failure is not None
        assert (failure.attempts, failure.stack_trace) == (attempt, "")
        assert failure.source == "failing_in_attempt"
    assert await process(pipeline, message) is Outcome.FAILED  # the last: error queue next
    failure = pipeline.failures.get(message.native_id)
    assert failure is not None
    assert failure.attempts == 3
    assert "Traceback" in failure.stack_trace
    assert "ValueError: attempt 3 fails" in failure.stack_trace
    assert pipeline.failures.text_size == len(failure.message) + len(failure.stack_trace)
