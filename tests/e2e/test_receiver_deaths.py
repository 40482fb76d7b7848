"""A message that kills its receiver process: after three deaths, the error queue.

The handler of ``Work(behaviour="die")`` calls ``os._exit`` (as a native crash or an
out-of-memory kill would end the process: no exception, no cleanup). The in-memory failure
count dies with the process; the crash ledger (``endpoint_runtime.runtime.actors.crash_ledger``) is
what counts the deaths.
"""

from __future__ import annotations

import uuid

import pytest
import ray

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.error_queue import list_failed, retry_failed
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.runtime.actors.crash_ledger import (
    MAX_RECEIVER_DEATHS,
    CrashLedger,
    DeathCounts,
    read_ledger_on_node,
)
from endpoint_runtime.wire.messages import TransportMessage
from tests.e2e.conftest import (
    Deployer,
    count,
    fresh_status,
    status_line,
    wait_for,
    wait_for_status,
)
from tests.support.hardening_endpoints import Work

pytestmark = pytest.mark.ray
MODULE = "tests.support.hardening_endpoints"


async def test_a_message_that_kills_its_receiver_goes_to_the_error_queue_after_three_deaths(
    deployer: Deployer, transport: PostgresTransport
) -> None:
    await transport.pool.execute("CREATE TABLE handled (key text)")
    await transport.create_queue("crashing")
    before = [create_outgoing(Work(f"before-{n}")) for n in range(3)]
    killer = create_outgoing(Work("killer", behaviour="die"))
    after = [create_outgoing(Work(f"after-{n}")) for n in range(3)]
    for outgoing in [*before, killer, *after]:
        await transport.send("crashing", outgoing)

    deployment = await deployer.start("crashing", module=MODULE)

    async def in_error_queue() -> bool:
        return await transport.depth("error") >= 1

    await wait_for(in_error_queue, timeout=120, what="the killer message in the error queue")
    status = await wait_for_status(
        deployment, lambda s: len(s.receivers) == 1, timeout=20, what="a receiver running",
    )
    # One receiver of one slot: each death took the killer with it, and only it.
    assert status.replaced_receivers == MAX_RECEIVER_DEATHS, status_line(status)

    async def all_others_handled() -> bool:
        return await count(transport.pool, "SELECT count(*) FROM handled") == 6

    await wait_for(all_others_handled, timeout=30, what="every other message handled")
    [failed] = await list_failed(transport)
    copy = failed.message
    assert isinstance(copy, TransportMessage)
    assert str(copy.native_id) == killer.message_id
    assert copy.body == killer.body
    assert copy.headers[ErrorHeaders.FAILED_QUEUE] == "public.crashing"
    assert copy.headers[ErrorHeaders.EXCEPTION_TYPE] == (
        "endpoint_runtime.runtime.actors.crash_ledger.ReceiverDiedError")
    reason = copy.headers[ErrorHeaders.MESSAGE]
    assert "the receiver process died 3 times while handling this message" in reason
    assert await transport.depth("crashing") == 0
    keys = {r["key"] for r in await transport.pool.fetch("SELECT key FROM handled")}
    assert keys == {f"before-{n}" for n in range(3)} | {f"after-{n}" for n in range(3)}
    # Once moved, it is forgotten everywhere: retried from the error queue (say, after a
    # fix) it is handled again, here killing a receiver again rather than going straight
    # back to the error queue.
    await wait_for_status(deployment, lambda s: s.doomed_messages == 0, timeout=20,
                          what="the peeker to settle the doomed id")
    await fresh_status(deployment)  # the receivers get the settled list
    await retry_failed(transport, copy.native_id)
    await wait_for_status(
        deployment, lambda s: s.replaced_receivers == MAX_RECEIVER_DEATHS + 1, timeout=60,
        what="the retried message to be handled (and kill) again",
    )
    assert await transport.depth("error") == 0


async def test_the_ledger_is_read_on_the_dead_receivers_node_by_a_pinned_task() -> None:
    """The peeker reads a ledger of another node with a Ray task pinned to that node; here the
    only node is this one, and the task is what runs (the direct read is for the peeker's own
    node)."""
    ledger = CrashLedger.create(f"test-{uuid.uuid4().hex[:8]}", records=2)
    in_flight = uuid.uuid4()
    finished = uuid.uuid4()
    ledger.leave(ledger.enter(finished))  # its record is cleared when its handlers end
    ledger.enter(in_flight)  # a handler still running: its id stays in the file

    node_id = ray.get_runtime_context().get_node_id()
    assert await read_ledger_on_node(node_id, str(ledger.path)) == [in_flight]
    assert not ledger.path.exists()  # read once


def test_death_counts_doom_at_the_limit_and_forget_settled_ids() -> None:
    deaths = DeathCounts(capacity=2, doomed=1)
    first, second, third = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    assert [deaths.count(first, "r1") for _ in range(MAX_RECEIVER_DEATHS)] == [1, 2, 3]
    assert deaths.version == 1
    assert "died 3 times" in deaths.snapshot()[first]
    deaths.count(second, "r2")
    deaths.count(third, "r3")  # the counts hold two ids: the oldest goes
    assert deaths.count(first, "r4") == 1
    deaths.settle([first])
    assert deaths.snapshot() == {}
    assert deaths.version == 2


def _message(native_id: uuid.UUID) -> TransportMessage:
    return TransportMessage(native_id=native_id, seq=0, headers={}, raw_headers="{}", body=b"")


async def test_a_restarted_peeker_keeps_the_deaths_counted_before(
    deployer: Deployer, transport: PostgresTransport
) -> None:
    """Two deaths under the first peeker, then the peeker is lost and restarted: the third
    death, under the new one, sends the message to the error queue. Before the counts were
    kept (a tally file on the node), a restarted peeker counted from zero: three more deaths
    for every peeker lost."""
    await transport.pool.execute("CREATE TABLE handled (key text)")
    await transport.create_queue("crashing")
    killer = create_outgoing(Work("killer", behaviour="die"))
    await transport.send("crashing", killer)
    # A slow peek cycle: a death is counted at the cycle after it, so the test restarts the
    # peeker well before a third one.
    deployment = await deployer.start("crashing", module=MODULE, peek_delay=2.0)
    await wait_for_status(deployment, lambda s: s.replaced_receivers >= 2, timeout=120,
                          what="two receiver deaths")
    await deployment.restart()  # as after the peeker's loss
    assert await transport.depth("error") == 0, "the third death came before the restart"

    async def in_error_queue() -> bool:
        return await transport.depth("error") >= 1

    await wait_for(in_error_queue, timeout=120, what="the killer message in the error queue")
    status = await fresh_status(deployment)
    assert status.replaced_receivers <= 1, status_line(status)  # the new peeker's deaths
    [failed] = await list_failed(transport)
    assert str(failed.message.native_id) == killer.message_id
    assert "died 3 times" in failed.message.headers[ErrorHeaders.MESSAGE]
