"""Optimistic batches: a failing message's effects leave the batch, the others commit once.

Each test drives one receive slot of a batched endpoint (batch_size 10, one immediate retry,
no delayed retries) through real PostgreSQL, no Ray, in both isolations: ``optimistic`` (no
savepoint per message; a failure rolls the batch back and runs it again without the failing
message) and ``savepoint``. Whatever the isolation: every other message's business row and
send commit exactly once, its after-commit hook runs once, it counts once in the committed
counts, and only the failing message is charged (its 1 + 1 attempts, then the error queue).
"""

from __future__ import annotations

import collections
import uuid
from typing import Any

import msgspec
import pytest

from endpoint_runtime import Endpoint
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.pipeline import Pipeline
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.runtime.actors.committed_counts import counts_table
from endpoint_runtime.transactions.counting import SlotCounts, create_counts_table
from endpoint_runtime.wire.messages import TransportMessage
from tests.support import optimistic_endpoints
from tests.support.optimistic_endpoints import COMMITTED, OUT, RUNS, TABLES, Booked, Entry

ISOLATIONS = ["optimistic", "savepoints"]
ATTEMPTS = 2  # 1 + immediate_retries
ROUND_LIMIT = 40


class Outcome(msgspec.Struct):
    entries: list[int]
    sent: list[int]
    failed: dict[int, str]
    """Message number -> exception type of its error-queue copy."""
    processed: int
    failed_count: int
    stats_failed: int
    charged: dict[int, int]
    """Message number -> failed attempts recoverability recorded."""


async def drain(transport: PostgresTransport, endpoint: Endpoint,
                entries: list[Entry]) -> Outcome:
    """Send ``entries`` in order, run one slot until the queue is empty, and collect what
    committed."""
    optimistic_endpoints.reset()
    for queue in (endpoint.name, OUT, "error"):
        await transport.create_queue(queue)
    await transport.pool.execute(TABLES)
    table = counts_table(endpoint.address)
    numbers = {}
    for entry in entries:
        message = create_outgoing(entry)
        numbers[message.message_id] = entry.n
        await transport.send(endpoint.name, message)
    pipeline: Pipeline = endpoint.create_pipeline()
    charged: collections.Counter[int] = collections.Counter()
    by_native_id: dict[uuid.UUID, int] = {}
    record = pipeline.failures.record

    def counting_record(native_id: uuid.UUID, exc: BaseException, **options: Any) -> Any:
        charged[by_native_id[native_id]] += 1
        return record(native_id, exc, **options)

    pipeline.failures.record = counting_record  # type: ignore[method-assign]
    enter = pipeline.enter

    def noting_ids(context: Any) -> Any:
        by_native_id[context.message.native_id] = numbers[context.message.message_id]
        return enter(context)

    pipeline.enter = noting_ids  # type: ignore[method-assign]
    strategy = endpoint.create_strategy(pipeline, transport.pool, endpoint.settings)
    counts = SlotCounts(table, deployment_id="d", receiver_id="r", slot=0, node_id="n")
    async with transport.pool.acquire() as connection:
        await create_counts_table(connection, table)
        await counts.ensure_row(connection)
        slot = strategy.open_slot(connection)
        slot.count_with(counts)
        for _ in range(ROUND_LIMIT):
            if not (await slot.round()).taken:
                break
        await slot.close()
    assert await transport.depth(endpoint.name) == 0, "the queue did not drain"
    failed = {}
    while (row := await transport.receive("error")) is not None:
        assert isinstance(row, TransportMessage)
        failed[numbers[row.message_id]] = row.headers[ErrorHeaders.EXCEPTION_TYPE]
    sent = [msgspec.json.decode(row["body"], type=Booked).n for row in await transport.pool.fetch(
        f"SELECT body FROM {transport.address(OUT).qualified} ORDER BY seq")]
    row = await transport.pool.fetchrow(f"SELECT processed, failed FROM {table.qualified}")
    return Outcome(
        entries=sorted(await transport.pool.fetchval(
            "SELECT coalesce(array_agg(n), '{}') FROM entries")),
        sent=sorted(sent), failed=failed, processed=row["processed"],
        failed_count=row["failed"], stats_failed=pipeline.stats.failed, charged=dict(charged))


def endpoint_of(isolation: str) -> Endpoint:
    endpoint: Endpoint = getattr(optimistic_endpoints, isolation)
    return endpoint


def assert_only_charged(outcome: Outcome, total: int, failing: dict[int, str]) -> None:
    """Every message but ``failing`` committed exactly once; each failing one was charged
    ATTEMPTS times, then went to the error queue with the exception type given."""
    others = [n for n in range(total) if n not in failing]
    assert outcome.entries == others, "each other message's row once, none of the failing"
    assert outcome.sent == others, "each other message's send once"
    assert collections.Counter(others) == COMMITTED, "after_commit once per committed message"
    assert outcome.charged == {n: ATTEMPTS for n in failing}, (
        "only the failing messages were charged")
    assert outcome.stats_failed == ATTEMPTS * len(failing)
    assert {n: kind.rsplit(".", 1)[-1] for n, kind in outcome.failed.items()} == failing
    assert (outcome.processed, outcome.failed_count) == (len(others), len(failing)), (
        "the committed counts count each message once")


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_failing_message_in_the_middle_is_the_only_one_charged(
    transport: PostgresTransport, isolation: str,
) -> None:
    entries = [Entry(n, "fail_after_write" if n == 5 else "write") for n in range(10)]
    outcome = await drain(transport, endpoint_of(isolation), entries)
    assert_only_charged(outcome, 10, {5: "EntryFailedError"})
    if isolation == "optimistic":
        # The batch rolled back and ran again without it: the messages before it ran twice
        # (non-database side effects may repeat), the ones after it once.
        assert {n: 2 for n in range(5)} | {5: 2} | {n: 1 for n in range(6, 10)} == RUNS
    else:
        assert {n: 1 for n in range(10) if n != 5} | {5: 2} == RUNS


async def test_a_message_that_fails_before_writing_costs_the_others_no_replay(
    transport: PostgresTransport,
) -> None:
    entries = [Entry(n, "fail_before_write" if n == 5 else "write") for n in range(10)]
    outcome = await drain(transport, endpoint_of("optimistic"), entries)
    assert_only_charged(outcome, 10, {5: "EntryFailedError"})
    assert {n: 1 for n in range(10) if n != 5} | {5: 2} == RUNS


CASES = {
    # id: (messages, the failing ones' actions, the exception type each is moved with)
    "a batch whose every message fails": (
        6, dict.fromkeys(range(6), "fail_after_write"),
        dict.fromkeys(range(6), "EntryFailedError")),
    "a deferred constraint failing at the commit, charged to the message that broke it": (
        8, {3: "deferred_violation"}, {3: "ForeignKeyViolationError"}),
    "a handler swallowing a database error without savepoint, charged, not the next one": (
        8, {4: "swallow"}, {4: "TransactionAbortedError"}),
    "a send to a missing queue, charged to its sender": (
        8, {6: "missing_queue"}, {6: "QueueNotFoundError"}),
    "a handler's own savepoint (undoes only its -2 row) beside a failure": (
        9, {2: "own_savepoint", 6: "fail_after_write"}, {6: "EntryFailedError"}),
    "failures of every kind in one batch": (
        10, {1: "swallow", 3: "fail_after_write", 4: "deferred_violation",
             7: "fail_before_write", 8: "missing_queue"},
        {1: "TransactionAbortedError", 3: "EntryFailedError", 4: "ForeignKeyViolationError",
         7: "EntryFailedError", 8: "QueueNotFoundError"}),
}


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("case", list(CASES))
async def test_only_the_message_whose_own_run_fails_is_charged(
    transport: PostgresTransport, isolation: str, case: str,
) -> None:
    total, actions, failing = CASES[case]
    entries = [Entry(n, actions.get(n, "write")) for n in range(total)]
    outcome = await drain(transport, endpoint_of(isolation), entries)
    assert_only_charged(outcome, total, failing)


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_send_refused_at_the_end_of_a_batch_that_used_no_database_is_charged_to_its_sender(
    transport: PostgresTransport, isolation: str,
) -> None:
    """No handler of the batch used the database, so no checkpoint is taken for the run's
    sends: the send the queue table refuses fails the whole batch, uncharged, and the slot's
    next rounds go one message at a time, which charges only its sender."""
    entries = [Entry(n, "refused_send" if n == 5 else "send_only") for n in range(8)]
    outcome = await drain(transport, endpoint_of(isolation), entries)
    others = [n for n in range(8) if n != 5]
    assert outcome.entries == [], "no handler wrote"
    assert outcome.sent == others, "each other message's send once"
    assert collections.Counter(others) == COMMITTED, "after_commit once per committed message"
    assert outcome.charged == {5: ATTEMPTS}, "only the refused send's sender was charged"
    assert {n: kind.rsplit(".", 1)[-1] for n, kind in outcome.failed.items()} == {
        5: "CheckViolationError"}
    assert (outcome.processed, outcome.failed_count) == (7, 1)


def test_an_unknown_isolation_is_refused() -> None:
    from endpoint_runtime.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="batch_isolation"):
        Endpoint(f"e{uuid.uuid4().hex[:6]}", batch_size=2, batch_isolation="bisect")  # type: ignore[arg-type]
