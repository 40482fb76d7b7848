"""The one place that picks a receive strategy from an endpoint's settings (what each mode
allows is in :mod:`endpoint_runtime.modes`)."""

from __future__ import annotations

import asyncpg

from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.pipeline import Pipeline
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.modes import TransactionMode
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transactions.atomic import atomic_strategy
from endpoint_runtime.transactions.base import ReceiveStrategy
from endpoint_runtime.transactions.batched import BatchedAtomicStrategy
from endpoint_runtime.transactions.none import NoTransactionStrategy
from endpoint_runtime.transactions.outbox_receive import OutboxStrategy
from endpoint_runtime.transactions.receive_only import receive_only_strategy


def strategy_for(
    settings: EndpointSettings, pipeline: Pipeline, pool: asyncpg.Pool
) -> ReceiveStrategy:
    """The receive strategy of the settings' transaction mode (and outbox, batch size)."""
    if settings.outbox is not None:
        if "outbox" not in pipeline.steps:
            raise ConfigurationError("the chain was built without the outbox: build it with the "
                                     "same settings as the strategy (create_pipeline(settings))")
        storage = OutboxStorage.for_settings(pipeline.local_address, settings)
        return OutboxStrategy(pipeline, pool, storage, settings.outbox)
    mode = settings.mode
    if mode is TransactionMode.NONE:
        return NoTransactionStrategy(pipeline, pool)
    if mode is TransactionMode.RECEIVE_ONLY:
        return receive_only_strategy(pipeline, pool)
    if settings.batch_size > 1:
        return BatchedAtomicStrategy(pipeline, pool, settings.batch_size,
                                     settings.batch_isolation)
    return atomic_strategy(pipeline, pool)
