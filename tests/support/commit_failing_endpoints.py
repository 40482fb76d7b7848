"""Endpoints whose handler's work fails at COMMIT, not in the handler (importable by path).

The handler writes an order line; a line whose order does not exist breaks a foreign key that
PostgreSQL checks at COMMIT (``DEFERRABLE INITIALLY DEFERRED``). So the handlers of a bad
message return normally and the attempt then rolls back: it must count as a failed attempt,
never as processed, and must not be audited. Every endpoint audits to ``audit``.
"""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, TransactionMode
from endpoint_runtime.settings import OutboxSettings

TABLES = """
CREATE TABLE orders (key integer PRIMARY KEY);
CREATE TABLE order_lines (order_key integer REFERENCES orders DEFERRABLE INITIALLY DEFERRED);
INSERT INTO orders VALUES (1);
"""
"""The business tables: order 1 exists, any other order breaks the key at COMMIT."""


class AddLine(msgspec.Struct):
    order_key: int


def make(name: str, mode: TransactionMode, **options: object) -> Endpoint:
    retries = 0 if mode is TransactionMode.NONE else 1  # none mode cannot retry
    endpoint = Endpoint(name, transaction_mode=mode, immediate_retries=retries,
                        delayed_retries=0, audit_queue="audit", max_concurrency=1,
                        **options)  # type: ignore[arg-type]

    @endpoint.handler
    async def add_line(message: AddLine, context: HandlerContext) -> None:
        await context.connection.execute("INSERT INTO order_lines (order_key) VALUES ($1)",
                                         message.order_key)

    return endpoint


atomic = make("lines_atomic", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE)
receive_only = make("lines_receive_only", TransactionMode.RECEIVE_ONLY)
batched = make("lines_batched", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, batch_size=4)
none = make("lines_none", TransactionMode.NONE)
"""No transaction: the key is checked as the INSERT autocommits, so the handler fails."""
with_outbox = make("lines_outbox", TransactionMode.RECEIVE_ONLY, outbox=OutboxSettings())
metered = make("lines_metered", TransactionMode.RECEIVE_ONLY)
"""The receive-only endpoint of the metrics test (its own name: Ray's metrics outlive a test)."""
