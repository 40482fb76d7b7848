"""``endpoint-runtime run``: deploy one endpoint on Ray until SIGINT/SIGTERM, or until a
critical error halts it (``on_critical_error="stop"``: exit status 2, the critical error
logged last).

Example::

    endpoint-runtime run handlers_examples.sales:endpoint --max-concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from typing import Any

import asyncpg
import structlog

from endpoint_runtime.actors.cluster import ensure_ray
from endpoint_runtime.cli.common import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_OK,
    positive_float,
    positive_int,
)
from endpoint_runtime.connecting import PostgresTransport
from endpoint_runtime.deployment import EndpointDeployment
from endpoint_runtime.endpoint import Endpoint, load_endpoint
from endpoint_runtime.errors import EndpointRuntimeError
from endpoint_runtime.settings import TransportSettings, load_settings
from endpoint_runtime.transport import QueueAddress

log = structlog.get_logger("endpoint_runtime.cli")


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    run = commands.add_parser(
        "run", parents=[common], help="run an endpoint until SIGINT/SIGTERM",
        description="Deploy the endpoint on Ray (RAY_ADDRESS, else a local Ray), log its "
        "status periodically, stop gracefully on SIGINT/SIGTERM (a second signal exits at once).",
    )
    run.add_argument("endpoint", metavar="MODULE:ATTR",
                     help="the Endpoint to run, e.g. handlers_examples.sales:endpoint")
    add_deployment_options(run)
    run.set_defaults(handler=run_command, log_level="info")


def add_deployment_options(parser: argparse.ArgumentParser) -> None:
    """The options of a command that runs a deployment (``run``, ``ingest``)."""
    parser.add_argument("--max-concurrency", type=positive_int, metavar="N",
                        help="most messages in flight for this deployment")
    parser.add_argument("--status-interval", type=positive_float, default=5.0, metavar="S",
                        help="seconds between status lines (default 5)")


async def run_command(args: argparse.Namespace, settings: TransportSettings) -> int:
    """Deploy one endpoint on Ray until SIGINT/SIGTERM, logging its status periodically."""
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()

    def request_stop(signame: str) -> None:
        if stop_requested.is_set():
            # Signals that arrived before the handlers were removed (`timeout` and terminals
            # signal the process and its group, so one stop can be delivered twice).
            return
        log.info("stop_requested", signal=signame, hint="send it again to exit at once")
        stop_requested.set()
        # A second signal gets the default behaviour (KeyboardInterrupt / termination).
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    def install_handlers() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, request_stop, sig.name)

    # Installed before the (slow) start so that an early Ctrl-C still stops gracefully.
    install_handlers()
    endpoint = load_endpoint(args.endpoint)
    overrides: dict[str, Any] = {"transport": merged_transport(endpoint, args.config)}
    if args.max_concurrency is not None:
        overrides["max_concurrency"] = args.max_concurrency
    # ray.init installs Ray's own SIGTERM handler (it aborts the process); initialise Ray
    # first, then take the signals back.
    await asyncio.to_thread(ensure_ray)
    if stop_requested.is_set():
        log.info("stopped_before_start", endpoint=endpoint.name)
        return EXIT_OK
    install_handlers()
    deployment = await EndpointDeployment.start(args.endpoint, **overrides)
    address = deployment.config.address
    exit_code = EXIT_OK
    try:
        async with PostgresTransport.connect(deployment.config.settings.transport) as transport:
            exit_code = await _report_until_stopped(
                deployment, transport, address, args.status_interval, stop_requested
            )
    finally:
        final = await deployment.stop()
        log.info(
            "endpoint_final_status",
            endpoint=final.endpoint,
            processed=final.processed,
            failed=sum(r.failed for r in final.receivers),
            moved_to_error=sum(r.moved_to_error for r in final.receivers),
            replaced_receivers=final.replaced_receivers,
        )
        if final.halted:
            # The reason the command ends, and the last thing it logs.
            log.critical("critical_error", endpoint=final.endpoint,
                         error=final.critical_error or final.last_critical_error,
                         on_critical_error="stop")
    return exit_code


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
    deployment: EndpointDeployment,
    transport: PostgresTransport,
    address: QueueAddress,
    interval: float,
    stop_requested: asyncio.Event,
) -> int:
    import ray  # the deployment has initialised Ray by now

    previous: tuple[float, int] | None = None
    while not stop_requested.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_requested.wait(), timeout=interval)
        if stop_requested.is_set():
            break
        try:
            # The supervisor: a peeker lost with its node is recreated on a surviving one.
            status = await deployment.supervised_status()
        except ray.exceptions.RayActorError as exc:
            log.error("peeker_lost", error=str(exc).splitlines()[0])
            return EXIT_FAILED
        if status.halted:
            # on_critical_error="stop": the receivers are gone; the process ends with them.
            log.error("endpoint_halted", endpoint=status.endpoint)
            return EXIT_ERROR
        try:
            depth: int | None = await transport.depth(address)
        except (EndpointRuntimeError, asyncpg.PostgresError, asyncpg.InterfaceError,
                OSError) as exc:
            # InterfaceError: a connection the server closed (an outage) must not end `run`.
            log.warning("depth_unavailable", error=f"{type(exc).__name__}: {exc}")
            depth = None
        now = time.monotonic()
        per_second = 0.0
        if previous is not None:
            # Never negative: a retired receiver takes its count with it.
            per_second = max(0.0, (status.processed - previous[1]) / (now - previous[0]))
        previous = (now, status.processed)
        log.info(
            "endpoint_status",
            endpoint=status.endpoint,
            depth=depth,
            estimate=status.estimate,
            receivers=len(status.receivers),
            receivers_by_node={node[:8]: n for node, n in status.receivers_by_node.items()},
            in_flight=status.in_flight,
            max_concurrency=status.max_concurrency,
            processed=status.processed,
            failed=sum(r.failed for r in status.receivers),
            per_second=round(per_second, 1),
        )
    return EXIT_OK
