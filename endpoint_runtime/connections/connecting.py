"""Connecting to PostgreSQL: pools of queue connections and queue operations over a pool.

This sits above the transport package (which knows nothing of settings or of where the
server comes from): it resolves the DSN (``endpoint_runtime.connections.embedded``), names the
server with
its password hidden when it cannot connect, and ties the transport's modules to a pool for code
that does not manage connections itself (CLI, scripts, the outside sender).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import asyncpg
import structlog

from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn
from endpoint_runtime.errors import DatabaseUnavailableError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import queues, receiving, sending
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import (
    DatabaseConnection,
    Home,
    QueueConnection,
    is_queue_connection,
    keep_no_statements,
    pooled,
)
from endpoint_runtime.transport.queues import QueueInfo
from endpoint_runtime.wire.messages import OutgoingMessage

__all__ = ["PostgresTransport", "close_pool", "connect_pool"]

log = structlog.get_logger("endpoint_runtime.connections.connecting")


async def connect_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, transaction_pooling: bool = False,
    **options: Any
) -> asyncpg.Pool:
    """An asyncpg pool of :class:`QueueConnection`; connection errors name the server with
    its password hidden. ``transaction_pooling``: ``dsn`` is a transaction-mode pooler
    (``TransportSettings.pooler_dsn``), so nothing may stay in the server session between
    transactions: no asyncpg statement cache (its named statements would be looked for in
    another session) and no SQL-level ``PREPARE`` (``transport.connection``)."""
    options.setdefault("connection_class", QueueConnection)
    if transaction_pooling:
        options["statement_cache_size"] = 0
    home = Home()
    user_init = options.pop("init", None)

    async def init(connection: DatabaseConnection) -> None:
        if is_queue_connection(connection):
            connection.home = home
        if transaction_pooling:
            keep_no_statements(connection)
        if user_init is not None:
            await user_init(connection)

    try:
        pool: asyncpg.Pool = await asyncpg.create_pool(
            dsn or None, min_size=min_size, max_size=max_size, init=init, **options
        )
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        where = redact_dsn(dsn) if dsn else "the PG* environment"
        raise DatabaseUnavailableError(
            f"cannot connect to PostgreSQL at {where}: {type(exc).__name__}: "
            f"{redact_dsn(str(exc))}"
        ) from None
    home.pool = pool
    return pool


POOL_CLOSE_TIMEOUT = 5.0
"""Seconds a stopping actor waits for its pool's connections to come back."""


async def close_pool(pool: asyncpg.Pool, timeout: float = POOL_CLOSE_TIMEOUT) -> None:  # noqa: ASYNC109
    """Close ``pool`` gracefully, waiting at most ``timeout`` seconds for its connections to
    come back; then terminate it. ``Pool.close`` alone waits for every checked-out
    connection without a bound: one that a failed cleanup never returned would hold a stop
    forever (the server rolls back whatever transaction it had open)."""
    try:
        await asyncio.wait_for(pool.close(), timeout)
    except TimeoutError:
        log.warning("pool_close_timeout", timeout=timeout,
                    still_checked_out=pool.get_size() - pool.get_idle_size())
        pool.terminate()


class PostgresTransport:
    """Queue operations over a pool.

    Example::

        async with PostgresTransport.connect(TransportSettings()) as transport:
            await transport.create_queue("sales")
            await transport.send("sales", outgoing)
    """

    def __init__(self, pool: asyncpg.Pool, settings: TransportSettings, dsn: str) -> None:
        self.pool = pool
        self.settings = settings
        self.dsn = dsn

    @classmethod
    def connect(cls, settings: TransportSettings | None = None, *,
                direct: bool = False) -> _Connecting:
        """Through ``settings.pooler_dsn`` when one is set, unless ``direct`` (the server
        itself, at ``settings.dsn``: its capacity, ``pg_stat_activity``)."""
        return _Connecting(settings or TransportSettings(), direct)

    async def close(self) -> None:
        """Close the pool, waiting at most :data:`POOL_CLOSE_TIMEOUT` s for connections still
        in use (one waiting on a lock would otherwise hold the close forever)."""
        await close_pool(self.pool)

    def address(self, queue: str | QueueAddress) -> QueueAddress:
        if isinstance(queue, QueueAddress):
            return queue
        return QueueAddress.parse(queue, self.settings.schema)

    async def create_queue(self, queue: str | QueueAddress) -> QueueAddress:
        address = self.address(queue)
        async with self.pool.acquire() as connection:
            await queues.create_queue(
                connection,
                address,
                body_string_column=self.settings.create_body_string_column,
                notify_on_send=self.settings.notify_on_send,
            )
        return address

    async def drop_queue(self, queue: str | QueueAddress) -> None:
        await queues.drop_queue(self.pool, self.address(queue))

    async def list_queues(self, schema: str | None = None) -> list[QueueInfo]:
        return await queues.list_queues(self.pool, schema)

    async def send(self, queue: str | QueueAddress, message: OutgoingMessage) -> None:
        async with pooled(self.pool) as connection:
            await sending.send(connection, self.address(queue), message)

    async def send_many(
        self, queue: str | QueueAddress, messages: Sequence[OutgoingMessage]
    ) -> None:
        async with pooled(self.pool) as connection:
            await sending.send_many(connection, self.address(queue), messages)

    async def receive(self, queue: str | QueueAddress) -> receiving.Received | None:
        """Receive one message and commit the DELETE at once (at-most-once; for tools)."""
        async with self.pool.acquire() as connection, connection.transaction():
            return await receiving.receive(connection, self.address(queue))

    async def peek(self, queue: str | QueueAddress) -> int:
        return await receiving.peek(
            self.pool, self.address(queue), self.settings.max_records_to_peek
        )

    async def depth(self, queue: str | QueueAddress) -> int:
        return await queues.depth(self.pool, self.address(queue))

    async def purge_expired(self, queue: str | QueueAddress) -> int:
        return await queues.purge_expired(
            self.pool, self.address(queue), self.settings.purge_batch_size
        )

    async def purge(self, queue: str | QueueAddress) -> int:
        return await queues.purge(self.pool, self.address(queue))


class _Connecting:
    """``async with PostgresTransport.connect(...)``, or ``await`` it and close it yourself."""

    def __init__(self, settings: TransportSettings, direct: bool) -> None:
        self.settings = settings
        self.direct = direct
        self.transport: PostgresTransport | None = None

    async def _open(self) -> PostgresTransport:
        # Starting an embedded server blocks on subprocesses: keep the event loop free.
        dsn = await asyncio.to_thread(resolve_dsn, self.settings.dsn)
        pooling = self.settings.transaction_pooling and not self.direct
        pool = await connect_pool(self.settings.pool_dsn(dsn) if pooling else dsn,
                                  max_size=self.settings.pool_max_size,
                                  transaction_pooling=pooling)
        return PostgresTransport(pool, self.settings, dsn)

    def __await__(self) -> Any:
        return self._open().__await__()

    async def __aenter__(self) -> PostgresTransport:
        self.transport = await self._open()
        return self.transport

    async def __aexit__(self, *exc_info: object) -> None:
        if self.transport is not None:
            await self.transport.close()
