"""The delayed-message store protocol (NServiceBus ``IDelayedMessageStore``, seed 004).

Each method takes the connection to work on. The built-in store lives in the queues' database,
so the mover can fetch (row locked), dispatch and remove in one transaction; a store elsewhere
may ignore the connection and use its own, at the price of at-least-once dispatch.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Protocol, runtime_checkable

import msgspec

from endpoint_runtime.connections.circuit_breakers import CircuitBreaker
from endpoint_runtime.transport.connection import DatabaseConnection


class DelayedMessage(msgspec.Struct, kw_only=True):
    """A message waiting for its due time."""

    id: uuid.UUID
    destination: str
    due: datetime
    headers: str
    """Headers as the JSON text that goes into the destination queue row."""
    body: bytes
    failures: int = 0


@runtime_checkable
class DelayedMessageStore(Protocol):
    """Where delayed messages wait. Implement it to plug in a store of your own."""

    async def setup_infrastructure(self, connection: DatabaseConnection) -> None:
        """Create tables and indexes if they do not exist (idempotent)."""

    async def store(self, connection: DatabaseConnection, message: DelayedMessage) -> None:
        """Keep ``message`` until it is due (in the connection's transaction, if any)."""

    async def fetch_next_due(self, connection: DatabaseConnection) -> DelayedMessage | None:
        """The next due message, locked so that no other instance dispatches it, or ``None``.

        Called inside a transaction that the caller commits after dispatch and removal.
        """

    async def remove(self, connection: DatabaseConnection, message: DelayedMessage) -> bool:
        """Delete a dispatched message; ``False`` when it was already gone."""

    async def increment_failure_count(
        self, connection: DatabaseConnection, message: DelayedMessage
    ) -> bool:
        """Count a failed dispatch; ``False`` when the message was already gone."""

    async def next_due_in(self, connection: DatabaseConnection) -> float | None:
        """Seconds until the earliest due message by the store's clock; ``None`` if empty."""

    @property
    def notify_channel(self) -> str | None:
        """LISTEN channel that signals a newly stored message, if the store has one."""


class CircuitBreakingStore:
    """A store whose ``store`` calls feed a circuit breaker (the store breaker of seed 004):
    failures arm it, a success disarms it, and a long enough run of failures raises the
    critical error. Everything else is passed through unchanged."""

    def __init__(self, inner: DelayedMessageStore, breaker: CircuitBreaker) -> None:
        self.inner = inner
        self.breaker = breaker

    @property
    def notify_channel(self) -> str | None:
        return self.inner.notify_channel

    async def setup_infrastructure(self, connection: DatabaseConnection) -> None:
        await self.inner.setup_infrastructure(connection)

    async def store(self, connection: DatabaseConnection, message: DelayedMessage) -> None:
        try:
            await self.inner.store(connection, message)
        except Exception as exc:
            self.breaker.record_failure(exc)  # no wait here: the caller's attempt just fails
            raise
        self.breaker.success()

    async def fetch_next_due(self, connection: DatabaseConnection) -> DelayedMessage | None:
        return await self.inner.fetch_next_due(connection)

    async def remove(self, connection: DatabaseConnection, message: DelayedMessage) -> bool:
        return await self.inner.remove(connection, message)

    async def increment_failure_count(
        self, connection: DatabaseConnection, message: DelayedMessage
    ) -> bool:
        return await self.inner.increment_failure_count(connection, message)

    async def next_due_in(self, connection: DatabaseConnection) -> float | None:
        return await self.inner.next_due_in(connection)
