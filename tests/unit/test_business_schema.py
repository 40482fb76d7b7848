"""The business schema's pure parts: which tables a schema SQL declares, and registering
install hooks (no database)."""

from __future__ import annotations

import pytest

from endpoint_runtime import Endpoint
from endpoint_runtime.database.business_schema import tables_created_by
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.transport.connection import DatabaseConnection
from tests.support import schema_endpoints


@pytest.mark.parametrize(("sql", "tables"), [
    ("CREATE TABLE IF NOT EXISTS orders (id int)", ["orders"]),
    ("create table orders (id int); CREATE UNLOGGED TABLE scratch (n int)",
     ["orders", "scratch"]),
    ('CREATE TABLE IF NOT EXISTS sales . "Order Lines" (n int)', ['sales."Order Lines"']),
    ('CREATE TABLE "we""ird" (n int)', ['"we""ird"']),
    ("CREATE TEMP TABLE t1 (n int); CREATE GLOBAL TEMPORARY TABLE t2 (n int)", []),
    ("-- CREATE TABLE commented (n int)\n/* CREATE TABLE also_not (n int) */ SELECT 1", []),
    ("INSERT INTO notes VALUES ('CREATE TABLE quoted (n int)')", []),
    ("CREATE INDEX IF NOT EXISTS i ON orders (id); CREATE VIEW v AS SELECT 1", []),
    ("CREATE TABLE IF NOT EXISTS a (n int); CREATE TABLE IF NOT EXISTS a (n int)", ["a"]),
])
def test_the_tables_a_schema_sql_creates(sql: str, tables: list[str]) -> None:
    assert tables_created_by(sql) == tables


def test_an_endpoint_declares_the_tables_of_its_sql_and_of_its_hooks() -> None:
    assert schema_endpoints.with_sql.business_schema.tables == [schema_endpoints.ORDERS]
    assert schema_endpoints.with_hook.business_schema.tables == [schema_endpoints.LEDGER]
    assert schema_endpoints.forgetful.business_schema.tables == ["bs_made", "bs_forgotten"]
    assert not Endpoint("no_tables").business_schema


def test_on_install_works_bare_and_with_options_and_returns_the_function() -> None:
    endpoint = Endpoint("hooked")

    async def first(connection: DatabaseConnection) -> None: ...

    async def second(connection: DatabaseConnection) -> None: ...

    async def third(connection: DatabaseConnection) -> None: ...

    assert endpoint.on_install(first) is first
    assert endpoint.on_install(tables=["t"])(second) is second
    assert endpoint.business_schema.hooks == [first, second]
    assert endpoint.business_schema.tables == ["t"]
    with pytest.raises(ConfigurationError, match="already added"):
        endpoint.on_install(first)
    with pytest.raises(ConfigurationError, match="not one string"):
        endpoint.on_install(tables="orders")(third)
    with pytest.raises(ConfigurationError, match="async function"):
        endpoint.on_install(lambda connection: None)  # type: ignore[arg-type,return-value]
    assert endpoint.business_schema.hooks == [first, second]
