"""The outbox end to end: competing deployments, and a receiver killed between the business
commit and the dispatch."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator

import pytest

from endpoint_runtime import TransportSettings
from endpoint_runtime.messages import Headers
from endpoint_runtime.outgoing import create_outgoing
from endpoint_runtime.transport import PostgresTransport
from tests.e2e.conftest import Deployer, count, create_queues, fresh_status, wait_for
from tests.support.recoverability_endpoints import Pay

pytestmark = pytest.mark.ray
MODULE = "tests.support.recoverability_endpoints"
HOLD_KEY = 4242
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
    WHERE locktype = 'advisory' AND objid = $1 AND NOT granted"""


@pytest.fixture
async def db(database_dsn: str) -> AsyncIterator[PostgresTransport]:
    async with PostgresTransport.connect(TransportSettings(dsn=database_dsn)) as transport:
        await create_queues(transport, "handler_runs", "paid_events", "error")
        await transport.pool.execute("CREATE TABLE paid (invoice text)")
        yield transport


async def test_duplicates_across_two_deployments_take_effect_once(
    db: PostgresTransport, deployer: Deployer
) -> None:
    first = await deployer.start("ledger", module=MODULE)
    second = await deployer.start("ledger", module=MODULE)  # same queue, competing
    invoices = [f"inv-{i}" for i in range(15)]
    for invoice in invoices:
        message_id = str(uuid.uuid4())
        for _ in range(2):  # each message twice, as a redelivering sender would leave it
            await db.send("ledger", create_outgoing(Pay(invoice),
                                                    headers={Headers.MESSAGE_ID: message_id}))

    async def done() -> bool:
        return await db.depth("ledger") == 0 and await db.depth("paid_events") >= 15

    await wait_for(done, timeout=30, what="all messages handled")
    assert await count(db.pool, "SELECT count(DISTINCT invoice) FROM paid") == 15
    assert await count(db.pool, "SELECT count(*) FROM paid") == 15  # business rows once
    assert await db.depth("paid_events") == 15  # each outgoing message dispatched once
    assert await db.depth("handler_runs") == 15  # pessimistic: each body ran once
    assert await db.depth("error") == 0
    duplicates = sum([(await first.status(refresh=True)).outbox_duplicates,
                      (await second.status(refresh=True)).outbox_duplicates])
    assert duplicates == 15  # every second copy was recognised, by one deployment or other


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
