"""Hostile input against a real PostgreSQL: names that try to break out of SQL literals,
reply addresses that name business tables, input that would grow memory without end, names
that would drive the terminal.

Each test here failed on the code before its fix (issue 13, items 7 to 10).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Callable

import asyncpg
import msgspec
import pytest

from endpoint_runtime import Endpoint
from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.policy import (
    FAILURE_CACHE_SIZE,
    ErrorHeaders,
    FailedMessages,
)
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.delayed.postgres import PostgresDelayedMessageStore
from endpoint_runtime.errors import NotAQueueError, QueueNotFoundError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress, queue_tables, quote_identifier, sending
from endpoint_runtime.transport.connection import MAX_PREPARED_STATEMENTS
from endpoint_runtime.transport.waiting import Waiting
from endpoint_runtime.wire.messages import Headers, TransportMessage
from endpoint_runtime.wire.serialization import MessageTypes
from tests.support import reply_endpoints
from tests.support.cli import Outcome, quiet_logging, run_cli
from tests.support.reply_endpoints import Ping

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
    assert await Waiting(address).mark(transport.pool)  # sends notify a channel that waits
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


# --- item 8: sends and replies write to queue tables only ----------------------------------

CRAFTED_REPLY_ADDRESSES = {
    "orders": "a business table with the columns of a send (no seq)",
    "accounting.ledger": "the same in another schema",
    "archive.inbox": "a queue table in a schema the endpoint may not send to",
    "accounting.orders_view": "a view of the business table",
}


async def prepare_replier(transport: PostgresTransport, endpoint: Endpoint) -> None:
    for queue in (endpoint.name, "error", "client", "archive.inbox"):
        await transport.create_queue(queue)
    await transport.pool.execute(
        "CREATE SCHEMA accounting;"
        "CREATE TABLE orders (id uuid PRIMARY KEY, expires timestamp, headers text, body bytea);"
        "CREATE TABLE accounting.ledger (LIKE orders);"
        "CREATE VIEW accounting.orders_view AS SELECT * FROM orders")
    async with transport.pool.acquire() as connection:
        if endpoint.settings.outbox is not None:
            await OutboxStorage.for_settings(endpoint.address, endpoint.settings).setup(
                connection)
        assert endpoint.delayed_store is not None
        await endpoint.delayed_store.setup_infrastructure(connection)


REPLIERS = ["atomic", "receive_only", "batched", "none", "with_outbox"]


@pytest.mark.parametrize("name", REPLIERS)
async def test_a_crafted_reply_address_writes_nothing_and_ends_in_the_error_queue(
    transport: PostgresTransport, name: str
) -> None:
    endpoint: Endpoint = getattr(reply_endpoints, name)
    await prepare_replier(transport, endpoint)
    for reply_to in [*CRAFTED_REPLY_ADDRESSES, "client"]:
        await transport.send(endpoint.name, create_outgoing(Ping(reply_to), reply_to=reply_to))
    settings = msgspec.structs.replace(endpoint.settings, transport=msgspec.structs.replace(
        endpoint.settings.transport, allowed_schemas=("public", "accounting")))
    strategy = endpoint.create_strategy(endpoint.create_pipeline(settings), transport.pool,
                                        settings)
    expected = len(CRAFTED_REPLY_ADDRESSES)
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        for _ in range(60):  # far more than 5 messages x 2 attempts need
            if (await transport.depth("error") == expected
                    and await transport.depth(endpoint.name) == 0):
                break
            await slot.round()
        await slot.close()

    for table in ("orders", "accounting.ledger", "archive.inbox"):
        count = await transport.pool.fetchval(f"SELECT count(*) FROM {table}")
        assert count == 0, f"a reply was written into {table}"
    assert await transport.depth("client") == 1  # a real reply address still works
    assert await transport.depth(endpoint.name) == 0
    failed = {}
    while (row := await transport.receive("error")) is not None:
        assert isinstance(row, TransportMessage)
        failed[row.headers[Headers.REPLY_TO_ADDRESS]] = row.headers
    assert set(failed) == set(CRAFTED_REPLY_ADDRESSES)
    for reply_to, headers in failed.items():
        assert headers[ErrorHeaders.EXCEPTION_TYPE].endswith(NotAQueueError.__name__)
        assert reply_to.split(".")[-1] in headers[ErrorHeaders.MESSAGE]
    assert "schema" in failed["archive.inbox"][ErrorHeaders.MESSAGE]
    for layout in ("orders", "accounting.ledger", "accounting.orders_view"):
        assert "queue layout" in failed[layout][ErrorHeaders.MESSAGE]


async def test_a_queue_table_is_verified_once_per_connection(
    transport: PostgresTransport,
) -> None:
    await transport.create_queue("client")
    address = QueueAddress("client")
    async with transport.pool.acquire() as connection:
        await queue_tables.ensure_queue_table(connection, address, allowed_schemas=None)
        assert address in connection.verified_queues
        await connection.execute("DROP TABLE client")  # a second check would notice
        await queue_tables.ensure_queue_table(connection, address, allowed_schemas=None)
        with pytest.raises(QueueNotFoundError):
            await queue_tables.ensure_queue_table(connection, QueueAddress("other"),
                                                  allowed_schemas=None)


# --- item 9: memory stays bounded whatever the input ----------------------------------------

MEMORY_LIMIT = 200 * 1024 * 1024  # what all of this may keep at most (the receiver RSS)


def retained_bytes(feed: Callable[[], object]) -> int:
    """Bytes still allocated after ``feed`` ran (its result kept alive while measuring)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = feed()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return after - before


def test_huge_enclosed_message_types_headers_are_not_kept() -> None:
    types = MessageTypes()
    name = types.add(Ping)

    def feed() -> MessageTypes:
        for i in range(2_000):  # 200 MB of headers, each naming a known type first
            assert types.resolve(f"{name};{'x' * 100_000}{i}") is Ping
        return types

    assert retained_bytes(feed) < 5 * 1024 * 1024
    assert types.resolve(name) is Ping


def test_the_failure_cache_is_bounded_by_size() -> None:
    failures = FailedMessages()

    def feed() -> FailedMessages:
        for i in range(FAILURE_CACHE_SIZE):  # 16 K message + the same in the trace, each
            failures.record(uuid.uuid4(), ValueError(f"{i} {'y' * 20_000}"), unrecoverable=False)
        return failures

    retained = retained_bytes(feed)
    assert len(failures) == FAILURE_CACHE_SIZE  # every attempt count is kept
    assert retained < 40 * 1024 * 1024, retained
    assert failures.text_size <= 12_000_000


async def test_prepared_statements_per_connection_are_bounded(
    transport: PostgresTransport,
) -> None:
    tables = MAX_PREPARED_STATEMENTS + 40
    await transport.pool.execute("; ".join(
        f'CREATE TABLE "q{i}" (id uuid PRIMARY KEY, expires timestamp, headers text, '
        "body bytea, seq bigint GENERATED BY DEFAULT AS IDENTITY)" for i in range(tables)))
    async with transport.pool.acquire() as connection:
        for i in [*range(tables), 0]:  # q0 again at the end: deallocated, prepared again
            statement = await sending.send_statement(connection, QueueAddress(f"q{i}"),
                                                     create_outgoing(Ping("hi")))
            assert statement is not None
            await connection.execute(statement)
        assert len(connection.sql_prepared) == MAX_PREPARED_STATEMENTS
        on_server = await connection.fetchval(
            "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'endpoint_runtime_%'")
        assert on_server == MAX_PREPARED_STATEMENTS
        for i in range(5_000):  # reply addresses that name no table: nothing is kept
            with pytest.raises(QueueNotFoundError):
                await queue_tables.ensure_queue_table(
                    connection, QueueAddress(f"missing_{i}"), allowed_schemas=None)
        assert len(connection.verified_queues) == 0
    assert await transport.depth("q0") == 2


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
