"""The console over a real PostgreSQL, through HTTP (uvicorn on 127.0.0.1): the token gate,
CSRF, read-only mode, failed-message groups, retry through ``retry_failed``, archive and
restore, the operator log, escaping, the endpoints and conversation pages."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx
import msgspec

from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.console.security import COOKIE
from endpoint_runtime.runtime.heartbeats import create_heartbeats_table
from endpoint_runtime.transport import sending
from endpoint_runtime.wire.messages import Headers
from tests.console.conftest import HOSTILE_ENDPOINT, Console, plant_failed
from tests.console.test_endpoints_page import peak

JOB_TIMEOUT = 10.0


class Invoice(msgspec.Struct):
    number: str


async def _groups(console: Console, by: str = "exception") -> dict[str, tuple[str, int]]:
    """Group name (exception type, queue or type) -> (group key, count), read from the
    failed-messages page."""
    async with console.client() as client:
        html = (await client.get(f"/failed?by={by}")).text
    rows = re.findall(r'href="/failed/group/([0-9a-f]{32})(?:\?by=\w+)?">([^<]*)</a></td>\s*'
                      r'<td>[^<]*</td>'
                      r'<td class="count">(\d+)</td>', html)
    return {name: (key, int(n)) for key, name, n in rows}


async def _run_job(client: httpx.AsyncClient, started: httpx.Response) -> str:
    """Follow a group action's job page until it has finished; returns its outcome."""
    assert started.status_code == 303
    job = started.headers["location"]
    assert job.startswith("/jobs/")
    async with asyncio.timeout(JOB_TIMEOUT):
        while True:
            html = (await client.get(job)).text
            if '<p id="job-state">finished</p>' in html:
                found = re.search(r'<p id="job-outcome">([^<]*)</p>', html)
                assert found is not None
                return found.group(1)
            await asyncio.sleep(0.05)


async def _plant_two_groups(db: PostgresTransport) -> list[uuid.UUID]:
    ids = [(await plant_failed(db, "billing", Invoice(str(i)), "builtins.TimeoutError",
                               "the card service timed out")).native_id for i in range(3)]
    for i in range(2):
        await plant_failed(db, "shipping", Invoice(f"s{i}"), "builtins.KeyError", "'address'")
    return ids


async def test_every_request_needs_the_token(console: Console) -> None:
    async with console.client(authorised=False) as anonymous:
        assert (await anonymous.get("/failed")).status_code == 403
        assert (await anonymous.get("/failed?token=wrong")).status_code == 403
    async with console.client(authorised=False) as forged:
        forged.cookies.set(COOKIE, "wrong")
        assert (await forged.get("/failed")).status_code == 403
    async with console.client(authorised=False) as anonymous:
        opened = await anonymous.get("/failed?token=" + console.token)
        assert opened.status_code == 303
        assert opened.headers["location"] == "/failed"  # the token leaves the address bar
        assert COOKIE in opened.cookies
        cookie = opened.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        assert (await anonymous.get("/endpoints")).status_code == 200  # the cookie opens it
    async with console.client() as bearer:
        assert (await bearer.get("/endpoints")).status_code == 200


async def test_a_missing_error_queue_is_named(console: Console) -> None:
    async with console.client() as client:
        page = await client.get("/failed")
    assert page.status_code == 404
    assert "queue public.error does not exist" in page.text


async def test_groups_by_exception_and_a_group_retry_moves_them_back(
    console: Console, db: PostgresTransport
) -> None:
    ids = await _plant_two_groups(db)
    groups = await _groups(console)
    assert {name: n for name, (_, n) in groups.items()} == {
        "builtins.TimeoutError": 3, "builtins.KeyError": 2}

    key = groups["builtins.TimeoutError"][0]
    async with console.client() as client:
        outcome = await _run_job(
            client, await client.post(f"/failed/group/{key}/retry", data=console.csrf))
    assert outcome == "3 retried"
    assert await db.depth("billing") == 3
    assert await db.depth("error") == 2
    back = {r["id"] for r in await db.pool.fetch('SELECT id FROM "public"."billing"')}
    assert back == set(ids)  # the original native ids, as `errors retry` restores them
    assert {name: n for name, (_, n) in (await _groups(console)).items()} == {
        "builtins.KeyError": 2}  # retried messages leave their group
    action = await db.pool.fetchrow("SELECT * FROM console_actions")
    assert action["action"] == "retry"
    assert action["outcome"] == "3 retried"
    assert len(set(action["native_ids"])) == 3
    assert action["client"].startswith("127.0.0.1:")


async def test_groups_by_failed_queue_or_message_type_and_retry_one_of_them(
    console: Console, db: PostgresTransport
) -> None:
    await _plant_two_groups(db)
    await plant_failed(db, "shipping", Invoice("s9"), "builtins.TimeoutError", "late")
    by_queue = await _groups(console, "queue")
    assert {name: n for name, (_, n) in by_queue.items()} == {
        "public.billing": 3, "public.shipping": 3}
    by_type = await _groups(console, "type")
    assert {name: n for name, (_, n) in by_type.items()} == {"Invoice": 6}
    async with console.client() as client:
        group = (await client.get(f"/failed/group/{by_queue['public.shipping'][0]}?by=queue")).text
        outcome = await _run_job(client, await client.post(
            f"/failed/group/{by_queue['public.shipping'][0]}/retry?by=queue", data=console.csrf))
    assert group.count('<a href="/message/') == 3
    assert outcome == "3 retried"
    assert await db.depth("shipping") == 3
    assert await db.depth("billing") == 0
    assert {name: n for name, (_, n) in (await _groups(console)).items()} == {
        "builtins.TimeoutError": 3}


async def test_a_group_retry_keeps_what_cannot_go_back_and_says_why(
    console: Console, db: PostgresTransport
) -> None:
    await _plant_two_groups(db)
    await db.drop_queue("billing")  # the FailedQ of the TimeoutError group is gone
    key = (await _groups(console))["builtins.TimeoutError"][0]
    async with console.client() as client:
        outcome = await _run_job(
            client, await client.post(f"/failed/group/{key}/retry", data=console.csrf))
    assert outcome.startswith("0 retried; 3 stayed: ")
    assert "public.billing does not exist" in outcome
    assert await db.depth("error") == 5  # nothing lost
    assert (await _groups(console))["builtins.TimeoutError"][1] == 3


async def test_a_post_without_the_csrf_token_is_refused(
    console: Console, db: PostgresTransport
) -> None:
    await _plant_two_groups(db)
    key = (await _groups(console))["builtins.KeyError"][0]
    async with console.client() as client:
        assert (await client.post(f"/failed/group/{key}/retry")).status_code == 403
        assert (await client.post(f"/failed/group/{key}/retry",
                                  data={"csrf": "0" * 64})).status_code == 403
    assert await db.depth("error") == 5
    assert await db.depth("shipping") == 0
    assert await db.pool.fetchval("SELECT count(*) FROM console_actions") == 0


async def test_read_only_refuses_actions_and_shows_no_buttons(
    read_only_console: Console, db: PostgresTransport
) -> None:
    await _plant_two_groups(db)
    groups = await _groups(read_only_console)
    async with read_only_console.client() as client:
        page = (await client.get("/failed")).text
        refused = await client.post(f"/failed/group/{groups['builtins.KeyError'][0]}/retry",
                                    data=read_only_console.csrf)
    assert "Retry group" not in page
    assert "read-only" in page
    assert refused.status_code == 403
    assert await db.depth("error") == 5


async def test_archive_and_restore_a_message(console: Console, db: PostgresTransport) -> None:
    [first, *_] = await _plant_two_groups(db)
    async with console.client() as client:
        await client.post(f"/message/{first}/archive", data=console.csrf)
        assert await db.depth("error") == 4
        archived = (await client.get(f"/message/{first}")).text
        assert "archived" in archived
        assert "Restore" in archived
        assert str(first) in (await client.get("/archive")).text
        await client.post(f"/message/{first}/restore", data=console.csrf)
        assert await db.depth("error") == 5
        assert (await _groups(console))["builtins.TimeoutError"][1] == 3
        log = (await client.get("/actions")).text
    assert "1 archived" in log
    assert "1 restored" in log


async def test_hostile_type_names_and_bodies_are_escaped(
    console: Console, db: PostgresTransport
) -> None:
    hostile = '<script>alert("type")</script><img src=x onerror=alert(1)>'
    planted = await plant_failed(
        db, "billing", Invoice(f"<img src=x onerror=alert(2)>{hostile}"),
        "<script>alert('exc')</script>", "<img src=x onerror=alert(3)>",
        headers={Headers.ENCLOSED_MESSAGE_TYPES: hostile})
    async with console.client() as client:
        pages = [(await client.get(path)).text for path in (
            "/failed", f"/message/{planted.native_id}", "/messages?q=%3Cscript%3E")]
        key = (await _groups(console))["&lt;script&gt;alert(&#39;exc&#39;)&lt;/script&gt;"][0]
        pages.append((await client.get(f"/failed/group/{key}")).text)
    for html in pages:
        assert "<script>alert" not in html
        assert "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(2)&gt;" in pages[1]  # the body, as text


async def test_endpoints_page_shows_queue_lengths(console: Console, db: PostgresTransport) -> None:
    await _plant_two_groups(db)
    async with console.client() as client:
        html = (await client.get("/endpoints")).text
    assert re.search(r'<td class="name">public\.error</td><td class="length">5</td>', html)
    assert re.search(r'<td class="name">public\.billing</td><td class="length">0</td>', html)


async def test_a_conversation_draws_its_endpoints_as_lanes(
    console: Console, db: PostgresTransport
) -> None:
    conversation = str(uuid.uuid4())
    await plant_failed(db, "billing", Invoice("c1"), "builtins.ValueError", "bad",
                       conversation_id=conversation)
    await _groups(console)  # the failed-messages page records the error queue
    async with console.client() as client:
        html = (await client.get(f"/conversation/{conversation}")).text
    lanes = re.findall(r'<g class="lane"><text[^>]*>([^<]*)</text>', html)
    assert lanes == ["sales", "billing"]
    assert 'class="arrow failed"' in html
    assert "Invoice" in html


async def test_endpoints_page_charts_the_audit_log_per_minute(
    console: Console, db: PostgresTransport
) -> None:
    # audit_log exists: the console created it (ingestion's tables) before it served.
    await db.pool.execute("""
        INSERT INTO audit_log (message_id, processing_endpoint, processing_ended,
                               processing_time_ms, critical_time_ms, body_size, retries, headers)
        SELECT 'm' || i, 'billing', now() - (i % 3) * interval '1 minute', i % 3 + 1,
               10 * (i % 3 + 1), 0, 0, '{}'
        FROM generate_series(1, 30) AS i""")
    async with console.client() as client:
        html = (await client.get("/endpoints")).text
    row = re.search(r"<td class=\"name\">public\.billing</td>.*?</tr>", html, re.S)
    assert row is not None
    assert '<td class="handled">30</td>' in row.group()
    assert '<td class="processing-ms">2.0</td>' in row.group()  # 1, 2 and 3 ms, 10 each
    assert '<td class="critical-ms">20.0</td>' in row.group()
    assert "<polyline" in row.group()
    assert "peak 10 msg/min" in row.group()  # 30 messages over 3 minutes
    assert "peak 30 ms" in row.group()
    assert peak(row.group(), "throughput") == 10.0
    assert peak(row.group(), "processing") == 3.0
    assert peak(row.group(), "critical") == 30.0


async def test_every_response_forbids_inline_scripts_and_framing(console: Console) -> None:
    async with console.client(authorised=False) as anonymous:
        refused = await anonymous.get("/failed")
    async with console.client() as client:
        page = await client.get("/endpoints")
        script = await client.get("/console.js")
    for response in (refused, page):
        policy = response.headers["content-security-policy"]
        assert "script-src 'self';" in policy
        assert "frame-ancestors 'none'" in policy
        assert response.headers["referrer-policy"] == "no-referrer"
    assert "onsubmit" not in page.text  # no inline handler: the confirmation is console.js
    assert script.status_code == 200
    assert "confirm" in script.text


async def test_the_report_is_served_from_its_directory_and_only_its_plots(
    report_console: Console, console: Console
) -> None:
    async with report_console.client() as client:
        page = await client.get("/report/")
        plot = await client.get("/report/plots/throughput.png")
        outside = {path: (await client.get(path)).status_code for path in (
            "/report/plots/..%2Fsecret.png", "/report/plots/../secret.png",
            "/report/plots/%2e%2e%2fsecret.png", "/report/plots/..%5Csecret.png",
            "/report/plots/%2e%2e%2f%2e%2e%2foutside.html", "/report/..%2F..%2Foutside.html",
            "/report/secret.png", "/report/plots/throughput.png%00.html",
            "/report/plots/leak.png",  # a link in the plots folder to a file outside it
            "/report/plots/missing.png")}
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<img src="plots/throughput.png" alt="Throughput">' in page.text
    assert plot.status_code == 200
    assert plot.headers["content-type"] == "image/png"
    assert set(outside.values()) == {404}, outside
    async with console.client() as client:
        none = await client.get("/report/")
    assert none.status_code == 404
    assert "--report DIR" in none.text


async def test_the_served_report_escapes_hostile_names(report_console: Console) -> None:
    async with report_console.client() as client:
        page = (await client.get("/report/")).text
    assert HOSTILE_ENDPOINT not in page
    assert "&lt;script&gt;alert(&#39;report&#39;)&lt;/script&gt;" in page
    assert "<script" not in page


async def test_deployments_come_from_heartbeats_and_an_old_one_is_silent(
    console: Console, db: PostgresTransport
) -> None:
    async with db.pool.acquire() as connection:
        await create_heartbeats_table(connection, "public")
    await db.pool.execute("""
        INSERT INTO endpoint_heartbeats (endpoint, deployment_id, host, state,
            receivers_by_node, processed, failed, estimate, last_seen)
        VALUES ('billing', 'aaaa', 'node-1', 'running', '{"n1": 2}', 7, 1, 0, now()),
               ('shipping', 'bbbb', 'node-2', 'running', '{}', 0, 0, 3,
                now() - interval '1 minute'),
               ('sales', 'cccc', 'node-2', 'stopped', '{}', 5, 0, 0,
                now() - interval '1 hour')""")
    async with console.client() as client:
        html = (await client.get("/endpoints")).text
    states = dict(re.findall(r'<tr class="deployment"><td>(\w+)</td>.*?<td class="state">(\w+)',
                             html, re.S))
    assert states == {"billing": "running", "shipping": "silent", "sales": "stopped"}
    assert '<td class="receivers">2 on n1</td>' in html


async def test_a_poison_message_shows_its_raw_headers_as_text(
    console: Console, db: PostgresTransport
) -> None:
    native_id = uuid.uuid4()
    raw = '{"NServiceBus.EnclosedMessageTypes": "<script>alert(1)</script>", broken'
    await sending.send_raw(db.pool, db.address("error"), native_id, raw, b"\xff\xfe<b>")
    groups = await _groups(console)
    assert groups["(none)"][1] == 1  # recorded, grouped with no exception
    async with console.client() as client:
        html = (await client.get(f"/message/{native_id}")).text
        retry = await client.post(f"/message/{native_id}/retry", data=console.csrf)
        log = (await client.get("/actions")).text
    assert "The headers do not parse" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert" not in html
    assert "not UTF-8" in html  # the body, in hex
    assert retry.status_code == 303
    assert "0 retried; 1 stayed" in log
    assert "headers that do not parse" in log
    assert await db.depth("error") == 1  # it stays, nothing lost


async def test_search_the_audit_log_by_id_conversation_type_prefix_and_time(
    console: Console, db: PostgresTransport
) -> None:
    await db.pool.execute("""
        INSERT INTO audit_log (message_id, message_type, conversation_id, processing_endpoint,
                               processing_ended, body_size, retries, headers)
        VALUES ('m1', 'shop.messages:PlaceOrder', 'conv-a', 'sales', '2026-01-01 10:00Z', 0, 0,
                '{}'),
               ('m2', 'shop.messages:BillOrder', 'conv-a', 'billing', '2026-01-01 11:00Z', 0,
                0, '{}'),
               ('m3', 'shop.messages:PlaceOrder_2', 'conv-b', 'sales', '2026-01-02 10:00Z', 0,
                0, '{}')""")

    async def found(query: str) -> list[str]:
        async with console.client() as client:
            html = (await client.get(f"/messages?{query}")).text
        return re.findall(r'<tr class="found"><td>(\w+)</td>', html)

    assert await found("q=m2") == ["m2"]
    assert await found("q=conv-a") == ["m2", "m1"]  # newest first
    assert await found("q=shop.messages:PlaceOrder") == ["m3", "m1"]  # a prefix
    assert await found("q=shop.messages:PlaceOrder_") == ["m3"]  # no LIKE wildcard
    assert await found("since=2026-01-01T10:30&until=2026-01-02T00:00") == ["m2"]
    assert await found("q=conv-a&since=2026-01-01T10:30") == ["m2"]
    assert await found("q=") == []
    async with console.client() as client:
        bad = await client.get("/messages?since=yesterday")
    assert bad.status_code == 400
    assert "YYYY-MM-DDTHH:MM" in bad.text


async def test_a_conversation_draws_sends_publishes_replies_and_failures_in_order(
    console: Console, db: PostgresTransport
) -> None:
    await db.pool.execute("""
        INSERT INTO audit_log (message_id, message_type, intent, sending_endpoint,
            processing_endpoint, conversation_id, time_sent, processing_ended, body_size,
            retries, headers)
        VALUES ('1', 'shop:PlaceOrder', 'Send', 'web', 'sales', 'flow', '2026-01-01 10:00Z',
                '2026-01-01 10:00:01Z', 0, 0, '{}'),
               ('2', 'shop:OrderPlaced', 'Publish', 'sales', 'billing', 'flow',
                '2026-01-01 10:00:02Z', '2026-01-01 10:00:03Z', 0, 0, '{}'),
               ('3', 'shop:OrderReceived', 'Reply', 'sales', 'web', 'flow',
                '2026-01-01 10:00:04Z', '2026-01-01 10:00:05Z', 0, 0, '{}')""")
    await plant_failed(db, "shipping", Invoice("late"), "builtins.ValueError", "bad",
                       conversation_id="flow")
    await _groups(console)  # records the failure into error_log
    async with console.client() as client:
        html = (await client.get("/conversation/flow")).text
    lanes = re.findall(r'<g class="lane"><text[^>]*>([^<]*)</text>', html)
    assert lanes == ["web", "sales", "billing", "shipping"]
    labels = re.findall(r'<text x="\d+" y="\d+" text-anchor="middle">(?:<a [^>]*>)?([^<]*)',
                        html)
    assert labels == ["PlaceOrder (Send)", "OrderPlaced (Publish)", "OrderReceived (Reply)",
                      "Invoice (Send) ✗ failed"]
    assert html.count('class="arrow failed"') == 1
