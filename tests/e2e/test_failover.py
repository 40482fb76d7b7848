"""A standby's promotion: the primary dies, its synchronous standby is promoted, and a
deployment on Ray, a sender and their pools go on with the new primary on their own, through
a DSN that names both servers with ``target_session_attrs=read-write``.

The servers are the test's own (``benchmarks.chaos.server`` and ``benchmarks.chaos.standby``:
the wheel's ``pg_basebackup``, streaming replication on this machine). Each message is sent
while the primary dies; a send that returned is acknowledged, one that raised may or may not
have committed. With synchronous replication every acknowledged message is handled exactly
once; with asynchronous replication what was acknowledged in the moment before the primary
died may be lost, and is counted. No message is handled twice, and processing resumes within
seconds of the promotion. Beside the endpoint, its delayed-message mover (a message due after
the promotion), ingestion (audit copies and the error queue into ``audit_log``/``error_log``)
and the console (the failed-messages page) go on with the promoted standby as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sized
from datetime import timedelta

import asyncpg
import httpx
import pytest

from benchmarks.chaos.server import ChaosServer
from benchmarks.chaos.standby import Standby
from endpoint_runtime import Sender, TransportSettings
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.delayed import PostgresDelayedMessageStore
from endpoint_runtime.transport import QueueAddress
from tests.cluster.nodes import free_ports
from tests.console.conftest import TOKEN, serve
from tests.e2e.conftest import Deployer, wait_for
from tests.support.failover_endpoints import Ping

MODULE = "tests.support.failover_endpoints"
SEND_GAP_S = 0.02
RESUMES_WITHIN_S = 5.0
"""The issue's bound: processing resumes within 5 s of the promotion."""
DELAY_S = 3.0
"""How long the delayed messages wait: due after the primary's death."""
INGESTION = "endpoint_runtime.ingestion"


@contextlib.contextmanager
def _primary_and_standby(*, synchronous: bool) -> Iterator[Standby]:
    """A primary and its standby, both the test's own."""
    primary_port, standby_port = free_ports(2)
    primary = ChaosServer.create(port=primary_port)
    try:
        standby = Standby.of(primary, port=standby_port, synchronous=synchronous)
        try:
            yield standby
        finally:
            standby.destroy()
    finally:
        primary.destroy()


@pytest.fixture(params=[True, False], ids=["synchronous", "asynchronous"])
def servers(request: pytest.FixtureRequest) -> Iterator[Standby]:
    """A primary and its standby (synchronous or not)."""
    with _primary_and_standby(synchronous=request.param) as standby:
        yield standby


async def _create_database(standby: Standby) -> str:
    admin = await asyncpg.connect(standby.primary.dsn)
    try:
        await admin.execute("CREATE DATABASE failover")
    finally:
        await admin.close()
    dsn = standby.failover_dsn("failover")
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("CREATE TABLE handled (key int NOT NULL, "
                                 "handled_at float8 NOT NULL DEFAULT "
                                 "extract(epoch FROM clock_timestamp()))")
    finally:
        await connection.close()
    return dsn


async def test_a_deployment_goes_on_with_the_promoted_standby(servers: Standby) -> None:
    """Synchronous: every acknowledged message is handled exactly once. Asynchronous: an
    acknowledged message may be lost, only one acknowledged in the moment before the primary
    died (what the standby had not received yet); the test counts them. Neither handles a
    message twice, and processing resumes within :data:`RESUMES_WITHIN_S` of the promotion."""
    dsn = await _create_database(servers)
    deployer = Deployer(dsn)
    acknowledged: dict[int, float] = {}  # key -> when its send returned
    unknown: list[int] = []
    try:
        await deployer.start("failover", module=MODULE)
        async with Sender("failover-driver", TransportSettings(dsn=dsn)) as sender:
            stop_sending = asyncio.Event()

            async def send_all() -> None:
                key = 0
                while not stop_sending.is_set():
                    try:
                        await sender.send(Ping(key), "failover")
                        acknowledged[key] = time.time()
                    except Exception:  # the primary gone, the standby not yet writable
                        unknown.append(key)
                        await asyncio.sleep(0.1)
                    key += 1
                    await asyncio.sleep(SEND_GAP_S)

            sending = asyncio.get_running_loop().create_task(send_all())
            await wait_for(lambda: _at_least(acknowledged, 50), timeout=30,
                           what="50 messages sent before the primary dies")
            killed_at = time.time()
            await asyncio.to_thread(servers.primary.stop, "immediate")
            await asyncio.to_thread(servers.promote)
            promoted_at = time.time()
            wanted = len(acknowledged) + 50
            await wait_for(lambda: _at_least(acknowledged, wanted), timeout=60,
                           what="50 messages sent to the promoted standby")
            stop_sending.set()
            await sending

        transport = await PostgresTransport.connect(TransportSettings(dsn=dsn))
        try:
            async def drained() -> bool:
                return await transport.depth("failover") == 0 and set(
                    k for k in acknowledged if acknowledged[k] > promoted_at) <= await _keys(
                        transport)

            await wait_for(drained, timeout=60, what="the queue drained after the promotion")
        finally:
            await transport.close()
        rows = await _handled(dsn)
    finally:
        await deployer.stop_all()

    times = {row["key"]: row["times"] for row in rows}
    assert all(count == 1 for count in times.values()), "a message handled twice"
    assert set(times) <= set(acknowledged) | set(unknown)
    lost = [key for key in acknowledged if key not in times]
    if servers.synchronous:
        assert lost == [], f"acknowledged and lost: {lost}"
    else:
        # Lost only what was acknowledged just before the primary died.
        assert all(killed_at - acknowledged[key] < 1.0 for key in lost), lost
    resumed = min(row["at"] for row in rows if row["at"] > promoted_at) - promoted_at
    assert resumed <= RESUMES_WITHIN_S, resumed
    print(f"failover ({'a' if not servers.synchronous else ''}synchronous): "
          f"{len(acknowledged)} acknowledged, {len(unknown)} unknown, {len(lost)} lost, "
          f"processing resumed {resumed:.2f} s after the promotion")


async def test_the_mover_ingestion_and_the_console_go_on_with_the_promoted_standby() -> None:
    """Synchronous replication. Before the primary dies: messages handled, audited and
    ingested, a failed one on the console; delayed messages due after the death. After the
    promotion, with nothing restarted: the delayed messages are moved and handled, new
    messages handled, every handled message is in ``audit_log`` once, both failures are in
    ``error_log``, and the console shows the new failure, each within
    :data:`RESUMES_WITHIN_S` of the promotion (the delayed ones of their due time, when later)."""
    with _primary_and_standby(synchronous=True) as servers:
        dsn = await _create_database(servers)
        deployer = Deployer(dsn)
        server, serving = await serve(dsn)
        console = httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.config.port}",
                                    headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        store = PostgresDelayedMessageStore.for_endpoint(QueueAddress.parse("failover"))
        try:
            await deployer.start("failover", module=MODULE)
            await deployer.start("endpoint", module=INGESTION)
            async with Sender("failover-driver", TransportSettings(dsn=dsn),
                              delayed_store=store) as sender:
                for key in range(10):
                    await sender.send(Ping(key), "failover")
                await sender.send(Ping(1000, raises="RuntimeError"), "failover")
                await wait_for(lambda: _ingested(dsn, audited=10, failed=1), timeout=60,
                               what="10 audited and 1 failure ingested before the death")
                await wait_for(lambda: _shows(console, "builtins.RuntimeError"), timeout=30,
                               what="the console showing the first failure")
                for key in range(100, 110):
                    await sender.send(Ping(key), "failover", delay=timedelta(seconds=DELAY_S))
                due = time.time() + DELAY_S

                await asyncio.to_thread(servers.primary.stop, "immediate")
                await asyncio.to_thread(servers.promote)
                promoted_at = time.time()

                for key in range(10, 20):
                    await _send_until_acknowledged(sender, Ping(key))
                await _send_until_acknowledged(sender, Ping(1001, raises="ValueError"))
            await wait_for(lambda: _shows(console, "builtins.ValueError"), timeout=60,
                           what="the console showing the failure after the promotion")
            shown_after = time.time() - promoted_at
            expected = {*range(20), *range(100, 110)}
            await wait_for(lambda: _ingested(dsn, audited=len(expected), failed=2), timeout=60,
                           what="every handled message audited, both failures ingested")
            ingested_after = time.time() - promoted_at
            rows = await _handled(dsn)
        finally:
            await deployer.stop_all()
            await console.aclose()
            server.should_exit = True
            await serving

    times = {row["key"]: row["times"] for row in rows}
    assert times == {key: 1 for key in expected}
    handled_at = {row["key"]: row["at"] for row in rows}
    assert all(handled_at[key] >= due - 0.5 for key in range(100, 110)), "delivered early"
    moved_after = max(handled_at[key] for key in range(100, 110)) - max(due, promoted_at)
    assert moved_after <= RESUMES_WITHIN_S, moved_after
    assert shown_after <= RESUMES_WITHIN_S, shown_after
    assert ingested_after <= RESUMES_WITHIN_S, ingested_after
    print(f"failover: delayed handled {moved_after:.2f} s after due/promotion, console "
          f"{shown_after:.2f} s, ingestion {ingested_after:.2f} s after the promotion")


async def _send_until_acknowledged(sender: Sender, message: Ping) -> None:
    """A send to the promoted standby; one that raises while it comes up is sent again (its
    first attempt did not commit: the primary that would have committed it is gone)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            await sender.send(message, "failover")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _ingested(dsn: str, *, audited: int, failed: int) -> bool:
    connection = await asyncpg.connect(dsn)
    try:
        row = await connection.fetchrow("SELECT (SELECT count(*) FROM audit_log) AS audited, "
                                        "(SELECT count(*) FROM error_log) AS failed")
        assert row is not None
        return bool(row["audited"] >= audited and row["failed"] >= failed)
    except asyncpg.UndefinedTableError:  # ingestion has not made its tables yet
        return False
    finally:
        await connection.close()


async def _shows(console: httpx.AsyncClient, text: str) -> bool:
    try:
        page = await console.get("/failed")
    except httpx.HTTPError:
        return False
    return page.status_code == 200 and text in page.text


async def _handled(dsn: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(dsn)
    try:
        return await connection.fetch(
            "SELECT key, count(*) AS times, min(handled_at) AS at FROM handled GROUP BY key")
    finally:
        await connection.close()


async def _keys(transport: PostgresTransport) -> set[int]:
    return {row["key"] for row in await transport.pool.fetch("SELECT DISTINCT key FROM handled")}


async def _at_least(items: Sized, count: int) -> bool:
    return len(items) >= count
