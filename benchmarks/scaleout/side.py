"""What every side of the scale-out benchmark offers: one drain of a backlog, one open-loop run.

A side is one way of processing messages from PostgreSQL: this runtime in one of its modes, a
peer library (pgqueuer, procrastinate) in one configuration, or a limit (pgbench, the leanest
asyncpg loop). Every side does the same work per message, so the figures compare equal work:

- the message carries a body of ``Load.body_bytes`` bytes and its send time;
- handling a message inserts one row into the side's sink table, in the side's own
  transaction where the side has one (the business effect);
- a drain fills a backlog of ``Load.messages`` messages first (not timed), then times the
  processing from the first receive until the sink holds one row per message, and checks
  that each message was handled exactly once (``handled`` and ``duplicates``).

Each side prepares its own tables (its own schema or database) and leaves no process behind.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Load:
    """The work of one run: how many messages, how many at once, how big."""

    messages: int
    concurrency: int
    body_bytes: int = 100


@dataclass
class DrainResult:
    """One timed drain of a backlog by one side."""

    side: str
    config: dict[str, Any]
    load: Load
    seconds: float
    handled: int  # distinct messages in the sink after the drain
    duplicates: int  # sink rows beyond one per message
    # Further figures of the drain where a side has them, e.g. the runtime's receivers and
    # the nodes they ran on, or a send rate (added for the harness's sweeps; peers leave it).
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        """Messages handled per second of the timed drain."""
        return self.handled / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        """The result as plain JSON values (the load flattened, the rate added)."""
        payload = asdict(self)
        payload["msgs_per_s"] = round(self.msgs_per_s, 1)
        return payload


@dataclass
class LatencyResult:
    """One open-loop run: messages sent at a fixed rate while the side handles them."""

    side: str
    config: dict[str, Any]
    rate_per_s: float
    sent: int
    handled: int
    # Percentiles in milliseconds, keys "p50", "p95", "p99".
    to_handler_start_ms: dict[str, float] = field(default_factory=dict)
    to_completion_ms: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The result as plain JSON values."""
        return asdict(self)


class Side(Protocol):
    """One way of processing messages; see the module docstring for the equal-work rules."""

    name: str  # e.g. "runtime_single", "pgqueuer_best", "pgbench"
    config: dict[str, Any]  # what distinguishes this configuration (batch size, durability...)

    async def drain(self, dsn: str, load: Load) -> DrainResult:
        """Fill a backlog of ``load.messages`` (untimed), time its processing, verify it."""
        ...

    async def open_loop(self, dsn: str, load: Load, rate_per_s: float,
                        seconds: float) -> LatencyResult:
        """Send at ``rate_per_s`` for ``seconds`` while handling; measure each message's latency.

        Send-to-handler-start and send-to-completion are measured on the database's clock
        (the send time in the message, ``clock_timestamp()`` in the handler's sink insert).
        """
        ...
