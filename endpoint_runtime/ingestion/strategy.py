"""The ingestion endpoint's receive: audit copies in batches into ``audit_log``.

One transaction per round: DELETE up to ``batch_size`` audit copies, insert their rows (one
statement per table), COMMIT. A copy that cannot be read as one (headers that do not parse,
processing times missing or malformed) goes to ``error_log`` with the reason, in the same
transaction: nothing is dropped and nothing stops ingestion.
"""

from __future__ import annotations

import asyncpg

from endpoint_runtime.ingestion.records import records_of
from endpoint_runtime.ingestion.storage import OperationalData
from endpoint_runtime.pipeline import Pipeline
from endpoint_runtime.transactions.base import EMPTY, Round
from endpoint_runtime.transport import receiving


class IngestionStrategy:
    def __init__(self, pipeline: Pipeline, data: OperationalData, batch_size: int) -> None:
        self._pipeline = pipeline
        self._data = data
        self._batch_size = batch_size

    async def slot_ended(self, connection: asyncpg.Connection) -> None:
        return None

    async def receive_round(self, connection: asyncpg.Connection) -> Round:
        address = self._pipeline.local_address
        async with connection.transaction():
            batch = await receiving.receive_batch(connection, address, self._batch_size)
            if not batch:
                return EMPTY
            audited, malformed = records_of(str(address), batch)
            await self._data.insert_audit(connection, audited)
            await self._data.insert_errors(connection, malformed)
        stats = self._pipeline.stats
        stats.processed += len(audited)
        stats.failed += len(malformed)
        return Round(taken=len(batch), handled=len(audited), failed=len(malformed))
