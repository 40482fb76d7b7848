"""The endpoint of the multi-node tests: each message writes one row, in its transaction.

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

HANDLER_SECONDS = 0.1


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
