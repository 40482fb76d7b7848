"""Building an endpoint's chain: which steps, in which order, and who adds which.

====================  ==========================================  ============================
step                  what it owns                                added
====================  ==========================================  ============================
``log_context``       the per-message log context                 always
``tracing``           the OpenTelemetry span of each attempt      with ``settings.tracing``
``recoverability``    screening, failure counting, the moves      always
``crash_ledger``      the native id noted while in the steps      by receiver actors
                                                                  (``in_flight=``)
``metrics``           processed counts and times, after commit    always (Ray metrics in
                                                                  receivers: ``metrics=``)
``outbox``            deduplication, business transaction,        with ``settings.outbox``
                      record and dispatch
user steps            :meth:`Endpoint.add_step`                   by the endpoint's code
``audit``             the audit copy                              with ``audit_queue``
``sagas``             the saga session, its audit headers         with ``@endpoint.saga``
``invoke_handlers``   decode, run the handlers                    always
====================  ==========================================  ============================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from endpoint_runtime.chain.handlers import HandlerRegistry
from endpoint_runtime.chain.metrics import Metrics
from endpoint_runtime.chain.outbox.step import OutboxStep
from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.pipeline import (
    Pipeline,
    ProcessingStats,
    Step,
    UserStep,
    order_user_steps,
)
from endpoint_runtime.chain.recoverability.policy import FailedMessages, RecoverabilityPolicy
from endpoint_runtime.chain.recoverability.step import RecoverabilityStep
from endpoint_runtime.chain.routing import RouteTable
from endpoint_runtime.chain.sagas.registry import Sagas
from endpoint_runtime.chain.sagas.step import SagaStep
from endpoint_runtime.chain.steps import (
    AuditStep,
    CrashLedgerStep,
    InFlight,
    InvokeHandlersStep,
    LogContextStep,
    MetricsStep,
    TypeTags,
)
from endpoint_runtime.chain.subscriptions import subscription_store
from endpoint_runtime.delayed.store import DelayedMessageStore
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transport.addresses import QueueAddress


def build_pipeline(
    *, endpoint: str, address: QueueAddress, registry: HandlerRegistry,
    settings: EndpointSettings, policy: RecoverabilityPolicy,
    delayed_store: DelayedMessageStore | None, user_steps: Sequence[UserStep] = (),
    metrics: Metrics | None = None, in_flight: InFlight | None = None,
    guard_store: Callable[[DelayedMessageStore], DelayedMessageStore] | None = None,
    sagas: Sagas | None = None, routes: RouteTable | None = None,
) -> Pipeline:
    """The chain of one endpoint (see the module docstring). ``guard_store`` wraps the
    delayed-message store (a receiver's circuit breaker); ``sagas``: the endpoint's, when it has
    some."""
    schema = settings.transport.schema
    metrics = metrics or Metrics()
    stats, failures, tags = ProcessingStats(), FailedMessages(), TypeTags(registry)
    store = delayed_store if settings.delayed_delivery.enabled else None
    if store is not None and guard_store is not None:
        store = guard_store(store)
    subscriptions = subscription_store(settings.transport)
    error_address = QueueAddress.parse(settings.error_queue, schema)
    audit_address = (QueueAddress.parse(settings.audit_queue, schema)
                     if settings.audit_queue else None)
    built_in: list[Step] = [LogContextStep(endpoint, failures)]
    batches = None
    recoverability = RecoverabilityStep(
        endpoint=endpoint, local_address=address, error_address=error_address,
        policy=policy, failures=failures, stats=stats, metrics=metrics, tags=tags,
        delayed_store=store, subscriptions=subscriptions)
    if settings.tracing:  # imported only when on: off, OpenTelemetry stays out of the process
        from endpoint_runtime.chain.tracing.step import TracingStep

        tracing = TracingStep(
            endpoint=endpoint, local_address=address, error_address=error_address,
            decided=lambda message: recoverability.pending_decision(message) is not None)
        built_in.append(tracing)
        batches = tracing.batch  # a receive span per batch, linked from its messages'
    built_in.append(recoverability)
    if in_flight is not None:
        built_in.append(CrashLedgerStep(in_flight))
    built_in.append(MetricsStep(stats, metrics, tags))
    if settings.outbox is not None:
        built_in.append(OutboxStep(OutboxStorage.for_settings(address, settings),
                                   settings.outbox, schema=schema, delayed_store=store,
                                   stats=stats))
    steps = [(step.name, step) for step in built_in]  # type: ignore[attr-defined]
    steps.extend((user.name, user.step) for user in order_user_steps(user_steps))
    if audit_address is not None:
        steps.append((AuditStep.name, AuditStep(endpoint, audit_address)))
    if sagas is not None:
        steps.append((SagaStep.name, SagaStep(sagas.not_found_hooks)))
    steps.append((InvokeHandlersStep.name, InvokeHandlersStep(
        endpoint=endpoint, registry=registry, local_address=address,
        error_address=error_address, subscriptions=subscriptions, routes=routes,
        allowed_schemas=(frozenset(settings.transport.allowed_schemas)
                         if settings.transport.allowed_schemas is not None else None),
        metrics=metrics, handler_timeout=settings.handler_timeout)))
    return Pipeline(endpoint=endpoint, local_address=address, steps=steps, stats=stats,
                    failures=failures, audit_address=audit_address, delayed_store=store,
                    batches=batches)
