"""An atomic-mode endpoint whose handler does what the message asks (importable by path)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, TransactionMode


class Job(msgspec.Struct):
    n: int
    action: str = "send"  # send | savepoint | deferred_violation | missing_queue | large_first
    # | expiring | slow_expiring
    size: int = 0


class Done(msgspec.Struct):
    n: int
    padding: str = ""


ledger = Endpoint("ledger_in", transaction_mode=TransactionMode.SENDS_ATOMIC_WITH_RECEIVE,
                  immediate_retries=0, delayed_retries=0)


@ledger.handler
async def work(message: Job, context: HandlerContext) -> None:
    connection = context.connection
    if message.action == "savepoint":
        await connection.execute("INSERT INTO ledger_rows (n) VALUES ($1)", message.n)
        try:
            async with connection.transaction():
                await connection.execute("INSERT INTO ledger_rows (n) VALUES ($1)", -message.n)
                raise RuntimeError("undone by the savepoint only")
        except RuntimeError:
            pass
    elif message.action == "deferred_violation":
        # Checked only at COMMIT: the statement that commits is the one that fails.
        await connection.execute("INSERT INTO ledger_children (parent) VALUES ($1)", message.n)
    elif message.action == "missing_queue":
        await context.send(Done(message.n), destination="nowhere")
        return
    elif message.action == "expiring":
        await context.send(Done(message.n), destination="ledger_out",
                           time_to_be_received=timedelta(seconds=90.5))
        return
    elif message.action == "slow_expiring":  # the handler takes a while, then sends
        await asyncio.sleep(2.0)
        await context.send(Done(message.n), destination="ledger_out",
                           time_to_be_received=timedelta(seconds=5))
        return
    elif message.action == "large_first":
        await context.send(Done(message.n, "x" * message.size), destination="ledger_out")
        await context.send(Done(message.n + 1), destination="ledger_out")
        return
    await context.send(Done(message.n), destination="ledger_out")


ledger_batched = Endpoint("ledger_batched", batch_size=4, immediate_retries=0,
                          delayed_retries=0)
ledger_batched.register(work)

ledger_batched_savepoints = Endpoint("ledger_batched_savepoints", batch_size=4,
                                     batch_isolation="savepoint", immediate_retries=0,
                                     delayed_retries=0)
ledger_batched_savepoints.register(work)
