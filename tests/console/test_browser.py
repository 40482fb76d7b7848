"""The console in a real headless Chromium: a failed-message group produced by a real
endpoint on Ray, retried from the page until the business table has the rows; a
conversation's lanes; the token and the CSRF token refused when missing; hostile content
rendered as text. The pages' screenshots in docs/console.md come from here."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest
from playwright.async_api import BrowserContext, Dialog, expect

from endpoint_runtime import TransportSettings
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.sagas.storage import SagaTable
from endpoint_runtime.chain.subscriptions import subscription_store
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.messages import Headers
from tests.console.browser import browser, screenshot
from tests.console.conftest import HOSTILE_ENDPOINT, Console, plant_failed
from tests.e2e.conftest import Deployer, wait_for
from tests.support.recoverability_endpoints import Charge

__all__ = ["browser"]  # the fixture, imported to be used here

MODULE = "tests.support.recoverability_endpoints"
EVENT = "Shop.OrderCharged, Shop.Messages"
AN_HOUR_AUDITED = """
    INSERT INTO audit_log (message_id, processing_endpoint, processing_ended,
                           processing_time_ms, critical_time_ms, body_size, retries, headers)
    SELECT 'earlier-' || m || '-' || i, 'switched', now() - m * interval '1 minute',
           20 + 15 * sin(m / 6.0), 60 + 40 * sin(m / 6.0) + i, 0, 0, '{}'
    FROM generate_series(1, 59) AS m, generate_series(1, 5 + m % 7) AS i"""
"""An hour of audit rows of the endpoint, as ingestion records them (it does not run here):
the endpoints page's charts of messages, processing and critical time per minute."""
ORDERS = 3


@pytest.fixture
async def shop(database_dsn: str) -> AsyncIterator[PostgresTransport]:
    """The tables and queues of the ``switched`` endpoint, which fails while ``switch`` says
    broken and inserts into ``charges`` when it is not."""
    async with PostgresTransport.connect(TransportSettings(dsn=database_dsn)) as transport:
        for name in ("attempts", "error"):
            await transport.create_queue(name)
        await transport.pool.execute("""
            CREATE TABLE charges (key text);
            CREATE TABLE switch (broken boolean);
            INSERT INTO switch VALUES (true)""")
        await _subscriptions_and_sagas(transport)
        yield transport


async def _subscriptions_and_sagas(transport: PostgresTransport) -> None:
    """What the endpoints page lists besides queues: a subscription whose queue exists, one
    whose queue does not, and a saga type with two live instances."""
    store = subscription_store(transport.settings)
    sagas = SagaTable(QueueAddress("switched_OrderBilling"), "order_id", str)
    async with transport.pool.acquire() as connection:
        await store.setup(connection)
        await store.subscribe(connection, transport.address("switched"), "switched", EVENT)
        await store.subscribe(connection, QueueAddress("retired_crm"), "crm", EVENT)
        await sagas.setup(connection)
        for order in ("order-1", "order-2"):
            await sagas.insert(connection, uuid.uuid4(), metadata="{}", data="{}",
                               saga_type_version="1", correlation_value=order)


async def test_retry_a_group_produced_by_a_real_endpoint(
    shop: PostgresTransport, console: Console, browser: BrowserContext, database_dsn: str
) -> None:
    # The endpoint in process: the console reads what it wrote (its failures, its heartbeats),
    # nothing of Ray.
    deployer = Deployer(database_dsn, in_process=True)
    try:
        await deployer.start("switched", module=MODULE)
        conversation = "order-conversation-1"
        for i in range(ORDERS):
            await shop.send("switched", create_outgoing(
                Charge(f"order-{i}", "ok"), originating_endpoint="shop",
                conversation_id=conversation))
        await wait_for(lambda: _depth_is(shop, "error", ORDERS), timeout=30,
                       what=f"{ORDERS} messages in the error queue")
        await shop.pool.execute("UPDATE switch SET broken = false")  # the fix

        page = await browser.new_page()
        dialogs: list[str] = []

        async def accept(dialog: Dialog) -> None:
            dialogs.append(dialog.message)
            await dialog.accept()

        page.on("dialog", accept)
        await page.goto(f"{console.url}/?token={console.token}")
        assert page.url == f"{console.url}/failed"  # the token left the address bar
        group = page.locator("tr.group", has_text="builtins.RuntimeError")
        await expect(group.locator("td.count")).to_have_text(str(ORDERS))
        await expect(group).to_contain_text("downstream system unavailable")
        await screenshot(page, "failed-messages")

        await group.get_by_role("link").click()
        await page.locator("table a[href^='/message/']").first.click()
        await expect(page.locator("#stack-trace")).to_contain_text("RuntimeError")
        await expect(page.locator("#body")).to_contain_text('"key": "order-')
        await screenshot(page, "message")
        await page.get_by_role("link", name="conversation").click()
        lanes = page.locator("#sequence g.lane text")
        await expect(lanes).to_have_text(["shop", "switched"])
        await expect(page.locator("#sequence g.arrow.failed")).to_have_count(ORDERS)
        await screenshot(page, "conversation")

        await page.goto(f"{console.url}/failed")
        await group.get_by_role("button", name="Retry group").click()
        await expect(page.locator("#job-state")).to_have_text("finished")  # it refreshes
        await expect(page.locator("#job-outcome")).to_have_text(f"{ORDERS} retried")
        await page.get_by_role("link", name="Operator log").first.click()
        await expect(page.locator("#actions td.outcome").first).to_have_text(
            f"{ORDERS} retried")
        assert dialogs == [f"Retry {ORDERS} messages?"]
        await wait_for(lambda: _charges(shop), timeout=30, what="the retried orders handled")
        await wait_for(lambda: _beat_counts(shop), timeout=20,
                       what="a heartbeat counting the failures and the retried orders")
        await screenshot(page, "operator-log")
        await page.goto(f"{console.url}/failed")
        await expect(page.get_by_text("No failed messages.")).to_be_visible()
        await shop.pool.execute(AN_HOUR_AUDITED)  # for the charts of the screenshot
        await page.goto(f"{console.url}/endpoints")
        await expect(page.locator("#endpoints")).to_contain_text("public.switched")
        deployment = page.locator("tr.deployment", has_text="switched")
        await expect(deployment.locator("td.state")).to_have_text("running")
        await expect(deployment.locator("td.receivers")).to_contain_text(" on ")
        await expect(page.locator("tr.subscription.nowhere")).to_contain_text("retired_crm")
        await expect(page.locator("tr.subscription.nowhere td.points")).to_have_text(
            "points nowhere: no such queue")
        await expect(page.locator("tr.saga td.instances")).to_have_text("2")
        await expect(page.locator("#endpoints svg.chart.throughput")).to_have_count(1)
        await screenshot(page, "endpoints", full_page=True)
        await deployer.stop_all()  # its last heartbeat says so
        await page.reload()
        await expect(deployment.locator("td.state")).to_have_text("stopped")
    finally:
        await deployer.stop_all()


async def _depth_is(transport: PostgresTransport, queue: str, expected: int) -> bool:
    return await transport.depth(queue) == expected


async def _charges(transport: PostgresTransport) -> bool:
    keys = {row["key"] for row in await transport.pool.fetch("SELECT key FROM charges")}
    return keys == {f"order-{i}" for i in range(ORDERS)}


async def _beat_counts(transport: PostgresTransport) -> bool:
    row = await transport.pool.fetchrow(
        "SELECT processed, failed FROM endpoint_heartbeats WHERE endpoint = 'switched'")
    return row is not None and row["failed"] >= ORDERS and row["processed"] >= ORDERS


class Invoice(msgspec.Struct):
    number: str


HOSTILE_TYPE = '<script>alert("type")</script><img src=x onerror=alert(1)>'
HOSTILE_BODY = "<img src=x onerror=alert(2)><script>alert(3)</script>"


async def test_hostile_content_renders_as_text_and_the_gates_hold(
    console: Console, db: PostgresTransport, browser: BrowserContext
) -> None:
    planted = await plant_failed(db, "billing", Invoice(HOSTILE_BODY),
                                 "<script>alert(4)</script>", "<img src=x onerror=alert(5)>",
                                 headers={Headers.ENCLOSED_MESSAGE_TYPES: HOSTILE_TYPE})
    page = await browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))

    refused = await page.goto(f"{console.url}/failed")
    assert refused is not None
    assert refused.status == 403  # no token

    await page.goto(f"{console.url}/message/{planted.native_id}?token={console.token}")
    await expect(page.locator("#message-type")).to_have_text(HOSTILE_TYPE)
    await expect(page.locator("#body")).to_contain_text(HOSTILE_BODY)
    assert await page.locator("main script, main img").count() == 0
    await page.goto(f"{console.url}/failed")
    await expect(page.locator("tr.group").first).to_contain_text("<script>alert(4)</script>")
    assert await page.locator("main script, main img").count() == 0
    assert dialogs == []  # nothing ran

    # A form posted without its CSRF token is refused and changes nothing.
    page.on("dialog", lambda dialog: dialog.accept())
    await page.evaluate("document.querySelectorAll('input[name=csrf]')"
                        ".forEach(field => field.remove())")
    async with page.expect_response(re.compile(r"/retry$")) as posted:
        await page.get_by_role("button", name="Retry group").click()
    assert (await posted.value).status == 403
    assert await db.depth("error") == 1
    assert await db.depth("billing") == 0


async def test_the_report_page_in_the_console(
    report_console: Console, browser: BrowserContext
) -> None:
    page = await browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await page.goto(f"{report_console.url}/report/?token={report_console.token}")
    await expect(page.locator("h1")).to_have_text("endpoint-runtime report")
    await expect(page.locator("tr.total td").first).to_have_text(HOSTILE_ENDPOINT)
    plot = page.locator('img[alt="Throughput"]')
    await expect(plot).to_be_visible()
    assert await plot.evaluate("image => image.naturalWidth") > 0  # served, and a PNG
    assert await page.locator("script").count() == 0
    assert dialogs == []
    await screenshot(page, "report")
