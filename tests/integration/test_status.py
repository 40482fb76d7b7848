"""``endpoint-runtime status``: queue length, rate and critical time from audit_log, errors."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.cli.status import (
    UNPARSABLE,
    collect,
    ingestion_hint,
    render,
    status_command,
)
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.wire.messages import Headers, to_wire_time
from tests.integration import test_cli
from tests.integration.test_cli import Cli, Database
from tests.integration.test_ingestion import ingest
from tests.support.pubsub_endpoints import PlaceOrder

cli = test_cli.cli  # the fixtures of the command-line tests
db = test_cli.db


async def audited(transport: PostgresTransport, endpoint: str, critical_ms: float,
                  ago: float = 0.0) -> None:
    ended = datetime.now(UTC) - timedelta(seconds=ago)
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
    assert sales.per_second == pytest.approx(4 / 300)  # over the window
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
    assert [line.split()[0] for line in table_of(shown.out)] == ["endpoint", "public.sales"]


async def test_the_rate_is_taken_over_the_window(transport: PostgresTransport) -> None:
    for queue in ("sales", "billing", "audit", "error"):
        await transport.create_queue(queue)
    for n in range(6):
        await audited(transport, "sales", 10, ago=2.0 + n)  # within the last 10 s
        await audited(transport, "billing", 10, ago=100.0 + n)  # 100-105 s ago
    await ingest(transport)

    short = {s.endpoint: s for s in await collect(transport, window=20)}
    assert short["public.sales"].per_second == pytest.approx(6 / 20)
    assert short["public.billing"].per_second is None  # outside the window
    long = {s.endpoint: s for s in await collect(transport, window=300)}
    assert long["public.sales"].per_second == pytest.approx(6 / 300)
    assert long["public.billing"].per_second == pytest.approx(6 / 300)


HOSTILE_FAILED_QUEUES = ['a.b.c', '', 'a..b', "x" * 200]


async def test_a_hostile_failed_queue_is_shown_as_unparsable_and_never_fatal(
    transport: PostgresTransport,
) -> None:
    await transport.create_queue("sales")
    await transport.create_queue("error")
    for failed_queue in HOSTILE_FAILED_QUEUES:
        await transport.send("error", create_outgoing(PlaceOrder("hostile"), headers={
            ErrorHeaders.FAILED_QUEUE: failed_queue}))
    await transport.pool.execute(  # headers that do not parse at all
        "INSERT INTO error (id, headers, body) VALUES (gen_random_uuid(), '{not json', '')")
    await transport.send("error", create_outgoing(PlaceOrder("ok"), headers={
        ErrorHeaders.FAILED_QUEUE: "sales"}))

    statuses = {s.endpoint: s for s in await collect(transport, window=300)}

    assert set(statuses) == {"public.sales", UNPARSABLE}
    assert statuses["public.sales"].failed == 1
    assert statuses[UNPARSABLE].failed == len(HOSTILE_FAILED_QUEUES) + 1
    assert UNPARSABLE in render(list(statuses.values()))


def test_the_status_command_survives_a_hostile_failed_queue(cli: Cli, db: Database) -> None:
    db.create("sales", "error")

    async def hostile(transport: PostgresTransport) -> None:
        await transport.send("error", create_outgoing(PlaceOrder("hostile"), headers={
            ErrorHeaders.FAILED_QUEUE: "a.b.c"}))

    db.run(hostile)
    shown = cli("status")
    assert shown.code == 0, shown.err
    assert [line.split()[0] for line in table_of(shown.out)] == [
        "endpoint", "(unparsable", "public.sales"]


async def test_only_the_transport_schemas_endpoints_are_listed(
    transport: PostgresTransport,
) -> None:
    for queue in ("sales", "audit", "error", "other.error", "other.audit", "other.billing"):
        await transport.create_queue(queue)

    statuses = await collect(transport, window=300)

    assert [s.endpoint for s in statuses] == ["public.sales"]


async def test_watch_goes_on_refreshing_past_a_hostile_row(
    transport: PostgresTransport, capsys: pytest.CaptureFixture[str],
) -> None:
    await transport.create_queue("sales")
    await transport.create_queue("error")
    await transport.send("error", create_outgoing(PlaceOrder("hostile"), headers={
        ErrorHeaders.FAILED_QUEUE: "a.b.c"}))
    args = argparse.Namespace(watch=True, interval=0.05, window=300.0, error_queue="error")
    watching = asyncio.create_task(status_command(args, transport.settings))
    shown = ""
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while shown.count(UNPARSABLE) < 3 and asyncio.get_running_loop().time() < deadline:
            assert not watching.done(), watching.exception()
            await asyncio.sleep(0.05)
            shown += capsys.readouterr().out
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    assert shown.count(UNPARSABLE) >= 3, shown  # three refreshes, and still running


async def test_status_says_how_to_get_rates_when_nothing_is_ingested(
    transport: PostgresTransport,
) -> None:
    await transport.create_queue("sales")
    await transport.create_queue("audit")
    before = await ingestion_hint(transport, await collect(transport, 300), 300)
    await audited(transport, "sales", 10, ago=900)  # ingested, but long before the window
    await ingest(transport)
    stale = await ingestion_hint(transport, await collect(transport, 300), 300)
    await audited(transport, "sales", 10)
    await ingest(transport)
    current = await ingestion_hint(transport, await collect(transport, 300), 300)

    assert before.strip().startswith("no audit data ingested yet: ")
    assert "`endpoint-runtime ingest`" in before
    assert stale.strip().startswith("no audit data ingested in the last 300 s: ")
    assert current == ""


def table_of(out: str) -> list[str]:
    """The endpoint table of status's output: the lines before the first blank one (notes
    follow it)."""
    return out.split("\n\n", 1)[0].splitlines()
