"""Shared fixtures: one PostgreSQL server per test session, one database per test.

The server is ``ENDPOINT_RUNTIME_DSN`` when set, otherwise an embedded one of the tests' own,
in the checkout's ``.endpoint_runtime/`` (never the user's per-user server: the suite sets
``ENDPOINT_RUNTIME_DATA_DIR`` for itself and every command and Ray worker it starts). A template
database is built once per session (``CREATE DATABASE ... TEMPLATE``) and cloned per test, so
each test starts from the same known state and tests never see each other's rows.

The suite runs in several worker processes (pytest-xdist, ``bin/dev test``): each test
module is one unit of work that stays on one worker, so a module's fixtures (a local Ray
cluster, a deployment shared by its tests) are set up once. The Spark tests are one unit (one
JVM for all of them), and so are the tests that read the chaos run (the run itself starts when
their fixture asks for it). Units go out by their number of tests, most first (pytest-xdist's
``--loadscope-reorder``, on by default), which puts the chaos run first (see :data:`BUSY`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from xdist.scheduler import LoadScopeScheduling

from endpoint_runtime.connections.connecting import PostgresTransport, close_pool, connect_pool
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import quote_identifier
from tests.chaos import ci_run

_counter = itertools.count()

TESTS = Path(__file__).resolve().parent
ONE_UNIT = ("analytics", "chaos")
"""Folders whose tests all run on one worker (one Spark session; one chaos run)."""

TESTS_DATA_DIR = TESTS.parent / ".endpoint_runtime"
"""The suite's own embedded server, whatever ENDPOINT_RUNTIME_DATA_DIR the shell had."""
os.environ["ENDPOINT_RUNTIME_DATA_DIR"] = str(TESTS_DATA_DIR)


def unit_of_work(nodeid: str) -> str:
    """The tests that stay on one worker: a folder of :data:`ONE_UNIT`, else one module
    (``nodeid``: ``tests/<folder>/<module>.py::<test>``)."""
    module = nodeid.split("::", 1)[0].removeprefix("tests/")
    folder = module.split("/", 1)[0]
    return folder if folder in ONE_UNIT else module


BUSY = ("chaos", "cluster/test_multinode.py", "analytics")
"""Units that keep both cores busy (the chaos run's Ray cluster, kills and restarts; a local
cluster of three Ray nodes; Spark): never two at once. Side by side, each slowed the other and
a clean clone's chaos run lost its peeker (mode ``none``: ten restarts in a row died). Units go
out by their number of tests, most first, so the chaos run (74 tests: its ledger's pure checks
and the run's) goes first, beside the modules with many tests, most of them PostgreSQL in
process; Spark and the three-node cluster follow it, one at a time. An explicit order (the
chaos run, then the light units beside it, then the Ray modules longest first) was tried on
2026-12-02: 793 s of pytest on a quiet machine against 618 s in this order the same day."""


class UnitScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduler with the units of :func:`unit_of_work`, handed out most
    tests first (its default), except that a :data:`BUSY` unit waits while another is assigned and
    not finished (a lighter unit goes out in its place). Its ``xdist_group`` marks do not group
    under pytest 9, whose node ids it can no longer suffix."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of_work(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        if self.workqueue and next(iter(self.workqueue)) in BUSY and self._busy_running():
            light = next((scope for scope in self.workqueue if scope not in BUSY), None)
            if light is not None:
                self.workqueue.move_to_end(light, last=False)
        super()._assign_work_unit(node)

    def _busy_running(self) -> bool:
        return any(scope in BUSY and not all(tests.values())
                   for assigned in self.assigned_work.values()
                   for scope, tests in assigned.items())


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> UnitScheduling:
    return UnitScheduling(config, log)


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
    with template_on(server_dsn) as name:
        yield name


@contextlib.contextmanager
def template_on(server_dsn: str) -> Iterator[str]:
    """This worker's template database on ``server_dsn``, dropped at the end."""
    name = f"er_template_{os.getpid()}"
    quoted = quote_identifier(name)
    asyncio.run(_admin(server_dsn, f"DROP DATABASE IF EXISTS {quoted}",
                       f"CREATE DATABASE {quoted}"))
    try:
        yield name
    finally:
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
    await close_pool(pool)  # bounded: a test cut short may leave a connection on a lock


@pytest.fixture
def exported() -> Iterator[Any]:
    """``(provider, exporter)``: spans of a real OpenTelemetry SDK, kept in memory
    (:mod:`tests.support.spans`; imported here only when a test asks for it)."""
    from tests.support.spans import in_memory

    with in_memory() as provider_and_exporter:
        yield provider_and_exporter


@pytest.fixture
async def transport(database_dsn: str) -> AsyncIterator[PostgresTransport]:
    settings = TransportSettings(dsn=database_dsn, pool_max_size=20)
    async with PostgresTransport.connect(settings) as transport:
        yield transport


@pytest.fixture(scope="module")
def pooler(server_dsn: str) -> Iterator[Any]:
    """A PgBouncer in transaction mode in front of the module's server
    (:func:`tests.support.poolers.start_pooler`)."""
    from tests.support.poolers import start_pooler

    pooler = start_pooler(server_dsn)
    yield pooler
    pooler.stop()
