"""The connections handlers get in transactions that asyncpg did not open itself.

Batched receive takes a savepoint per message on its first database use
(:class:`LazySavepointConnection`); the outbox and the chained receive transactions begin with a
plain ``BEGIN`` that asyncpg does not know of (:class:`OpenTransactionConnection`). Both forward
everything else to the connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from endpoint_runtime.transport.connection import DatabaseConnection

_QUERY_METHODS = frozenset({
    "execute", "executemany", "fetch", "fetchrow", "fetchval", "fetchmany", "prepare",
    "copy_from_query", "copy_from_table", "copy_records_to_table", "copy_to_table",
})


def _keep_queue_checks(proxy: object, connection: object) -> None:
    """The connection's record of verified queues and its pool (``QueueConnection``) as plain
    attributes of the proxy: every send reads them (``ensure_queue_table``), and through the
    proxies' ``__getattr__`` (two or three levels deep) that was a measurable share of a
    batch's CPU. Both live as long as the connection."""
    proxy.__dict__["verified_queues"] = getattr(connection, "verified_queues", None)
    proxy.__dict__["home"] = getattr(connection, "home", None)


class LazySavepointConnection:
    """A connection whose first query first runs ``ensure_savepoint``.

    Batched receive handles many messages in one transaction; each message's database work
    must be undoable on its own. A savepoint per message would cost two round trips even for
    handlers that never touch the database, so it is taken on first use instead.

    ``ensure_savepoint()`` is called before every query and returns what to await first (the
    savepoint's statement), or ``None`` when there is nothing to wait for: then the query is
    the connection's own coroutine, with no coroutine of the proxy around it. Every round
    trip of a handler passes here, and each coroutine frame between a task and a round trip
    costs CPU at each suspension and resumption (docs/performance.md, "In one process").
    The proxy lives for one batch: each query method is looked up once and kept.
    """

    def __init__(
        self, connection: DatabaseConnection | OpenTransactionConnection,
        ensure_savepoint: Callable[[], Awaitable[None] | None],
    ) -> None:
        self._connection = connection
        self._ensure_savepoint = ensure_savepoint
        _keep_queue_checks(self, connection)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._connection, name)
        if name not in _QUERY_METHODS:
            return attribute
        ensure = self._ensure_savepoint

        def query(*args: Any, **kwargs: Any) -> Awaitable[Any]:
            first = ensure()
            if first is None:
                return attribute(*args, **kwargs)  # type: ignore[no-any-return]
            return _after(first, attribute, args, kwargs)

        self.__dict__[name] = query  # found without __getattr__ from now on
        return query

    def transaction(self, **options: Any) -> Any:
        return _SavepointFirst(self, options)


async def _after(first: Awaitable[None], query: Callable[..., Awaitable[Any]],
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    await first
    return await query(*args, **kwargs)


class _SavepointFirst:
    def __init__(self, proxy: LazySavepointConnection, options: dict[str, Any]) -> None:
        self._proxy = proxy
        self._options = options
        self._inner: Any = None

    async def __aenter__(self) -> Any:
        first = self._proxy._ensure_savepoint()
        if first is not None:
            await first
        self._inner = self._proxy._connection.transaction(**self._options)
        return await self._inner.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)


class OpenTransactionConnection:
    """A connection whose transaction was opened with a plain ``BEGIN`` (the outbox sends
    BEGIN together with its look-up). asyncpg does not know of such a transaction, so
    ``transaction()`` is served here as a SAVEPOINT, as it would be in any other mode."""

    def __init__(self, connection: DatabaseConnection) -> None:
        self._connection = connection
        self._savepoints = 0
        _keep_queue_checks(self, connection)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def transaction(self, **options: Any) -> Any:
        self._savepoints += 1
        return _ExplicitSavepoint(self._connection, f"endpoint_runtime_{self._savepoints}")


class _ExplicitSavepoint:
    def __init__(self, connection: DatabaseConnection, name: str) -> None:
        self._connection = connection
        self._name = name

    async def __aenter__(self) -> _ExplicitSavepoint:
        await self._connection.execute(f"SAVEPOINT {self._name}")
        return self

    async def __aexit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is None:
            await self._connection.execute(f"RELEASE SAVEPOINT {self._name}")
        else:
            await self._connection.execute(f"ROLLBACK TO SAVEPOINT {self._name}")
