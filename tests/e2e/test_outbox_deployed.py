"""The outbox end to end: competing deployments, and a receiver killed between the business
commit and the dispatch."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator

import pytest

from endpoint_runtime import TransportSettings
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.wire.messages import Headers
from tests.e2e.conftest import (
    Deployer,
    count,
    create_queues,
    fresh_status,
    status_line,
    wait_for,
    wait_for_status,
)
from tests.support.outbox_endpoints import HELD_INVOICE_LOCK, PayInvoice
from tests.support.recoverability_endpoints import HELD_PAY_LOCK, Pay

pytestmark = pytest.mark.ray
MODULE = "tests.support.recoverability_endpoints"
HOLD_KEY = 4242
PEEK_DELAY_WITHOUT_RACES = 5.0
"""Few peeks while a test's first messages are received (see the kill test below)."""
HOLD_PAID_EVENTS = """
    CREATE FUNCTION hold_paid_events() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock(4242);
        RETURN NEW;
    END $$;
    CREATE TRIGGER hold BEFORE INSERT ON paid_events
        FOR EACH ROW EXECUTE FUNCTION hold_paid_events()"""
WAITING_FOR_HOLD = """
    SELECT pid FROM pg_locks
    WHERE locktype = 'advisory' AND objid = $1 AND NOT granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
# backends of the test's database that wait for the advisory lock $1


@pytest.fixture
async def db(database_dsn: str) -> AsyncIterator[PostgresTransport]:
    async with PostgresTransport.connect(TransportSettings(dsn=database_dsn)) as transport:
        await create_queues(transport, "handler_runs", "paid_events", "error")
        await transport.pool.execute("CREATE TABLE paid (invoice text)")
        yield transport


@pytest.mark.in_process
async def test_duplicates_across_two_deployments_take_effect_once(
    db: PostgresTransport, deployer: Deployer
) -> None:
    """Two deployments of ``ledger`` (at most 2 messages in flight each) compete on one
    queue. Four "held" messages wait in their handlers on a lock the test holds: four of
    them waiting at once is only possible with both deployments taking part."""
    first = await deployer.start("ledger", module=MODULE)
    second = await deployer.start("ledger", module=MODULE)  # same queue, competing
    invoices = [f"held-{i}" for i in range(4)] + [f"inv-{i}" for i in range(11)]
    message_ids = {invoice: str(uuid.uuid4()) for invoice in invoices}

    async def send(invoice: str) -> None:
        await db.send("ledger", create_outgoing(
            Pay(invoice), headers={Headers.MESSAGE_ID: message_ids[invoice]}))

    async with db.pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock($1)", HELD_PAY_LOCK)
        for invoice in invoices[:4]:
            await send(invoice)

        async def four_waiting() -> bool:
            return len(await db.pool.fetch(WAITING_FOR_HOLD, HELD_PAY_LOCK)) == 4

        await wait_for(four_waiting, timeout=30, what="four held messages in flight at once")
        await holder.execute("SELECT pg_advisory_unlock($1)", HELD_PAY_LOCK)
    for invoice in invoices[:4] + invoices[4:] * 2:  # each message twice in all, as a
        await send(invoice)  # redelivering sender would leave it

    async def done() -> bool:
        return await db.depth("ledger") == 0 and await db.depth("paid_events") >= 15

    await wait_for(done, timeout=30, what="all messages handled")
    assert await count(db.pool, "SELECT count(DISTINCT invoice) FROM paid") == 15
    assert await count(db.pool, "SELECT count(*) FROM paid") == 15  # business rows once
    assert await db.depth("paid_events") == 15  # each outgoing message dispatched once
    assert await db.depth("handler_runs") == 15  # pessimistic: each body ran once
    assert await db.depth("error") == 0
    statuses = [await first.status(refresh=True), await second.status(refresh=True)]
    assert all(status.processed >= 2 for status in statuses), [
        status_line(status) for status in statuses]  # both took part
    # Every second copy was recognised, by one deployment or the other.
    assert sum(status.outbox_duplicates for status in statuses) == 15


async def test_killed_between_commit_and_dispatch_dispatches_on_redelivery(
    db: PostgresTransport, deployer: Deployer
) -> None:
    deployment = await deployer.start("ledger", module=MODULE)
    await db.pool.execute(HOLD_PAID_EVENTS)
    async with db.pool.acquire() as blocker:
        # Inserts into paid_events (the dispatch) wait for this lock, after the business
        # commit and after the statements were prepared.
        await blocker.execute("SELECT pg_advisory_lock($1)", HOLD_KEY)
        await db.send("ledger", create_outgoing(Pay("crash")))
        await wait_for(lambda: count(db.pool, "SELECT count(*) FROM paid"), timeout=15,
                       what="the business commit")
        waiting = await wait_for(lambda: db.pool.fetch(WAITING_FOR_HOLD, HOLD_KEY), timeout=15,
                                 what="the dispatch to wait for the lock")
        [pid] = await deployment.receiver_pids()
        os.kill(pid, signal.SIGKILL)
        # The server would finish the waiting dispatch for the dead process: end it too.
        for row in waiting:
            await db.pool.execute("SELECT pg_terminate_backend($1)", row["pid"])
        await blocker.execute("SELECT pg_advisory_unlock($1)", HOLD_KEY)

    await wait_for(lambda: db.depth("paid_events"), timeout=30,
                   what="the stored operation to be dispatched")
    assert await count(db.pool, "SELECT count(*) FROM paid") == 1
    assert await db.depth("handler_runs") == 1  # the handler did not run again
    assert await db.depth("paid_events") == 1
    assert await db.depth("ledger") == 0
    assert (await fresh_status(deployment)).replaced_receivers >= 1


@pytest.mark.parametrize("peek_meets_b", [False, True], ids=["in-order", "peek-meets-b"])
async def test_a_receiver_killed_while_acks_wait_repeats_no_effect(
    database_dsn: str, deployer: Deployer, peek_meets_b: bool
) -> None:
    """``receipts`` commits acks in groups of 3. One slot handles "a" and "b" (their acks
    wait) and then blocks in "held"'s business transaction; the kill rolls back both waiting
    acks. "a" and "b" come again, are recognised as duplicates and acked: each business row
    is written once and each outgoing message sent once.

    Receives take the lowest row that is not locked, and the peeker's peek locks the lowest
    one for a moment (FOR UPDATE SKIP LOCKED, the original's statement): a receive that meets
    a peek takes the next row, so "b" (rarely "a") may come only after "held". What the slot
    handled before "held" is therefore read from the database before the kill, not assumed
    (a clean clone's CI once saw only "a" handled, and one duplicate). A peek delay of 5 s
    makes such a meeting rare (the e2e tests' usual 0.2 s peeks 25 times as often), and at
    least one waiting ack is needed for the test to check what it claims. "c" and "d" are
    sent after the kill. ``peek-meets-b`` makes that meeting certain: the test holds "b"'s
    row locked, as a peek does for a moment, until "held" waits; "a" alone waits then, and "b"
    is handled after the kill as a first delivery."""
    async with PostgresTransport.connect(TransportSettings(dsn=database_dsn)) as db:
        await create_queues(db, "receipts", "ledger", "handler_runs", "error")
        await db.pool.execute("CREATE TABLE paid_invoices (invoice text)")
        invoices = ["a", "b", "held", "c", "d"]
        for invoice in invoices[:3]:
            await db.send("receipts", create_outgoing(PayInvoice(invoice)))
        async with db.pool.acquire() as holder, db.pool.acquire() as peek:
            await holder.execute("SELECT pg_advisory_lock($1)", HELD_INVOICE_LOCK)
            if peek_meets_b:
                # (Rows skipped by an OFFSET under FOR UPDATE are locked too: not that.)
                await peek.execute("BEGIN; SELECT seq FROM receipts WHERE seq = (SELECT seq "
                                   "FROM receipts ORDER BY seq OFFSET 1 LIMIT 1) FOR UPDATE")
            deployment = await deployer.start(
                "receipts", module="tests.support.outbox_endpoints", max_concurrency=1,
                peek_delay=PEEK_DELAY_WITHOUT_RACES)
            await wait_for(lambda: db.pool.fetch(WAITING_FOR_HOLD, HELD_INVOICE_LOCK),
                           timeout=30, what='"held" to wait for the lock')
            if peek_meets_b:
                await peek.execute("ROLLBACK")
            # The messages whose business work committed before "held": their acks wait.
            waiting = [row["invoice"] for row in await db.pool.fetch(
                "SELECT invoice FROM paid_invoices ORDER BY invoice")]
            if peek_meets_b:
                assert waiting == ["a"]
            assert set(waiting) <= {"a", "b"}, waiting
            assert waiting, "no ack waited: both receives met a peek (rare; see above)"
            # Each dispatched with its business commit (a dispatch that fell back to the
            # receive transaction would have committed the group's acks at once) ...
            assert await db.depth("ledger") == len(waiting)
            assert await db.depth("receipts") == 3  # ... and none acked
            [pid] = await deployment.receiver_pids()
            os.kill(pid, signal.SIGKILL)
            await holder.execute("SELECT pg_advisory_unlock($1)", HELD_INVOICE_LOCK)
        # Sent now, their NOTIFY wakes the peeker at once: it finds the receiver dead and
        # replaces it without waiting out its long peek delay.
        for invoice in invoices[3:]:
            await db.send("receipts", create_outgoing(PayInvoice(invoice)))

        async def done() -> bool:
            return await db.depth("receipts") == 0 and await db.depth("ledger") >= 5

        await wait_for(done, timeout=60, what="all invoices after the kill")
        paid = await db.pool.fetch("SELECT invoice FROM paid_invoices ORDER BY invoice")
        assert [row["invoice"] for row in paid] == sorted(invoices)
        assert await db.depth("ledger") == 5
        assert await db.depth("handler_runs") == 6  # "held" ran twice: killed the first time
        assert await db.depth("error") == 0
        # The waiting ones were recognised as duplicates (the counts of running and retired
        # receivers alike, as the peeker's cycles see them).
        status = await wait_for_status(
            deployment, lambda s: s.outbox_duplicates >= len(waiting), timeout=30,
            what=f"the redelivered {waiting} counted as duplicates", fresh=True)
        assert status.outbox_duplicates == len(waiting), status_line(status)
        assert status.replaced_receivers == 1


@pytest.mark.in_process
async def test_duplicates_counted_by_a_retired_receiver_stay_in_the_status(
    database_dsn: str, deployer: Deployer
) -> None:
    """A message and its duplicate (same id) are handled by a receiver that is then retired
    (no receiver while idle): the deployment's status still counts the duplicate (it once
    summed only the running receivers, so a count made by a receiver retired or replaced
    was gone)."""
    async with PostgresTransport.connect(TransportSettings(dsn=database_dsn)) as db:
        await create_queues(db, "receipts_on_demand", "ledger", "handler_runs", "error")
        await db.pool.execute("CREATE TABLE paid_invoices (invoice text)")
        message_id = str(uuid.uuid4())
        for _ in range(2):
            await db.send("receipts_on_demand", create_outgoing(
                PayInvoice("twice"), headers={Headers.MESSAGE_ID: message_id}))
        deployment = await deployer.start(
            "receipts_on_demand", module="tests.support.outbox_endpoints", peek_delay=0.5)
        status = await wait_for_status(
            deployment, lambda s: s.receivers == [] and s.retired_processed >= 1, timeout=30,
            what="both copies handled and the receiver retired")
        assert await db.depth("receipts_on_demand") == 0
        assert await db.depth("handler_runs") == 1  # the duplicate did not run the handler
        assert await db.depth("ledger") == 1
        assert status.outbox_duplicates == 1
