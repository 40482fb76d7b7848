"""Span and metric attribute names: OpenTelemetry's messaging conventions, and NServiceBus's
``nservicebus.*`` names for its headers (NServiceBus.Core's ``ActivityTags``), so that traces
of both look alike in one backend."""

from __future__ import annotations

from endpoint_runtime.wire.messages import Headers, RetryHeaders

INSTRUMENTATION = "endpoint_runtime"
"""The tracer's and the meter's name."""
SYSTEM = "endpoint_runtime"
"""``messaging.system``: no well-known value fits PostgreSQL queue tables."""

MESSAGING_SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
OPERATION_TYPE = "messaging.operation.type"
"""``process`` for an attempt at a message, ``send`` for sends, publishes, replies and
delayed retries."""
OPERATION_NAME = "messaging.operation.name"
BATCH_COUNT = "messaging.batch.message_count"
"""On a batch's receive span: the messages it took."""
MESSAGE_ID = "messaging.message.id"
CONVERSATION_ID = "messaging.message.conversation_id"
CONSUMER_GROUP = "messaging.consumer.group.name"
"""The endpoint processing the message (its receivers compete on one queue)."""
ERROR_TYPE = "error.type"

RECOVERABILITY_ACTION = "nservicebus.recoverability_action"
"""What recoverability did or will do: ``immediate_retry``, ``delayed_retry``,
``error_queue``, ``discard``."""
NATIVE_MESSAGE_ID = "nservicebus.native_message_id"
"""On the span of a poison row (its headers did not parse): the row's id."""
EVENT_TYPES = "nservicebus.event_types"
DELAYED_DISPATCH_FAILURES = "endpoint_runtime.delayed.dispatch_failures"
"""On the mover's span: the failed dispatches of the message before this one."""

SENT_HEADERS: tuple[tuple[str, str], ...] = (
    (Headers.ENCLOSED_MESSAGE_TYPES, "nservicebus.enclosed_message_types"),
    (Headers.DELIVER_AT, "nservicebus.deliver_at"),
    (Headers.TIME_TO_BE_RECEIVED, "nservicebus.time_to_be_received"),
)
"""Headers copied onto the span of an outgoing message, under NServiceBus's attribute names
(its id and conversation are ``messaging.message.id`` and ``.conversation_id``)."""
PROCESSED_HEADERS: tuple[tuple[str, str], ...] = (
    *SENT_HEADERS,
    (Headers.ORIGINATING_ENDPOINT, "nservicebus.originating_endpoint"),
    (RetryHeaders.RETRIES, "nservicebus.delayed_retries"),
)
"""Headers copied onto the span of an attempt. Each attribute costs a receiver about 1.5 us
in the SDK and 1-3 us in the OTLP encoding, per span: the set is kept to what tells a
message's story. Left out: the correlation id and ``RelatedTo`` (the parent span is the
message they name), the intent (the parent's ``messaging.operation.name`` says it), the
row's native id."""

START_NEW_TRACE = "NServiceBus.OpenTelemetry.StartNewTrace"
"""NServiceBus's header: ``True`` makes the receiving side start a new trace, linked to the
span that sent the message, instead of continuing it."""
PROCESSING_TRACEPARENT = "EndpointRuntime.ProcessingTraceParent"
"""The W3C ``traceparent`` of the span of the attempt at a message, written into its headers
by the ``tracing`` step: on its audit copy (kept in ``audit_log.headers``), on its error-queue
copy and on a delayed retry's copy (the attempt the next one links to)."""
LINK_KIND = "endpoint_runtime.link"
"""On a link: ``previous_attempt``, ``receive`` (the batch's receive span) or ``sender``
(``StartNewTrace``)."""
