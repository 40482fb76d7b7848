"""Main job: run the example order flow end to end and print what happened.

    python -m handlers_examples [--orders 50] [--timeout 120] [--invalid-orders 1]
                                [--redeliveries 3]

Starts the six example endpoints on Ray (sales, billing, shipping, loyalty, notifications,
analytics; each creates its business tables at start, from its ``schema_sql``), sends
PlaceOrder messages to sales (plus invalid ones that must end in the error queue), waits
until every valid order is shipped and has its loyalty points, whose deferred expiry reminder
was handled too, and its OrderPlaced event reached both subscribers, prints a summary and
stops the endpoints gracefully.
Once loyalty has handled every AwardPoints, the client sends a few of them again with their
original message ids, as a redelivery would: loyalty's outbox must keep them from its handler
(the summary checks loyalty's and notifications' final counts for that).

Exit status: 0 when the flow completed, 1 when it did not within the timeout, 2 on a
configuration or database error, 130 when SIGINT/SIGTERM cut the wait short (the endpoints are
still stopped gracefully and the summary printed).

Re-runnable: each run uses fresh order ids (``<run id>-00001``...) and counts only its own rows
and replies; the error queue is reported as "added by this run".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import sys
import time
import uuid
from decimal import Decimal

import asyncpg
import msgspec

from endpoint_runtime import (
    EndpointDeployment,
    EndpointRuntimeError,
    PostgresTransport,
    Sender,
    TransportSettings,
    load_settings,
)
from endpoint_runtime.cli.console import DEFAULT_PORT as CONSOLE_PORT
from endpoint_runtime.logging import configure_logging
from endpoint_runtime.runtime.actors.peeker import DeploymentStatus
from endpoint_runtime.wire.messages import TransportMessage
from handlers_examples import fulfilment
from handlers_examples.loyalty import REMINDER_DELAY
from handlers_examples.messages import (
    AwardPoints,
    OrderReceived,
    PlaceOrder,
    award_points_message_id,
)
from handlers_examples.schema import count_rows
from handlers_examples.tenancy import TENANT_HEADER

TENANT = "acme"
"""The tenant the client stamps on its orders; sales' replies must carry it back."""

ENDPOINTS = {
    "sales": "handlers_examples.sales:endpoint",
    "billing": "handlers_examples.billing:endpoint",
    "shipping": "handlers_examples.shipping:endpoint",
    "loyalty": "handlers_examples.loyalty:endpoint",
    "notifications": "handlers_examples.notifications:endpoint",
    "analytics": "handlers_examples.analytics:endpoint",
    # Built in: audit copies of every example endpoint into audit_log, the error queue into
    # error_log (read by `endpoint-runtime status` and `endpoint-runtime report`).
    "ingestion": "endpoint_runtime.ingestion:endpoint",
}
CLIENT_QUEUE = "examples_client"
"""The sending client's own queue: sales replies OrderReceived there."""
ERROR_QUEUE = "error"
PRODUCTS = (("keyboard", "49.90"), ("mouse", "19.95"), ("monitor", "229.00"),
            ("headset", "79.50"), ("webcam", "64.99"))
SEND_CONCURRENCY = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m handlers_examples",
        description="Run the example endpoints (sales -> billing -> shipping -> notifications, "
        "sales -> loyalty -> notifications, sales' OrderPlaced to billing and analytics) end to "
        "end on PostgreSQL and Ray.",
    )
    parser.add_argument("--orders", type=int, default=50, help="valid orders to place (50)")
    parser.add_argument("--invalid-orders", type=int, default=1,
                        help="invalid orders to place; each must end in the error queue (1)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the flow to complete (120)")
    parser.add_argument("--redeliveries", type=int, default=3,
                        help="AwardPoints copies sent again, with their original message ids, "
                        "once loyalty has handled them; its outbox must ignore them (3)")
    parser.add_argument("--console", action="store_true",
                        help="then serve the operator's console over the examples' database "
                        "(Ctrl-C stops it)")
    args = parser.parse_args(argv)
    if args.orders < 1 or args.invalid_orders < 0 or args.timeout <= 0:
        parser.error("--orders must be at least 1, --invalid-orders at least 0, --timeout > 0")
    if not 0 <= args.redeliveries <= args.orders:
        parser.error("--redeliveries must be between 0 and --orders")
    return args


def make_orders(run_id: str, count: int) -> list[PlaceOrder]:
    orders = []
    for i in range(1, count + 1):
        product, price = PRODUCTS[i % len(PRODUCTS)]
        orders.append(PlaceOrder(
            order_id=f"{run_id}-{i:05d}", customer=f"customer-{i % 7 + 1}",
            product=product, quantity=i % 3 + 1, unit_price=Decimal(price),
        ))
    return orders


def make_invalid_orders(run_id: str, count: int) -> list[PlaceOrder]:
    return [
        PlaceOrder(order_id=f"{run_id}-invalid-{i}", customer="customer-0", product="keyboard",
                   quantity=0, unit_price=Decimal("49.90"))
        for i in range(1, count + 1)
    ]


class Progress(msgspec.Struct):
    orders: int = 0
    invoices: int = 0
    shipments: int = 0
    points: int = 0
    """Rows of loyalty_points."""
    reminded: int = 0
    """Of those, rows whose deferred PointsExpiryReminder was handled."""
    billing_events: int = 0
    analytics_events: int = 0
    """OrderPlaced events handled by each subscriber."""
    replies: int = 0
    tenant_replies: int = 0
    """Replies that carried the client's tenant header back (copied by sales' step)."""
    redelivered: int = 0
    """AwardPoints copies the client sent again."""
    errors_added: int = 0
    notifications_waiting: int = 0
    loyalty_waiting: int = 0
    fulfilment: dict[str, int] = msgspec.field(default_factory=dict)
    """The fulfilment saga's outcomes of this run's orders (shipped, cancelled, live)."""


class Client:
    """The sending side: places orders and receives sales' replies from its own queue."""

    def __init__(self, transport: PostgresTransport, order_ids: list[str]) -> None:
        self.transport = transport
        self.order_ids = set(order_ids)
        self.replied: set[str] = set()
        self.with_tenant: set[str] = set()
        self.redelivered = 0

    async def redeliver_awards(self, sender: Sender, orders: list[PlaceOrder]) -> None:
        """Send AwardPoints for ``orders`` again with the message ids sales gave them: to
        loyalty this is a redelivery of messages it has already handled."""
        for order in orders:
            await sender.send(
                AwardPoints(order_id=order.order_id, customer=order.customer,
                            amount=order.amount),
                message_id=award_points_message_id(order.order_id),
            )
            self.redelivered += 1

    async def receive_replies(self) -> int:
        """Take every reply waiting in the client queue; count those of this run's orders
        (a reply to an order of an earlier, interrupted run is read and dropped)."""
        while (received := await self.transport.receive(CLIENT_QUEUE)) is not None:
            if not isinstance(received, TransportMessage):
                continue  # headers that do not parse: not a reply of ours
            with contextlib.suppress(msgspec.DecodeError):
                reply = msgspec.json.decode(received.body, type=OrderReceived)
                if reply.order_id in self.order_ids:
                    self.replied.add(reply.order_id)
                    if received.headers.get(TENANT_HEADER) == TENANT:
                        self.with_tenant.add(reply.order_id)
        return len(self.replied)


async def observe(client: Client, errors_before: int) -> Progress:
    transport = client.transport
    rows = await count_rows(transport.pool, list(client.order_ids))
    return Progress(
        orders=rows["orders"], invoices=rows["invoices"], shipments=rows["shipments"],
        points=rows["loyalty_points"], reminded=rows["reminded"],
        billing_events=rows["billing_events"], analytics_events=rows["analytics_events"],
        replies=await client.receive_replies(), tenant_replies=len(client.with_tenant),
        redelivered=client.redelivered,
        errors_added=await transport.depth(ERROR_QUEUE) - errors_before,
        notifications_waiting=await transport.depth("notifications"),
        loyalty_waiting=await transport.depth("loyalty"),
        fulfilment=await fulfilment.outcomes(transport.pool, list(client.order_ids)),
    )


async def run(args: argparse.Namespace) -> int:
    configure_logging()
    settings = load_settings(TransportSettings)
    print("== endpoint_runtime examples: sales -> billing -> shipping -> notifications, "
          "sales -> loyalty -> notifications", flush=True)
    async with PostgresTransport.connect(settings) as transport:
        # Resolved once (embedded server started if needed); the sender reuses it.
        settings = msgspec.structs.replace(settings, dsn=transport.dsn)
        client_queue = await transport.create_queue(CLIENT_QUEUE)
        await transport.purge(client_queue)

        deployments: dict[str, EndpointDeployment] = {}
        finals: dict[str, DeploymentStatus] = {}
        # The client routes its commands by type too (docs/routing.md): sends name no queue.
        sender = Sender("examples-client", settings, local_address=client_queue,
                        routes={PlaceOrder: "sales", AwardPoints: "loyalty",
                                fulfilment.FulfilOrder: "sales",
                                fulfilment.PaymentReceived: "sales"})
        sender.on_outgoing(lambda headers: headers.setdefault(TENANT_HEADER, TENANT))
        try:
            startup = time.monotonic()
            await start_all(deployments)
            # From here on SIGINT/SIGTERM end the wait early: the endpoints are still stopped
            # gracefully and the summary printed. (Installed after start: Ray puts its own
            # SIGTERM handler in place when it starts.)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            startup = time.monotonic() - startup
            print(f"started {len(deployments)} endpoints in {startup:.1f} s", flush=True)
            print(routes_line(), flush=True)

            errors_before = await transport.depth(ERROR_QUEUE)
            run_started = time.time()
            run_id = uuid.uuid4().hex[:8]
            orders = make_orders(run_id, args.orders)
            invalid = make_invalid_orders(run_id, args.invalid_orders)
            order_ids = [o.order_id for o in orders]

            began = time.monotonic()
            await send_all(sender, [*orders, *invalid])
            await fulfilment.send_orders(sender, order_ids)
            sent_in = time.monotonic() - began
            print(f"run {run_id}: sent {len(orders)} orders and {len(invalid)} invalid "
                  f"order(s) to sales in {sent_in:.2f} s", flush=True)

            client = Client(transport, order_ids)
            progress, shipped_after = await wait_for_flow(
                client, sender, orders[:args.redeliveries], deployments, errors_before, args,
                stop,
            )
            elapsed = time.monotonic() - began
            complete = flow_complete(progress, args)
            audit = await audit_summary(transport, run_started)
        finally:
            await sender.close()
            stopped = await asyncio.gather(
                *(d.stop() for d in deployments.values()), return_exceptions=True
            )
            for name, result in zip(deployments, stopped, strict=True):
                if isinstance(result, DeploymentStatus):
                    finals[name] = result
                else:
                    print(f"stopping {name} failed: {result!r}", file=sys.stderr)
        errors_total = await transport.depth(ERROR_QUEUE)

    print_summary(args, progress, finals, elapsed, shipped_after, errors_total, complete,
                  stop.is_set())
    print_audit(audit)
    print_console_hint(args)
    if stop.is_set():
        return 130
    if args.console:
        await serve_console()
    return 0 if complete else 1


def print_console_hint(args: argparse.Namespace) -> None:
    data_dir = os.environ.get("ENDPOINT_RUNTIME_DATA_DIR", "")
    command = (f"ENDPOINT_RUNTIME_DATA_DIR={shlex.quote(data_dir)} " if data_dir else "")
    print()
    print("the operator's console over this database (failed messages, endpoints, flow):")
    print(f"  {command}endpoint-runtime console")
    print(f"  then open http://127.0.0.1:{CONSOLE_PORT}/?token=<the token it prints>"
          + ("" if args.console else "  (or: bin/dev examples --console)"))


async def serve_console() -> None:
    from endpoint_runtime.cli.console import console_command

    print("starting the console (Ctrl-C stops it)", flush=True)
    parser_args = argparse.Namespace(host="127.0.0.1", port=CONSOLE_PORT, token=None,
                                     error_queue=ERROR_QUEUE, read_only=False,
                                     report=None)
    await console_command(parser_args, load_settings(TransportSettings))


AUDIT_SETTLE_SECONDS = 10.0
AUDIT_POLL_SECONDS = 0.1


async def audit_summary(transport: PostgresTransport, since: float) -> list[asyncpg.Record]:
    """Per processing endpoint, the audit rows of messages sent since ``since`` (epoch s), once
    the ingestion has taken what waits in the audit queue (up to AUDIT_SETTLE_SECONDS)."""
    for _ in range(int(AUDIT_SETTLE_SECONDS / AUDIT_POLL_SECONDS)):
        # A copy leaves the queue in the transaction that writes its row: depth 0, all rows.
        if not await transport.depth("audit"):
            break
        await asyncio.sleep(AUDIT_POLL_SECONDS)
    rows: list[asyncpg.Record] = await transport.pool.fetch(
        """
        SELECT processing_endpoint AS endpoint, count(*) AS audited,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY critical_time_ms) AS p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY critical_time_ms) AS p95
        FROM audit_log WHERE time_sent >= to_timestamp($1) GROUP BY 1 ORDER BY 1
        """,
        since,
    )
    return rows


def print_audit(rows: list[asyncpg.Record]) -> None:
    print()
    print("audit_log (this run's audit copies, ingested by the ingestion endpoint):")
    for row in rows:
        print(f"  {row['endpoint']:<14}{row['audited']:>6} handled   critical time p50 "
              f"{row['p50']:7.1f} ms  p95 {row['p95']:7.1f} ms")
    print("  (`endpoint-runtime status` shows the same live; `endpoint-runtime report` the "
          "whole history)")


def routes_line() -> str:
    """Where each endpoint's commands go, by type (its ``route`` calls): no handler of the
    examples names a queue in a send (docs/routing.md)."""
    parts = []
    for name, path in ENDPOINTS.items():
        from endpoint_runtime import load_endpoint

        routes = load_endpoint(path).routes.items()
        if routes:
            parts.append(f"{name}: " + ", ".join(
                f"{key.rsplit('.', 1)[-1]} -> {queue}" for key, queue in routes))
    return "routes (by type; the handlers name no queue): " + "; ".join(parts)


async def start_all(deployments: dict[str, EndpointDeployment]) -> None:
    """Start the endpoints side by side (each waits for its actors' processes to start).

    Endpoints that started are put in ``deployments`` even if another fails, so they get
    stopped.
    """
    results = await asyncio.gather(
        *(EndpointDeployment.start(path) for path in ENDPOINTS.values()), return_exceptions=True
    )
    for name, result in zip(ENDPOINTS, results, strict=True):
        if isinstance(result, EndpointDeployment):
            deployments[name] = result
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def send_all(sender: Sender, messages: list[PlaceOrder]) -> None:
    """Send concurrently, at most SEND_CONCURRENCY at a time (one pooled connection each)."""
    limit = asyncio.Semaphore(SEND_CONCURRENCY)

    async def send(message: PlaceOrder) -> None:
        async with limit:
            await sender.send(message)  # to sales, by the sender's route

    await asyncio.gather(*(send(m) for m in messages))


def flow_complete(progress: Progress, args: argparse.Namespace) -> bool:
    return (
        progress.shipments == args.orders
        and progress.replies == args.orders
        and progress.points == args.orders
        and progress.reminded == args.orders
        and progress.billing_events == args.orders
        and progress.analytics_events == args.orders
        and progress.redelivered == args.redeliveries
        and progress.errors_added >= args.invalid_orders
        and progress.notifications_waiting == 0
        and progress.loyalty_waiting == 0  # the redelivered copies were consumed too
        and progress.fulfilment == fulfilment.expected(args.orders)
    )


async def wait_for_flow(
    client: Client, sender: Sender, redeliver: list[PlaceOrder],
    deployments: dict[str, EndpointDeployment], errors_before: int,
    args: argparse.Namespace, stop: asyncio.Event,
) -> tuple[Progress, float | None]:
    """Poll the business tables until every order is shipped and has its points, reminded;
    a progress line each second (with each endpoint's running receivers, so that a stall
    shows where it is). Once every order has its points, the AwardPoints of ``redeliver``
    are sent again. Returns the last progress and the seconds until every order was shipped
    (``None`` if that did not happen)."""
    began = time.monotonic()
    deadline = began + args.timeout
    last_line = began
    shipped_after = None
    n = args.orders
    while True:
        progress = await observe(client, errors_before)
        now = time.monotonic()
        if shipped_after is None and progress.shipments == n:
            shipped_after = now - began
        if flow_complete(progress, args) or now >= deadline or stop.is_set():
            break
        if progress.points == n and client.redelivered < len(redeliver):
            await client.redeliver_awards(sender, redeliver)
            print(f"  {now - began:5.1f} s  every order has its points: sent {len(redeliver)} "
                  "AwardPoints again with their original message ids (a redelivery)",
                  flush=True)
        if now - last_line >= 1.0:
            last_line = now
            statuses = await asyncio.gather(*(d.status() for d in deployments.values()))
            receivers = " ".join(f"{s.endpoint}={len(s.receivers)}" for s in statuses)
            print(f"  {now - began:5.1f} s  orders {progress.orders}/{n}  invoices "
                  f"{progress.invoices}/{n}  shipments {progress.shipments}/{n}  "
                  f"points {progress.points}/{n}  reminded {progress.reminded}/{n}  "
                  f"events {progress.billing_events + progress.analytics_events}/{2 * n}  "
                  f"error queue +{progress.errors_added}  receivers {receivers}", flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.1)
    return progress, shipped_after


def print_summary(
    args: argparse.Namespace, progress: Progress, finals: dict[str, DeploymentStatus],
    elapsed: float, shipped_after: float | None, errors_total: int, complete: bool,
    interrupted: bool,
) -> None:
    n = args.orders
    delay = f"{REMINDER_DELAY.total_seconds():g} s"
    handled = (progress.orders + progress.invoices + progress.shipments + progress.points
               + progress.reminded + progress.billing_events + progress.analytics_events)
    print()
    print("== summary")
    print(f"orders     {progress.orders:6d} / {n}   (table orders, this run)")
    print(f"invoices   {progress.invoices:6d} / {n}   (table invoices)")
    print(f"shipments  {progress.shipments:6d} / {n}   (table shipments)")
    print(f"points     {progress.points:6d} / {n}   (table loyalty_points, written through "
          "loyalty's outbox)")
    print(f"reminded   {progress.reminded:6d} / {n}   (loyalty_points.reminded_at: "
          f"PointsExpiryReminder handled, deferred {delay} by loyalty)")
    print(f"published  {progress.billing_events:6d} / {n}   (OrderPlaced events handled by "
          "billing, a subscriber)")
    print(f"           {progress.analytics_events:6d} / {n}   (... and by analytics, the other "
          "subscriber)")
    print(f"replies    {progress.replies:6d} / {n}   (OrderReceived, received by the client from "
          f"queue {CLIENT_QUEUE})")
    print(f"tenant     {progress.tenant_replies:6d} / {n}   (replies carrying the orders' "
          f"{TENANT_HEADER} header, copied by sales' own 'tenant' step)")
    print(f"redelivered{progress.redelivered:6d} / {args.redeliveries}    (AwardPoints sent again "
          "with their original message ids, as in a redelivery)")
    saga, wanted = progress.fulfilment, fulfilment.expected(n)
    print(f"fulfilment {saga.get('shipped', 0):6d} / {wanted['shipped']}   shipped, "
          f"{saga.get('cancelled', 0)} / {wanted['cancelled']} cancelled, {saga.get('live', 0)} "
          "running (saga OrderFulfilment: placed + paid in any order; unpaid orders cancelled "
          f"after its {fulfilment.PAYMENT_TIMEOUT.total_seconds():g} s timeout)")
    until = "the flow completed" if complete else (
        "the interruption" if interrupted else "the timeout")
    print(f"took       {elapsed:6.2f} s from the first send until {until}: "
          f"{handled / elapsed:.1f} messages/s (sales + billing + shipping + loyalty + "
          f"analytics; the {delay} reminder delay included)")
    if shipped_after is not None:
        print(f"           every order was shipped after {shipped_after:.2f} s: "
              f"{n / shipped_after:.1f} orders/s")
    print()
    print(f"{'endpoint':<14}{'mode':<38}{'processed':>10}{'failed':>8}{'to error':>10}"
          f"{'receivers':>11}")
    for name, status in finals.items():
        mode = _mode_of(name)
        failed = sum(r.failed for r in status.receivers)
        moved = sum(r.moved_to_error for r in status.receivers)
        print(f"{name:<14}{mode:<38}{status.processed:>10}{failed:>8}{moved:>10}"
              f"{len(status.receivers):>11}")
    print("  (processed = messages whose handlers ran; failed = failed attempts: shipping's "
          "simulated carrier timeouts are retried, sales' invalid orders are not; when an "
          "order's two fulfilment messages start its saga at once, one loses the race and is "
          "retried)")
    print()
    print_exactly_once(args, finals)
    print(f"error queue: +{progress.errors_added} this run (expected {args.invalid_orders}, "
          f"the invalid orders); {errors_total} message(s) in it in total")
    if complete:
        print(f"OK: all {n} orders went through sales -> billing -> shipping -> notifications "
              f"and got their loyalty points, with the reminder {delay} later; OrderPlaced "
              "reached both subscribers")
    elif interrupted:
        print("INTERRUPTED: the endpoints were stopped before the flow completed")
    else:
        print(f"FAILED: the flow did not complete within {args.timeout:g} s "
              "(the log on stderr says why; the counts above say where it stopped)")


def print_exactly_once(args: argparse.Namespace, finals: dict[str, DeploymentStatus]) -> None:
    """What the endpoints' final counts say about the redelivered AwardPoints.

    A copy that got past loyalty's outbox would run the award handler again: its plain INSERT
    would fail on the points row's primary key (a failed attempt), and a PointsAwarded sent
    twice would add to notifications' count.
    """
    loyalty, notifications = finals.get("loyalty"), finals.get("notifications")
    if loyalty is None or notifications is None:
        return
    n = args.orders
    confirmed = (loyalty.processed == 2 * n and loyalty.failed == 0
                 and notifications.processed == 2 * n)
    print(f"outbox: loyalty's handlers ran {loyalty.processed} times ({n} AwardPoints + {n} "
          f"reminders) with {loyalty.failed} failed attempts; notifications handled "
          f"{notifications.processed} ({n} OrderShipped + {n} PointsAwarded)")
    if confirmed:
        print(f"        so the {args.redeliveries} redelivered AwardPoints reached no handler: "
              "points, PointsAwarded and reminders exactly once")
    else:
        print(f"        NOT CONFIRMED: expected {2 * n}, 0 failed attempts and {2 * n} "
              "(messages left by an interrupted run, or a transient failure, also count here)")


def _mode_of(name: str) -> str:
    from endpoint_runtime import load_endpoint

    if name == "ingestion":
        return "built in: audit -> audit_log"
    settings = load_endpoint(ENDPOINTS[name]).settings
    mode = settings.mode.value
    if settings.outbox is not None:
        concurrency = "pessimistic" if settings.outbox.pessimistic else "optimistic"
        return f"{mode} + outbox ({concurrency})"
    return f"{mode} (batch {settings.batch_size})" if settings.batch_size > 1 else mode


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except EndpointRuntimeError as exc:
        print(f"examples: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("examples: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
