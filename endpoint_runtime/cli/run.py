"""``endpoint-runtime run``: deploy one or more endpoints (and, with ``--ingest``, the ingestion
endpoint) on one Ray, from one process, until SIGINT/SIGTERM, or until a critical error halts
one of them (``on_critical_error="stop"``: every deployment stops, exit status 2, the critical
error logged last).

Example::

    endpoint-runtime run handlers_examples.sales:endpoint handlers_examples.billing:endpoint \\
        --ingest --max-concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from typing import Any

import asyncpg
import ray
import structlog

from endpoint_runtime.cli.common import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    PROG,
    positive_float,
    positive_int,
)
from endpoint_runtime.cli.status_lines import StatusFigures, StatusLines
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import ConfigurationError, EndpointRuntimeError
from endpoint_runtime.runtime.actors.cluster import ensure_ray
from endpoint_runtime.runtime.deployment import EndpointDeployment
from endpoint_runtime.runtime.endpoint import Endpoint, load_endpoint
from endpoint_runtime.settings import TransportSettings, load_settings

log = structlog.get_logger("endpoint_runtime.cli")

INGESTION_ENDPOINT = "endpoint_runtime.ingestion:endpoint"
"""What ``--ingest`` adds (and ``endpoint-runtime ingest`` runs by default)."""


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    run = commands.add_parser(
        "run", parents=[common], help="run endpoints until SIGINT/SIGTERM",
        description="Deploy the endpoints on one Ray (RAY_ADDRESS, else a local Ray started "
        "by this process and stopped when it exits), log a status line when an endpoint's "
        "figures change, stop gracefully on SIGINT/SIGTERM (a second signal exits at once).",
    )
    run.add_argument("endpoints", nargs="+", metavar="MODULE:ATTR",
                     help="the Endpoints to run, e.g. handlers_examples.sales:endpoint")
    run.add_argument("--ingest", action="store_true",
                     help=f"also run the ingestion endpoint ({INGESTION_ENDPOINT}: audit "
                     "copies into audit_log, the error queue into error_log)")
    add_deployment_options(run)
    run.set_defaults(handler=run_command, log_level="info")


def add_deployment_options(parser: argparse.ArgumentParser) -> None:
    """The options of a command that runs deployments (``run``, ``ingest``)."""
    parser.add_argument("--max-concurrency", type=positive_int, metavar="N",
                        help="most messages in flight for each deployment")
    parser.add_argument("--stop-timeout", type=positive_float, metavar="S",
                        help="grace period of a stop: seconds in-flight handlers may still "
                        "run before they are cancelled and their messages rolled back "
                        "(default: each endpoint's stop_timeout setting, 30)")
    parser.add_argument("--status-interval", type=positive_float, default=5.0, metavar="S",
                        help="seconds between looks at the status; a line is logged when it "
                        "changed (default 5)")


async def run_command(args: argparse.Namespace, settings: TransportSettings) -> int:
    """Deploy the endpoints of ``args`` on one Ray until SIGINT/SIGTERM, logging status
    lines when their figures change."""
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()

    def request_stop(signame: str) -> None:
        if stop_requested.is_set():
            # Signals that arrived before the handlers were removed (`timeout` and terminals
            # signal the process and its group, so one stop can be delivered twice).
            return
        log.info("stop_requested", signal=signame, hint="send it again to exit at once")
        stop_requested.set()
        # A second signal ends the process at once: SIGTERM by its default action, SIGINT
        # with status 130. Not by KeyboardInterrupt: asyncio.run would cancel the tasks and
        # wait for their clean-up, which is the graceful stop again (a clean clone's CI: still
        # running 20 s after the second Ctrl-C, its handler's minute not yet over).
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        signal.signal(signal.SIGINT, _exit_at_once)

    def install_handlers() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, request_stop, sig.name)

    # Installed before the (slow) start so that an early Ctrl-C still stops gracefully.
    install_handlers()
    paths = endpoint_paths(args)
    endpoints = [load_endpoint(path) for path in paths]
    starts_local_ray = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    # In the main thread, never through asyncio.to_thread: Ray ties its local processes (GCS,
    # raylet) to the *thread* that starts them (prctl PR_SET_PDEATHSIG), so when asyncio.run
    # ended the executor's thread they were SIGKILLed, ray.shutdown then waited ~15 s for the
    # dead raylet and Ray's agents were orphaned for minutes. ray.init installs its own
    # SIGTERM handler here; the signals are taken back just after.
    ensure_ray()
    install_handlers()
    # A Ctrl-C during ray.init (which blocks the loop) is only written to the loop's wake-up
    # pipe: let the loop read it (one pass) and run request_stop (the next) before deciding
    # whether to start anything.
    for _ in range(3):
        await asyncio.sleep(0)
    deployments: list[EndpointDeployment] = []
    exit_code = EXIT_OK
    try:
        for path, endpoint in zip(paths, endpoints, strict=True):
            if stop_requested.is_set():
                break
            deployments.append(await EndpointDeployment.start(path, **_overrides(endpoint, args)))
        if stop_requested.is_set():
            log.info("stopped_before_start", endpoints=[e.name for e in endpoints])
        else:
            exit_code = await _report_until_stopped(deployments, args.status_interval,
                                                    stop_requested)
    finally:
        await _stop_all(deployments)
        if starts_local_ray:
            shutdown_local_ray()
    return exit_code


def _exit_at_once(signum: int, frame: object) -> None:
    """The second SIGINT: leave now; in-flight messages roll back as their connections close,
    and a local Ray's processes end with this one (they are tied to its main thread)."""
    os.write(2, f"{PROG}: interrupted\n".encode())
    os._exit(EXIT_INTERRUPTED)


def shutdown_local_ray() -> None:
    """Stop the local Ray this process started, now (atexit would, after a half-second pause
    of Ray's own), and with it every process it started.

    Ray's autoscaler monitor is killed first: ``ray.shutdown`` stops it after the GCS server,
    and on SIGTERM it tries to report its end to that stopped GCS, so Ray waits its full second
    before killing it anyway (1.4 s of shutdown instead of 0.35 s, measured). A local Ray's
    monitor has nothing to scale. Reaching it uses Ray's private node handle; if a Ray release
    moves it, the shutdown is merely slower.
    """
    with contextlib.suppress(Exception):
        from ray._private import ray_constants, worker

        node = worker._global_node
        if node is not None and node.is_head():
            for info in node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []):
                info.process.kill()
                info.process.wait(timeout=5)
    ray.shutdown()


def endpoint_paths(args: argparse.Namespace) -> list[str]:
    """The ``module:attribute`` paths to deploy: the positional ones, then the ingestion
    endpoint with ``--ingest``; each once."""
    paths = list(args.endpoints)
    if getattr(args, "ingest", False):
        paths.append(INGESTION_ENDPOINT)
    repeated = sorted({path for path in paths if paths.count(path) > 1})
    if repeated:
        raise ConfigurationError(f"endpoint named more than once: {', '.join(repeated)}")
    return paths


def _overrides(endpoint: Endpoint, args: argparse.Namespace) -> dict[str, Any]:
    return deployment_overrides(endpoint, args.config, max_concurrency=args.max_concurrency,
                                stop_timeout=args.stop_timeout)


def deployment_overrides(endpoint: Endpoint, config: str | None,
                         **given: Any) -> dict[str, Any]:
    """The setting overrides of one deployment of ``endpoint``: the transport with ``config``
    and the environment applied (:func:`merged_transport`), and each of ``given`` that is not
    ``None`` (an option left out)."""
    return {"transport": merged_transport(endpoint, config),
            **{name: value for name, value in given.items() if value is not None}}


async def _stop_all(deployments: list[EndpointDeployment]) -> None:
    """Stop every deployment at once (each waits for its handlers up to its stop_timeout);
    log their final counts, the critical error of a halted one last."""
    finals = await asyncio.gather(*(d.stop() for d in deployments), return_exceptions=True)
    halted = []
    for deployment, final in zip(deployments, finals, strict=True):
        if isinstance(final, BaseException):
            log.error("endpoint_stop_failed", endpoint=deployment.config.endpoint_name,
                      error=f"{type(final).__name__}: {final}".splitlines()[0][:500])
            continue
        log.info(
            "endpoint_final_status",
            endpoint=final.endpoint,
            processed=final.processed,
            failed=final.failed,
            moved_to_error=final.moved_to_error,
            replaced_receivers=final.replaced_receivers,
        )
        if final.halted:
            halted.append(final)
    for final in halted:
        # The reason the command ends, and the last thing it logs.
        log.critical("critical_error", endpoint=final.endpoint,
                     error=final.critical_error or final.last_critical_error,
                     on_critical_error="stop")


def merged_transport(endpoint: Endpoint, config: str | None) -> TransportSettings:
    """The endpoint's transport settings with the file and the environment of now applied.

    Precedence as in :func:`~endpoint_runtime.settings.load_settings`: what the endpoint's code
    set (:attr:`Endpoint.transport_in_code`), then the environment, then ``config``, then the
    defaults. The environment is read again here: the one the endpoint's module saw when it was
    imported (a process that imported it earlier, under another ``ENDPOINT_RUNTIME_DSN``) is
    not code. ``schema`` always stays the endpoint's own: its queue address (and the schema
    its sends resolve in) is fixed when the Endpoint is created.
    """
    in_code = endpoint.settings.transport
    explicit = {field: getattr(in_code, field) for field in endpoint.transport_in_code}
    explicit["schema"] = in_code.schema
    return load_settings(TransportSettings, path=config, table="transport", **explicit)


async def _report_until_stopped(
    deployments: list[EndpointDeployment],
    interval: float,
    stop_requested: asyncio.Event,
) -> int:
    lines = StatusLines()
    rates: dict[str, tuple[float, int]] = {}
    async with contextlib.AsyncExitStack() as stack:
        transports: dict[str, PostgresTransport] = {}
        for deployment in deployments:  # one connection pool per server, for the depths
            transport_settings = deployment.config.settings.transport
            key = str(transport_settings.dsn)
            if key not in transports:
                transports[key] = await stack.enter_async_context(
                    PostgresTransport.connect(transport_settings))
        while not stop_requested.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_requested.wait(), timeout=interval)
            if stop_requested.is_set():
                break
            for deployment in deployments:
                transport = transports[str(deployment.config.settings.transport.dsn)]
                code = await _report_one(deployment, transport, lines, rates)
                if code is not None:
                    return code
    return EXIT_OK


async def _report_one(
    deployment: EndpointDeployment,
    transport: PostgresTransport,
    lines: StatusLines,
    rates: dict[str, tuple[float, int]],
) -> int | None:
    """Log the deployment's status line if it changed; an exit status when ``run`` must end."""
    try:
        # The supervisor: a peeker lost with its node is recreated on a surviving one.
        status = await deployment.supervised_status()
    except ray.exceptions.RayActorError as exc:
        log.error("peeker_lost", error=str(exc).splitlines()[0])
        return EXIT_FAILED
    if status.halted:
        # on_critical_error="stop": its receivers are gone; the process ends with them.
        log.error("endpoint_halted", endpoint=status.endpoint)
        return EXIT_ERROR
    try:
        depth: int | None = await transport.depth(deployment.config.address)
    except (EndpointRuntimeError, asyncpg.PostgresError, asyncpg.InterfaceError,
            OSError) as exc:
        # InterfaceError: a connection the server closed (an outage) must not end `run`.
        log.warning("depth_unavailable", endpoint=status.endpoint,
                    error=f"{type(exc).__name__}: {exc}")
        depth = None
    now = time.monotonic()
    previous = rates.get(status.endpoint)
    per_second = 0.0
    if previous is not None:
        # Never negative: a retired receiver takes its count with it.
        per_second = max(0.0, (status.processed - previous[1]) / (now - previous[0]))
    rates[status.endpoint] = (now, status.processed)
    figures = StatusFigures(
        endpoint=status.endpoint,
        depth=depth,
        estimate=status.estimate,
        receivers=len(status.receivers),
        in_flight=status.in_flight,
        max_concurrency=status.max_concurrency,
        processed=status.processed,
        failed=status.failed,
    )
    level = lines.level_for(figures, now=now)
    if level is not None:
        getattr(log, level)(
            "endpoint_status",
            **{f: getattr(figures, f) for f in figures.__struct_fields__},
            receivers_by_node={node[:8]: n for node, n in status.receivers_by_node.items()},
            per_second=round(per_second, 1),
        )
    return None
