"""Hostile input against a real PostgreSQL: names that try to break out of SQL literals,
reply addresses that name business tables, input that would grow memory without end, names
that would drive the terminal.

Each test here failed on the code before its fix (issue 13, items 7 to 10).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable

import asyncpg
import msgspec
import pytest

from endpoint_runtime.delayed.postgres import PostgresDelayedMessageStore
from endpoint_runtime.outbox import OutboxStorage
from endpoint_runtime.outgoing import create_outgoing
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import PostgresTransport, QueueAddress, quote_identifier
from tests.support.cli import Outcome, quiet_logging, run_cli

# Names that end a literal early when only ' is doubled and the server reads \' as a quote
# (standard_conforming_strings off), or that end a dollar-quoted body ($migrate$ in the
# delayed store's DO block).
INJECTING_NAMES = [
    "x\\');CREATE TABLE pwned();--",
    "x');CREATE TABLE pwned();--",
    "y\\\\');CREATE TABLE pwned();--",
    "d$migrate$;CREATE TABLE pwned();--",
    "e$$;CREATE TABLE pwned();--",
]


class Ping(msgspec.Struct):
    pass


async def turn_off_standard_conforming_strings(dsn: str) -> None:
    """Every new session of the database of ``dsn`` reads \\' in '...' as a quote."""
    connection = await asyncpg.connect(dsn)
    try:
        database = await connection.fetchval("SELECT current_database()")
        await connection.execute(
            f"ALTER DATABASE {quote_identifier(database)} SET standard_conforming_strings = off"
        )
    finally:
        await connection.close()


@pytest.fixture
def nonconforming_dsn(database_dsn: str) -> str:
    asyncio.run(turn_off_standard_conforming_strings(database_dsn))
    return database_dsn


@pytest.fixture
async def nonconforming(database_dsn: str) -> AsyncIterator[PostgresTransport]:
    await turn_off_standard_conforming_strings(database_dsn)
    settings = TransportSettings(dsn=database_dsn, pool_max_size=4)
    async with PostgresTransport.connect(settings) as transport:
        assert await transport.pool.fetchval("SHOW standard_conforming_strings") == "off"
        yield transport


async def _pwned(transport: PostgresTransport) -> bool:
    return bool(await transport.pool.fetchval("SELECT to_regclass('public.pwned') IS NOT NULL"))


async def _assert_send_notifies(transport: PostgresTransport, address: QueueAddress) -> None:
    await transport.create_queue(address)  # the trigger again (the other transport dropped it)
    notified = asyncio.Event()

    def on_notify(*_: object) -> None:
        notified.set()

    async with transport.pool.acquire() as listener:
        await listener.add_listener(address.notify_channel, on_notify)
        await transport.send(address, create_outgoing(Ping()))
        await asyncio.wait_for(notified.wait(), timeout=10)
        await listener.remove_listener(address.notify_channel, on_notify)


# --- item 7: literals in DDL --------------------------------------------------------------


@pytest.mark.parametrize("name", INJECTING_NAMES)
async def test_every_ddl_path_keeps_a_hostile_queue_name_a_name(
    nonconforming: PostgresTransport, name: str
) -> None:
    transport = nonconforming
    address = QueueAddress(name)
    await transport.create_queue(address)  # notify trigger: the channel is a literal
    assert await transport.depth(address) == 0
    no_notify = TransportSettings(dsn=transport.dsn, notify_on_send=False,
                                  create_body_string_column=True)
    async with PostgresTransport.connect(no_notify) as other:
        await other.create_queue(address)  # body_string column, trigger dropped
    delayed = PostgresDelayedMessageStore.for_endpoint(QueueAddress(name[:40]))
    outbox = OutboxStorage.for_endpoint(QueueAddress(name[:40]), None)
    async with transport.pool.acquire() as connection:
        await delayed.setup_infrastructure(connection)  # channel and table literals
        await delayed.setup_infrastructure(connection)  # again: the key migration's DO block
        await outbox.setup(connection)
    assert not await _pwned(transport)
    listed = {info.address for info in await transport.list_queues()}
    assert address in listed
    await _assert_send_notifies(transport, address)  # the channel literal read back exactly
    assert await transport.purge(address) == 1
    assert await transport.purge_expired(address) == 0
    await transport.drop_queue(address)
    assert not await _pwned(transport)


def command_line(dsn: str, capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> Callable[..., Outcome]:
    """``endpoint-runtime ARGV...`` in this process, on the database of ``dsn``."""
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", dsn)
    quiet_logging(monkeypatch)
    return functools.partial(run_cli, capsys)


def test_queues_create_on_the_command_line_keeps_a_hostile_name_a_name(
    nonconforming_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = command_line(nonconforming_dsn, capsys, monkeypatch)
    outcome = cli("queues", "create", INJECTING_NAMES[0])
    assert outcome.code == 0, outcome.err

    async def check() -> None:
        settings = TransportSettings(dsn=nonconforming_dsn)
        async with PostgresTransport.connect(settings) as transport:
            assert await transport.pool.fetchval("SHOW standard_conforming_strings") == "off"
            assert not await _pwned(transport)
            assert await transport.depth(INJECTING_NAMES[0]) == 0

    asyncio.run(check())


# --- item 10: names that would drive the terminal ------------------------------------------

TERMINAL_NAME = "q\x1b]0;owned\x07\x1b[2J\x1b[31mred\r\x9b1m"


def test_queue_names_reach_the_terminal_escaped(
    database_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def create() -> None:
        async with PostgresTransport.connect(TransportSettings(dsn=database_dsn)) as transport:
            await transport.create_queue(QueueAddress(TERMINAL_NAME))

    asyncio.run(create())
    cli = command_line(database_dsn, capsys, monkeypatch)
    outputs = [cli("queues", "list"), cli("queues", "peek", TERMINAL_NAME),
               cli("queues", "purge", TERMINAL_NAME), cli("queues", "create", TERMINAL_NAME),
               cli("queues", "list", "--schema", "no\x1b[2Jsuch")]
    for outcome in outputs:
        assert outcome.code == 0, outcome.err
        assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0
                       for c in outcome.out), repr(outcome.out)
    assert "q\\x1b]0;owned\\x07\\x1b[2J\\x1b[31mred\\r\\x9b1m" in outputs[0].out
