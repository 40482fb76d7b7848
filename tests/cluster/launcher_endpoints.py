"""The endpoint of the launcher test (tests/cluster/launcher.sh): one row per message.

Its business table comes from ``schema_sql``, so the page's install step (``endpoint-runtime
db install`` or the submit script's ``install = true``) is what creates it on a fresh
database. Each message writes ``(message_id, node, pid)`` in its receive transaction
(``SENDS_ATOMIC_WITH_RECEIVE``): a receiver killed with its node rolls its rows back with its
messages, so at the end each message id has exactly one row, and the rows are what the
runtime committed. The handler then sleeps a little, so that a backlog of a few thousand
messages drains for long enough to lose a node in the middle of it.
"""

from __future__ import annotations

import asyncio
import os

import msgspec
import ray

from endpoint_runtime import Endpoint, HandlerContext, TransactionMode

QUEUE = "launcher_work"
TABLE = "launcher_handled"
HANDLER_SECONDS = 0.05


class Work(msgspec.Struct):
    note: str = ""


work = Endpoint(
    QUEUE,
    transaction_mode=TransactionMode.SENDS_ATOMIC_WITH_RECEIVE,
    stop_timeout=5.0,
    schema_sql=f"""
    CREATE TABLE IF NOT EXISTS {TABLE} (
        message_id text NOT NULL,
        node       text NOT NULL,
        pid        integer NOT NULL
    );
    """,
)


@work.handler
async def handle_work(message: Work, context: HandlerContext) -> None:
    await context.connection.execute(
        f"INSERT INTO {TABLE} (message_id, node, pid) VALUES ($1, $2, $3)",
        context.message_id, ray.get_runtime_context().get_node_id(), os.getpid(),
    )
    await asyncio.sleep(HANDLER_SECONDS)
