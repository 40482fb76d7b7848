"""What a LISTEN connection hears on a queue's channel, checked against a marker NOTIFY.

A listener hears every channel in commit order, so the payloads a queue's channel heard before a
marker NOTIFY sent now on a channel of the test's own are everything the sends committed earlier
notified (and none of it when they did not notify). The marker channel wakes no peeker or
receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg

MARKERS = "test.markers"


class Heard:
    """The payloads one connection hears on ``channel`` and on :data:`MARKERS`."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.heard: list[tuple[str, str]] = []
        self._marker_heard = asyncio.Event()

    def on_notify(self, _connection: object, _pid: int, channel: str, payload: str) -> None:
        self.heard.append((channel, payload))
        if channel == MARKERS:
            self._marker_heard.set()

    @contextlib.asynccontextmanager
    async def listening(self, connection: asyncpg.Connection) -> AsyncIterator[Heard]:
        """Listen on both channels on ``connection`` until the block ends."""
        for channel in (self.channel, MARKERS):
            await connection.add_listener(channel, self.on_notify)
        try:
            yield self
        finally:
            for channel in (self.channel, MARKERS):
                await connection.remove_listener(channel, self.on_notify)

    async def before_marker(self, pool: asyncpg.Pool, marker: str = "marker") -> list[str]:
        """The queue channel's payloads heard before a NOTIFY of ``marker`` sent now, and
        forget what was heard."""
        self._marker_heard.clear()
        await pool.execute("SELECT pg_notify($1, $2)", MARKERS, marker)
        await asyncio.wait_for(self._marker_heard.wait(), timeout=10)
        before = self.heard[:self.heard.index((MARKERS, marker))]
        self.heard.clear()
        return [payload for channel, payload in before if channel == self.channel]
