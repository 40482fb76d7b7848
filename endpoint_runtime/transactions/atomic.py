"""TransactionMode.SENDS_ATOMIC_WITH_RECEIVE: outgoing messages are inserted in the receive
transaction, so the receive, the sends and the handler's writes commit or roll back as one."""

from __future__ import annotations

import asyncpg

from endpoint_runtime.chain.pipeline import Pipeline
from endpoint_runtime.transactions.single import SingleMessageStrategy


def atomic_strategy(pipeline: Pipeline, pool: asyncpg.Pool) -> SingleMessageStrategy:
    return SingleMessageStrategy(pipeline, pool, sends_atomic=True)
