"""What a deployment is (its plain, picklable description) and what its peeker reports."""

from __future__ import annotations

import collections
import uuid

import msgspec

from endpoint_runtime.runtime.actors.receiver import ReceiverStatus
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transport.addresses import QueueAddress


class DeploymentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Plain, picklable description of one endpoint deployment."""

    endpoint_path: str
    endpoint_name: str
    address: QueueAddress
    dsn: str
    settings: EndpointSettings
    deployment_id: str = msgspec.field(default_factory=lambda: uuid.uuid4().hex[:8])
    """The deployment's id: its receivers' committed counts are kept under it
    (:mod:`endpoint_runtime.runtime.actors.committed_counts`), and its connections' reservation
    names
    it (:mod:`endpoint_runtime.connections.connection_budget`, whence 8 hex digits: an
    ``application_name`` holds 63 bytes)."""
    otel_environment: dict[str, str] = {}
    """With ``settings.tracing``: the ``OTEL_*`` variables of the deploying process, set in
    each receiver before its OpenTelemetry SDK starts
    (:mod:`endpoint_runtime.chain.tracing.setup`)."""


class DeploymentStatus(msgspec.Struct, frozen=True, kw_only=True):
    endpoint: str
    estimate: int
    max_concurrency: int
    receivers: list[ReceiverStatus]
    replaced_receivers: int
    delayed_dispatched: int = 0
    delayed_to_error: int = 0
    critical_error: str | None = None
    """The critical error in effect: with ``on_critical_error="log"`` it is cleared once every
    circuit breaker has disarmed again (the database is back, work goes on by itself); with
    ``"stop"`` it stays, with ``halted``."""
    halted: bool = False
    """A critical error stopped receiving (``on_critical_error="stop"``): no receivers run
    until the deployment is started again. The peek estimate still follows the queue."""
    last_critical_error: str | None = None
    """The latest critical error, even when it is over."""
    doomed_messages: int = 0
    """Messages that were in the handlers of :data:`MAX_RECEIVER_DEATHS` receivers when they
    died, waiting for their next delivery to go to the error queue (crash ledger)."""
    retired_processed: int = 0
    """Messages processed by receivers that were retired or died (their last status)."""
    retired_failed: int = 0
    retired_moved_to_error: int = 0
    retired_outbox_duplicates: int = 0
    """Duplicates recognised by the outbox in receivers that were retired or died."""
    retired_by_node: dict[str, int] = {}
    """Messages processed by retired or dead receivers, per Ray node id."""

    @property
    def receivers_by_node(self) -> dict[str, int]:
        """Receivers running on each Ray node (node id: count)."""
        return dict(collections.Counter(r.node_id for r in self.receivers))

    @property
    def processed_by_node(self) -> dict[str, int]:
        """Messages processed on each Ray node, by running and retired receivers alike."""
        counts = collections.Counter(self.retired_by_node)
        for receiver in self.receivers:
            counts[receiver.node_id] += receiver.processed
        return dict(counts)

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.receivers)

    @property
    def processed(self) -> int:
        return self.retired_processed + sum(r.processed for r in self.receivers)

    @property
    def outbox_duplicates(self) -> int:
        """Duplicates the outbox recognised, in running and retired receivers alike."""
        return self.retired_outbox_duplicates + sum(r.outbox_duplicates for r in self.receivers)

    @property
    def failed(self) -> int:
        return self.retired_failed + sum(r.failed for r in self.receivers)

    @property
    def moved_to_error(self) -> int:
        """Messages moved to the error queue, by running and retired receivers alike."""
        return self.retired_moved_to_error + sum(r.moved_to_error for r in self.receivers)
