"""Commands that deploy or install an endpoint read ``ENDPOINT_RUNTIME_*`` when they run.

An Endpoint takes its settings from the environment when its module is imported. A process
that imported the module earlier, under another ``ENDPOINT_RUNTIME_DSN`` (a test session run
against a configured server, a program that sets the variable before calling the command),
must still run against the server and database the environment names now: before the fix,
``run`` (and ``db install``, ``submit``) took every transport field the import-time
environment had set for a value the endpoint's code chose, and created the queue in the
session's database instead of the test's (the TCP failures of issue 26). Fields the code did
set keep winning over the environment.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from types import ModuleType

import asyncpg
import pytest

from endpoint_runtime.connections.embedded import with_database
from tests.support.cli import quiet_logging, run_cli

MODULE = "tests.support.late_environment_endpoint"


def _import_under(monkeypatch: pytest.MonkeyPatch, environment: dict[str, str]) -> ModuleType:
    """A fresh import of :data:`MODULE` with exactly ``environment`` as ENDPOINT_RUNTIME_*."""
    for name in list(os.environ):
        if name.startswith("ENDPOINT_RUNTIME_"):
            monkeypatch.delenv(name)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    return importlib.import_module(MODULE)


async def _table_exists(dsn: str, table: str) -> bool:
    connection = await asyncpg.connect(dsn)
    try:
        return await connection.fetchval("SELECT to_regclass($1)", table) is not None
    finally:
        await connection.close()


def test_db_install_uses_the_dsn_set_now_not_the_one_seen_at_import(
    database_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Imported while ENDPOINT_RUNTIME_DSN named a database that does not exist, installed
    with it naming the test's database: the queue is created in the test's database."""
    elsewhere = with_database(database_dsn, "er_no_such_database")
    module = _import_under(monkeypatch, {"ENDPOINT_RUNTIME_DSN": elsewhere})
    assert module.from_environment.settings.transport.dsn == elsewhere
    assert module.from_environment.transport_in_code == frozenset()
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", database_dsn)
    quiet_logging(monkeypatch)

    outcome = run_cli(capsys, "db", "install", f"{MODULE}:from_environment")

    assert outcome.code == 0, outcome
    assert asyncio.run(_table_exists(database_dsn, "public.late_environment"))


def test_a_field_set_in_code_wins_over_the_environment_then_and_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``peek_delay`` set in the endpoint's code stays; the DSN follows the environment of
    the command, not of the import; a file's value loses to the environment."""
    from endpoint_runtime.cli.run import merged_transport

    module = _import_under(monkeypatch, {"ENDPOINT_RUNTIME_DSN": "postgresql:///at_import",
                                         "ENDPOINT_RUNTIME_PEEK_DELAY": "5"})
    endpoint = module.peek_in_code
    assert endpoint.transport_in_code == frozenset({"peek_delay"})
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", "postgresql:///now")
    monkeypatch.setenv("ENDPOINT_RUNTIME_PEEK_DELAY", "9")

    merged = merged_transport(endpoint, None)

    assert merged.dsn == "postgresql:///now"
    assert merged.peek_delay == 0.7
    assert merged_transport(module.from_environment, None).peek_delay == 9
