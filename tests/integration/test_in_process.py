"""An endpoint in process (``InProcessDeployment``): the real peeker and receivers on the test's
event loop, against the real PostgreSQL, with no Ray started."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys

import msgspec
import pytest
import structlog

import endpoint_runtime
from endpoint_runtime import InProcessDeployment, TransportSettings
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.connections.embedded import with_database
from endpoint_runtime.errors import ConfigurationError, DatabaseUnavailableError
from endpoint_runtime.runtime.actors.deployment_status import DeploymentConfig
from endpoint_runtime.runtime.actors.receiver_handles import ReceiverHandle
from endpoint_runtime.runtime.deployment import deployment_config
from endpoint_runtime.runtime.in_process import InProcessReceivers
from tests.e2e.conftest import count, send_batch, wait_for
from tests.support import counted_endpoints
from tests.support.counted_endpoints import Count

MODULE = "tests.support.counted_endpoints"


async def deployment_connections(transport: PostgresTransport, deployment_id: str) -> int:
    """The server's backends whose application_name carries the deployment's reservation."""
    return await count(transport.pool, "SELECT count(*) FROM pg_stat_activity "
                       "WHERE application_name LIKE '%' || $1 || '%'", deployment_id)


async def started_receiver(
    transport: PostgresTransport, database_dsn: str
) -> tuple[InProcessReceivers, ReceiverHandle, DeploymentConfig]:
    """One receiver of the atomic endpoint, launched and started by a hosting of its own (no
    peeker), its connections open."""
    config = await deployment_config(
        f"{MODULE}:atomic", transport=TransportSettings(dsn=database_dsn))
    receivers = InProcessReceivers()
    handle = receivers.launch(config, config.settings, None)
    await receivers.call(handle, "start", None)
    assert await deployment_connections(transport, config.deployment_id) > 0
    return receivers, handle, config


async def test_messages_are_handled_and_retried_here_and_the_stop_closes_every_connection(
    transport: PostgresTransport, database_dsn: str
) -> None:
    await transport.pool.execute("CREATE TABLE counted (n integer)")
    logging, collector = structlog.get_config(), (gc.get_threshold(), gc.get_freeze_count())
    deployment = await InProcessDeployment.start(
        f"{MODULE}:atomic", transport=TransportSettings(dsn=database_dsn, peek_delay=0.2),
        max_concurrency=4, slots_per_receiver=2)
    endpoint = counted_endpoints.atomic
    try:
        # "flaky" fails its first attempt: a retry, as on Ray, through the same chain.
        await send_batch(transport, endpoint.name,
                         [Count(n, "flaky" if n % 4 == 0 else "ok") for n in range(20)])

        async def all_handled() -> bool:
            return await count(transport.pool, "SELECT count(*) FROM counted") == 20

        await wait_for(all_handled, timeout=30, what="20 rows")
        # Every receiver the peeker started runs in this process.
        pids = await deployment.receiver_pids()
        assert pids
        assert set(pids) == {os.getpid()}, pids
        status = await deployment.status(refresh=True)
        assert status.processed == 20, status
        assert status.failed == 5, status  # one failed attempt per flaky message
        assert await deployment_connections(transport, deployment.config.deployment_id) > 0
    finally:
        final = await deployment.stop()
    assert final.processed == 20
    # The process's logging and collector are its own: a receiver configured structlog once
    # (cached loggers: a later test's capture_logs saw nothing) and froze the collector.
    assert structlog.get_config() == logging
    assert (gc.get_threshold(), gc.get_freeze_count()) == collector
    # Every connection of the peeker and the receivers is closed by the time stop returns.
    assert await deployment_connections(transport, deployment.config.deployment_id) == 0
    assert await transport.depth(endpoint.name) == 0


async def test_bad_settings_fail_the_start_before_anything_runs(
    transport: PostgresTransport, database_dsn: str
) -> None:
    with pytest.raises(ConfigurationError, match="max_concurrency"):
        await InProcessDeployment.start(
            f"{MODULE}:atomic", transport=TransportSettings(dsn=database_dsn),
            max_concurrency=0)
    assert await transport.pool.fetchval(
        "SELECT to_regclass($1)", counted_endpoints.atomic.address.qualified) is None


async def test_a_killed_receiver_closes_its_connections_and_a_stop_leaves_no_task(
    transport: PostgresTransport, database_dsn: str
) -> None:
    """The peeker kills a receiver whose start failed or timed out without draining it: in
    process, the kill must still close what the receiver opened."""
    receivers, handle, config = await started_receiver(transport, database_dsn)
    receivers.kill(handle)
    await receivers.ended()
    assert await deployment_connections(transport, config.deployment_id) == 0

    deployment = await InProcessDeployment.start(
        f"{MODULE}:atomic", transport=TransportSettings(dsn=database_dsn, peek_delay=0.1))
    assert await deployment.receiver_pids() == [os.getpid()]
    await deployment.stop()
    assert await deployment_connections(transport, deployment.config.deployment_id) == 0
    assert not runtime_tasks()


def runtime_tasks() -> list[str]:
    """The tasks on this loop whose coroutine is the runtime's code (a peeker's loop, a slot,
    a listener, the mover, a flush), by name."""
    package = os.path.dirname(endpoint_runtime.__file__)
    return [task.get_coro().__qualname__  # type: ignore[union-attr]
            for task in asyncio.all_tasks()
            if getattr(task.get_coro(), "cr_code", None) is not None
            and task.get_coro().cr_code.co_filename.startswith(package)]  # type: ignore[union-attr]


async def test_a_receiver_whose_start_failed_is_closed_without_an_error_left_behind(
    transport: PostgresTransport, database_dsn: str
) -> None:
    """Its start failed before the chain existed (no database by that name): the kill's
    drain still ends, with nothing open and no exception left unretrieved in a task."""
    config = await deployment_config(
        f"{MODULE}:atomic", transport=TransportSettings(dsn=database_dsn))
    broken = msgspec.structs.replace(config, dsn=with_database(database_dsn, "er_no_such_db"))
    receivers = InProcessReceivers()
    handle = receivers.launch(broken, broken.settings, None)
    with pytest.raises(DatabaseUnavailableError, match="er_no_such_db"):
        await receivers.call(handle, "start", None)
    receivers.kill(handle)
    await receivers.ended()
    assert handle.actor.drained  # closed, though its status has no chain to report
    assert not runtime_tasks()


async def test_receivers_a_cancelled_start_left_out_are_closed_at_the_end(
    transport: PostgresTransport, database_dsn: str
) -> None:
    """A receiver launched and started, then left in no list of the peeker's (its cycle was
    cancelled while it started): the hosting's end still closes it."""
    receivers, handle, config = await started_receiver(transport, database_dsn)
    await receivers.ended()  # no kill: only the hosting knows of it
    assert handle.actor.drained
    assert await deployment_connections(transport, config.deployment_id) == 0


async def test_tracing_is_refused_in_process(database_dsn: str) -> None:
    """The tracer provider is the host process's own: an endpoint in process may not install
    it (nor shut it down at its stop)."""
    with pytest.raises(ConfigurationError, match="tracing=True needs processes"):
        await InProcessDeployment.start(
            f"{MODULE}:atomic", transport=TransportSettings(dsn=database_dsn), tracing=True)


STARTS_NO_RAY = """
import asyncio, sys
import ray
from endpoint_runtime import InProcessDeployment, TransportSettings

async def main():
    deployment = await InProcessDeployment.start(
        "tests.support.counted_endpoints:atomic", transport=TransportSettings(dsn=sys.argv[1]))
    status = await deployment.status(refresh=True)
    await deployment.stop()
    print(ray.is_initialized(), [r.node_id for r in status.receivers])

asyncio.run(main())
"""


def test_an_endpoint_in_process_starts_no_ray(database_dsn: str) -> None:
    """In a process of its own (a test process may have started Ray for other tests): a
    receiver asked Ray's runtime context for its node id, which started a local Ray."""
    done = subprocess.run([sys.executable, "-c", STARTS_NO_RAY, database_dsn],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False ['local']", done.stdout[-3000:]
