"""OpenTelemetry for endpoints: one trace across endpoints, and the runtime's metrics.

Switched on per endpoint with ``tracing=True`` (``EndpointSettings.tracing``,
``ENDPOINT_RUNTIME_TRACING=true``); off, nothing here is imported and the chain has no
``tracing`` step. On:

- :mod:`.step`: the chain's ``tracing`` step, a span per attempt at a message (``process
  <queue>``, a child of the ``traceparent`` the message carries), with recoverability's
  verdict, the failure's exception, and short spans for a delayed retry or a move to the
  error queue; trace and span ids in the log context and on the audit copy; a batch's
  receive span, linked from its messages' spans.
- :mod:`.spans`: the outgoing hook that makes a span per send, publish and reply and writes
  its W3C ``traceparent``/``tracestate`` into the message's headers (handlers and
  :class:`~endpoint_runtime.runtime.sender.Sender` alike).
- :mod:`.delivery`: the delayed-message mover's span per dispatch of a due message.
- :mod:`.attributes`: attribute names, OpenTelemetry's messaging conventions and
  NServiceBus's.
- :mod:`.setup`: the SDK in an actor's process, from the ``OTEL_*`` variables (service name =
  endpoint name), flushed when the actor stops; spans leave through the SDK's OTLP
  exporter.
- ``endpoint_runtime.runtime.actors.otel_metrics``: the processing metrics as OpenTelemetry
  instruments, beside Ray's; ``endpoint_runtime.runtime.actors.telemetry``: what a receiver
  and a peeker set up as they start (the peeker exports the queue length).

See docs/observability.md.
"""

from __future__ import annotations

import importlib.util

from endpoint_runtime.errors import ConfigurationError


def check() -> None:
    """Fail at once, where a traced endpoint is deployed, when its receivers could not set up
    what this process's ``OTEL_*`` variables ask for: the SDK missing (``opentelemetry-api``
    alone records nothing), an exporter or OTLP protocol this runtime cannot make."""
    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise ConfigurationError(
                f"tracing=True needs {module}: pip install 'endpoint-runtime[otel]'")
    from endpoint_runtime.chain.tracing.setup import exporter_classes

    for signal in ("TRACES", "METRICS"):
        exporter_classes(signal)
