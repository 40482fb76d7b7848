"""The connection class of the transport's pools: an asyncpg connection that remembers which
SQL-level prepared statements (``PREPARE``) its server session holds.

Such a statement is run as ``EXECUTE name(literal values)``, a short text that can travel with
other statements in one simple query (e.g. just before COMMIT), while the server parses and
plans the statement itself only once per session. ``DISCARD ALL`` or ``DEALLOCATE ALL`` on the
connection, or a pooler that moves sessions between clients, would break this bookkeeping:
behind a transaction-mode pooler a connection keeps no statements (:func:`keep_no_statements`)
and the same texts travel with their values written in (``literals.inline_parameters``).

A statement is prepared per queue, and the queues a process sends to come from its messages
(reply addresses): a connection keeps at most :data:`MAX_PREPARED_STATEMENTS` of them, the
least recently used is deallocated first. So does the list of queue tables it verified
(``transport.queue_tables``), without a round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Hashable
from typing import Any, NoReturn, TypeAlias, TypeGuard

import asyncpg
import structlog
from asyncpg.pool import PoolConnectionProxy

from endpoint_runtime.errors import ConnectionLostError

_log = structlog.get_logger("endpoint_runtime.transport")

DatabaseConnection: TypeAlias = (
    "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"
)
"""A connection as the runtime holds it: its own, or one acquired from a pool (a proxy)."""

QUERY_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError,
                OSError)
"""What a statement on a failing connection may raise: the server's error, a lost connection,
and asyncpg's protocol caught mid-operation by the connection's loss
(``InternalClientError: cannot switch to state ...``). Cleanup that must not fail suppresses
these."""


def is_lost(connection: DatabaseConnection) -> bool:
    """Whether ``connection`` is closed. A pool's proxy whose connection closed while checked
    out (terminated, server restarted) is detached by asyncpg at once, its holder back in the
    pool, and then raises ``InterfaceError`` on every call, ``is_closed()`` included: that
    connection is lost too."""
    try:
        return connection.is_closed()
    except asyncpg.InterfaceError:
        return True


LOSS_SETTLE_SECONDS = 2.0
"""How long :func:`found_lost` watches for a connection's loss after a client-state error. Only
such an error pays it, and only when the connection stays open (a handler's own misuse of its
connection, charged after the wait); a loss is found as soon as asyncpg reads the end of the
socket, which on a loaded machine can come well after the server's FATAL message (the backend
still exiting), so the margin is generous."""


async def found_lost(*connections: DatabaseConnection | None,
                     within: float = LOSS_SETTLE_SECONDS) -> bool:
    """Whether one of ``connections`` is lost, or is found lost within ``within`` seconds.

    For an error that may be a connection's loss seen early. When the server ends a
    connection (a restart, ``pg_terminate_backend``) asyncpg reads the server's last message
    (FATAL) while the connection is idle, and its protocol leaves its idle state; a statement
    started before asyncpg has also read the end of the socket raises ``InternalClientError:
    cannot switch to state 15; another operation (2) is in progress``, and the connection is
    found closed a moment later. A connection that stays open past ``within`` was not lost:
    the error is the statement's own. ``None`` entries are skipped."""
    present = [connection for connection in connections if connection is not None]
    if not present:
        return False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not any(is_lost(connection) for connection in present):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def raise_as_loss_if_lost(connection: DatabaseConnection,
                                exc: asyncpg.InternalClientError, work: str) -> NoReturn:
    """Raise ``exc``, a client-state error of ``connection`` during a message's ``work``
    (e.g. "a send to public.orders"), as :class:`ConnectionLostError` when the connection
    turns out lost (:func:`found_lost`: its server session ended while it waited in the
    pool), a failure of the transport rather than of the message; else as it is. Called from
    an ``except``, so the message is formatted only when it is needed."""
    if await found_lost(connection):
        raise ConnectionLostError(f"the connection of {work} was lost ({exc})") from exc
    raise exc


@contextlib.asynccontextmanager
async def pooled(pool: asyncpg.Pool) -> AsyncIterator[PoolConnectionProxy[asyncpg.Record]]:
    """A connection of ``pool`` for work that commits as it goes (a send), given back
    whatever happens. asyncpg resets a connection on its way back and, when that fails (its
    server session ended just then), ends the connection and raises; the work had committed
    already, so that failure is not the work's: it is logged, not raised (the pool opens a
    new connection when one is next needed). A failure of the work itself is raised as it
    is."""
    connection = await pool.acquire()
    try:
        yield connection
    finally:
        try:
            await pool.release(connection)
        except QUERY_ERRORS as exc:
            _log.info("pooled_connection_lost_on_release", error=f"{type(exc).__name__}: {exc}")


def in_transaction(connection: DatabaseConnection) -> bool:
    """Whether ``connection`` is alive and inside a transaction (see :func:`is_lost`)."""
    return not is_lost(connection) and connection.is_in_transaction()


MAX_PREPARED_STATEMENTS = 128
"""SQL-level prepared statements one connection keeps. A single transaction must not use
more distinct statements than this (they are named in text sent later, e.g. with COMMIT)."""
MAX_VERIFIED_QUEUES = 1024
"""Queue tables one connection remembers as verified (see ``transport.queue_tables``)."""


class BoundedSet:
    """The last ``limit`` items added; the oldest is forgotten first."""

    __slots__ = ("_items", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[Hashable, None] = OrderedDict()

    def __contains__(self, item: Hashable) -> bool:
        return item in self._items

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: Hashable) -> None:
        self._items[item] = None
        if len(self._items) > self.limit:
            self._items.popitem(last=False)


class Home:
    """The pool a connection belongs to: a side channel for checks that must not run in the
    connection's own transaction (a handler may have left it aborted)."""

    __slots__ = ("pool",)

    def __init__(self, pool: asyncpg.Pool | None = None) -> None:
        self.pool = pool


MAX_UNNAMED_STATEMENTS = 256
"""Described statements a connection behind a transaction-mode pooler keeps (see
:meth:`QueueConnection._get_statement`)."""


class QueueConnection(asyncpg.Connection):
    """Also keeps, per queue, where its receives start (``receiving.ReceivePosition``)."""

    __slots__ = ("described", "home", "keeps_session", "receive_positions", "sql_prepared",
                 "verified_queues")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.home = Home()  # connect_pool() puts the pool it belongs to here
        # name -> None, least recently used first
        self.sql_prepared: OrderedDict[str, None] | None = OrderedDict()
        self.keeps_session = True  # False behind a transaction-mode pooler
        self.described: OrderedDict[Hashable, Any] = OrderedDict()
        self.receive_positions: dict[Any, Any] = {}
        self.verified_queues = BoundedSet(MAX_VERIFIED_QUEUES)

    # asyncpg's own (private, untyped in its stubs) hook between a query and its execution.
    async def _get_statement(self, query: str, timeout: float | None,  # noqa: ASYNC109
                             **options: Any) -> Any:
        """Behind a transaction-mode pooler (no statement cache): the statement asyncpg
        described the first time, again. Without a cache asyncpg describes a query on every
        execution (Parse, Describe, Sync: a round trip) and then sends it again, as an unnamed
        statement marked unprepared, with its Bind and Execute (Parse, Bind, Execute, Sync).
        That second message alone needs nothing from the server session, so a statement kept
        here costs one round trip per execution instead of two, in whatever server session
        the pooler gives it; the server parses it each time, as it does without a pooler's
        cache. asyncpg's own statement cache stays what it is for connections that keep their
        session."""
        if self.keeps_session or options.get("named") or not options.get("use_cache", True):
            return await super()._get_statement(  # type: ignore[misc]
                query, timeout, **options)
        key = (query, options.get("record_class"), options.get("ignore_custom_codec", False))
        state = self.described.get(key)
        if state is not None and not state.closed:
            self.described.move_to_end(key)
            return state
        state = await super()._get_statement(query, timeout, **options)  # type: ignore[misc]
        if not state.name and not state.prepared:  # re-parsed at each execution
            self.described[key] = state
            if len(self.described) > MAX_UNNAMED_STATEMENTS:
                self.described.popitem(last=False)
        return state

    def get_reset_query(self) -> str:
        """What a pool runs on a connection it takes back (asyncpg's documented override):
        nothing behind a transaction-mode pooler. The server session there is not this
        client's: ``pg_advisory_unlock_all()``, ``CLOSE ALL`` and ``UNLISTEN *`` would act on
        whatever session the pooler hands the statement to (another client's advisory locks
        and cursors), and ``RESET ALL`` clears the ``application_name`` the pooler keeps for
        this client (PgBouncer takes the server's report of it as the client's own): the
        deployment's tag would then be gone from the server's view of its transactions. An
        open transaction is still rolled back first (asyncpg's own step)."""
        if not self.keeps_session:
            return ""
        query: str = super().get_reset_query()
        return query


def is_queue_connection(connection: object) -> TypeGuard[QueueConnection]:
    """Whether ``connection`` is a :class:`QueueConnection` itself (asyncpg's ``isinstance``
    is true of any of its connections and of pool proxies, whatever the class asked for)."""
    return issubclass(type(connection), QueueConnection)


def keep_no_statements(connection: DatabaseConnection) -> None:
    """``connection`` goes through a transaction-mode pooler, where the next transaction may
    run in another server session: it prepares nothing (:func:`prepared_name` gives ``None``,
    and its callers write the values into the statement instead)."""
    if is_queue_connection(connection):
        connection.sql_prepared = None
        connection.keeps_session = False


def keeps_session(connection: DatabaseConnection) -> bool:
    """Whether what ``connection`` leaves in its server session (``SET``, ``PREPARE``) stays
    its own: ``False`` behind a transaction-mode pooler (see :func:`keep_no_statements`),
    where another client's next transaction may run in that session."""
    return getattr(connection, "keeps_session", True)


async def prepared_name(
    connection: DatabaseConnection, statement: str, parameter_types: str
) -> str | None:
    """The name under which ``statement`` (with ``$n`` parameters of ``parameter_types``) is
    prepared in the connection's session, preparing it on first use. ``None`` when the
    connection does not track its session's statements (it is no :class:`QueueConnection`)."""
    prepared: OrderedDict[str, None] | None = getattr(connection, "sql_prepared", None)
    if prepared is None:
        return None
    name = _name(statement, parameter_types)
    if name in prepared:
        prepared.move_to_end(name)
        return name
    if len(prepared) >= MAX_PREPARED_STATEMENTS:
        oldest = next(iter(prepared))
        await connection.execute(f"DEALLOCATE {oldest}")
        del prepared[oldest]
    text = statement.strip().rstrip(";")
    await connection.execute(f"PREPARE {name} ({parameter_types}) AS {text}")
    prepared[name] = None
    return name


@functools.lru_cache(maxsize=1024)
def _name(statement: str, parameter_types: str) -> str:
    """A name derived from the statement itself, so that one name never means two texts."""
    text = statement.strip().rstrip(";")
    digest = hashlib.blake2b(f"{parameter_types}|{text}".encode(), digest_size=10)
    return "endpoint_runtime_" + digest.hexdigest()
