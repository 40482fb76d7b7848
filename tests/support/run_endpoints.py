"""Two quick endpoints that ``endpoint-runtime run`` deploys together (with ``--ingest``) in
``tests/e2e/test_run_command.py``: each writes the key it handled into ``handled`` and sends
its audit copy to ``audit``, which the ingestion endpoint records in ``audit_log``."""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext


class Note(msgspec.Struct):
    key: str


async def _note(message: Note, context: HandlerContext) -> None:
    await context.connection.execute("INSERT INTO handled (key) VALUES ($1)", message.key)


orders = Endpoint("run_orders", audit_queue="audit", max_concurrency=1, slots_per_receiver=1)
orders.register(_note)
shipping = Endpoint("run_shipping", audit_queue="audit", max_concurrency=1,
                    slots_per_receiver=1)
shipping.register(_note)
