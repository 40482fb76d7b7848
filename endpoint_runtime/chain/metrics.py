"""What the chain reports to metrics: the :class:`Metrics` interface the steps call, and no
metrics at all (its own methods do nothing) outside Ray.

The runtime's receivers and peekers pass
:class:`~endpoint_runtime.runtime.actors.ray_metrics.RayMetrics`, which exports the counts
through Ray's metrics API (the names are listed there and in docs/operations.md). The chain
itself imports no Ray.
"""

from __future__ import annotations

UNKNOWN_TYPE = "unknown"


class Metrics:
    """No metrics (outside Ray, and the base of the actors' ``RayMetrics``)."""

    def processed(self, message_type: str, started: float, ended: float,
                  headers: dict[str, str]) -> None:
        """A message handled and its work committed; ``started``/``ended`` (its handlers)
        in epoch seconds."""

    def failed(self, message_type: str, *, immediate_retry: bool) -> None:
        """A failed attempt; ``immediate_retry``: the next step retries at once."""

    def delayed_retry(self, message_type: str) -> None: ...

    def moved_to_error(self, message_type: str) -> None: ...

    def publish_undeliverable(self, message_type: str) -> None:
        """A published copy whose subscriber queue does not exist went to the error queue."""

    def queue_length(self, length: int) -> None: ...

    async def close(self) -> None:
        """Hand what was counted to Ray before the process ends."""
