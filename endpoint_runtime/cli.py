"""The ``endpoint-runtime`` command: run an endpoint, send a message, manage queues.

Example::

    endpoint-runtime run handlers_examples.sales:endpoint --max-concurrency 8
    endpoint-runtime send sales --type handlers_examples.messages:PlaceOrder \\
        --json '{"order_id": "1", "customer": "c", "product": "mouse", "quantity": 1,
                 "unit_price": "19.95"}'
    endpoint-runtime queues list
    endpoint-runtime queues peek sales
    endpoint-runtime db stop

Every command reads :class:`~endpoint_runtime.settings.TransportSettings` from the ``[transport]``
table of ``--config FILE`` (optional) and the ``ENDPOINT_RUNTIME_*`` environment, so
``ENDPOINT_RUNTIME_DSN`` picks the server; without one the embedded PostgreSQL is used. Errors
of the runtime (:class:`~endpoint_runtime.errors.EndpointRuntimeError`) print one line on stderr
and exit with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import structlog

from endpoint_runtime.actors.cluster import ensure_ray
from endpoint_runtime.deployment import EndpointDeployment
from endpoint_runtime.endpoint import load_endpoint
from endpoint_runtime.errors import ConfigurationError, EndpointRuntimeError, QueueNotFoundError
from endpoint_runtime.logging import configure_logging
from endpoint_runtime.sender import Sender
from endpoint_runtime.settings import TransportSettings, load_settings
from endpoint_runtime.transport import PostgresTransport, QueueAddress
from endpoint_runtime.transport import queues as queue_tables

log = structlog.get_logger("endpoint_runtime.cli")

PROG = "endpoint-runtime"
SENDER_NAME = "endpoint-runtime-cli"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

Command = Callable[[argparse.Namespace, TransportSettings], Coroutine[Any, Any, int]]


# -- run --------------------------------------------------------------------------------------


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
    overrides: dict[str, Any] = {"transport": _merged_transport(endpoint.settings.transport, args)}
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
    return exit_code


def _merged_transport(in_code: TransportSettings, args: argparse.Namespace) -> TransportSettings:
    """The endpoint's transport settings with the file and the environment applied.

    Precedence as in :func:`~endpoint_runtime.settings.load_settings`: what the endpoint's code
    set explicitly (fields that differ from the defaults), then the environment, then
    ``--config``, then the defaults. ``schema`` always stays the endpoint's own: its queue
    address (and the schema its sends resolve in) is fixed when the Endpoint is created.
    """
    defaults = TransportSettings()
    explicit = {
        field: getattr(in_code, field)
        for field in TransportSettings.__struct_fields__
        if getattr(in_code, field) != getattr(defaults, field)
    }
    explicit["schema"] = in_code.schema
    return load_settings(TransportSettings, path=args.config, table="transport", **explicit)


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
            status = await deployment.status()
        except ray.exceptions.RayActorError as exc:
            log.error("peeker_lost", error=str(exc).splitlines()[0])
            return EXIT_FAILED
        try:
            depth: int | None = await transport.depth(address)
        except (EndpointRuntimeError, asyncpg.PostgresError, OSError) as exc:
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
            in_flight=status.in_flight,
            max_concurrency=status.max_concurrency,
            processed=status.processed,
            failed=sum(r.failed for r in status.receivers),
            per_second=round(per_second, 1),
        )
    return EXIT_OK


# -- send -------------------------------------------------------------------------------------


async def send_command(args: argparse.Namespace, settings: TransportSettings) -> int:
    message_type = import_message_type(args.type)
    message = decode_message(message_type, args.json)
    headers = parse_headers(args.header)
    async with Sender(SENDER_NAME, settings) as sender:
        for _ in range(args.count):
            message_id = await sender.send(message, args.queue, headers=headers or None)
            print(message_id, flush=True)
    return EXIT_OK


def import_message_type(spec: str) -> type[msgspec.Struct]:
    """``package.module:StructName`` (or ``package.module.StructName``) -> the class."""
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        module_name, _, attribute = spec.rpartition(".")
    if not module_name or not attribute:
        raise ConfigurationError(f"--type {spec!r} must look like 'package.module:StructName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"--type {spec!r}: cannot import {module_name!r}: {exc}") from exc
    found: Any = module
    for part in attribute.split("."):  # nested classes: module:Outer.Inner
        found = getattr(found, part, None)
        if found is None:
            raise ConfigurationError(f"--type {spec!r}: {module_name} has no {attribute!r}")
    if not (isinstance(found, type) and issubclass(found, msgspec.Struct)):
        raise ConfigurationError(f"--type {spec!r} is not a msgspec.Struct subclass")
    return found


def decode_message(message_type: type[msgspec.Struct], text: str) -> msgspec.Struct:
    """Decode ``--json`` (``-`` reads standard input) into ``message_type``."""
    if text == "-":
        text = sys.stdin.read()
    try:
        message: msgspec.Struct = msgspec.json.decode(text.encode(), type=message_type)
    except msgspec.ValidationError as exc:
        raise ConfigurationError(
            f"--json does not fit {message_type.__module__}.{message_type.__qualname__}: {exc}"
        ) from exc
    except msgspec.DecodeError as exc:
        raise ConfigurationError(f"--json is not valid JSON: {exc}") from exc
    return message


def parse_headers(pairs: list[str]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--header {pair!r} must look like NAME=VALUE")
        headers[key.strip()] = value
    return headers


# -- queues -----------------------------------------------------------------------------------


async def queues_list(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        found = await transport.list_queues(args.schema)
    if not found:
        where = f"schema {args.schema}" if args.schema else "any schema"
        print(f"no queues in {where}")
        return EXIT_OK
    names = [str(q.address) for q in found]
    width = max(len("queue"), *(len(n) for n in names))
    print(f"{'queue':<{width}}  {'depth':>10}")
    for name, queue in zip(names, found, strict=True):
        print(f"{name:<{width}}  {queue.depth:>10}")
    return EXIT_OK


async def queues_create(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        for name in args.names:
            address = await transport.create_queue(name)
            print(f"queue {address} is ready")
    return EXIT_OK


async def queues_purge(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        address = await _existing(transport, args.name)
        if args.expired_only:
            deleted = await transport.purge_expired(address)
            print(f"purged {deleted} expired message(s) from {address}")
        else:
            deleted = await transport.purge(address)
            print(f"purged {deleted} message(s) from {address}")
    return EXIT_OK


async def queues_peek(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        address = await _existing(transport, args.name)
        estimate = await transport.peek(address)
        depth = await transport.depth(address)
    print(f"queue {address}: estimate {estimate} (unlocked, max-min seq), depth {depth} (rows)")
    return EXIT_OK


async def _existing(transport: PostgresTransport, name: str) -> QueueAddress:
    address = transport.address(name)
    if not await queue_tables.queue_exists(transport.pool, address):
        raise QueueNotFoundError(str(address))
    return address


# -- db ---------------------------------------------------------------------------------------


async def db_stop(args: argparse.Namespace, settings: TransportSettings) -> int:
    from endpoint_runtime.embedded import data_dir, stop_embedded

    directory = data_dir()
    try:
        stopped = await asyncio.to_thread(stop_embedded)
    except Exception as exc:  # pg_ctl failures come as CalledProcessError and friends
        raise EndpointRuntimeError(
            f"could not stop the embedded PostgreSQL in {directory / 'pgdata'}: {exc}"
        ) from exc
    if stopped:
        print(f"stopped the embedded PostgreSQL in {directory / 'pgdata'}")
    else:
        print(f"no embedded PostgreSQL is running in {directory / 'pgdata'}")
    if settings.dsn or os.environ.get("ENDPOINT_RUNTIME_DSN"):
        print("note: a DSN is configured; that server is not managed by this command")
    return EXIT_OK


# -- arguments --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run message endpoints on PostgreSQL queue tables and Ray, send messages "
        "and manage queues.",
        epilog="Settings: [transport] table of --config, ENDPOINT_RUNTIME_* variables "
        "(ENDPOINT_RUNTIME_DSN picks the server; without one an embedded PostgreSQL starts).",
    )
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="TOML settings file (its [transport] table is read)")
    # Also accepted after the subcommand; SUPPRESS keeps an earlier value from being reset.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="TOML settings file (its [transport] table is read)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run", parents=[common], help="run an endpoint until SIGINT/SIGTERM",
        description="Deploy the endpoint on Ray (RAY_ADDRESS, else a local Ray), log its "
        "status periodically, stop gracefully on SIGINT/SIGTERM (a second signal exits at once).",
    )
    run.add_argument("endpoint", metavar="MODULE:ATTR",
                     help="the Endpoint to run, e.g. handlers_examples.sales:endpoint")
    run.add_argument("--max-concurrency", type=_positive_int, metavar="N",
                     help="most messages in flight for this deployment")
    run.add_argument("--status-interval", type=_positive_float, default=5.0, metavar="S",
                     help="seconds between status lines (default 5)")
    run.set_defaults(handler=run_command, log_level="info")

    send = commands.add_parser(
        "send", parents=[common], help="send a message to a queue",
        description="Decode --json into the msgspec Struct named by --type and send it.",
    )
    send.add_argument("queue", metavar="QUEUE", help="destination queue ([schema.]name)")
    send.add_argument("--type", required=True, metavar="MODULE:STRUCT",
                      help="message type, e.g. handlers_examples.messages:PlaceOrder")
    send.add_argument("--json", required=True, metavar="JSON",
                      help="the message as a JSON object ('-' reads standard input)")
    send.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                      help="extra header (repeatable)")
    send.add_argument("--count", type=_positive_int, default=1, metavar="N",
                      help="send N copies, each with its own message id (default 1)")
    send.set_defaults(handler=send_command)

    queues = commands.add_parser("queues", parents=[common], help="list, create, purge, peek")
    queue_commands = queues.add_subparsers(dest="queues_command", required=True,
                                           metavar="COMMAND")
    listing = queue_commands.add_parser("list", parents=[common],
                                        help="queue tables and their depth")
    listing.add_argument("--schema", default=None, help="only this schema (default: all)")
    listing.set_defaults(handler=queues_list)
    create = queue_commands.add_parser("create", parents=[common],
                                       help="create queues (idempotent)")
    create.add_argument("names", nargs="+", metavar="NAME", help="[schema.]name")
    create.set_defaults(handler=queues_create)
    purge = queue_commands.add_parser("purge", parents=[common],
                                      help="delete the messages of a queue")
    purge.add_argument("name", metavar="NAME")
    purge.add_argument("--expired-only", action="store_true",
                       help="delete only messages whose time to be received has passed")
    purge.set_defaults(handler=queues_purge)
    peek = queue_commands.add_parser("peek", parents=[common],
                                     help="the peek estimate and the exact depth")
    peek.add_argument("name", metavar="NAME")
    peek.set_defaults(handler=queues_peek)

    db = commands.add_parser("db", parents=[common], help="the embedded PostgreSQL")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    stop = db_commands.add_parser(
        "stop", parents=[common], help="stop the embedded server (it outlives each run)"
    )
    stop.set_defaults(handler=db_stop)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive (got {value})")
    return value


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``endpoint-runtime`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    # Logs go to stderr; commands other than `run` show warnings only unless asked otherwise,
    # so that their standard output (message ids, queue lists) stays clean.
    configure_logging(
        os.environ.get("ENDPOINT_RUNTIME_LOG_LEVEL", getattr(args, "log_level", "warning"))
    )
    # Like `python -m`: modules of the current directory can be named (endpoints, types).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    command: Command = args.handler
    try:
        settings = load_settings(
            TransportSettings, path=Path(args.config) if args.config else None, table="transport"
        )
        return asyncio.run(command(args, settings))
    except EndpointRuntimeError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except asyncpg.PostgresError as exc:
        print(f"{PROG}: error: PostgreSQL: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
