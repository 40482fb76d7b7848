"""An endpoint's business tables through ``endpoint-runtime db install`` (the CLI, in this
process) against the test's database: created with the runtime's tables, twice without harm,
SQL that is not idempotent and a hook that forgets a declared table refused clearly, with
nothing committed. (Deployments with installers on and off: tests/e2e/test_business_schema.py.)
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests.support import schema_endpoints
from tests.support.cli import quiet_logging, run_cli

MODULE = "tests.support.schema_endpoints"


@pytest.fixture
def installing(database_dsn: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The CLI pointed at the test's database (``db install`` reads the DSN when it runs)."""
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", database_dsn)
    quiet_logging(monkeypatch)
    return database_dsn


def query(dsn: str, sql: str) -> object:
    async def fetch() -> object:
        connection = await asyncpg.connect(dsn)
        try:
            return await connection.fetchval(sql)
        finally:
            await connection.close()
    return asyncio.run(fetch())


def test_db_install_creates_the_business_tables_of_schema_sql_and_keeps_them_twice(
    installing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = run_cli(capsys, "db", "install", f"{MODULE}:with_sql")

    assert first.code == 0, first
    assert f"business table: {schema_endpoints.ORDERS}" in first.out.splitlines(), first.out
    assert "queue: public.bs_sales" in first.out.splitlines(), first.out
    for what, table in (("heartbeats", "endpoint_heartbeats"),  # the peeker's, the console's
                        ("queue_lengths", "endpoint_queue_lengths")):
        assert f"{what}: public.{table}" in first.out.splitlines(), first.out
        assert query(installing, f"SELECT to_regclass('{table}')")
    assert query(installing, f"SELECT to_regclass('{schema_endpoints.ORDERS}_note_idx')")
    query(installing, f"INSERT INTO {schema_endpoints.ORDERS} (order_id) VALUES ('kept')")

    second = run_cli(capsys, "db", "install", f"{MODULE}:with_sql")

    assert second.code == 0, second
    assert second.out == first.out
    assert query(installing, f"SELECT count(*) FROM {schema_endpoints.ORDERS}") == 1
    # What the comment and the string literal of the SQL mention is no table.
    assert query(installing, "SELECT to_regclass('not_a_table')") is None
    assert query(installing, "SELECT to_regclass('inside_a_literal')") is None


def test_db_install_runs_an_install_hook_and_its_table_is_declared(
    installing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(2):
        outcome = run_cli(capsys, "db", "install", f"{MODULE}:with_hook")
        assert outcome.code == 0, outcome
        assert f"business table: {schema_endpoints.LEDGER}" in outcome.out, outcome.out
    assert query(installing, f"SELECT to_regclass('{schema_endpoints.LEDGER}')")


def test_schema_sql_that_is_not_idempotent_fails_the_second_install_with_a_hint(
    installing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "db", "install", f"{MODULE}:not_idempotent").code == 0

    again = run_cli(capsys, "db", "install", f"{MODULE}:not_idempotent")

    assert again.code == 2, again
    assert "business schema of endpoint 'bs_plain' is not idempotent" in again.err, again.err
    assert "CREATE TABLE IF NOT EXISTS" in again.err, again.err


def test_a_declared_table_that_the_hooks_do_not_create_fails_and_nothing_is_committed(
    installing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = run_cli(capsys, "db", "install", f"{MODULE}:forgetful")

    assert outcome.code == 2, outcome
    assert "did not create: bs_forgotten" in outcome.err, outcome.err
    assert query(installing, "SELECT to_regclass('bs_made')") is None  # rolled back


def test_wrong_schema_sql_names_the_endpoint_and_the_error(
    installing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = run_cli(capsys, "db", "install", f"{MODULE}:typo")

    assert outcome.code == 2, outcome
    assert "business schema of endpoint 'bs_typo' failed: UndefinedObjectError" in outcome.err, \
        outcome.err
    assert 'type "innt" does not exist' in outcome.err, outcome.err


def test_db_grants_grants_nothing_on_business_tables_and_says_so(
    installing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = run_cli(capsys, "db", "grants", f"{MODULE}:with_sql", "--role", "sales_app")

    assert outcome.code == 0, outcome
    lines = outcome.out.splitlines()
    assert not [line for line in lines if schema_endpoints.ORDERS in line
                and not line.startswith("--")], lines
    assert lines[-1] == ("-- not granted here: the business tables the endpoint declares "
                         f"({schema_endpoints.ORDERS}); grant the role what its handlers do "
                         "with them"), lines
