"""A recoverability policy of the user's own (``@endpoint.recoverability_policy``) against a
real PostgreSQL, in every transaction mode, without Ray: it sends one exception type to the
error queue at once, discards another, leaves the rest to the built-in decision, and a policy
that raises or returns something else falls back to the built-in decision: no message is lost
or handled past its retries."""

from __future__ import annotations

import msgspec
import pytest

from endpoint_runtime import Action, Decision, Endpoint, Failure, HandlerContext
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.wire.messages import ErrorHeaders
from tests.support.draining import (
    ATTEMPTS_TABLES,
    attempts_by_message,
    drain,
    prepare,
    received_all,
)
from tests.support.modes import MODES

RETRIES = 2


class Job(msgspec.Struct):
    n: int
    raises: str  # "ValueError", "KeyError", "RuntimeError", "LookupError", "ZeroDivisionError"


def endpoint_in(mode: str, transport: PostgresTransport) -> Endpoint:
    retries = {} if mode == "none" else {"immediate_retries": RETRIES, "delayed_retries": 0}
    endpoint = Endpoint("jobs", **MODES[mode], **retries)

    @endpoint.handler
    async def run(message: Job, context: HandlerContext) -> None:
        await transport.pool.execute("INSERT INTO attempts (n) VALUES ($1)", message.n)
        if message.raises:
            raise {"ValueError": ValueError, "KeyError": KeyError,
                   "RuntimeError": RuntimeError, "LookupError": LookupError,
                   "ZeroDivisionError": ZeroDivisionError}[message.raises](message.n)
        await context.connection.execute("INSERT INTO handled (n) VALUES ($1)", message.n)

    @endpoint.recoverability_policy
    def policy(failure: Failure, headers: dict[str, str], default: Decision) -> Decision:
        if failure.exception_type == "builtins.ValueError":
            return Decision(Action.ERROR_QUEUE)  # no retry can help
        if failure.exception_type == "builtins.KeyError":
            return Decision(Action.DISCARD)
        if failure.exception_type == "builtins.LookupError":
            raise AssertionError("a policy with a bug")
        if failure.exception_type == "builtins.ZeroDivisionError":
            return "retry, please"  # type: ignore[return-value]
        return default

    return endpoint


@pytest.mark.parametrize("mode", MODES)
async def test_a_custom_policy_decides_and_its_faults_fall_back_to_the_built_in_one(
    transport: PostgresTransport, mode: str,
) -> None:
    endpoint = endpoint_in(mode, transport)
    await prepare(transport, endpoint, "jobs", "error",
                  tables=ATTEMPTS_TABLES)
    jobs = [Job(1, "ValueError"), Job(2, "KeyError"), Job(3, "RuntimeError"),
            Job(4, "LookupError"), Job(5, "ZeroDivisionError"), Job(6, "")]
    for job in jobs:
        await transport.send("jobs", create_outgoing(job))

    await drain(transport, endpoint)

    assert await transport.pool.fetchval("SELECT array_agg(n) FROM handled") == [6]
    failed = {msgspec.json.decode(m.body, type=Job).n: m.headers[ErrorHeaders.EXCEPTION_TYPE]
              for m in await received_all(transport, "error")}
    # 2 discarded: neither handled nor in the error queue; the rest there, by their type.
    assert failed == {1: "builtins.ValueError", 3: "builtins.RuntimeError",
                      4: "builtins.LookupError", 5: "builtins.ZeroDivisionError"}
    assert await transport.depth("jobs") == 0
    attempts = await attempts_by_message(transport)
    built_in = 1 if mode == "none" else 1 + RETRIES  # the built-in decision's retries
    assert attempts == {1: 1, 2: 1, 3: built_in, 4: built_in, 5: built_in, 6: 1}, attempts


def test_a_policy_that_is_not_callable_or_a_second_one_is_refused() -> None:
    endpoint = Endpoint("jobs")
    with pytest.raises(ConfigurationError, match="must be callable"):
        endpoint.recoverability_policy("error_queue")  # type: ignore[arg-type]

    @endpoint.recoverability_policy
    def first(failure: Failure, headers: dict[str, str], default: Decision) -> Decision:
        return default

    with pytest.raises(ConfigurationError, match="has a recoverability policy already"):
        endpoint.recoverability_policy(first)
