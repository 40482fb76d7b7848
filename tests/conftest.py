"""Shared fixtures: one PostgreSQL server per test session, one database per test.

The server is ``ENDPOINT_RUNTIME_DSN`` when set, otherwise an embedded one of the tests' own,
in the checkout's ``.endpoint_runtime/`` (never the user's per-user server: the suite sets
``ENDPOINT_RUNTIME_DATA_DIR`` for itself and every command and Ray worker it starts). A template
database is built once per session (``CREATE DATABASE ... TEMPLATE``) and cloned per test, so
each test starts from the same known state and tests never see each other's rows.

The chaos run (``tests/chaos/ci_run.py``) is started in the background once the tests that
keep both cores busy (Spark, multi-node Ray clusters) are behind, and the tests that read it
run last: its minutes of waiting overlap the other tests' instead of adding to them.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from endpoint_runtime.connections.connecting import PostgresTransport, connect_pool
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import quote_identifier
from tests.chaos import ci_run

_counter = itertools.count()

BUSY_TESTS = tuple(Path(__file__).resolve().parent / name for name in ("analytics", "cluster"))
"""Tests that keep both cores busy (Spark; local clusters of several Ray nodes), first in
the run: the chaos run starts after them, beside tests that mostly wait."""
_CHAOS_DECIDED = pytest.StashKey[bool]()

TESTS_DATA_DIR = Path(__file__).resolve().parent.parent / ".endpoint_runtime"
"""The suite's own embedded server, whatever ENDPOINT_RUNTIME_DATA_DIR the shell had."""
os.environ["ENDPOINT_RUNTIME_DATA_DIR"] = str(TESTS_DATA_DIR)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The chaos run's tests last (a stable sort: every other test keeps its place)."""
    items.sort(key=lambda item: item.path == ci_run.TEST_FILE)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """At the first test after the :data:`BUSY_TESTS`: start the chaos run if its tests are
    among the selected ones (after ``-k``/``-m``: ``session.items``)."""
    config = item.config
    if config.stash.get(_CHAOS_DECIDED, False) or any(
            item.path.is_relative_to(busy) for busy in BUSY_TESTS):
        return
    config.stash[_CHAOS_DECIDED] = True
    if any(selected.path == ci_run.TEST_FILE for selected in item.session.items):
        ci_run.chaos_run(config).start()


def pytest_unconfigure(config: pytest.Config) -> None:
    ci_run.stop(config)


async def _admin(dsn: str, *statements: str) -> None:
    connection = await asyncpg.connect(with_database(dsn, "postgres"))
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


@pytest.fixture(scope="session")
def server_dsn() -> str:
    return resolve_dsn(None)


@pytest.fixture(scope="session")
def template_database(server_dsn: str) -> Iterator[str]:
    name = f"er_template_{os.getpid()}"
    quoted = quote_identifier(name)
    asyncio.run(_admin(server_dsn, f"DROP DATABASE IF EXISTS {quoted}",
                       f"CREATE DATABASE {quoted}"))
    yield name
    asyncio.run(_admin(server_dsn, f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))


@pytest.fixture
async def database_dsn(server_dsn: str, template_database: str) -> AsyncIterator[str]:
    """DSN of a fresh database cloned from the session's template."""
    name = f"er_test_{os.getpid()}_{next(_counter)}"
    quoted = quote_identifier(name)
    await _admin(server_dsn,
                 f"CREATE DATABASE {quoted} TEMPLATE {quote_identifier(template_database)}")
    yield with_database(server_dsn, name)
    await _admin(server_dsn, f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")


@pytest.fixture
async def pool(database_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await connect_pool(database_dsn, min_size=1, max_size=20)
    yield pool
    await pool.close()


@pytest.fixture
async def transport(database_dsn: str) -> AsyncIterator[PostgresTransport]:
    settings = TransportSettings(dsn=database_dsn, pool_max_size=20)
    async with PostgresTransport.connect(settings) as transport:
        yield transport
