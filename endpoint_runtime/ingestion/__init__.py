"""Ingestion: audit copies and failed messages become operational data.

A built-in endpoint, run on Ray like any other (``endpoint-runtime ingest``, or
``EndpointDeployment.start("endpoint_runtime.ingestion:endpoint")``), so it scales out the same
way:

- its receivers consume the audit queue in batches into ``audit_log`` (typed columns: message
  id and type, intent, sending and processing endpoint and machine, conversation, related-to,
  time sent, processing start and end, processing and critical time, body size, retries, the
  raw headers);
- its peeker records the error queue into ``error_log`` once a second, **leaving the rows
  where they are**: ``errors retry`` still finds them, and a message that fails again is
  recorded again (each row of the queue once, by native id and seq; a row that commits after
  later ones is still found: see :meth:`OperationalData.record_error_queue`);
- once a minute, every row older than ``keep_for`` seconds (default 30 days) is deleted, in
  batches, until none is left.

A malformed or hostile audit copy is recorded in ``error_log`` with the reason, never dropped.
Tables live in the transport's schema. For another audit or error queue, define your own
``IngestionEndpoint("my_audit", error_queue="my_errors")`` at module level and run that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import asyncpg
import structlog

from endpoint_runtime.chain.pipeline import Pipeline
from endpoint_runtime.ingestion.storage import OperationalData
from endpoint_runtime.ingestion.strategy import IngestionStrategy
from endpoint_runtime.runtime.endpoint import Endpoint
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transactions.base import ReceiveStrategy
from endpoint_runtime.transport.addresses import QueueAddress

log = structlog.get_logger("endpoint_runtime.ingestion")

DEFAULT_KEEP_FOR = 30 * 86_400.0
ERROR_SCAN_INTERVAL = 1.0
CLEANUP_INTERVAL = 60.0


class IngestionEndpoint(Endpoint):
    """Consumes an audit queue (its name) and records an error queue.

    Args:
        name: the audit queue (default ``"audit"``).
        error_queue: the error queue to record (default ``"error"``).
        batch_size: audit copies per transaction.
        keep_for: seconds rows are kept in ``audit_log`` and ``error_log``.
    """

    def __init__(
        self, name: str = "audit", *, error_queue: str = "error", batch_size: int = 500,
        keep_for: float = DEFAULT_KEEP_FOR, **overrides: Any,
    ) -> None:
        overrides.setdefault("max_concurrency", 2)
        super().__init__(name, error_queue=error_queue, audit_queue=None, auto_subscribe=False,
                         immediate_retries=0, delayed_retries=0, **overrides)
        self.ingestion_batch_size = batch_size
        self.keep_for = keep_for
        self.data = OperationalData(self.address.schema)
        self.delayed_store = None  # it defers nothing: no mover

    def validate(self) -> None:
        return None  # no handlers: its receive is its own

    def create_strategy(  # type: ignore[override]
        self, pipeline: Pipeline, pool: asyncpg.Pool, settings: EndpointSettings
    ) -> ReceiveStrategy:
        return IngestionStrategy(pipeline, self.data, self.ingestion_batch_size)

    def background_tasks(
        self, pool: asyncpg.Pool, settings: EndpointSettings
    ) -> list[Coroutine[Any, Any, None]]:
        error_queue = QueueAddress.parse(settings.error_queue, settings.transport.schema)
        return [self._record_errors(pool, error_queue)]

    async def _record_errors(self, pool: asyncpg.Pool, error_queue: QueueAddress) -> None:
        """Every second: record new error-queue rows (and, once a minute, clean up)."""
        loop = asyncio.get_running_loop()
        next_cleanup = 0.0
        async with pool.acquire() as connection:
            await self.data.setup(connection)
        while True:
            try:
                async with pool.acquire() as connection:
                    while await self.data.record_error_queue(connection, error_queue):
                        pass  # a full batch: more may wait
                    if loop.time() >= next_cleanup:
                        await self.data.clean_up(connection, self.keep_for)
                        next_cleanup = loop.time() + CLEANUP_INTERVAL
            except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
                log.warning("error_queue_recording_failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(ERROR_SCAN_INTERVAL)


endpoint = IngestionEndpoint()
"""The default ingestion endpoint: audit queue ``audit``, error queue ``error``."""

__all__ = ["IngestionEndpoint", "OperationalData", "endpoint"]
