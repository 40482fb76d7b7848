"""Where tracing's time goes, per message, in the chain alone (no database, no Ray).

The same 20,000 received messages go through an endpoint's chain in this process (the
handler of ``benchmarks.endpoints``: one send), with tracing off and on, spans made by the SDK
with a batch span processor whose exporter drops them; the CPU time per message of each, and
the OTLP/protobuf encoding time per span that an exporter adds in the receiver (measured on
the spans of the ``on`` pass): the SDK's encoder, what a receiver's OTLP exporter uses (the
runtime's own encoder was removed on 2026-12-01: its saving did not show end to end). The
baseline is tracing off in the same run; ratios are off/on. Run ``python -m
benchmarks.tracing_profile``; ``--profile MODE`` prints cProfile's top functions for one mode
instead. ``--modes off`` imports nothing of tracing: with ``PYTHONPATH`` naming another
checkout's package, it measures the chain of code from before tracing existed (what "off
costs nothing" is checked against).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import endpoint_runtime
from benchmarks.common import median
from benchmarks.endpoints import Work, echo
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.pipeline import Pipeline, Unit
from endpoint_runtime.runtime.endpoint import Endpoint
from endpoint_runtime.testing import RecordingDispatcher
from endpoint_runtime.wire.messages import TransportMessage

MODES = ("off", "always_on", "ratio_0.1", "ratio_0.1_downstream")
"""``ratio_0.1``: messages without a trace (each a new root, sampled at 10 %);
``ratio_0.1_downstream``: messages of an upstream endpoint sampling 10 % (their
``traceparent`` sampled for one in ten), as most messages of a traced flow arrive."""


class Keep:
    """An exporter that drops the spans, keeping the last batch (to time their encoding)."""

    def __init__(self) -> None:
        self.last: Sequence[Any] = ()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.last = spans
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def chain(mode: str, exporter: Keep) -> tuple[Pipeline, Any]:
    if mode == "off":  # the constructor as before tracing existed
        endpoint = Endpoint("bench_atomic")
        endpoint.register(echo)
        return endpoint.create_pipeline(), None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    endpoint = Endpoint("bench_atomic", tracing=True)
    endpoint.register(echo)
    pipeline = endpoint.create_pipeline()
    sampler = ALWAYS_ON if mode == "always_on" else ParentBased(TraceIdRatioBased(0.1))
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=2048))
    pipeline.step("tracing").use(provider.get_tracer("benchmark"))
    return pipeline, provider


def received(count: int, mode: str = "off") -> list[TransportMessage]:
    messages = []
    for n in range(count):
        headers = None
        if mode.endswith("downstream"):
            flags = "01" if n % 10 == 0 else "00"
            headers = {"traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-{flags}"}
        outgoing = create_outgoing(Work(n, time.time()), originating_endpoint="bench",
                                   headers=headers)
        messages.append(TransportMessage(native_id=uuid.uuid4(), seq=n,
                                         headers=dict(outgoing.headers), raw_headers="",
                                         body=outgoing.body))
    return messages


async def cpu_per_message(pipeline: Pipeline, messages: list[TransportMessage]) -> float:
    dispatcher = RecordingDispatcher()
    started = time.process_time()
    for message in messages:
        unit = Unit(None, dispatcher, None)  # type: ignore[arg-type]  # no moves here
        await pipeline.run(message, unit)
        unit.committed()
        dispatcher.dispatched.clear()
    return (time.process_time() - started) / len(messages) * 1e6


FLOOR_ATTRIBUTES = {"messaging.system": "postgresql", "messaging.destination.name": "sales",
                    "messaging.operation.type": "process", "messaging.message.id": "id",
                    "messaging.message.conversation_id": "conversation"}
"""Five attributes, as a ``process`` span carries."""


def sdk_span_floor(spans: int, rounds: int) -> dict[str, float]:
    """The SDK's own CPU per span, nothing of the runtime around it: ``start_span`` with
    :data:`FLOOR_ATTRIBUTES` and ``end``, a batch span processor whose exporter drops the
    spans; ``always_on`` (a recorded span) and ``ratio_0.1_root`` (a new root the
    ``parentbased_traceidratio`` 0.1 sampler drops nine times in ten). Best of ``rounds``.
    What no change in the runtime can take away while spans are the SDK's."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased
    from opentelemetry.trace import SpanKind

    floor = {}
    for name, sampler in (("always_on", ALWAYS_ON),
                          ("ratio_0.1_root", ParentBased(TraceIdRatioBased(0.1)))):
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(Keep()))  # as a receiver's: defaults
        tracer = provider.get_tracer("benchmark")
        best = float("inf")
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(spans):
                tracer.start_span("process", kind=SpanKind.CONSUMER,
                                  attributes=FLOOR_ATTRIBUTES).end()
            best = min(best, (time.process_time() - started) / spans * 1e6)
        provider.shutdown()
        floor[name] = round(best, 1)
    return floor


def measure(args: argparse.Namespace) -> dict[str, Any]:
    per_mode: dict[str, list[float]] = {mode: [] for mode in args.modes}
    encode: list[float] = []
    for _ in range(args.rounds):
        for mode in args.modes:  # the modes alternate within each round
            exporter = Keep()
            pipeline, provider = chain(mode, exporter)
            per_mode[mode].append(asyncio.run(cpu_per_message(pipeline,
                                                              received(args.messages, mode))))
            if provider is not None:
                provider.force_flush()
                provider.shutdown()
            if mode == "always_on" and exporter.last:
                from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
                    encode_spans,
                )

                spans = exporter.last
                started = time.process_time()
                encode_spans(spans).SerializePartialToString()
                encode.append((time.process_time() - started) / len(spans) * 1e6)
    off = median(per_mode["off"]) if "off" in per_mode else float("nan")
    return {
        "benchmark": "tracing_profile", "messages": args.messages, "rounds": args.rounds,
        "package": str(Path(endpoint_runtime.__file__).parent),
        "chain_cpu_us_per_message": {m: round(median(v), 1) for m, v in per_mode.items()},
        "added_us_per_message": {m: round(median(v) - off, 1)
                                 for m, v in per_mode.items() if m != "off"},
        "ratio_off_to_on": {m: round(off / median(v), 3)
                            for m, v in per_mode.items() if m != "off"},
        "otlp_encode_us_per_span": round(median(encode), 1) if encode else None,
        "spans_per_message_always_on": 2,
        "sdk_span_floor_us": sdk_span_floor(args.messages, args.rounds),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracing_profile",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--profile", choices=MODES, help="cProfile one mode")
    args = parser.parse_args(argv)
    if args.profile:
        pipeline, _ = chain(args.profile, Keep())
        messages = received(args.messages, args.profile)
        profiler = cProfile.Profile()
        profiler.runcall(asyncio.run, cpu_per_message(pipeline, messages))
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
        return
    print(json.dumps(measure(args)), flush=True)


if __name__ == "__main__":
    main()
