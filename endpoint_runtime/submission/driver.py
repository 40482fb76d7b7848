"""The submit script's run: wait for the nodes, install, deploy, report, stop (docs/cluster.md).

Exit statuses: 0; 1 when a deployment could not be started (no node has the resources it
asks for), could not be kept running, or halted on a critical error; 2 on a configuration
error.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import asyncpg
import structlog

from endpoint_runtime.cli.run import deployment_overrides
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import EndpointTables
from endpoint_runtime.errors import EndpointRuntimeError, ResourcesUnavailableError
from endpoint_runtime.logging import configure_logging
from endpoint_runtime.runtime.actors.cluster import ensure_ray
from endpoint_runtime.runtime.actors.committed_counts import counts_table, read_committed
from endpoint_runtime.runtime.deployment import (
    EndpointDeployment,
    check_placement,
    deployment_settings,
    prepare_endpoint,
)
from endpoint_runtime.runtime.endpoint import Endpoint, load_endpoint
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.submission import replacing
from endpoint_runtime.submission.options import SubmitOptions, as_arguments, parse
from endpoint_runtime.submission.report import Tracker, print_report, short
from endpoint_runtime.submission.watch import STATUS_CALL_SECONDS, StatusWatch, bounded
from endpoint_runtime.transport import queues

log = structlog.get_logger("endpoint_runtime.submit")

T = TypeVar("T")

STOP_GRACE_SECONDS = 60.0
"""How long a stopping peeker may take beyond its receivers' ``stop_timeout``."""


def main(argv: list[str] | None = None) -> int:
    """Run the submit script with ``argv`` (default: the command line); the exit status."""
    configure_logging(os.environ.get("ENDPOINT_RUNTIME_LOG_LEVEL", "info"))
    # Like `python -m`: modules of the current directory can be named.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        options = parse(argv)
        return asyncio.run(submit(options))
    except ResourcesUnavailableError as exc:
        print(f"submit: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except EndpointRuntimeError as exc:
        print(f"submit: error: {exc}", file=sys.stderr, flush=True)
        return 2


class _Stopped(Exception):
    """SIGINT/SIGTERM or the end of ``--duration`` came before the deployments ran."""


class Run:
    """One run: the options, the stop request, the deadline."""

    def __init__(self, options: SubmitOptions) -> None:
        self.options = options
        self.stop_requested = asyncio.Event()
        self.started = time.monotonic()

    def remaining(self) -> float | None:
        if self.options.duration is None:
            return None
        return self.options.duration - (time.monotonic() - self.started)

    async def before_stop(self, awaitable: Awaitable[T]) -> T:
        """``awaitable``'s result, unless a stop request or the end of ``--duration`` comes
        first (then :class:`_Stopped`): placing a deployment may take long."""
        work = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.stop_requested.wait())
        try:
            done, _ = await asyncio.wait({work, stop}, timeout=self.remaining(),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if work in done:
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise _Stopped


async def submit(options: SubmitOptions) -> int:
    run = Run(options)
    loop = asyncio.get_running_loop()
    # In the main thread, never a worker thread: a local Ray's GCS server and raylet die with
    # the thread that started them (see cli.run), which a thread pool ends.
    ensure_ray()

    # After ray.init, which installs its own SIGTERM handler.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, run.stop_requested.set)
    log.info("submit_started", **as_arguments(options))
    nodes = await _wait_for_nodes(options.nodes, options.nodes_timeout)
    if nodes is None:
        return 1
    run.started = time.monotonic()
    deployments: list[EndpointDeployment] = []
    tracker = Tracker()
    exit_code = 0
    try:
        planned = [(path, load_endpoint(path)) for path in options.endpoints]
        settings = [await deployment_settings(endpoint, **deployment_overrides(
            endpoint, options.config, max_concurrency=options.max_concurrency,
            receiver_resources=options.receiver_resources)) for _, endpoint in planned]
        for each in settings:  # before anything is created: it could never run
            await asyncio.to_thread(check_placement, each, options.peeker_resources)
        # Every endpoint's tables and subscriptions before any starts: a publisher among
        # them finds its subscribers' subscriptions from its first message on.
        for (path, endpoint), each in zip(planned, settings, strict=True):
            await prepare_endpoint(endpoint, each, install=options.install)
            if options.install:
                _print_installed(path, endpoint, each)
        for (path, endpoint), each in zip(planned, settings, strict=True):
            deployment = await run.before_stop(EndpointDeployment.start(
                endpoint, settings=each, peeker_resources=options.peeker_resources,
                prepared=True))
            deployments.append(deployment)
            print(f"deployed {path} (peeker on node "
                  f"{(await deployment.node_of_peeker())[:12]}, deployment "
                  f"{deployment.config.deployment_id})", flush=True)
        if options.replace:
            for deployment in deployments:
                for old in await replacing.replace_others(deployment):
                    print(f"replacing deployment {old} of {deployment.config.endpoint_name}",
                          flush=True)
        exit_code = await StatusLoop(run, deployments, planned, settings, tracker).run()
    except _Stopped:
        log.info("stopped_before_start", deployed=len(deployments))
    finally:
        for deployment in deployments:
            if not deployment.stopped:
                await _stop(deployment, tracker)
    import ray

    committed = await _committed(deployments)
    extra: dict[str, Any] = {"counted": "peekers"}
    if committed is None:  # the database away at the very end: the peekers' last word
        processed = tracker.processed()
    else:
        processed, failed = committed
        extra = {"counted": "committed", "moved_to_error_queue": failed}
    print_report(tracker, deployments, time.monotonic() - run.started, processed,
                 await asyncio.to_thread(ray.nodes), extra)
    return exit_code


async def _stop(deployment: EndpointDeployment, tracker: Tracker) -> None:
    """Stop gracefully (receivers finish what they hold within ``stop_timeout``); a peeker
    that does not answer by :data:`STOP_GRACE_SECONDS` after that is left to Ray (it ends
    with this driver's job)."""
    timeout = deployment.config.settings.stop_timeout + STOP_GRACE_SECONDS
    try:
        final = await asyncio.wait_for(deployment.stop(), timeout)
    except Exception as exc:  # Ray's errors: the peeker lost at the very end
        log.error("stop_failed", endpoint=deployment.config.endpoint_name,
                  error=(str(exc).strip().splitlines() or [repr(exc)])[-1][:300])
        return
    tracker.record(deployment, final)


async def _committed(
    deployments: list[EndpointDeployment],
) -> tuple[collections.Counter[str], int] | None:
    """What the deployments' receivers committed, per Ray node id, and how many messages they
    moved to the error queue, from the database (exact, whatever happened to receivers and
    peekers); ``None`` when it cannot be read."""
    total: collections.Counter[str] = collections.Counter()
    failed = 0
    if not deployments:
        return total, failed
    try:
        async with PostgresTransport.connect(deployments[0].config.settings.transport) as db:
            for deployment in deployments:
                counts = await read_committed(db.pool, deployment.config.deployment_id,
                                              table=counts_table(deployment.config.address))
                total.update(counts.by_node)
                failed += counts.failed
    except (EndpointRuntimeError, OSError, asyncpg.PostgresError,
            asyncpg.InterfaceError) as exc:
        log.error("committed_counts_unavailable", error=f"{type(exc).__name__}: {exc}"[:300])
        return None
    return total, failed


def _print_installed(path: str, endpoint: Endpoint, settings: EndpointSettings) -> None:
    tables = [str(table) for _, table in EndpointTables.of(endpoint, settings).named()]
    tables += list(endpoint.business_schema.tables)
    print(f"installed {path}: {', '.join(tables)}", flush=True)


class StatusLoop:
    """A status line per deployment every ``--status-interval`` seconds, whatever its peeker
    does, until the run stops; deployments replaced by a newer one stop on the way."""

    def __init__(self, run: Run, deployments: list[EndpointDeployment],
                 planned: list[tuple[str, Endpoint]], settings: list[EndpointSettings],
                 tracker: Tracker) -> None:
        self.submission = run
        self.watches = [StatusWatch(d) for d in deployments]
        self.planned = planned
        self.settings = settings
        self.tracker = tracker
        self.exit_code = 0

    async def run(self) -> int:
        import ray

        run = self.submission
        async with PostgresTransport.connect(self.settings[0].transport) as transport:
            try:
                while not run.stop_requested.is_set() and self.watches:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(run.stop_requested.wait(),
                                               run.options.status_interval)
                    try:
                        fresh = await self._tick(transport)
                    except ray.exceptions.RayActorError:
                        return 1  # logged by the supervisor; the caller stops the others
                    await self._stop_replaced()
                    remaining = run.remaining()
                    if remaining is not None and remaining <= 0:
                        break
                    if run.options.until_empty and fresh and await self._idle(transport):
                        break
            finally:
                for watch in self.watches:
                    await watch.close()
        return self.exit_code

    async def _tick(self, transport: PostgresTransport) -> bool:
        """Log a line per deployment; whether every status is fresh. At once, each figure
        bounded: the lines go out within STATUS_CALL_SECONDS."""
        deployments = [w.deployment for w in self.watches]
        fresh, depths, committed = await asyncio.gather(
            asyncio.gather(*(w.refresh(STATUS_CALL_SECONDS) for w in self.watches)),
            asyncio.gather(*(bounded(transport.depth(d.config.address), STATUS_CALL_SECONDS)
                             for d in deployments)),
            asyncio.gather(*(bounded(read_committed(
                transport.pool, d.config.deployment_id, table=counts_table(d.config.address)),
                STATUS_CALL_SECONDS) for d in deployments)))
        for watch, depth, counts in zip(self.watches, depths, committed, strict=True):
            status = watch.status
            endpoint = watch.deployment.config.endpoint_name
            processed = counts.total if counts is not None else None
            if status is None:
                log.warning("endpoint_status", endpoint=endpoint, depth=depth,
                            processed=processed, peeker=watch.peeker)
                continue
            self.tracker.record(watch.deployment, status)
            if status.halted:
                log.error("endpoint_halted", endpoint=endpoint)
                self.exit_code = 1
                self.submission.stop_requested.set()
            unresponsive = len(watch.notes.unresponsive_receivers)
            line = log.info if watch.peeker == "ok" and not unresponsive else log.warning
            line("endpoint_status", endpoint=endpoint, depth=depth,
                 receivers=len(status.receivers),
                 receivers_by_node=short(status.receivers_by_node),
                 processed=processed if processed is not None else status.processed,
                 restarts=watch.deployment.restarts, peeker=watch.peeker,
                 unresponsive_receivers=unresponsive)
        return all(fresh) and all(w.status is not None and w.status.in_flight == 0
                                  for w in self.watches)

    async def _stop_replaced(self) -> None:
        for watch in list(self.watches):
            by = watch.notes.replaced_by
            if by is None or watch.peeker != "ok":
                continue
            deployment = watch.deployment
            print(f"replaced by deployment {by}: stopping deployment "
                  f"{deployment.config.deployment_id} of {deployment.config.endpoint_name}",
                  flush=True)
            self.watches.remove(watch)
            await watch.close()
            await _stop(deployment, self.tracker)

    async def _idle(self, transport: PostgresTransport) -> bool:
        running = {w.deployment.config.endpoint_name for w in self.watches}
        chosen = [(p, s) for p, s in zip(self.planned, self.settings, strict=True)
                  if p[1].name in running]
        return bool(await bounded(_all_empty(transport, [p for p, _ in chosen],
                                             [s for _, s in chosen]), STATUS_CALL_SECONDS))


async def _all_empty(transport: PostgresTransport, planned: list[tuple[str, Endpoint]],
                     settings: list[EndpointSettings]) -> bool:
    """Whether every endpoint's queue and delayed-message store are empty, in one snapshot:
    a message moving from one to the other (a delayed retry, a due message dispatched) is
    seen in one of them."""
    async with transport.pool.acquire() as connection, connection.transaction(
            isolation="repeatable_read", readonly=True):
        for (_, endpoint), each in zip(planned, settings, strict=True):
            if await queues.depth(connection, endpoint.address):
                return False
            store = endpoint.delayed_store
            if (store is not None and each.delayed_delivery.enabled
                    and await store.next_due_in(connection) is not None):
                log.info("waiting_for_delayed_messages", endpoint=endpoint.name)
                return False
    return True


async def _wait_for_nodes(count: int, timeout: float) -> list[dict[str, Any]] | None:  # noqa: ASYNC109
    import ray

    deadline = time.monotonic() + timeout
    while True:
        alive = [n for n in await asyncio.to_thread(ray.nodes) if n.get("Alive")]
        if len(alive) >= count:
            for node in alive:
                print(f"node {node['NodeID'][:12]} {node['NodeManagerAddress']} "
                      f"resources={_node_resources(node)}", flush=True)
            return alive
        if time.monotonic() >= deadline:
            print(f"submit: only {len(alive)} of {count} nodes alive after {timeout:.0f} s",
                  file=sys.stderr)
            return None
        log.info("waiting_for_nodes", alive=len(alive), wanted=count)
        await asyncio.sleep(2.0)


def _node_resources(node: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in node.get("Resources", {}).items()
            if not k.startswith("node:") and "memory" not in k}


__all__ = ["main", "submit"]
