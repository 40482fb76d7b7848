"""One ``process`` span per delivery attempt of a failed message, on real PostgreSQL (no Ray):
the delivery that carries out the last attempt's decision (a move to the error queue, a
delayed retry) makes none of its own; the move is the failed attempt's child and the copies
name that attempt."""

from __future__ import annotations

import msgspec
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, format_span_id

from endpoint_runtime import Endpoint, HandlerContext
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.tracing.attributes import PROCESSING_TRACEPARENT
from endpoint_runtime.chain.tracing.step import TracingStep
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.wire.messages import TransportMessage
from tests.support.draining import drain, received_all


class Charge(msgspec.Struct):
    n: int


def failing(delayed_retries: int) -> Endpoint:
    endpoint = Endpoint("payments", tracing=True, immediate_retries=1,
                        delayed_retries=delayed_retries, delayed_retry_delay=0.0)

    @endpoint.handler
    async def charge(message: Charge, context: HandlerContext) -> None:
        raise RuntimeError(f"card declined for {message.n}")

    return endpoint


async def run(transport: PostgresTransport, endpoint: Endpoint,
              provider: TracerProvider) -> None:
    """Receive on one slot until the queue is empty, spans to ``provider``."""
    pipeline = endpoint.create_pipeline()
    step: TracingStep = pipeline.step("tracing")
    step.use(provider.get_tracer("test"))
    await drain(transport, endpoint, pipeline)


def process_spans(spans: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    return [s for s in spans if s.kind is SpanKind.CONSUMER]


async def test_a_message_moved_to_the_error_queue_has_one_span_per_attempt_and_the_move_as_its_child(  # noqa: E501
    transport: PostgresTransport, exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = exported
    for queue in ("payments", "error"):
        await transport.create_queue(queue)
    await transport.send("payments", create_outgoing(Charge(1)))

    await run(transport, failing(delayed_retries=0), provider)

    spans = exporter.get_finished_spans()
    attempts = process_spans(spans)
    assert len(attempts) == 2  # the first attempt and its immediate retry; nothing else
    assert all(s.status.status_code is StatusCode.ERROR for s in attempts)
    assert [s.attributes["nservicebus.recoverability_action"] for s in attempts] == [
        "immediate_retry", "error_queue"]
    last = attempts[-1]
    assert [event.name for event in last.events] == ["exception"]
    [move] = [s for s in spans if s.kind is SpanKind.PRODUCER]
    assert move.name == "move to error public.error"
    assert move.parent is not None
    assert move.parent.span_id == last.context.span_id
    [copy] = await received_all(transport, "error")
    assert isinstance(copy, TransportMessage)
    assert copy.headers[PROCESSING_TRACEPARENT].split("-")[2] == format_span_id(
        last.context.span_id)
