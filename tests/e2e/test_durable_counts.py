"""Committed counts in the database: what a deployment processed, exactly, whatever dies.

Black-box, per transaction mode: messages go in through the endpoint's queue, the business
rows and the error queue are read with SQL, and the counts with
:func:`~endpoint_runtime.runtime.actors.committed_counts.read_committed`, the reader the submit
report
uses. Each mode's endpoint is in ``tests/support/counted_endpoints.py``.
"""

from __future__ import annotations

import os
import signal

import pytest

from endpoint_runtime import Endpoint
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.runtime.actors.committed_counts import (
    CommittedCounts,
    counts_table,
    read_committed,
)
from tests.e2e.conftest import (
    Deployer,
    Deployment,
    count,
    fresh_status,
    send_batch,
    status_line,
    wait_for,
    wait_for_status,
)
from tests.support import commit_failing_endpoints, counted_endpoints
from tests.support.commit_failing_endpoints import AddLine
from tests.support.counted_endpoints import Count

pytestmark = pytest.mark.ray

MODULE = "tests.support.counted_endpoints"
MODES = ["atomic", "receive_only", "batched", "with_outbox", "none"]
TRANSACTIONAL = ["atomic", "receive_only", "batched", "with_outbox"]
ROWS = "SELECT count(*) FROM counted"


async def committed(transport: PostgresTransport,
                    deployment: Deployment) -> CommittedCounts:
    config = deployment.config
    return await read_committed(transport.pool, config.deployment_id,
                                table=counts_table(config.address))


async def counted_and_committed(
    transport: PostgresTransport, deployment: Deployment
) -> tuple[int, CommittedCounts]:
    """The business rows and the committed counts, in one snapshot."""
    async with transport.pool.acquire() as connection, connection.transaction(
            isolation="repeatable_read"):
        rows: int = await connection.fetchval(ROWS)
        config = deployment.config
        return rows, await read_committed(connection, config.deployment_id,
                                          table=counts_table(config.address))


async def deploy_with_backlog(
    deployer: Deployer, transport: PostgresTransport, name: str, messages: list[Count],
    **overrides: float,
) -> tuple[Endpoint, Deployment]:
    """The table ``counted``, the endpoint of mode ``name`` deployed, ``messages`` sent."""
    endpoint: Endpoint = getattr(counted_endpoints, name)
    await transport.pool.execute("CREATE TABLE counted (n integer)")
    deployment = await deployer.start(name, module=MODULE, **overrides)
    await send_batch(transport, endpoint.name, messages)
    return endpoint, deployment


@pytest.mark.in_process
@pytest.mark.parametrize("name", MODES)
async def test_the_committed_total_is_the_business_rows_and_the_failed_the_error_queue(
    deployer: Deployer, transport: PostgresTransport, name: str,
) -> None:
    behaviours = {3: "fail", 5: "flaky"}  # by n % 10
    messages = [Count(n, behaviours.get(n % 10, "ok")) for n in range(40)]
    endpoint, deployment = await deploy_with_backlog(deployer, transport, name, messages)
    # None mode cannot retry: its flaky messages go to the error queue too.
    failing = {"fail", "flaky"} if name == "none" else {"fail"}
    expected_rows = sum(m.behaviour not in failing for m in messages)

    async def settled() -> bool:
        return (await transport.depth(endpoint.name) == 0
                and await transport.depth("error") == len(messages) - expected_rows
                and await count(transport.pool, ROWS) == expected_rows)

    await wait_for(settled, timeout=60, what=f"{expected_rows} rows and the rest in error")
    if name == "none":  # its counts go with the slot's next receive
        async def flushed() -> bool:
            return (await committed(transport, deployment)).total == expected_rows

        await wait_for(flushed, timeout=10, what="none mode's counts to be written")
    rows, counts = await counted_and_committed(transport, deployment)
    assert counts.total == rows == expected_rows, counts
    assert counts.failed == len(messages) - expected_rows, counts
    assert counts.by_node == {await deployment.node_of_peeker(): rows}  # one node
    # Once the deployment stops, its counts stay.
    await deployer.stop(deployment)
    assert await committed(transport, deployment) == counts


@pytest.mark.parametrize("name", TRANSACTIONAL)
async def test_receivers_killed_mid_load_leave_the_committed_total_equal_to_the_rows(
    deployer: Deployer, transport: PostgresTransport, name: str,
) -> None:
    total = 400
    endpoint, deployment = await deploy_with_backlog(
        deployer, transport, name, [Count(n, "slow") for n in range(total)])

    async def some_committed() -> bool:
        return await count(transport.pool, ROWS) >= 40

    await wait_for(some_committed, timeout=60, what="some messages handled")
    pids = await deployment.receiver_pids()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    rows, counts = await counted_and_committed(transport, deployment)
    assert counts.total == rows < total, (counts, rows)  # mid-load

    async def all_handled() -> bool:
        return (await transport.depth(endpoint.name) == 0
                and await count(transport.pool, ROWS) == total)

    await wait_for(all_handled, timeout=90, what=f"all {total} handled after the kill")
    assert set(await deployment.receiver_pids()).isdisjoint(pids)  # replaced
    rows, counts = await counted_and_committed(transport, deployment)
    assert counts.total == rows == total, counts
    assert counts.failed == 0, counts


@pytest.mark.in_process
@pytest.mark.parametrize("name", MODES)
async def test_an_attempt_whose_commit_fails_is_not_counted(
    deployer: Deployer, transport: PostgresTransport, name: str,
) -> None:
    """``commit_failing_endpoints``: a message whose work breaks a deferred foreign key at
    COMMIT (in none mode, at its autocommitted INSERT): failed attempts, then the error queue;
    the committed counts show one processed (the good message) and one failed."""
    endpoint = getattr(commit_failing_endpoints, name)
    await transport.pool.execute(commit_failing_endpoints.TABLES)
    for queue in ("audit", "error"):
        await transport.create_queue(queue)
    deployment = await deployer.start(name, module="tests.support.commit_failing_endpoints")
    await send_batch(transport, endpoint.name, [AddLine(1), AddLine(2)])

    async def settled() -> bool:
        return (await transport.depth("error") == 1
                and await transport.depth(endpoint.name) == 0)

    await wait_for(settled, timeout=60, what="the bad message in the error queue")
    if name == "none":
        async def flushed() -> bool:
            return (await committed(transport, deployment)).failed == 1

        await wait_for(flushed, timeout=10, what="none mode's counts to be written")
    counts = await committed(transport, deployment)
    assert (counts.total, counts.failed) == (1, 1), counts
    assert await count(transport.pool, "SELECT count(*) FROM order_lines") == 1


@pytest.mark.in_process
@pytest.mark.parametrize("name", ["atomic", "batched"])
async def test_a_counts_table_that_cannot_be_written_is_a_set_up_fault_never_charged_to_messages(
    deployer: Deployer, transport: PostgresTransport, name: str,
) -> None:
    """Its table dropped under a running deployment: each message's COMMIT carries a count
    and fails. Charged to the message, the failure led to the error queue, whose move carries
    a count too and failed the same way: the messages went round for ever (330,757 failed
    attempts in 4 minutes, seen while the counts were built). Now the receivers back off as
    from a database outage, the messages wait in the queue uncharged, and the circuit breaker
    raises the critical error, which names the fix."""
    endpoint, deployment = await deploy_with_backlog(
        deployer, transport, name, [Count(0)], circuit_breaker_time_to_trigger=2.0)

    async def first_handled() -> bool:
        return await count(transport.pool, ROWS) == 1

    await wait_for(first_handled, timeout=30, what="the first message handled")
    await transport.pool.execute(
        f"DROP TABLE {counts_table(deployment.config.address).qualified}")
    await send_batch(transport, endpoint.name, [Count(n) for n in range(1, 4)])

    status = await wait_for_status(
        deployment, lambda s: "committed counts" in (s.last_critical_error or ""),
        timeout=30, what="the critical error about the committed counts")
    assert "db install" in (status.last_critical_error or "")
    status = await fresh_status(deployment)
    assert status.failed == 0, status_line(status)  # no attempt charged to a message
    assert await transport.depth("error") == 0
    assert await transport.depth(endpoint.name) == 3
    assert await count(transport.pool, ROWS) == 1
