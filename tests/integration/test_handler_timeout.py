"""The handler time limit (``handler_timeout``) against a real PostgreSQL, in every transaction
mode, without Ray: a handler that never returns and one blocked in a statement are cancelled
past the limit, each attempt charged (retries, then the error queue with
``HandlerTimeoutError``), the statement cancelled in the server and the row's lock released;
a quick handler beside them is untouched, and a ``TimeoutError`` a handler raises itself stays
what it is."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from endpoint_runtime import Endpoint, HandlerContext
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.wire.messages import ErrorHeaders
from tests.support.draining import (
    ATTEMPTS_TABLES,
    attempts_by_message,
    drain,
    prepare,
    received_all,
)
from tests.support.modes import MODES

LIMIT = 0.5
SLEEP = "SELECT pg_sleep(3600) -- handler_timeout test"


class Task(msgspec.Struct):
    n: int
    how: str  # "forever", "statement", "own_timeout" or "quick"


def endpoint_in(mode: str, transport: PostgresTransport) -> Endpoint:
    retries = {} if mode == "none" else {"immediate_retries": 1, "delayed_retries": 0}
    endpoint = Endpoint("tasks", **MODES[mode], **retries, handler_timeout=LIMIT)

    @endpoint.handler
    async def run(message: Task, context: HandlerContext) -> None:
        # Outside the message's transaction: every attempt is seen, rolled back or not.
        await transport.pool.execute("INSERT INTO attempts (n) VALUES ($1)", message.n)
        if message.how == "forever":
            await asyncio.Event().wait()
        elif message.how == "statement":
            await context.connection.execute(SLEEP)
        elif message.how == "own_timeout":
            raise TimeoutError("the payment provider did not answer")
        await context.connection.execute("INSERT INTO handled (n) VALUES ($1)", message.n)

    return endpoint


@pytest.mark.parametrize("mode", MODES)
async def test_a_handler_past_its_time_limit_is_cancelled_and_charged(
    transport: PostgresTransport, mode: str,
) -> None:
    endpoint = endpoint_in(mode, transport)
    await prepare(transport, endpoint, "tasks", "error",
                  tables=ATTEMPTS_TABLES)
    tasks = [Task(1, "forever"), Task(2, "statement"), Task(3, "own_timeout"), Task(4, "quick")]
    for task in tasks:
        await transport.send("tasks", create_outgoing(task))

    # Bounded: without the limit the first message holds its slot (and its row) for ever.
    await asyncio.wait_for(drain(transport, endpoint), 60)

    assert await transport.pool.fetchval("SELECT array_agg(n) FROM handled") == [4]
    failed = {msgspec.json.decode(m.body, type=Task).n: m.headers
              for m in await received_all(transport, "error")}
    assert sorted(failed) == [1, 2, 3]
    for n in (1, 2):
        assert failed[n][ErrorHeaders.EXCEPTION_TYPE] == \
            "endpoint_runtime.errors.HandlerTimeoutError", failed[n]
        assert f"ran past handler_timeout ({LIMIT:g} s)" in failed[n][ErrorHeaders.MESSAGE]
    assert failed[3][ErrorHeaders.EXCEPTION_TYPE] == "builtins.TimeoutError", failed[3]
    assert await transport.depth("tasks") == 0
    attempts = await attempts_by_message(transport)
    tries = 1 if mode == "none" else 2  # one immediate retry where the mode retries
    assert attempts == {1: tries, 2: tries, 3: tries, 4: 1}, attempts
    # The statement was cancelled in the server, not left running behind the rollback.
    assert await transport.pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'",
        SLEEP) == 0


@pytest.mark.parametrize("bad", [0, -1.5, float("nan")])
def test_a_time_limit_that_is_not_a_positive_number_is_refused(bad: float) -> None:
    with pytest.raises(ConfigurationError, match="handler_timeout"):
        EndpointSettings(handler_timeout=bad)


def test_no_time_limit_by_default() -> None:
    assert EndpointSettings().handler_timeout is None
