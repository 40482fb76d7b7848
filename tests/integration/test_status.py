"""``endpoint-runtime status``: queue length, rate and critical time from audit_log, errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from endpoint_runtime.cli.status import collect, render
from endpoint_runtime.connecting import PostgresTransport
from endpoint_runtime.messages import Headers, to_wire_time
from endpoint_runtime.outgoing import create_outgoing
from endpoint_runtime.recoverability import ErrorHeaders
from tests.integration import test_cli
from tests.integration.test_cli import Cli, Database
from tests.integration.test_ingestion import ingest
from tests.support.pubsub_endpoints import PlaceOrder

cli = test_cli.cli  # the fixtures of the command-line tests
db = test_cli.db


async def audited(transport: PostgresTransport, endpoint: str, critical_ms: float) -> None:
    ended = datetime.now(UTC)
    await transport.send("audit", create_outgoing(PlaceOrder("x"), headers={
        Headers.TIME_SENT: to_wire_time(ended - timedelta(milliseconds=critical_ms)),
        Headers.PROCESSING_STARTED: to_wire_time(ended - timedelta(milliseconds=1)),
        Headers.PROCESSING_ENDED: to_wire_time(ended),
        Headers.PROCESSING_ENDPOINT: endpoint}))


async def test_status_shows_each_endpoint_with_its_queue_rate_latency_and_errors(
    transport: PostgresTransport,
) -> None:
    for queue in ("sales", "billing", "audit", "error"):
        await transport.create_queue(queue)
    for critical in (10, 20, 30, 40):
        await audited(transport, "sales", critical)
    await ingest(transport)
    await transport.send("billing", create_outgoing(PlaceOrder("waiting")))
    for _ in range(2):
        await transport.send("error", create_outgoing(PlaceOrder("failed"), headers={
            ErrorHeaders.FAILED_QUEUE: "public.billing"}))

    statuses = {s.endpoint: s for s in await collect(transport, window=300)}

    assert set(statuses) == {"public.sales", "public.billing"}
    sales, billing = statuses["public.sales"], statuses["public.billing"]
    assert (sales.queue_length, billing.queue_length) == (0, 1)
    assert sales.per_second == pytest.approx(4 / 60)
    assert sales.critical_p50_ms == pytest.approx(25, abs=0.5)
    assert sales.critical_p95_ms == pytest.approx(38.5, abs=0.5)
    assert (sales.failed, billing.failed) == (0, 2)
    assert billing.per_second is None
    lines = render(list(statuses.values())).splitlines()
    assert lines[0].split() == ["endpoint", "queue", "msg/s", "p50", "ms", "p95", "ms", "errors"]


def test_the_status_command_prints_one_line_per_endpoint(cli: Cli, db: Database) -> None:
    db.create("sales", "error")
    shown = cli("status")
    assert shown.code == 0
    assert [line.split()[0] for line in shown.out.splitlines()] == ["endpoint", "public.sales"]
