"""Endpoints behind PgBouncer in transaction mode, without Ray: every mode's strategy on
several slots whose pools connect through a real PgBouncer (``benchmarks.chaos.pooler``) with
two server connections per database, so that one client's consecutive transactions run in
different server sessions.

That the pooler does move sessions is shown first: a pool that keeps session statements (the
default, for a direct connection) fails through it. Then each mode drains a queue on eight
slots with ``pooler_dsn`` (one in the modes that hold two connections at once): every message
handled once, its message sent once, the
first attempt of every fifth failing and retried, nothing in the error queue.
"""

from __future__ import annotations

import asyncio
import collections

import asyncpg
import msgspec
import pytest

from endpoint_runtime import Endpoint, HandlerContext, TransportSettings
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport.connection import (
    QueueConnection,
    keep_no_statements,
    keeps_session,
)
from tests.support.draining import ATTEMPTS_TABLES, attempts_by_message, prepare, received_all
from tests.support.modes import MODES
from tests.support.poolers import POOLER_SIZE

MESSAGES = 120
SLOTS = 8


class Note(msgspec.Struct):
    n: int


class Echo(msgspec.Struct):
    n: int


def endpoint_in(mode: str, direct: asyncpg.Pool) -> Endpoint:
    retries = {} if mode == "none" else {"immediate_retries": 2, "delayed_retries": 0}
    endpoint = Endpoint("notes", **MODES[mode], **retries)

    @endpoint.handler
    async def note(message: Note, context: HandlerContext) -> None:
        # Outside the message's transaction and the pooler (the test's own connections): every
        # attempt is seen, rolled back or not.
        attempt = await direct.fetchval(
            "WITH noted AS (INSERT INTO attempts (n) VALUES ($1) RETURNING n) "
            "SELECT count(*) + 1 FROM attempts WHERE n = $1", message.n)
        await context.send(Echo(message.n), "echoes")
        await context.connection.execute("INSERT INTO handled (n) VALUES ($1)", message.n)
        if mode != "none" and message.n % 5 == 0 and attempt == 1:
            raise RuntimeError("the first attempt of every fifth message fails")

    return endpoint


async def drain_on_slots(transport: PostgresTransport, endpoint: Endpoint, slots: int) -> None:
    """Receive on ``slots`` slots at once until the queue is empty, as a receiver does."""
    strategy = endpoint.create_strategy(endpoint.create_pipeline(), transport.pool,
                                        endpoint.settings)

    async def slot_loop() -> None:
        async with transport.pool.acquire() as connection:
            slot = strategy.open_slot(connection)
            try:
                while (await slot.round()).taken:
                    pass
            finally:
                await slot.close()

    await asyncio.wait_for(asyncio.gather(*(slot_loop() for _ in range(slots))), 120)


@pytest.fixture
async def pooled(pooler: object, database_dsn: str) -> collections.abc.AsyncIterator[
        PostgresTransport]:
    """The test's database through the pooler, as ``pooler_dsn`` configures it."""
    settings = TransportSettings(dsn=database_dsn, pool_max_size=2 * SLOTS + 4,
                                 pooler_dsn=pooler.for_dsn(database_dsn))  # type: ignore[attr-defined]
    async with PostgresTransport.connect(settings) as transport:
        yield transport


async def test_session_statements_fail_through_the_pooler(pooler: object,
                                                          database_dsn: str) -> None:
    """The pooler hands a client's next transaction to another server session: a statement
    that client A prepared is missing when another client holds A's session in a transaction
    (what ``pooler_dsn`` makes the runtime avoid: it prepares nothing)."""
    dsn = pooler.for_dsn(database_dsn)  # type: ignore[attr-defined]
    a = await asyncpg.connect(dsn, statement_cache_size=0)
    b = await asyncpg.connect(dsn, statement_cache_size=0)
    try:
        await a.execute("PREPARE probe AS SELECT pg_backend_pid()")
        prepared_in = await a.fetchval("EXECUTE probe")  # LIFO: the same session again
        async with b.transaction():
            held = await b.fetchval("SELECT pg_backend_pid()")
            assert held == prepared_in  # B took the session A just left
            with pytest.raises(asyncpg.InvalidSQLStatementNameError):
                await a.execute("EXECUTE probe")
    finally:
        await a.close()
        await b.close()


async def test_a_statement_is_described_once_and_runs_in_any_server_session(
        pooler: object, database_dsn: str) -> None:
    """Behind the pooler a connection keeps each statement's description (one round trip per
    execution, ``QueueConnection._get_statement``), never a statement of the server session:
    the same query runs again while another client holds the session it ran in."""
    dsn = pooler.for_dsn(database_dsn)  # type: ignore[attr-defined]
    a = await asyncpg.connect(dsn, statement_cache_size=0, connection_class=QueueConnection)
    b = await asyncpg.connect(dsn, statement_cache_size=0)
    keep_no_statements(a)
    query = "SELECT pg_backend_pid() + $1::int * 0"
    try:
        first = await a.fetchval(query, 1)
        assert len(a.described) == 1
        [state] = a.described.values()
        async with b.transaction():
            assert await b.fetchval("SELECT pg_backend_pid()") == first  # B holds A's session
            assert await a.fetchval(query, 2) != first  # another session, same description
        assert list(a.described.values()) == [state]
        assert not state.name
        assert not state.prepared
    finally:
        await a.close()
        await b.close()


async def test_a_pooled_connection_taken_back_by_its_pool_resets_no_server_session(
        pooled: PostgresTransport) -> None:
    """A pool's reset of a connection it takes back (asyncpg: ``RESET ALL``, advisory locks
    unlocked, ...) would run in whatever server session the pooler picks. RESET ALL there
    cleared the application_name that PgBouncer keeps for the client, so later transactions of
    that client ran untagged; now a pooled connection's pool resets nothing in the session."""
    async with pooled.pool.acquire() as connection:
        await connection.execute("SET application_name = 'er-tagged'")  # as at its startup
    for _ in range(3):
        async with pooled.pool.acquire() as connection:
            assert await connection.fetchval("SELECT current_setting('application_name')") \
                == "er-tagged"


async def test_a_pooled_transport_keeps_nothing_in_the_session(
        pooled: PostgresTransport) -> None:
    async with pooled.pool.acquire() as connection:
        assert not keeps_session(connection)
        assert connection._con._config.statement_cache_size == 0


TWO_CONNECTIONS = {"receive_only", "outbox"}
"""Modes whose slot holds a second connection while its receive transaction is open (the sends
of receive-only, the outbox's business transaction): below the pooler's server connections
(docs/operations.md), here one slot on two."""


@pytest.mark.parametrize("mode", list(MODES))
async def test_every_mode_drains_through_the_pooler_once(
        pooled: PostgresTransport, pool: asyncpg.Pool, mode: str) -> None:
    endpoint = endpoint_in(mode, pool)
    await prepare(pooled, endpoint, "notes", "echoes", "error", tables=ATTEMPTS_TABLES)
    await pooled.send_many("notes", [create_outgoing(Note(n)) for n in range(MESSAGES)])

    await drain_on_slots(pooled, endpoint, slots=POOLER_SIZE - 1 if mode in TWO_CONNECTIONS
                         else SLOTS)

    assert await received_all(pooled, "error") == []
    handled = await pooled.pool.fetch("SELECT n FROM handled ORDER BY n")
    assert [row["n"] for row in handled] == list(range(MESSAGES))
    echoes = collections.Counter(msgspec.json.decode(m.body, type=Echo).n
                                 for m in await received_all(pooled, "echoes"))
    attempts = await attempts_by_message(pooled)  # read through the pooler too
    # Receive-only sends at once: a failed attempt's message stays sent.
    assert echoes == (attempts if mode == "receive_only"
                      else collections.Counter(range(MESSAGES)))
    failing = {n for n in range(MESSAGES) if n % 5 == 0} if mode != "none" else set()
    if mode != "batched":  # a failed batch is tried again whole
        assert attempts == {n: 2 if n in failing else 1 for n in range(MESSAGES)}
    assert all(attempts[n] >= 2 for n in failing)
    assert await pooled.depth("notes") == 0
