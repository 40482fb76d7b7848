"""Only what committed counts: an attempt whose COMMIT fails is neither processed nor audited.

Each mode's endpoint (``tests/support/commit_failing_endpoints.py``) gets one message that
commits and one whose work breaks a deferred foreign key at COMMIT (its handler returns
normally). Seen from outside, through the deployment's status and the queues: one message
processed, one audit copy, one message in the error queue after its attempts. (None mode,
the control: its INSERT autocommits, so the bad message fails in its handler.)
"""

from __future__ import annotations

import pytest

from endpoint_runtime import Sender
from endpoint_runtime.connections.connecting import PostgresTransport
from tests.e2e.conftest import Deployer, fresh_status, status_line, wait_for
from tests.support import commit_failing_endpoints
from tests.support.commit_failing_endpoints import AddLine

pytestmark = pytest.mark.in_process

MODULE = "tests.support.commit_failing_endpoints"


@pytest.mark.parametrize("name", ["atomic", "receive_only", "batched", "with_outbox", "none"])
async def test_an_attempt_whose_commit_fails_is_not_processed_and_not_audited(
    deployer: Deployer, transport: PostgresTransport, sender: Sender, name: str,
) -> None:
    endpoint = getattr(commit_failing_endpoints, name)
    await transport.pool.execute(commit_failing_endpoints.TABLES)
    for queue in ("audit", "error"):
        await transport.create_queue(queue)
    deployment = await deployer.start(name, module=MODULE)
    await sender.send(AddLine(1), destination=endpoint.name)
    await sender.send(AddLine(2), destination=endpoint.name)  # no order 2: fails at COMMIT

    async def settled() -> bool:
        return (await transport.depth("error") == 1
                and await transport.depth(endpoint.name) == 0)

    await wait_for(settled, timeout=60, what="the bad message in the error queue")
    status = await fresh_status(deployment)
    lines = await transport.pool.fetchval("SELECT array_agg(order_key) FROM order_lines")
    assert lines == [1]
    assert status.processed == 1, status_line(status)
    # The first attempt and its retry; none mode's one attempt is not retried.
    assert status.failed >= (1 if name == "none" else 2), status_line(status)
    assert await transport.depth("audit") == 1  # the committed message's copy only
