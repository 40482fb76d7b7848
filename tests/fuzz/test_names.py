"""Queue and schema names: any text is a name or is refused with InvalidQueueNameError, and a
name always stays a name in SQL (every identifier quoted, every literal escaped), also with
``standard_conforming_strings`` off."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import EndpointTables
from endpoint_runtime.database.privileges import grant_statements
from endpoint_runtime.delayed.postgres import PostgresDelayedMessageStore
from endpoint_runtime.errors import InvalidQueueNameError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress, quote_identifier
from endpoint_runtime.transport.addresses import ENDPOINT_NAME_SUFFIXES, TABLE_NAME_SUFFIXES
from endpoint_runtime.wire.messages import TransportMessage
from tests.fuzz.conftest import examples, outcome
from tests.fuzz.endpoints import Echo
from tests.integration.test_hostile_input import (
    INJECTING_NAMES,
    turn_off_standard_conforming_strings,
)
from tests.support import least_privilege_endpoints

ENDPOINT_SUFFIXES = TABLE_NAME_SUFFIXES + ENDPOINT_NAME_SUFFIXES

# Names: any text (NUL included, which must be refused), and injection attempts inside text.
names = st.one_of(
    st.text(min_size=0, max_size=30),
    st.builds(lambda before, attack, after: before + attack + after,
              st.text(max_size=5), st.sampled_from([*INJECTING_NAMES, '"', '""', ".", "\\"]),
              st.text(max_size=5)),
)


@given(address=names)
def test_an_address_parses_into_names_that_print_back_to_it(address: str) -> None:
    parsed = outcome(lambda: QueueAddress.parse(address))
    if isinstance(parsed, InvalidQueueNameError):
        assert str(parsed)
        return
    assert isinstance(parsed, QueueAddress)
    assert QueueAddress.parse(str(parsed)) == parsed
    assert QueueAddress.parse(parsed.qualified) == parsed


@given(schema=names, table=names)
def test_names_are_refused_clearly_or_quoted_whole(schema: str, table: str) -> None:
    address = outcome(lambda: QueueAddress(table, schema))
    if isinstance(address, InvalidQueueNameError):
        assert "\x00" in schema + table or not schema or not table or len(
            max(schema, table, key=lambda name: len(name.encode())).encode()) > 63
        return
    assert isinstance(address, QueueAddress)
    quoted_schema, _, quoted_table = address.qualified.partition('"."')
    assert quoted_schema[1:].replace('""', '"') == schema
    assert quoted_table[:-1].replace('""', '"') == table


@pytest.fixture
async def nonconforming(database_dsn: str) -> AsyncIterator[PostgresTransport]:
    """The test's database, every session of which reads \\' as a quote."""
    await turn_off_standard_conforming_strings(database_dsn)
    settings = TransportSettings(dsn=database_dsn, pool_max_size=4)
    async with PostgresTransport.connect(settings) as transport:
        yield transport


async def exact_table_exists(transport: PostgresTransport, address: QueueAddress) -> bool:
    return bool(await transport.pool.fetchval(
        "SELECT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = $1 AND c.relname = $2)", address.schema, address.table))


async def injected(transport: PostgresTransport) -> bool:
    return bool(await transport.pool.fetchval(
        "SELECT EXISTS (SELECT FROM pg_class WHERE relname = 'pwned')"))


@examples(0.3)
@given(schema=names.filter(lambda name: not name.startswith("pg_")), table=names)
async def test_every_queue_operation_keeps_a_hostile_name_a_name(
    nonconforming: PostgresTransport, schema: str, table: str
) -> None:
    transport = nonconforming
    address = outcome(lambda: QueueAddress(table, schema))
    assume(isinstance(address, QueueAddress))  # refusals: the test above
    assert isinstance(address, QueueAddress)
    room = outcome(lambda: address.check_room_for_suffixes(ENDPOINT_SUFFIXES, "endpoint"))
    assume(not isinstance(room, InvalidQueueNameError))  # a clear refusal at Endpoint()
    try:
        await transport.create_queue(address)
        assert await exact_table_exists(transport, address)
        await transport.send(address, create_outgoing(Echo(1, table)))
        assert address in {info.address for info in await transport.list_queues(schema)}
        received = await transport.receive(address)
        assert isinstance(received, TransportMessage)
        assert received.body == create_outgoing(Echo(1, table)).body
        async with transport.pool.acquire() as connection:
            await PostgresDelayedMessageStore.for_endpoint(address).setup_infrastructure(
                connection)
            await OutboxStorage.for_endpoint(address, None).setup(connection)
        assert await transport.purge_expired(address) == 0
        await transport.drop_queue(address)
        assert not await exact_table_exists(transport, address)
    finally:
        assert not await injected(transport)
        await drop_schema(transport, address)


async def drop_schema(transport: PostgresTransport, address: QueueAddress) -> None:
    """What an example made: its schema, or its tables in ``public``."""
    if address.schema != "public":
        await transport.pool.execute(
            f"DROP SCHEMA IF EXISTS {quote_identifier(address.schema)} CASCADE")
        return
    for suffix in ("", ".delayed", "_OutboxData"):
        table = QueueAddress(address.table + suffix, address.schema)
        await transport.pool.execute(f"DROP TABLE IF EXISTS {table.qualified}")


def parses(queue: str) -> bool:
    return isinstance(outcome(lambda: QueueAddress.parse(queue)), QueueAddress)


@given(role=names, sends_to=st.lists(names, max_size=3))
def test_grant_statements_quote_every_name(role: str, sends_to: list[str]) -> None:
    tables = EndpointTables.of(least_privilege_endpoints.atomic,
                               least_privilege_endpoints.atomic.settings)
    statements = outcome(lambda: grant_statements(tables, role, sends_to=sends_to,
                                                  database=role))
    if isinstance(statements, InvalidQueueNameError):
        assert "\x00" in role or not all(parses(queue) for queue in sends_to)
        return
    assert isinstance(statements, list)
    who = quote_identifier(role)
    for statement in statements:
        assert statement.startswith("GRANT ")
        assert statement.endswith(f" TO {who};")
        assert "CREATE" not in statement.split(" ON ")[0]
    granted = " ".join(statements)
    for queue in sends_to:
        assert f"INSERT ON TABLE {QueueAddress.parse(queue).qualified} " in granted or (
            QueueAddress.parse(queue) in {tables.queue, tables.error_queue, tables.delayed,
                                          tables.subscriptions})
