"""Hostile rows inserted straight into a queue table, received by each transaction mode's
real receive path (one slot, in this process, on a real PostgreSQL).

Whatever the headers (any JSON, non-objects, huge, deep, escaped NUL and lone surrogates,
forged runtime headers), the body (any bytes, JSON of any shape) and the message type names,
every row ends in exactly one place: handled once, in the error queue with a reason, in the
delayed store for its retry, or dropped as expired (the outbox may also find a forged message
id already handled: a duplicate). No round raises, and the queue empties within a bounded
number of rounds.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from endpoint_runtime import Endpoint
from endpoint_runtime.connections.connecting import PostgresTransport
from tests.fuzz.accounting import (
    assert_conserved,
    insert,
    install_fuzzed,
    reset,
    where_rows_ended,
)
from tests.fuzz.conftest import examples
from tests.fuzz.endpoints import ENDPOINTS
from tests.fuzz.strategies import Row, rows

ROWS_PER_EXAMPLE = 6
ROUNDS_PER_ROW = 4
"""A failing row takes three rounds (two attempts, then the move); a batch that cannot
commit is retried one by one."""


@pytest.fixture
async def installed(transport: PostgresTransport) -> PostgresTransport:
    """The examples of a test share this database and reset it."""
    return await install_fuzzed(transport)


async def receive_all(transport: PostgresTransport, endpoint: Endpoint, rounds: int) -> None:
    """Rounds on one slot until one takes nothing; fails when ``rounds`` do not suffice."""
    strategy = endpoint.create_strategy(endpoint.create_pipeline(), transport.pool,
                                        endpoint.settings)
    async with transport.pool.acquire() as connection, strategy.open_slot(connection) as slot:
        for _ in range(rounds):
            if not (await slot.round()).taken:
                break
        else:
            raise AssertionError(f"still taking messages after {rounds} rounds")
    assert await transport.depth(endpoint.address) == 0, "an empty round left rows behind"


@pytest.mark.parametrize("mode", list(ENDPOINTS))
@examples(0.25)
@given(batch=rows(ROWS_PER_EXAMPLE))
async def test_every_hostile_row_ends_handled_failed_delayed_or_expired(
    installed: PostgresTransport, mode: str, batch: list[Row]
) -> None:
    endpoint = ENDPOINTS[mode]
    await reset(installed, endpoint)
    await insert(installed, endpoint, batch)

    await receive_all(installed, endpoint, ROUNDS_PER_ROW * len(batch) + 10)

    assert_conserved(endpoint, batch, await where_rows_ended(installed, endpoint, batch))
