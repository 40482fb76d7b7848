"""The throughput benchmark's workload with OpenTelemetry tracing on (``benchmarks.tracing``;
the sampler and the exporter come from the OTEL_* variables of the process that deploys them).
Apart from ``benchmarks.endpoints``, which must import with code from before tracing existed
(``benchmarks.tracing_profile --modes off`` against another checkout)."""

from __future__ import annotations

from benchmarks.endpoints import echo
from endpoint_runtime import Endpoint

traced = Endpoint("bench_traced", tracing=True)
traced.register(echo)

traced_batched = Endpoint("bench_traced_batched", batch_size=50, tracing=True)
traced_batched.register(echo)
