"""Traces across endpoints on real Ray: every receiver process exports its spans over
OTLP/HTTP to a receiver this test starts, and one trace per order comes out of it, with the
parent/child structure of sends, publishes, retries, a delayed retry, the delayed-message
mover's deliveries and the error queue; batches with their receive spans and replays."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import format_span_id, format_trace_id

from endpoint_runtime import Sender, TransportSettings
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.wire.messages import Headers, TransportMessage
from endpoint_runtime.wire.serialization import message_type_name
from tests.e2e.conftest import Deployer, count, create_queues, drain_queue, wait_for
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.tracing_endpoints import (
    BatchedTracedOrder,
    PlaceTracedOrder,
    ShipTracedOrder,
    TracedOrderPlaced,
)

pytestmark = pytest.mark.ray

MODULE = "tests.support.tracing_endpoints"
PROCESSING_TRACEPARENT = "EndpointRuntime.ProcessingTraceParent"


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def exporting(otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> OtlpReceiver:
    """The deploying process's OTEL_* variables, which the receivers get: export to the
    test's receiver, spans only when a receiver stops (a batch every minute otherwise: the
    spans the tests see are those the stop flushed)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "300")
    otlp.received.spans.clear()
    return otlp


def one(spans: list[ReceivedSpan], **match: object) -> ReceivedSpan:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s.service, s.name, s.parent_id) for s in spans])
    return found[0]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_id == parent.span_id]


async def test_one_trace_per_order_through_sales_billing_and_shipping(
    deployer: Deployer, transport: PostgresTransport, database_dsn: str,
    exporting: OtlpReceiver,
) -> None:
    await create_queues(transport, "audit")
    deployments = [await deployer.start(name, module=MODULE)
                   for name in ("shipping", "billing", "sales")]
    # The web request that places the orders: its span is the callers' current context (an
    # SDK of the test's own, exporting nowhere); Sender(tracing=True) continues it.
    web = TracerProvider().get_tracer("web")
    roots, sent = {}, {}
    async with Sender("web", TransportSettings(dsn=database_dsn), tracing=True) as sender:
        for order in ("plain-1", "flaky-1", "doomed-1"):
            with web.start_as_current_span(f"POST /orders/{order}") as root:
                sent[order] = await sender.send(PlaceTracedOrder(order_id=order), "trace_sales")
            roots[order] = root.get_span_context()

    async def settled() -> bool:
        # 3 placed, 3 billed, 2 shipped: 8 audit copies; doomed-1 in the error queue.
        return (await count(transport.pool, "SELECT count(*) FROM audit") == 8
                and await count(transport.pool, "SELECT count(*) FROM error") == 1)

    await wait_for(settled, timeout=90, what="8 audit copies and 1 message in the error queue")
    for deployment in deployments:  # the receivers flush their spans as they stop
        await deployer.stop(deployment)
    spans = exporting.received.snapshot()

    trace_ids = {format_trace_id(root.trace_id): order for order, root in roots.items()}
    strays = [(s.service, s.name) for s in spans if s.trace_id not in trace_ids]
    assert not strays, f"spans outside the orders' traces: {strays}"
    for order, root in roots.items():
        ours = [s for s in spans if s.trace_id == format_trace_id(root.trace_id)]
        # The Sender's send span (no SDK exports it here) carries the web request's context.
        placed = one(ours, name="process public.trace_sales")
        assert placed.parent_id == format_span_id(root.span_id)
        assert placed.service == "trace_sales"
        assert placed.kind == "SPAN_KIND_CONSUMER"
        assert placed.attributes["messaging.system"] == "endpoint_runtime"
        assert placed.attributes["messaging.operation.type"] == "process"
        assert placed.attributes["messaging.destination.name"] == "public.trace_sales"
        assert placed.attributes["messaging.message.id"] == sent[order]
        assert placed.attributes["messaging.message.conversation_id"] == sent[order]
        assert placed.attributes["nservicebus.originating_endpoint"] == "web"
        assert not placed.error
        published = one(children(ours, placed), kind="SPAN_KIND_PRODUCER")
        assert published.name == f"publish {message_type_name(TracedOrderPlaced)}"
        assert published.attributes["messaging.operation.name"] == "publish"
        assert published.attributes["nservicebus.event_types"] == message_type_name(
            TracedOrderPlaced)
        billed = children(ours, published)
        assert {s.service for s in billed} == {"trace_billing"}
        assert len(billed) == (2 if order.startswith("flaky") else 1)
        failed_bills = [s for s in billed if s.error]
        if order.startswith("flaky"):
            [failure] = failed_bills
            assert failure.attributes["nservicebus.recoverability_action"] == "immediate_retry"
            assert failure.attributes["error.type"] == "builtins.RuntimeError"
            [(event, details)] = failure.events
            assert event == "exception"
            assert "card declined" in details["exception.message"]
        else:
            assert not failed_bills
        [bill] = [s for s in billed if not s.error]
        shipped_send = one(children(ours, bill), kind="SPAN_KIND_PRODUCER")
        assert shipped_send.name == "send public.trace_shipping"
        assert shipped_send.attributes["messaging.destination.name"] == "public.trace_shipping"
        assert "nservicebus.deliver_at" in shipped_send.attributes  # the deferred send
        shipping = [s for s in children(ours, shipped_send) if s.kind == "SPAN_KIND_CONSUMER"]
        assert {s.service for s in shipping} == {"trace_shipping"}
        # billing's mover delivered the deferred send when it was due: a span beside them.
        delivered = [s for s in children(ours, shipped_send) if s.kind == "SPAN_KIND_PRODUCER"]
        from_billing = one(delivered, service="trace_billing")
        assert from_billing.name == "deliver public.trace_shipping"
        assert from_billing.attributes["messaging.operation.name"] == "deliver"
        assert from_billing.attributes["messaging.message.id"] == (
            shipped_send.attributes["messaging.message.id"])
        assert from_billing.resource["service.instance.id"] == "trace_billing-peeker"
        assert not from_billing.error
        assert from_billing.links == []
        for span in (*billed, *shipping):  # one conversation from the web request on
            assert span.attributes["messaging.message.conversation_id"] == sent[order]
        if not order.startswith("doomed"):
            [shipped] = shipping
            assert not shipped.error
            assert len(delivered) == 1
            continue
        # Two failed attempts, the second's decision a delayed retry, two more failed
        # attempts, the last's decision the error queue: one span per attempt, none for the
        # deliveries that carried the decisions out (their moves are the attempts' children).
        actions = [s.attributes.get("nservicebus.recoverability_action") for s in shipping]
        assert sorted(actions) == sorted(["immediate_retry", "delayed_retry",
                                          "immediate_retry", "error_queue"])
        assert sum(s.error for s in shipping) == 4 == len(shipping)
        moves = {s.name: s for p in shipping for s in children(ours, p)}
        assert set(moves) == {"delayed retry public.trace_shipping", "move to error public.error"}
        [storing] = [p for p in shipping if moves["delayed retry public.trace_shipping"]
                     in children(ours, p)]
        [moving] = [p for p in shipping if moves["move to error public.error"]
                    in children(ours, p)]
        assert storing.attributes["nservicebus.recoverability_action"] == "delayed_retry"
        assert moving.attributes["nservicebus.recoverability_action"] == "error_queue"
        retried = [s for s in shipping if s.attributes.get("nservicebus.delayed_retries") == "1"]
        assert len(retried) == 2  # the attempts after the delayed retry carry its header
        for span in shipping:  # ... and link to the delivery that stored it
            expected = [(storing.trace_id, storing.span_id)] if span in retried else []
            assert span.links == expected, span
        # shipping's mover delivered the delayed retry: linked to the attempt that stored it.
        retry_delivered = one(delivered, service="trace_shipping")
        assert retry_delivered.name == "deliver public.trace_shipping"
        assert retry_delivered.links == [(storing.trace_id, storing.span_id)]
        assert len(delivered) == 2
        [error_copy] = await drain_queue(transport, "error")
        assert isinstance(error_copy, TransportMessage)
        assert error_copy.headers[PROCESSING_TRACEPARENT].split("-")[2] == moving.span_id

    audited = [m for m in await drain_queue(transport, "audit")
               if isinstance(m, TransportMessage)]
    assert len(audited) == 8
    processing = {s.span_id: s for s in spans if s.kind == "SPAN_KIND_CONSUMER"}
    for copy in audited:  # each audit copy names the span that processed the message
        _, trace_id, span_id, _ = copy.headers[PROCESSING_TRACEPARENT].split("-")
        assert processing[span_id].trace_id == trace_id
        assert processing[span_id].service == copy.headers[Headers.PROCESSING_ENDPOINT]
    assert {"nservicebus.messaging.successes", "nservicebus.messaging.critical_time",
            "messaging.process.duration"} <= exporting.received.metrics.get("trace_sales", set())
    assert "nservicebus.recoverability.error" in exporting.received.metrics["trace_shipping"]
    assert "endpoint_runtime.queue.length" in exporting.received.metrics["trace_billing"]


async def test_a_message_in_nservicebus_wire_format_continues_its_traceparent(
    deployer: Deployer, transport: PostgresTransport, exporting: OtlpReceiver,
) -> None:
    await create_queues(transport, "audit")
    deployment = await deployer.start("shipping", module=MODULE)
    await deployer.start("endpoint", module="endpoint_runtime.ingestion")  # audit -> audit_log
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    message_id = str(uuid.uuid4())
    headers = {  # as an NServiceBus endpoint writes them (assembly-qualified type name)
        Headers.MESSAGE_ID: message_id,
        Headers.CONVERSATION_ID: message_id,
        Headers.CORRELATION_ID: message_id,
        Headers.MESSAGE_INTENT: "Send",
        Headers.CONTENT_TYPE: "application/json",
        Headers.ENCLOSED_MESSAGE_TYPES: (f"{message_type_name(ShipTracedOrder)}, Shipping, "
                                         "Version=1.0.0.0, Culture=neutral, PublicKeyToken=null"),
        Headers.ORIGINATING_ENDPOINT: "Sales",
        Headers.TIME_SENT: "2026-11-27 08:00:00:000000 Z",
        "traceparent": f"00-{trace_id}-{parent_id}-01",
        "tracestate": "vendor=nservicebus",
    }
    await transport.pool.execute(
        "INSERT INTO public.trace_shipping (id, expires, headers, body) VALUES ($1, NULL, $2, $3)",
        uuid.UUID(message_id), json.dumps(headers), b'{"order_id": "from-nservicebus"}')

    async def ingested() -> bool:
        return await count(transport.pool, "SELECT count(*) FROM audit_log") == 1

    await wait_for(ingested, timeout=60, what="the NServiceBus message processed and audited")
    await deployer.stop(deployment)
    [span] = [s for s in exporting.received.snapshot() if s.trace_id == trace_id]
    assert span.parent_id == parent_id
    # audit_log keeps the trace: the sender's traceparent and the processing span's.
    row = await transport.pool.fetchrow("SELECT message_id, headers FROM audit_log")
    stored = json.loads(row["headers"])
    assert row["message_id"] == message_id
    assert stored["traceparent"] == headers["traceparent"]
    assert stored[PROCESSING_TRACEPARENT] == f"00-{trace_id}-{span.span_id}-01"
    assert span.name == "process public.trace_shipping"
    assert span.attributes["nservicebus.originating_endpoint"] == "Sales"
    assert span.attributes["messaging.message.id"] == message_id
    assert not span.error


async def test_a_batch_has_one_receive_span_and_a_replay_links_to_the_run_before(
    deployer: Deployer, transport: PostgresTransport, database_dsn: str,
    exporting: OtlpReceiver,
) -> None:
    """Batches of up to 5 in one slot (optimistic isolation), all ten messages waiting before
    the endpoint starts. fail-once-2's first attempt runs a statement and fails: its batch
    rolls back to the checkpoint and runs the messages before it again (at least b-1: the
    batch that takes fail-once-2 takes the lowest seqs not taken, and the peeker locks at
    most the lowest for a moment); fail-once-2 goes back with its seq and comes in a later
    batch."""
    await create_queues(transport, "audit", "trace_batched")
    orders = [f"b-{n}" if n != 2 else "fail-once-2" for n in range(10)]
    web = TracerProvider().get_tracer("web")
    sent, roots = {}, {}
    async with Sender("web", TransportSettings(dsn=database_dsn), tracing=True) as sender:
        for order in orders:  # in seq order, all waiting before the endpoint starts
            with web.start_as_current_span(f"POST /orders/{order}") as root:
                message_id = await sender.send(BatchedTracedOrder(order_id=order),
                                               "trace_batched")
            sent[message_id] = order
            roots[order] = (format_trace_id(root.get_span_context().trace_id),
                            format_span_id(root.get_span_context().span_id))
    deployment = await deployer.start("batched", module=MODULE)

    async def audited() -> bool:
        return await count(transport.pool, "SELECT count(*) FROM audit") == len(orders)

    await wait_for(audited, timeout=90, what="10 audit copies")
    await deployer.stop(deployment)
    spans = [s for s in exporting.received.snapshot() if s.service == "trace_batched"]

    receives = {s.span_id: s for s in spans if s.name == "receive public.trace_batched"}
    for receive in receives.values():
        assert receive.kind == "SPAN_KIND_CLIENT"
        assert receive.parent_id == ""  # a root of its own
        assert receive.attributes["messaging.operation.type"] == "receive"
        assert receive.attributes["messaging.destination.name"] == "public.trace_batched"
        assert 1 <= receive.attributes["messaging.batch.message_count"] <= 5
    # Ten messages, fail-once-2 received twice.
    assert sum(r.attributes["messaging.batch.message_count"] for r in receives.values()) == 11
    attempts: dict[str, list[tuple[ReceivedSpan, str]]] = {order: [] for order in orders}
    in_batch: dict[str, set[str]] = {span_id: set() for span_id in receives}
    for span in (s for s in spans if s.kind == "SPAN_KIND_CONSUMER"):
        order = sent[span.attributes["messaging.message.id"]]
        # Each message continues its own trace, linked to the receive of its batch.
        assert (span.trace_id, span.parent_id) == roots[order]
        [batch] = [span_id for _, span_id in span.links if span_id in receives]
        attempts[order].append((span, batch))
        in_batch[batch].add(order)
    for span_id, members in in_batch.items():  # every message of a batch links to its span
        assert len(members) == receives[span_id].attributes["messaging.batch.message_count"]

    [(failure, failed_in)] = [(s, b) for s, b in attempts["fail-once-2"] if s.error]
    assert failure.attributes["error.type"] == "builtins.RuntimeError"
    [(retried, retried_in)] = [(s, b) for s, b in attempts["fail-once-2"] if not s.error]
    assert retried_in != failed_in  # its immediate retry: a later batch, no link to the first
    assert len(retried.links) == 1
    replayed = {order for order in in_batch[failed_in] if orders.index(order) < 2}
    assert "b-1" in replayed
    for order in orders:
        found = attempts[order]
        if order not in replayed:
            assert len(found) == (2 if order == "fail-once-2" else 1), order
            continue
        # Run again in its batch: a new span, linked to the first run and to the receive.
        (first, batch), (again, batch_again) = sorted(found, key=lambda a: len(a[0].links))
        assert batch == batch_again == failed_in
        assert set(again.links) == {(first.trace_id, first.span_id),
                                    (receives[batch].trace_id, batch)}
        assert not first.error
        assert not again.error
