"""The processing circuit breaker and the default critical-error action, end to end.

A recoverability step that fails (the error queue is gone, so a failed message cannot be moved
there) is a critical error and counts against the processing breaker, which triggers after
``circuit_breaker_time_to_trigger`` (2 s for these endpoints, 30 s by default) without a
handled message. The endpoints are in ``tests/support/hardening_endpoints.py``.
"""

from __future__ import annotations

import time

import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from tests.e2e.conftest import Deployer, count, fresh_status, wait_for, wait_for_status
from tests.support.hardening_endpoints import Doomed, Work

pytestmark = pytest.mark.in_process
MODULE = "tests.support.hardening_endpoints"
TRIGGER_SECONDS = 2.0


@pytest.fixture
def db(with_handled: PostgresTransport) -> PostgresTransport:
    return with_handled


async def test_the_processing_breaker_arms_triggers_and_disarms(
    db: PostgresTransport, deployer: Deployer
) -> None:
    """on_critical_error="log": a message that cannot reach the (dropped) error queue arms
    the processing breaker; it triggers after the trigger time, the message stays queued;
    with the error queue back and a message handled, it disarms and the error is over."""
    deployment = await deployer.start("processing_log", module=MODULE)
    await db.pool.execute('DROP TABLE "public"."error"')
    sent = time.monotonic()
    await db.send("processing_log", create_outgoing(Doomed(1)))

    async def breaker(state: str) -> bool:
        status = await fresh_status(deployment)
        return any(r.processing_breaker == state for r in status.receivers)

    await wait_for(lambda: breaker("armed"), timeout=30, what="the breaker to arm")
    await wait_for(lambda: breaker("triggered"), timeout=30, what="the breaker to trigger")
    assert time.monotonic() - sent >= TRIGGER_SECONDS
    status = await fresh_status(deployment)
    assert status.critical_error is not None
    assert not status.halted
    assert await db.depth("processing_log") == 1  # kept: the move was rolled back

    await db.create_queue("error")
    await db.send("processing_log", create_outgoing(Work("after")))
    await wait_for(lambda: db.depth("error"), timeout=30, what="the message in the error queue")
    await wait_for(lambda: count(db.pool, "SELECT count(*) FROM handled WHERE key = 'after'"),
                   timeout=30, what="a message handled")
    await wait_for(lambda: breaker("disarmed"), timeout=30, what="the breaker to disarm")
    await wait_for_status(deployment, lambda s: s.critical_error is None, timeout=30,
                          what="the critical error to be over")


async def test_a_critical_error_stops_the_deployment_by_default(
    db: PostgresTransport, deployer: Deployer
) -> None:
    """An endpoint that says nothing about on_critical_error stops at its first critical
    error: no receivers, halted, the message kept, later messages not handled."""
    deployment = await deployer.start("default_action", module=MODULE)
    await db.pool.execute('DROP TABLE "public"."error"')
    await db.send("default_action", create_outgoing(Doomed(1)))
    status = await wait_for_status(deployment, lambda s: s.halted, timeout=30,
                                   what="the deployment to halt")
    assert status.critical_error is not None
    assert "recoverability" in status.critical_error.lower()
    await wait_for_status(deployment, lambda s: s.receivers == [], timeout=30,
                          what="the receivers to stop")
    await db.send("default_action", create_outgoing(Work("later")))
    await wait_for_status(deployment, lambda s: s.estimate == 2, timeout=30,
                          what="the estimate to count both messages")
    assert await db.depth("default_action") == 2
    assert await count(db.pool, "SELECT count(*) FROM handled") == 0
