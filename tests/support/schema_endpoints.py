"""Endpoints that own business tables (importable by path): through ``schema_sql``, through
an install hook, with SQL that is not idempotent, and with a hook that forgets a table it
declares. Each handler writes its business table, so a deployment shows the table works."""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext
from endpoint_runtime.transport.connection import DatabaseConnection

ORDERS = "bs_orders"
LEDGER = "bs_ledger"


class RecordOrder(msgspec.Struct):
    order_id: str


class Book(msgspec.Struct):
    entry: str


with_sql = Endpoint("bs_sales", schema_sql=f"""
    -- an order per RecordOrder; CREATE TABLE in a comment is no table: not_a_table
    CREATE TABLE IF NOT EXISTS {ORDERS} (order_id text PRIMARY KEY, note text DEFAULT 'CREATE
        TABLE inside_a_literal');
    CREATE INDEX IF NOT EXISTS {ORDERS}_note_idx ON {ORDERS} (note);
""")


@with_sql.handler
async def record_order(message: RecordOrder, context: HandlerContext) -> None:
    await context.connection.execute(
        f"INSERT INTO {ORDERS} (order_id) VALUES ($1) ON CONFLICT DO NOTHING", message.order_id)


with_hook = Endpoint("bs_books")


@with_hook.on_install(tables=[LEDGER])
async def create_ledger(connection: DatabaseConnection) -> None:
    await connection.execute(f"CREATE TABLE IF NOT EXISTS {LEDGER} (entry text PRIMARY KEY)")


@with_hook.handler
async def book(message: Book, context: HandlerContext) -> None:
    await context.connection.execute(f"INSERT INTO {LEDGER} (entry) VALUES ($1)", message.entry)


not_idempotent = Endpoint("bs_plain",
                          schema_sql="CREATE TABLE bs_plain_rows (n int);")


@not_idempotent.handler
async def count_plain(message: RecordOrder, context: HandlerContext) -> None:
    await context.connection.execute("INSERT INTO bs_plain_rows VALUES (1)")


forgetful = Endpoint("bs_forgetful",
                     schema_sql="CREATE TABLE IF NOT EXISTS bs_made (n int);")


@forgetful.on_install(tables=["bs_forgotten"])
async def forget_a_table(connection: DatabaseConnection) -> None:
    await connection.execute("SELECT 1")  # declares bs_forgotten, never creates it


@forgetful.handler
async def count_made(message: RecordOrder, context: HandlerContext) -> None:
    await context.connection.execute("INSERT INTO bs_made VALUES (1)")


typo = Endpoint("bs_typo", schema_sql="CREATE TABLE IF NOT EXISTS bs_typo_rows (n innt);")


@typo.handler
async def count_typo(message: RecordOrder, context: HandlerContext) -> None:
    await context.connection.execute("INSERT INTO bs_typo_rows VALUES (1)")
