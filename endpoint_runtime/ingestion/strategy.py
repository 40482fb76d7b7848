"""The ingestion endpoint's receive: audit copies in batches into ``audit_log``.

One transaction per round: DELETE up to ``batch_size`` audit copies, insert their rows (one
statement per table), COMMIT. A copy that cannot be read as one (headers that do not parse,
processing times missing or malformed) goes to ``error_log`` with the reason, in the same
transaction: nothing is dropped and nothing stops ingestion.
"""

from __future__ import annotations

from endpoint_runtime.chain.pipeline import Pipeline
from endpoint_runtime.ingestion.records import records_of
from endpoint_runtime.ingestion.storage import OperationalData
from endpoint_runtime.transactions.base import EMPTY, ReceiveSlot, Round
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import DatabaseConnection


class IngestionStrategy:
    def __init__(self, pipeline: Pipeline, data: OperationalData, batch_size: int) -> None:
        self.pipeline = pipeline
        self.data = data
        self.batch_size = batch_size

    def open_slot(self, connection: DatabaseConnection) -> IngestionSlot:
        return IngestionSlot(self, connection)


class IngestionSlot(ReceiveSlot):
    """A slot of ingestion rounds; each commits its batch, nothing is carried over."""

    def __init__(self, strategy: IngestionStrategy, connection: DatabaseConnection) -> None:
        super().__init__(connection)
        self._strategy = strategy

    async def round(self) -> Round:
        strategy, connection = self._strategy, self.connection
        address = strategy.pipeline.local_address
        async with connection.transaction():
            batch = await receiving.receive_batch(connection, address, strategy.batch_size)
            if not batch:
                return EMPTY
            audited, malformed = records_of(str(address), batch)
            await strategy.data.insert_audit(connection, audited)
            await strategy.data.insert_errors(connection, malformed)
        stats = strategy.pipeline.stats
        stats.processed += len(audited)
        stats.failed += len(malformed)
        return Round(taken=len(batch), handled=len(audited), failed=len(malformed))
