"""The queue's insert trigger notifies only a channel marked waiting (transport.waiting), and
the mark is what the roles of the least-privilege grants may read and write."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import msgspec
import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import EndpointTables
from endpoint_runtime.database.privileges import grant_statements
from endpoint_runtime.transport import QueueAddress, sending
from endpoint_runtime.transport.waiting import Waiting, waiting_table
from tests.support.notifications import Heard
from tests.support.roles import Role, login_role

QUEUE = QueueAddress("waited_on")


class Ping(msgspec.Struct):
    n: int


@pytest.fixture
async def heard(transport: PostgresTransport) -> AsyncIterator[Heard]:
    await transport.create_queue(QUEUE)
    listening = await asyncpg.connect(transport.dsn)
    try:
        async with Heard(QUEUE.notify_channel).listening(listening) as heard:
            yield heard
    finally:
        await listening.close()


async def test_a_send_notifies_only_while_the_channel_is_marked_waiting(
    transport: PostgresTransport, heard: Heard
) -> None:
    waiting = Waiting(QUEUE)
    assert not await waiting.is_waiting(transport.pool)
    await transport.send(QUEUE, create_outgoing(Ping(1)))
    assert await heard.before_marker(transport.pool) == []

    assert await waiting.mark(transport.pool)  # this call made the mark
    assert not await waiting.mark(transport.pool)  # it was there
    await transport.send(QUEUE, create_outgoing(Ping(2)))
    await transport.send_many(QUEUE, [create_outgoing(Ping(n)) for n in (3, 4)])
    assert await heard.before_marker(transport.pool) == ["", ""]

    assert await waiting.clear(transport.pool)
    assert not await waiting.clear(transport.pool)
    await transport.send(QUEUE, create_outgoing(Ping(5)))
    assert await heard.before_marker(transport.pool) == []
    assert await transport.depth(QUEUE) == 5  # every send went in, notified or not


async def test_the_mark_of_one_queue_does_not_make_another_notify(
    transport: PostgresTransport, heard: Heard
) -> None:
    other = QueueAddress("other_queue")
    await transport.create_queue(other)
    assert await Waiting(other).mark(transport.pool)
    await transport.send(QUEUE, create_outgoing(Ping(1)))
    assert await heard.before_marker(transport.pool) == []


@pytest.fixture
async def sending_role(database_dsn: str) -> AsyncIterator[Role]:
    async with login_role(database_dsn) as role:
        yield role


async def test_a_role_that_may_only_insert_sends_and_notifies_a_waiting_channel(
    transport: PostgresTransport, heard: Heard, sending_role: Role
) -> None:
    """The trigger reads the table of waiting channels as its owner: the SEND grant (INSERT
    on the queue) is all a sender needs, as before the mark."""
    await transport.pool.execute(
        f'GRANT INSERT ON TABLE {QUEUE.qualified} TO "{sending_role.name}"')
    assert await Waiting(QUEUE).mark(transport.pool)
    connection = await asyncpg.connect(sending_role.dsn)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await connection.fetchval(f"SELECT count(*) FROM {waiting_table('public').qualified}")
        await sending.send(connection, QUEUE, create_outgoing(Ping(1)))
    finally:
        await connection.close()
    assert await heard.before_marker(transport.pool) == [""]


async def test_the_endpoints_grants_let_its_role_mark_and_clear_its_channel(
    transport: PostgresTransport, sending_role: Role
) -> None:
    tables = EndpointTables(queue=QUEUE, error_queue=QueueAddress("error"),
                            waiting=waiting_table("public"))
    await transport.create_queue(QUEUE)
    for statement in grant_statements(tables, sending_role.name):
        if "error" not in statement:
            await transport.pool.execute(statement)
    connection = await asyncpg.connect(sending_role.dsn)
    try:
        waiting = Waiting(QUEUE)
        assert await waiting.mark(connection)
        assert await waiting.is_waiting(connection)
        assert await waiting.clear(connection)
    finally:
        await connection.close()
