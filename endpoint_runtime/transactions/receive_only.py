"""TransactionMode.RECEIVE_ONLY: the receive transaction stays open during the handler;
sends leave at once on other connections, so they stay sent if the handler then fails."""

from __future__ import annotations

import asyncpg

from endpoint_runtime.pipeline import Pipeline
from endpoint_runtime.transactions.single import SingleMessageStrategy


def receive_only_strategy(pipeline: Pipeline, pool: asyncpg.Pool) -> SingleMessageStrategy:
    return SingleMessageStrategy(pipeline, pool, sends_atomic=False)
