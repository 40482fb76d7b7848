"""The endpoints of the multi-node tests: each message writes one row, in its transaction.

``handled (n, node, pid)``: ``node`` is the index the test cluster gave the node the receiver
runs on (``ER_TEST_NODE``, inherited from its raylet), else its Ray node id. The row is
written first and the handler then sleeps: a node killed mid-load leaves uncommitted rows
behind, which must roll back with their messages (atomic mode: each message's effect
commits exactly once).
"""

from __future__ import annotations

import asyncio
import os

import msgspec
import ray

from endpoint_runtime import Endpoint, HandlerContext, TransactionMode
from endpoint_runtime.wire.messages import RetryHeaders

HANDLER_SECONDS = 0.1
DELAYED_RETRY_SECONDS = 4.0


class Job(msgspec.Struct):
    n: int


work = Endpoint(
    "cluster_work",
    transaction_mode=TransactionMode.SENDS_ATOMIC_WITH_RECEIVE,
    max_concurrency=6,
    slots_per_receiver=2,
    stop_timeout=5.0,
)


@work.handler
async def handle_job(message: Job, context: HandlerContext) -> None:
    await context.connection.execute(
        "INSERT INTO handled (n, node, pid) VALUES ($1, $2, $3)",
        message.n, os.environ.get("ER_TEST_NODE") or ray.get_runtime_context().get_node_id(),
        os.getpid(),
    )
    await asyncio.sleep(HANDLER_SECONDS)


retrying = Endpoint(
    "cluster_retrying",
    transaction_mode=TransactionMode.SENDS_ATOMIC_WITH_RECEIVE,
    max_concurrency=4,
    immediate_retries=0,
    delayed_retries=1,
    delayed_retry_delay=DELAYED_RETRY_SECONDS,
    stop_timeout=5.0,
    # Its table comes with installers or `--install` (the other endpoint's tests create it).
    schema_sql="CREATE TABLE IF NOT EXISTS handled (n int, node text, pid int);",
)
"""Fails each message's first delivery: it waits in the delayed store for
:data:`DELAYED_RETRY_SECONDS`, then its delayed retry writes its row."""


@retrying.handler
async def handle_job_after_a_delayed_retry(message: Job, context: HandlerContext) -> None:
    if RetryHeaders.RETRIES not in context.headers:
        raise RuntimeError(f"job {message.n}: first delivery fails, the delayed retry works")
    await handle_job(message, context)
