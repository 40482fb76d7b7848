"""The examples' business tables, and counting their rows.

Each example endpoint owns its tables: its ``Endpoint(..., schema_sql=...)`` creates them
(``CREATE TABLE IF NOT EXISTS``) when a deployment starts with installers, or when
``endpoint-runtime db install`` runs; sales has ``orders``, billing ``invoices``, shipping
``shipments``, loyalty ``loyalty_points``, analytics ``product_sales``. ``order_events`` is
written by two endpoints, billing and analytics, so both declare it (:data:`ORDER_EVENTS`).

The handlers write these tables through ``context.connection``, i.e. in the transaction that
received the message (loyalty, which has the outbox: in the business transaction that also
stores the message's outbox record), so a row exists exactly when its message was consumed.
"""

from __future__ import annotations

import asyncpg

ORDER_EVENTS = """
CREATE TABLE IF NOT EXISTS order_events (
    endpoint    text NOT NULL,
    order_id    text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (endpoint, order_id)
);
"""
"""The OrderPlaced events each subscriber (billing, analytics) handled, one row per order."""


async def count_rows(
    connection: asyncpg.Connection | asyncpg.Pool, order_ids: list[str]
) -> dict[str, int]:
    """Rows of each business table that belong to the given orders, by table name, and
    ``reminded``: the loyalty rows whose expiry reminder was handled; ``billing_events`` and
    ``analytics_events``: OrderPlaced events each subscriber handled."""
    row = await connection.fetchrow(
        """
        SELECT (SELECT count(*) FROM orders    WHERE order_id = ANY($1::text[])) AS orders,
               (SELECT count(*) FROM invoices  WHERE order_id = ANY($1::text[])) AS invoices,
               (SELECT count(*) FROM shipments WHERE order_id = ANY($1::text[])) AS shipments,
               l.loyalty_points, l.reminded,
               (SELECT count(*) FROM order_events
                WHERE endpoint = 'billing' AND order_id = ANY($1::text[])) AS billing_events,
               (SELECT count(*) FROM order_events
                WHERE endpoint = 'analytics' AND order_id = ANY($1::text[])) AS analytics_events
        FROM (SELECT count(*) AS loyalty_points, count(reminded_at) AS reminded
              FROM loyalty_points WHERE order_id = ANY($1::text[])) AS l
        """,
        order_ids,
    )
    assert row is not None
    return dict(row)
