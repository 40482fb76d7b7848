"""The delayed-message store protocol (NServiceBus ``IDelayedMessageStore``, seed 004).

Each method takes the connection to work on. The built-in store lives in the queues' database,
so the mover can fetch (row locked), dispatch and remove in one transaction; a store elsewhere
may ignore the connection and use its own, at the price of at-least-once dispatch.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Protocol, runtime_checkable

import asyncpg
import msgspec


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

    async def setup_infrastructure(self, connection: asyncpg.Connection) -> None:
        """Create tables and indexes if they do not exist (idempotent)."""

    async def store(self, connection: asyncpg.Connection, message: DelayedMessage) -> None:
        """Keep ``message`` until it is due (in the connection's transaction, if any)."""

    async def fetch_next_due(self, connection: asyncpg.Connection) -> DelayedMessage | None:
        """The next due message, locked so that no other instance dispatches it, or ``None``.

        Called inside a transaction that the caller commits after dispatch and removal.
        """

    async def remove(self, connection: asyncpg.Connection, message: DelayedMessage) -> bool:
        """Delete a dispatched message; ``False`` when it was already gone."""

    async def increment_failure_count(
        self, connection: asyncpg.Connection, message: DelayedMessage
    ) -> bool:
        """Count a failed dispatch; ``False`` when the message was already gone."""

    async def next_due_in(self, connection: asyncpg.Connection) -> float | None:
        """Seconds until the earliest due message by the store's clock; ``None`` if empty."""

    @property
    def notify_channel(self) -> str | None:
        """LISTEN channel that signals a newly stored message, if the store has one."""
