"""``endpoint-runtime status [--watch]``: every endpoint of the deployment at a glance.

For each endpoint (a queue table of the transport's schema other than the audit and error
queues, a processing endpoint of recent audit copies, or a queue that messages in the error
queue failed in): its queue length, messages per second and critical time p50/p95 over the
last ``--window`` seconds (from ``audit_log``: endpoints need ``audit_queue`` set and
``endpoint-runtime ingest`` running), and how many of its messages wait in the error queue.
Error-queue rows whose failed queue does not name a queue (hostile or corrupt headers) are
counted on one line, ``(unparsable failed queue)``. ``--watch`` refreshes in place.

Example::

    endpoint-runtime status
    endpoint-runtime status --watch --interval 2
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import asyncpg
import msgspec

from endpoint_runtime.chain.subscriptions import dangling_subscriptions, subscription_store
from endpoint_runtime.cli.common import EXIT_OK, positive_float, printable
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.ingestion.storage import OperationalData
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress

AUDIT_QUEUE = "audit"
ERROR_QUEUE = "error"
UNPARSABLE = "(unparsable failed queue)"
"""The line of error-queue rows whose failed-queue header names no queue."""
CLEAR_SCREEN = "\x1b[H\x1b[2J"


class EndpointStatus(msgspec.Struct, kw_only=True):
    endpoint: str
    queue_length: int | None = None
    per_second: float | None = None
    critical_p50_ms: float | None = None
    critical_p95_ms: float | None = None
    failed: int = 0


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    status = commands.add_parser(
        "status", parents=[common], help="queue length, rate, critical time, errors",
        description="Every endpoint of the transport's schema: queue length, messages per "
        "second and critical time p50/p95 over --window from audit_log, messages in the error "
        "queue.",
    )
    status.add_argument("--watch", action="store_true", help="refresh until interrupted")
    status.add_argument("--interval", type=positive_float, default=2.0, metavar="S",
                        help="seconds between refreshes with --watch (default 2)")
    status.add_argument("--window", type=positive_float, default=300.0, metavar="S",
                        help="seconds of audit data for the rate and the percentiles "
                        "(default 300)")
    status.add_argument("--error-queue", default=ERROR_QUEUE, metavar="QUEUE")
    status.set_defaults(handler=status_command)


async def collect(transport: PostgresTransport, window: float,
                  error_queue: str = ERROR_QUEUE) -> list[EndpointStatus]:
    """One snapshot, by endpoint (queue address), sorted by name."""
    schema = transport.settings.schema
    data = OperationalData(schema)
    found: dict[str, EndpointStatus] = {}

    def entry(name: str) -> EndpointStatus:
        try:
            key = str(QueueAddress.parse(name, schema))
        except ValueError:  # header text from outside: shown, never fatal
            key = UNPARSABLE
        return found.setdefault(key, EndpointStatus(endpoint=key))

    special = {str(transport.address(AUDIT_QUEUE)), str(transport.address(error_queue))}
    for queue in await transport.list_queues(schema):
        if str(queue.address) not in special:
            entry(str(queue.address)).queue_length = queue.depth
    try:
        activity = await transport.pool.fetch(data.sql["endpoint_activity"], window)
    except asyncpg.UndefinedTableError:
        activity = []  # no ingestion yet
    for row in activity:
        status = entry(row["endpoint"])
        status.per_second = float(row["per_second"])
        status.critical_p50_ms = row["critical_p50_ms"]
        status.critical_p95_ms = row["critical_p95_ms"]
    failed_sql = data.sql["failed_by_queue"].replace(
        "{error_queue}", transport.address(error_queue).qualified)
    try:
        failed = await transport.pool.fetch(failed_sql)
    except asyncpg.UndefinedTableError:
        failed = []
    for row in failed:
        entry(row["queue"] or "").failed += row["failed"]
    return sorted(found.values(), key=lambda s: s.endpoint)


def render(statuses: list[EndpointStatus]) -> str:
    if not statuses:
        return "no endpoints found (no queue tables, audit rows or failed messages)\n"
    names = [printable(s.endpoint, keep="") for s in statuses]
    width = max(len("endpoint"), *(len(n) for n in names))

    def number(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [f"{'endpoint':<{width}}  {'queue':>8}  {'msg/s':>8}  {'p50 ms':>9}  {'p95 ms':>9}"
             f"  {'errors':>7}"]
    for name, s in zip(names, statuses, strict=True):
        queue = "-" if s.queue_length is None else str(s.queue_length)
        lines.append(f"{name:<{width}}  {queue:>8}  {number(s.per_second, 1):>8}  "
                     f"{number(s.critical_p50_ms, 1):>9}  {number(s.critical_p95_ms, 1):>9}  "
                     f"{s.failed:>7}")
    return "\n".join(lines) + "\n"


async def status_command(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        while True:
            statuses = await collect(transport, args.window, args.error_queue)
            text = render(statuses)
            text += await ingestion_hint(transport, statuses, args.window)
            text += await subscriptions_pointing_nowhere(transport)
            if args.watch and sys.stdout.isatty():
                text = CLEAR_SCREEN + text
            print(text, end="", flush=True)
            if not args.watch:
                return EXIT_OK
            await asyncio.sleep(args.interval)
            if not sys.stdout.isatty():
                print()


async def subscriptions_pointing_nowhere(transport: PostgresTransport) -> str:
    """Lines for the subscriptions whose queue table does not exist (or whose address does
    not parse): their events wait in the error queue (``subscriptions prune`` removes them).
    Empty when there are none."""
    settings = transport.settings
    try:
        found = await dangling_subscriptions(transport.pool, subscription_store(settings),
                                             settings.schema)
    except asyncpg.InsufficientPrivilegeError:
        return "\nsubscriptions: this role may not read the subscription table\n"
    if not found:
        return ""
    lines = [f"\nsubscriptions that point nowhere ({len(found)}; "
             "endpoint-runtime subscriptions prune removes them):"]
    for dangling in found:
        subscription = dangling.subscription
        lines.append(f"  {printable(subscription.endpoint, keep='')} -> "
                     f"{printable(subscription.queue_address, keep='')} "
                     f"({printable(subscription.topic, keep='')})")
    return "\n".join(lines) + "\n"


INGEST_HINT = (
    "msg/s and latencies come from audit copies that `endpoint-runtime ingest` (or `run "
    "--ingest`) has stored; endpoints audit with Endpoint(..., audit_queue=\"audit\")"
)


async def ingestion_hint(
    transport: PostgresTransport, statuses: list[EndpointStatus], window: float
) -> str:
    """A line saying why msg/s and the latencies show dashes: nothing is ingested yet, or
    nothing in the window. Empty when some endpoint has figures."""
    if any(status.per_second is not None for status in statuses):
        return ""
    audit_log = OperationalData(transport.settings.schema).table("audit_log").qualified
    if not await transport.pool.fetchval("SELECT to_regclass($1) IS NOT NULL", audit_log):
        return f"\nno audit data ingested yet: {INGEST_HINT}\n"
    return f"\nno audit data ingested in the last {window:g} s: {INGEST_HINT}\n"
