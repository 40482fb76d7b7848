"""LISTEN/NOTIFY wake-ups that survive a lost connection or a database restart.

One connection per process role listens on any number of channels. When the connection goes
away, it is re-opened with back-off and every channel is listened to again; notifications
sent meanwhile are lost, so each callback is also called once after a reconnection, to look
for work that arrived unannounced.

Example::

    listener = Listener(dsn)
    await listener.start()
    await listener.listen("er.public.sales", wake_up)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import asyncpg
import structlog

from endpoint_runtime.transport.connection import DatabaseConnection

log = structlog.get_logger("endpoint_runtime.listening")

Callback = Callable[[], object]


class Listener:
    def __init__(
        self, dsn: str, *, retry_delay: float = 0.5, max_retry_delay: float = 30.0
    ) -> None:
        self._dsn = dsn
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._channels: dict[str, list[Callback]] = {}
        self._connection: DatabaseConnection | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._closed = False
        self.reconnections = 0

    async def start(self) -> None:
        await self._connect()

    async def listen(self, channel: str, callback: Callback) -> None:
        first = channel not in self._channels
        self._channels.setdefault(channel, []).append(callback)
        if first and self._connection is not None and not self._connection.is_closed():
            await self._connection.add_listener(channel, self._notified)

    async def unlisten(self, channel: str, callback: Callback) -> None:
        callbacks = self._channels.get(channel, [])
        if callback in callbacks:
            callbacks.remove(callback)
        if (not callbacks and self._channels.pop(channel, None) is not None
                and self._connection is not None and not self._connection.is_closed()):
            with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                await self._connection.remove_listener(channel, self._notified)

    async def close(self) -> None:
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnecting
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()

    @property
    def connected(self) -> bool:
        return self._connection is not None and not self._connection.is_closed()

    async def _connect(self) -> None:
        connection = await asyncpg.connect(self._dsn or None)
        connection.add_termination_listener(self._terminated)
        for channel in self._channels:
            await connection.add_listener(channel, self._notified)
        self._connection = connection

    def _notified(self, connection: object, pid: int, channel: str, payload: object) -> None:
        for callback in list(self._channels.get(channel, ())):
            callback()

    def _terminated(self, connection: object) -> None:
        if self._closed or self._reconnecting is not None:
            return
        log.warning("listener_connection_lost")
        self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = self._retry_delay
        try:
            while not self._closed:
                try:
                    await self._connect()
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    log.warning("listener_reconnect_failed", error=f"{type(exc).__name__}: {exc}",
                                retry_in_s=delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._max_retry_delay)
                    continue
                self.reconnections += 1
                log.info("listener_reconnected", channels=len(self._channels))
                for callbacks in list(self._channels.values()):
                    for callback in list(callbacks):
                        callback()  # notifications may have been missed meanwhile
                return
        finally:
            self._reconnecting = None
