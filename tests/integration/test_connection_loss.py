"""A connection loss that asyncpg reports first as a client-state error, against a real
PostgreSQL, without Ray: the race reproduced, then classified by what is found right after.

When the server ends a pooled connection while it waits in the pool (a restart,
``pg_terminate_backend``), asyncpg reads the server's FATAL message while the connection is
idle. A send that takes that connection before asyncpg has also read the end of the socket
fails with ``InternalClientError: cannot switch to state 15; another operation (2) is in
progress``; the connection is found closed right after. A clean clone's CI once saw a
database restart move a message to the error queue that way: the loss was charged to it.

The handlers below plant exactly that: they end the backend of the connection on top of the
pool (asyncpg's pool is last in, first out) and block the event loop until that backend is
gone (a thread waits for it: a clean clone's CI on a busy machine once ended no backend within
a fixed 0.2 s), so that the server's last message and the end of the connection are both
there; then they let the loop read once or more and send. What the loop has read when the
send starts is the race; the tests run enough messages to see it won and lost (typically 10
client-state errors, 6 losses mid-statement of 16 first attempts), and count each outcome as
observed.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time

import asyncpg
import msgspec
import pytest

from endpoint_runtime import Endpoint, HandlerContext
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport, close_pool, connect_pool
from endpoint_runtime.errors import ConnectionLostError
from endpoint_runtime.transactions.base import ImmediateDispatcher
from endpoint_runtime.transport.connection import found_lost
from endpoint_runtime.wire.messages import ErrorHeaders
from tests.support.draining import ATTEMPTS_TABLES, attempts_by_message, prepare, received_all
from tests.support.modes import MODES

MESSAGES = 16
GONE_WITHIN = 30.0
"""Seconds an ended backend may take to go (a busy machine)."""
RETRYING = [mode for mode in MODES if mode != "none"]


class Note(msgspec.Struct):
    n: int


class Echo(msgspec.Struct):
    n: int


def end_and_wait_until_gone(dsn: str, pid: int) -> None:
    """End backend ``pid`` and return once it is gone (its last message sent, its socket
    closed), on a connection and an event loop of this call's own: run from a thread while
    the test's loop is blocked, so that loop reads nothing of the ended connection meanwhile."""
    async def end() -> None:
        admin = await asyncpg.connect(dsn)
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
            deadline = time.monotonic() + GONE_WITHIN
            while await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                                       pid):
                assert time.monotonic() < deadline, f"backend {pid} still there"
                await asyncio.sleep(0.01)
        finally:
            await admin.close()

    asyncio.run(end())


async def end_the_next_pooled_connection(transport: PostgresTransport, turns: int) -> None:
    """End the server session of the connection the pool hands out next, and let the event
    loop read ``turns`` times: with 1 or 2 it has usually read the server's FATAL message and
    not yet the end of the socket (the race); with 3, usually both."""
    async with transport.pool.acquire() as pooled:
        pid = await pooled.fetchval("SELECT pg_backend_pid()")
    # Blocking this loop on purpose (a thread of its own ends the backend and waits for it to
    # be gone, however busy the machine): the server's last message and the end of the
    # connection both arrive while this loop reads nothing, so the turns below decide what
    # it has read.
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        thread.submit(end_and_wait_until_gone, transport.settings.dsn, pid).result()
    time.sleep(0.05)  # noqa: ASYNC251 - the end of the socket, on loopback
    for _ in range(turns):
        await asyncio.sleep(0)


def endpoint_in(mode: str, transport: PostgresTransport,
                seen: collections.Counter[str]) -> Endpoint:
    """No retries: a loss charged to a message sends it to the error queue at once."""
    retries = {} if mode == "none" else {"immediate_retries": 0, "delayed_retries": 0}
    endpoint = Endpoint("notes", **MODES[mode], **retries)

    @endpoint.handler
    async def note(message: Note, context: HandlerContext) -> None:
        # Outside the message's transaction: every attempt is seen, rolled back or not.
        attempt = await transport.pool.fetchval(
            "WITH noted AS (INSERT INTO attempts (n) VALUES ($1) RETURNING n) "
            "SELECT count(*) + 1 FROM attempts WHERE n = $1", message.n)
        if attempt == 1:
            await end_the_next_pooled_connection(transport, turns=1 + message.n % 3)
        try:
            await context.send(Echo(message.n), "echoes", immediate=True)
        except Exception as exc:
            seen[type(exc).__name__] += 1
            raise
        seen["sent"] += 1
        await context.connection.execute("INSERT INTO handled (n) VALUES ($1)", message.n)

    return endpoint


async def drain_through_losses(transport: PostgresTransport,
                               endpoint: Endpoint) -> list[BaseException]:
    """Receive until the queue is empty, as a receiver does: a round that raises (the
    transport failed) ends its slot, and a fresh slot on a fresh connection goes on. Returns
    what the rounds raised."""
    strategy = endpoint.create_strategy(endpoint.create_pipeline(), transport.pool,
                                        endpoint.settings)
    raised: list[BaseException] = []
    for _ in range(4 * MESSAGES):
        async with transport.pool.acquire() as connection:
            slot = strategy.open_slot(connection)
            try:
                while (await slot.round()).taken:
                    pass
                return raised
            except Exception as exc:
                raised.append(exc)
            finally:
                await slot.close()
    raise AssertionError(f"the queue did not empty; rounds raised {raised!r}")


async def setup(transport: PostgresTransport, endpoint: Endpoint) -> None:
    await prepare(transport, endpoint, "notes", "echoes", "error", tables=ATTEMPTS_TABLES)
    for n in range(MESSAGES):
        await transport.send("notes", create_outgoing(Note(n)))


@pytest.mark.parametrize("mode", RETRYING)
async def test_a_loss_first_seen_as_a_client_state_error_is_not_charged_to_the_message(
    transport: PostgresTransport, mode: str,
) -> None:
    seen: collections.Counter[str] = collections.Counter()
    endpoint = endpoint_in(mode, transport, seen)
    await setup(transport, endpoint)

    raised = await asyncio.wait_for(drain_through_losses(transport, endpoint), 120)

    # Not charged: without retries a charged attempt would have sent the message to the
    # error queue; every message came back and was handled once.
    assert await received_all(transport, "error") == []
    handled = await transport.pool.fetch("SELECT n FROM handled ORDER BY n")
    assert [row["n"] for row in handled] == list(range(MESSAGES))
    # The race, observed: some sends met the ended connection after asyncpg had read only
    # the server's last message (the client-state error, now a ConnectionLostError), some
    # met it mid-statement (asyncpg's ConnectionDoesNotExistError, a loss as before), and
    # the others got a fresh connection from the pool. Each loss is the transport's: raised
    # to the receive loop, or rolled back by the strategy (whose receive connection is fine).
    assert seen["ConnectionLostError"] >= 1, seen
    assert seen["sent"] >= 1, seen
    assert set(seen) <= {"ConnectionLostError", "ConnectionDoesNotExistError", "sent"}, seen
    assert all(isinstance(exc, ConnectionLostError | asyncpg.ConnectionDoesNotExistError)
               for exc in raised), raised
    lost = seen["ConnectionLostError"] + seen["ConnectionDoesNotExistError"]
    attempts = await attempts_by_message(transport)
    if mode != "batched":  # a batch's loss rolls back, and repeats, the whole batch
        assert sum(attempts.values()) == MESSAGES + lost


async def test_in_none_mode_the_message_of_such_a_loss_is_kept_in_the_error_queue(
    transport: PostgresTransport,
) -> None:
    """The message left its queue before its handler ran: nothing can bring it back, so it
    is charged and its copy goes to the error queue, named by the loss."""
    seen: collections.Counter[str] = collections.Counter()
    endpoint = endpoint_in("none", transport, seen)
    await setup(transport, endpoint)

    raised = await asyncio.wait_for(drain_through_losses(transport, endpoint), 120)

    assert seen["ConnectionLostError"] >= 1, seen
    failed = await received_all(transport, "error")
    assert len(failed) == seen["ConnectionLostError"]
    assert {m.headers[ErrorHeaders.EXCEPTION_TYPE] for m in failed} == {
        "endpoint_runtime.errors.ConnectionLostError"}
    # A loss met mid-statement is raised to the receive loop as before: that message, in
    # hand, is lost (at most once), and only that one.
    assert len(raised) == seen["ConnectionDoesNotExistError"], (raised, seen)
    handled = await transport.pool.fetchval("SELECT count(*) FROM handled")
    assert handled + len(failed) + len(raised) == MESSAGES


@pytest.mark.parametrize("mode", RETRYING)
async def test_a_handler_that_misuses_its_connection_concurrently_is_still_charged(
    transport: PostgresTransport, mode: str,
) -> None:
    """Two statements at once on one connection: asyncpg refuses the second, the
    connection stays open, and the failure is the message's (the error queue, no retries)."""
    endpoint = Endpoint("notes", **MODES[mode], immediate_retries=0, delayed_retries=0)

    @endpoint.handler
    async def note(message: Note, context: HandlerContext) -> None:
        if message.n == 0:  # both awaited to their end: nothing is left running
            outcomes = await asyncio.gather(
                context.connection.execute("SELECT pg_sleep(0.05)"),
                context.connection.execute("SELECT 1"), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
        await context.connection.execute("INSERT INTO handled (n) VALUES ($1)", message.n)

    await prepare(transport, endpoint, "notes", "error", tables=ATTEMPTS_TABLES)
    for n in range(2):
        await transport.send("notes", create_outgoing(Note(n)))

    raised = await asyncio.wait_for(drain_through_losses(transport, endpoint), 60)

    assert raised == []
    failed = await received_all(transport, "error")
    assert [msgspec.json.decode(m.body, type=Note).n for m in failed] == [0]
    assert failed[0].headers[ErrorHeaders.EXCEPTION_TYPE] == \
        "asyncpg.exceptions._base.InterfaceError", failed[0].headers
    assert await transport.pool.fetchval("SELECT array_agg(n) FROM handled") == [1]


async def test_found_lost_waits_for_a_loss_and_not_longer_than_its_bound(
    transport: PostgresTransport,
) -> None:
    connection = await asyncpg.connect(transport.settings.dsn)
    try:
        started = time.monotonic()
        assert not await found_lost(connection, None, within=0.2)
        assert time.monotonic() - started >= 0.2
        pid = await connection.fetchval("SELECT pg_backend_pid()")
        assert await transport.pool.fetchval("SELECT pg_terminate_backend($1)", pid)
        assert await found_lost(connection, within=5)
        assert not await found_lost(None)
    finally:
        connection.terminate()


@pytest.mark.parametrize("sender", ["dispatcher", "transport"])
async def test_a_send_whose_connection_is_lost_on_its_way_back_to_the_pool_is_sent(
    transport: PostgresTransport, sender: str,
) -> None:
    """The send committed; then, as asyncpg resets the connection to give it back to the
    pool, the server ends its session (planted in the pool's reset: the backend is ended and
    gone before the reset's statement). asyncpg ends the connection and raises from the
    release. The send once failed with that error: a handler's send in ``NONE`` mode put a
    message with its effect committed and its echo sent into the error queue as well (a
    clean clone's chaos run, counted twice), and a retrying mode ran it again."""
    dsn = transport.settings.dsn
    ended: list[int] = []

    async def reset(connection: asyncpg.Connection[asyncpg.Record]) -> None:
        if not ended:
            ended.append(connection.get_server_pid())
            await asyncio.to_thread(end_and_wait_until_gone, dsn, ended[0])
        await connection.execute("SELECT 1")

    await transport.create_queue("echoes")
    pool = await connect_pool(dsn, min_size=1, max_size=1, reset=reset)
    address = transport.address("echoes")
    try:
        through_pool = PostgresTransport(pool, transport.settings, dsn)
        for n in range(2):  # the second one on the pool's new connection
            message = create_outgoing(Echo(n))
            if sender == "dispatcher":
                await ImmediateDispatcher(pool, None).dispatch(address, message, immediate=True)
            else:
                await through_pool.send(address, message)
    finally:
        await close_pool(pool)
    assert len(ended) == 1
    sent = await received_all(transport, "echoes")
    assert sorted(msgspec.json.decode(m.body, type=Echo).n for m in sent) == [0, 1]
