"""Where hostile rows ended: the tables of the fuzzed endpoints, putting rows into their
queues, and the count of rows by where they ended (shared by the in-process and the Ray
fuzz tests)."""

from __future__ import annotations

import collections
import uuid

from endpoint_runtime import Endpoint
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import EndpointTables, install
from endpoint_runtime.errors import PoisonMessageError
from endpoint_runtime.wire.messages import (
    ErrorHeaders,
    Headers,
    PoisonMessage,
    TransportMessage,
    decode_headers,
)
from tests.fuzz.endpoints import ENDPOINTS, HANDLED_TABLE, SINK
from tests.fuzz.strategies import Row


async def install_fuzzed(transport: PostgresTransport) -> PostgresTransport:
    """Every fuzzed endpoint's tables, the sink and the record of handled messages."""
    await transport.pool.execute(f"CREATE TABLE {HANDLED_TABLE} (endpoint text, n bigint)")
    await transport.create_queue(SINK)
    for endpoint in ENDPOINTS.values():
        await install(transport, endpoint, endpoint.settings)
    return transport


async def reset(transport: PostgresTransport, endpoint: Endpoint) -> None:
    """Empty what an example of ``endpoint`` leaves behind (examples share a database)."""
    tables = [table.qualified for _, table in EndpointTables.of(endpoint, endpoint.settings)
              .named()]
    await transport.pool.execute(
        "; ".join(f"DELETE FROM {table}" for table in [*tables, SINK, HANDLED_TABLE]))


async def insert(transport: PostgresTransport, endpoint: Endpoint, batch: list[Row]) -> None:
    """The rows as they are, in one statement, into the endpoint's queue."""
    await transport.pool.executemany(
        f"INSERT INTO {endpoint.address.qualified} (id, expires, headers, body) VALUES "
        "($1, CASE WHEN $2 THEN (statement_timestamp() AT TIME ZONE 'UTC') - interval '1 hour'"
        " END, $3, $4)",
        [(row.native_id, row.expired, row.headers, row.body) for row in batch])


def effective_message_id(row: Row) -> str:
    """The message id the runtime sees in ``row`` (the row id when the header is absent)."""
    try:
        return decode_headers(row.headers).get(Headers.MESSAGE_ID) or str(row.native_id)
    except PoisonMessageError:
        return str(row.native_id)


async def where_rows_ended(transport: PostgresTransport, endpoint: Endpoint,
                           batch: list[Row]) -> collections.Counter[str]:
    """How many rows ended where; checks the error-queue copies and the delayed retries
    against the rows they came from (the error queue is emptied on the way)."""
    inserted = {row.native_id: row for row in batch}
    tables = EndpointTables.of(endpoint, endpoint.settings)
    ended: collections.Counter[str] = collections.Counter()
    accounted: set[uuid.UUID] = set()
    while (copy := await transport.receive(tables.error_queue)) is not None:
        row = inserted[copy.native_id]
        assert copy.body == (row.body or b""), row
        if isinstance(copy, PoisonMessage):
            assert copy.raw_headers == row.headers  # moved as it is
        else:
            assert isinstance(copy, TransportMessage)
            assert copy.headers[ErrorHeaders.EXCEPTION_TYPE], row
            assert copy.headers[ErrorHeaders.FAILED_QUEUE] == str(endpoint.address), row
        accounted.add(copy.native_id)
        ended["error_queue"] += 1
    if tables.delayed is not None:
        for record in await transport.pool.fetch(f"SELECT id FROM {tables.delayed.qualified}"):
            assert record["id"] in inserted
            assert record["id"] not in accounted
            accounted.add(record["id"])
            ended["delayed_retry"] += 1
    expired = {row.native_id for row in batch if row.expired}
    assert not expired & accounted, "an expired row was received"
    ended["expired"] = len(expired)
    ended["handled"] = await transport.pool.fetchval(
        f"SELECT count(*) FROM {HANDLED_TABLE} WHERE endpoint = $1", endpoint.name)
    return ended


def least_ended(endpoint: Endpoint, batch: list[Row]) -> int:
    """How many of ``batch``'s rows must end somewhere (see :func:`assert_conserved`)."""
    if endpoint.settings.outbox is None:
        return len(batch)
    ids = collections.Counter(effective_message_id(row) for row in batch if not row.expired)
    return len(batch) - sum(n - 1 for n in ids.values())


async def count_ended(transport: PostgresTransport, endpoint: Endpoint,
                      batch: list[Row]) -> int:
    """How many rows ended somewhere so far, read without taking anything (a row a ``none``
    receiver took is in no table until its handler or its move to the error queue is done)."""
    tables = EndpointTables.of(endpoint, endpoint.settings)
    counted = [f"(SELECT count(*) FROM {tables.error_queue.qualified})",
               f"(SELECT count(*) FROM {HANDLED_TABLE} WHERE endpoint = $1)"]
    if tables.delayed is not None:
        counted.append(f"(SELECT count(*) FROM {tables.delayed.qualified})")
    ended: int = await transport.pool.fetchval(f"SELECT {' + '.join(counted)}", endpoint.name)
    return ended + sum(row.expired for row in batch)


def assert_conserved(endpoint: Endpoint, batch: list[Row],
                     ended: collections.Counter[str]) -> None:
    """Every row ended in exactly one place; with the outbox, a row whose (forged) message id
    an earlier row carried may end nowhere: deduplicated."""
    missing = len(batch) - sum(ended.values())
    assert 0 <= missing <= len(batch) - least_ended(endpoint, batch), ended
