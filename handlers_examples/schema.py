"""Business tables of the examples (idempotent, safe to run from several processes at once).

The handlers write these tables through ``context.connection``, i.e. in the transaction that
received the message (loyalty, which has the outbox: in the business transaction that also
stores the message's outbox record), so a row exists exactly when its message was consumed.
"""

from __future__ import annotations

import asyncpg

# Concurrent CREATE TABLE IF NOT EXISTS can still collide on pg_type; one lock serialises it.
_LOCK_KEY = 0x6578616D_706C6573  # "examples"

TABLES = ("orders", "invoices", "shipments", "loyalty_points", "order_events", "product_sales")

_DDL = """
CREATE TABLE IF NOT EXISTS orders (
    order_id    text PRIMARY KEY,
    customer    text NOT NULL,
    product     text NOT NULL,
    quantity    integer NOT NULL CHECK (quantity > 0),
    amount      numeric(12, 2) NOT NULL,
    accepted_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS invoices (
    invoice_id  uuid PRIMARY KEY,
    order_id    text NOT NULL UNIQUE,
    customer    text NOT NULL,
    amount      numeric(12, 2) NOT NULL,
    billed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS shipments (
    shipment_id uuid PRIMARY KEY,
    order_id    text NOT NULL UNIQUE,
    carrier     text NOT NULL,
    shipped_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS order_events (
    endpoint    text NOT NULL,
    order_id    text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (endpoint, order_id)
);
CREATE TABLE IF NOT EXISTS product_sales (
    product     text PRIMARY KEY,
    orders      bigint NOT NULL,
    amount      numeric(14, 2) NOT NULL
);
CREATE TABLE IF NOT EXISTS loyalty_points (
    order_id       text PRIMARY KEY,
    customer       text NOT NULL,
    points         integer NOT NULL CHECK (points >= 0),
    awarded_at     timestamptz NOT NULL DEFAULT now(),
    reminded_at    timestamptz
);
"""


async def create_tables(connection: asyncpg.Connection) -> None:
    """Create ``orders``, ``invoices``, ``shipments`` and ``loyalty_points`` if they do not
    exist yet."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        await connection.execute(_DDL)


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
