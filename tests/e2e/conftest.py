"""End-to-end fixtures: one local Ray per session, deployments stopped after every test, over TCP.

The e2e tests connect over TCP, as users do: to ``ENDPOINT_RUNTIME_DSN`` when it is set, else
to a server of the worker's own on a free 127.0.0.1 port (``tests/support/tcp_server.py``),
while the other folders use the embedded server's Unix socket, so that one run checks both.
Every test gets a fresh database (``database_dsn``, from ``tests/conftest.py``); it creates its
business tables and the queues its handlers send to, then deploys an endpoint of
``tests/e2e/endpoints.py`` by path, exactly as the runtime does in production: a PeekerActor
that starts ReceiverActors, each importing the endpoint module itself.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeAlias, TypeVar

import asyncpg
import msgspec
import pytest
import ray

from endpoint_runtime import EndpointDeployment, Sender, TransportSettings
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.connections.embedded import resolve_dsn
from endpoint_runtime.runtime.actors.cluster import ensure_ray
from endpoint_runtime.runtime.actors.deployment_status import DeploymentStatus
from endpoint_runtime.runtime.in_process import InProcessDeployment
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.messages import PoisonMessage, TransportMessage
from tests import conftest
from tests.support import tcp_server

ENDPOINTS_MODULE = "tests.e2e.endpoints"
PEEK_DELAY = 0.2
STOP_TIMEOUT = 5.0
POLL_SECONDS = 0.05

T = TypeVar("T")


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """The e2e tests' server: ``ENDPOINT_RUNTIME_DSN``, else one over TCP of this worker's."""
    if os.environ.get("ENDPOINT_RUNTIME_DSN"):
        yield resolve_dsn(None)
        return
    server = tcp_server.start()
    try:
        yield server.dsn
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def template_database(server_dsn: str) -> Iterator[str]:
    """This worker's template database on the e2e tests' server."""
    with conftest.template_on(server_dsn) as name:
        yield name


METRICS_REPORT_MS = "1000"
"""How often the session's Ray workers hand their metrics to the node's exporter (Ray's default,
10 s, is most of what a test of the Prometheus export would wait)."""


@pytest.fixture(scope="session", autouse=True)
def ray_session() -> Iterator[None]:
    """One local Ray for every e2e test of the session."""
    os.environ.setdefault("RAY_metrics_report_interval_ms", METRICS_REPORT_MS)
    ensure_ray()
    yield
    ray.shutdown()


async def wait_for(
    condition: Callable[[], Awaitable[T]],
    *,
    timeout: float,  # noqa: ASYNC109 - a polling deadline, reported with what was awaited
    what: str,
    interval: float = POLL_SECONDS,
) -> T:
    """Poll ``condition`` every ``interval`` s until it returns something truthy; return it.

    Fails with ``what`` and the last value seen when ``timeout`` s pass first.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} "
                                 f"(last value: {value!r})")
        await asyncio.sleep(interval)


Deployment: TypeAlias = EndpointDeployment | InProcessDeployment


class Deployer:
    """Starts deployments of ``tests.e2e.endpoints`` endpoints on the test's database and
    stops, at teardown, every one the test did not stop itself.

    In the modules marked ``in_process`` a deployment's peeker and receivers run on the test's
    event loop (:mod:`endpoint_runtime.runtime.in_process`): the same objects, queues, chain
    and PostgreSQL as on Ray, without two Ray worker processes per deployment (3 s each). Those
    modules check what is not about Ray; receiver deaths, scaling over processes, draining,
    metrics export and node loss stay on Ray.
    """

    def __init__(self, dsn: str, *, in_process: bool = False) -> None:
        self.dsn = dsn
        self.in_process = in_process
        self._running: list[Deployment] = []

    async def start(
        self, name: str, *, peek_delay: float = PEEK_DELAY, module: str = ENDPOINTS_MODULE,
        pooler_dsn: str | None = None, **overrides: Any,
    ) -> Deployment:
        overrides.setdefault("stop_timeout", STOP_TIMEOUT)
        kind = InProcessDeployment if self.in_process else EndpointDeployment
        deployment = await kind.start(
            f"{module}:{name}",
            transport=TransportSettings(dsn=self.dsn, peek_delay=peek_delay,
                                        pooler_dsn=pooler_dsn),
            **overrides,
        )
        self._running.append(deployment)
        return deployment

    async def stop(self, deployment: Deployment) -> DeploymentStatus:
        self._running.remove(deployment)
        return await deployment.stop()

    async def stop_all(self) -> None:
        while self._running:
            await self.stop(self._running[-1])


@pytest.fixture
async def deployer(database_dsn: str, request: pytest.FixtureRequest) -> AsyncIterator[Deployer]:
    deployer = Deployer(database_dsn,
                        in_process=request.node.get_closest_marker("in_process") is not None)
    try:
        yield deployer
    finally:
        await deployer.stop_all()


@pytest.fixture
async def with_handled(transport: PostgresTransport) -> PostgresTransport:
    """The test's database with the table ``handled (key text)`` that the handlers of
    ``tests/support/hardening_endpoints.py`` and ``waking_endpoints.py`` write to."""
    await transport.pool.execute("CREATE TABLE handled (key text)")
    return transport


@pytest.fixture
async def sender(database_dsn: str) -> AsyncIterator[Sender]:
    """Sends from outside any endpoint, as a script or web application would."""
    async with Sender("e2e-driver", TransportSettings(dsn=database_dsn)) as sender:
        yield sender


# -- looking at queues and tables ----------------------------------------------------------


async def create_queues(transport: PostgresTransport, *names: str) -> None:
    for name in names:
        await transport.create_queue(name)


async def send_batch(
    transport: PostgresTransport, queue: str, messages: Sequence[msgspec.Struct]
) -> list[str]:
    """Send ``messages`` in one INSERT (one statement: the backlog appears at once)."""
    outgoing = [create_outgoing(m, originating_endpoint="e2e-driver") for m in messages]
    await transport.send_many(queue, outgoing)
    return [o.message_id for o in outgoing]


async def queue_exists(dsn: str, queue: str) -> bool:
    """Whether ``public.<queue>`` exists yet (a deployment started elsewhere creates it);
    ``False`` also while the database refuses connections."""
    try:
        connection = await asyncpg.connect(dsn)
    except (OSError, asyncpg.PostgresError):
        return False
    try:
        return bool(await connection.fetchval("SELECT to_regclass($1)",
                                              QueueAddress.parse(queue).qualified))
    finally:
        await connection.close()


async def count(pool: asyncpg.Pool, sql: str, *args: Any) -> int:
    value: int = await pool.fetchval(sql, *args)
    return value


async def ns_in_queue(transport: PostgresTransport, queue: str) -> list[int]:
    """Field ``n`` of every message body waiting in ``queue`` (JSON bodies), sorted."""
    address = QueueAddress.parse(queue)
    rows = await transport.pool.fetch(
        f"SELECT (convert_from(body, 'UTF8')::json->>'n')::int AS n FROM {address.qualified}"
    )
    return sorted(row["n"] for row in rows)


async def drain_queue(
    transport: PostgresTransport, queue: str
) -> list[TransportMessage | PoisonMessage]:
    """Receive every message of ``queue`` (in seq order)."""
    received = []
    while (message := await transport.receive(queue)) is not None:
        received.append(message)
    return received


async def depths(transport: PostgresTransport, *queues: str) -> dict[str, int]:
    return {queue: await transport.depth(queue) for queue in queues}


async def fresh_status(deployment: Deployment) -> DeploymentStatus:
    """The peeker's status after asking every receiver now (``status()`` alone returns what
    the receivers said at the last peek cycle)."""
    await deployment.receiver_pids()  # refreshes the peeker's view of every receiver
    return await deployment.status()


async def wait_for_status(
    deployment: Deployment,
    predicate: Callable[[DeploymentStatus], bool],
    *,
    timeout: float,  # noqa: ASYNC109 - passed on to wait_for
    what: str,
    fresh: bool = False,
) -> DeploymentStatus:
    """Wait until the peeker's status (refreshed at each peek cycle; ``fresh``: asked of every
    receiver at each look, for a long peek delay) satisfies ``predicate``."""
    last: list[DeploymentStatus] = []

    async def satisfied() -> bool:
        status = await (fresh_status(deployment) if fresh else deployment.status())
        last[:] = [status]
        return predicate(status)

    try:
        await wait_for(satisfied, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {status_line(last[0])}") from None
    return last[0]


def status_line(status: DeploymentStatus) -> str:
    receivers = ", ".join(
        f"{r.receiver_id}(allowance={r.allowance} slots={r.slots} in_flight={r.in_flight} "
        f"processed={r.processed} failed={r.failed} moved={r.moved_to_error})"
        for r in status.receivers
    )
    return (f"estimate={status.estimate} max_concurrency={status.max_concurrency} "
            f"replaced={status.replaced_receivers} processed={status.processed} "
            f"failed={status.failed} outbox_duplicates={status.outbox_duplicates} "
            f"receivers=[{receivers}]")

