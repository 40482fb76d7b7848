"""A batch's receive span and the mover's delivery spans, without a database or Ray: spans
made by a real SDK into an in-memory exporter of the test's own (across processes:
tests/e2e/test_tracing.py)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id

from endpoint_runtime import HandlerContext
from endpoint_runtime.chain.pipeline import Unit
from endpoint_runtime.chain.tracing.delivery import DeliverySpans
from endpoint_runtime.delayed.store import DelayedMessage
from tests.unit.test_pipeline import Recording
from tests.unit.test_tracing import PARENT_ID, TRACE_ID, Order, received, traced_pipeline


def exporting(sampler: Sampler = ALWAYS_ON) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def accept(message: Order, context: HandlerContext) -> None:
    return None


async def test_each_message_of_a_batch_links_to_its_receive_span() -> None:
    provider, exporter = exporting()
    pipeline = traced_pipeline(provider, accept)
    messages = [received({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}) for _ in range(3)]
    with pipeline.batch() as batch:
        batch.taken(len(messages))
        for message in messages:
            await pipeline.run(message, Unit(None, Recording(), None))
    outside = received()
    await pipeline.run(outside, Unit(None, Recording(), None))  # after the batch: no link

    spans = exporter.get_finished_spans()
    [receive] = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert receive.name == "receive public.sales"
    assert receive.parent is None  # a root of its own
    assert receive.attributes is not None
    assert receive.attributes["messaging.operation.type"] == "receive"
    assert receive.attributes["messaging.batch.message_count"] == 3
    assert receive.attributes["messaging.destination.name"] == "public.sales"
    processed = [s for s in spans if s.kind is SpanKind.CONSUMER]
    assert len(processed) == 4
    for span in processed[:3]:  # each continues its own trace, linked to the receive
        assert format_trace_id(span.context.trace_id) == TRACE_ID
        [link] = span.links
        assert link.context.span_id == receive.context.span_id
        assert link.attributes == {"endpoint_runtime.link": "receive"}
    assert processed[3].links == ()


class DropReceives(Sampler):
    """Samples every span but the receive spans."""

    def should_sample(self, parent_context: Any, trace_id: int, name: str,
                      *args: Any, **kwargs: Any) -> SamplingResult:
        return (ALWAYS_OFF if name.startswith("receive") else ALWAYS_ON).should_sample(
            parent_context, trace_id, name, *args, **kwargs)

    def get_description(self) -> str:
        return "DropReceives"


async def test_an_empty_receive_makes_no_span_and_a_sampled_out_one_no_link() -> None:
    provider, exporter = exporting(DropReceives())
    pipeline = traced_pipeline(provider, accept)
    with pipeline.batch() as batch:
        batch.taken(1)
        await pipeline.run(received(), Unit(None, Recording(), None))
    [span] = exporter.get_finished_spans()
    assert span.kind is SpanKind.CONSUMER
    assert span.links == ()  # to a span no backend receives
    provider, exporter = exporting()
    pipeline = traced_pipeline(provider, accept)
    with pipeline.batch() as batch:
        batch.taken(0)
    assert exporter.get_finished_spans() == ()


async def test_a_message_run_again_in_its_batch_links_to_the_run_before() -> None:
    """An optimistic batch's replay runs the same received message again: the header the
    first run wrote makes the second a new span linked to it."""
    provider, exporter = exporting()
    pipeline = traced_pipeline(provider, accept)
    message = received({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    with pipeline.batch() as batch:
        batch.taken(1)
        for _ in range(2):
            await pipeline.run(message, Unit(None, Recording(), None))
    first, replay = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert replay.context.span_id != first.context.span_id
    assert {link.attributes["endpoint_runtime.link"]: link.context.span_id  # type: ignore[index]
            for link in replay.links}["previous_attempt"] == first.context.span_id


def stored(headers: dict[str, str] | str, failures: int = 0) -> DelayedMessage:
    return DelayedMessage(id=uuid.uuid4(), destination="public.shipping",
                          due=datetime.now(UTC), failures=failures, body=b"{}",
                          headers=headers if isinstance(headers, str) else json.dumps(headers))


def test_a_dispatched_message_gets_a_span_in_its_trace_linked_to_its_last_attempt() -> None:
    provider, exporter = exporting()
    earlier = "2" * 16
    message = stored({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01",
                      "NServiceBus.MessageId": "m-1",
                      "EndpointRuntime.ProcessingTraceParent": f"00-{TRACE_ID}-{earlier}-01"})
    DeliverySpans("shipping", provider.get_tracer("test"))(message, 1_000, None, "dispatched")

    [span] = exporter.get_finished_spans()
    assert span.name == "deliver public.shipping"
    assert span.kind is SpanKind.PRODUCER
    assert span.start_time == 1_000
    assert format_trace_id(span.context.trace_id) == TRACE_ID
    assert span.parent is not None
    assert format_span_id(span.parent.span_id) == PARENT_ID
    [link] = span.links
    assert format_span_id(link.context.span_id) == earlier
    assert span.attributes is not None
    assert span.attributes["messaging.operation.name"] == "deliver"
    assert span.attributes["messaging.message.id"] == "m-1"
    assert span.status.status_code is StatusCode.UNSET


@pytest.mark.parametrize(("outcome", "action"), [("postponed", None),
                                                 ("error_queue", "error_queue")])
def test_a_failed_dispatch_records_its_exception(outcome: str, action: str | None) -> None:
    provider, exporter = exporting()
    message = stored({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}, failures=2)
    DeliverySpans("shipping", provider.get_tracer("test"))(
        message, 1_000, LookupError("no queue shipping"), outcome)

    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "builtins.LookupError"
    assert span.attributes["endpoint_runtime.delayed.dispatch_failures"] == 2
    assert span.attributes.get("nservicebus.recoverability_action") == action


@pytest.mark.parametrize("headers", ["not json", "[1, 2]", '{"traceparent": null}'])
def test_headers_that_do_not_parse_give_a_root_span(headers: str) -> None:
    provider, exporter = exporting()
    DeliverySpans("shipping", provider.get_tracer("test"))(stored(headers), 1_000, None,
                                                           "dispatched")
    [span] = exporter.get_finished_spans()
    assert span.parent is None
