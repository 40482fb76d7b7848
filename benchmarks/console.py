"""How fast the console's pages are with 1M audit rows and 100k failed messages.

One throwaway database: ``--audit-rows`` rows in ``audit_log`` (spread over 30 days, 10
endpoints, conversations of 5 messages), ``--failed`` messages in the error queue (20
exception types x 5 messages each, failed in 10 queues) with the headers recoverability
writes; for the endpoints page each endpoint has a delayed store (``--delayed`` messages),
a heartbeat with a day of queue lengths per minute, a subscription (and one more pointing
nowhere) and a saga table of ``--sagas`` instances. The console runs in this process
(uvicorn on 127.0.0.1, one httpx client): each page is loaded ``--loads`` times (after one
warm-up load); the baseline is the same page's database calls (the console's
``ConsoleData`` methods the page makes: its SQL, with the rows decoded) timed alone in the
same run, so ``ratio`` = page p95 / its queries' p95 says what HTTP and the templates add.
The target of the issue is a p95 under 300 ms for every page.

The first page that reads failed messages records the error queue into ``error_log`` (the
ingestion's scan); that one-off cost is reported apart (``first_recording_s``).

Run ``python -m benchmarks.console --help``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import uvicorn

from benchmarks.common import percentile, progress, run_benchmark, throwaway_database
from endpoint_runtime.chain.sagas.storage import SagaTable
from endpoint_runtime.chain.subscriptions import subscription_store
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.console import create_app
from endpoint_runtime.console.storage import ConsoleData
from endpoint_runtime.delayed.postgres import PostgresDelayedMessageStore
from endpoint_runtime.runtime.heartbeats import create_heartbeats_table
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress

TOKEN = "bench"
QUEUES = 10
EXCEPTIONS = 20
TYPES = 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.console",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="server (default: the usual resolution)")
    parser.add_argument("--audit-rows", type=int, default=1_000_000)
    parser.add_argument("--failed", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=20, help="loads of each page (20)")
    parser.add_argument("--delayed", type=int, default=10_000,
                        help="delayed messages per endpoint (10,000)")
    parser.add_argument("--sagas", type=int, default=10_000,
                        help="live saga instances per endpoint (10,000)")
    parser.add_argument("--quick", action="store_true",
                        help="100k audit rows, 10k failed messages, 10 loads; not kept")
    args = parser.parse_args(argv)
    if args.quick:
        args.audit_rows, args.failed, args.loads = 100_000, 10_000, 10
    return args


async def load_data(transport: PostgresTransport, audit_rows: int, failed: int) -> None:
    pool = transport.pool
    for n in range(QUEUES):
        await transport.create_queue(f"queue{n}")
    await pool.execute("""
        INSERT INTO audit_log (message_id, message_type, intent, sending_endpoint,
            processing_endpoint, conversation_id, time_sent, processing_started,
            processing_ended, processing_time_ms, critical_time_ms, body_size, retries, headers)
        SELECT 'm' || i, 'shop.messages:Type' || (i % 7), 'Send', 'queue' || ((i + 1) % 10),
               'queue' || (i % 10), 'c' || (i / 5),
               now() - (i * interval '30 days' / $1) - interval '50 ms',
               now() - (i * interval '30 days' / $1) - interval '10 ms',
               now() - (i * interval '30 days' / $1), 10, 50, 100, 0, '{}'
        FROM generate_series(1, $1::bigint) AS i""", audit_rows)
    await pool.execute("""
        INSERT INTO error (id, expires, headers, body)
        SELECT gen_random_uuid(), NULL, json_build_object(
            'NServiceBus.MessageId', 'f' || i,
            'NServiceBus.EnclosedMessageTypes', 'shop.messages:Type' || (i % $3),
            'NServiceBus.ConversationId', 'c' || i,
            'NServiceBus.FailedQ', 'public.queue' || (i % 10),
            'NServiceBus.ExceptionInfo.ExceptionType', 'shop.errors.Error' || (i % $2),
            'NServiceBus.ExceptionInfo.Message', 'failure number ' || (i % $2),
            'NServiceBus.ExceptionInfo.StackTrace', repeat('  File "shop.py", line 1\n', 20),
            'NServiceBus.TimeOfFailure',
                to_char((now() - i * interval '1 second') AT TIME ZONE 'UTC',
                        'YYYY-MM-DD HH24:MI:SS:US') || ' Z'
        )::text, convert_to('{"order": ' || i || '}', 'UTF8')
        FROM generate_series(1, $1::bigint) AS i""", failed, EXCEPTIONS, TYPES)
    await pool.execute("ANALYZE")


async def load_endpoints(transport: PostgresTransport, delayed: int, sagas: int) -> None:
    """What the endpoints page reads besides queues and the audit log, per endpoint."""
    pool = transport.pool
    store = subscription_store(transport.settings)
    async with pool.acquire() as connection:
        await create_heartbeats_table(connection, "public")
        await store.setup(connection)
        for n in range(QUEUES):
            queue = transport.address(f"queue{n}")
            delayed_store = PostgresDelayedMessageStore.for_endpoint(queue)
            await delayed_store.setup_infrastructure(connection)
            await connection.execute(
                f"INSERT INTO {delayed_store.table.qualified} (id, destination, due, headers, "
                "body) SELECT gen_random_uuid(), $1, now() + i * interval '1 second', '{}', "
                "'' FROM generate_series(1, $2::bigint) AS i", str(queue), delayed)
            saga = SagaTable(QueueAddress(f"queue{n}_OrderSaga"), "order_id", str)
            await saga.setup(connection)
            await connection.execute(
                f'INSERT INTO {saga.address.qualified} ("Id", "Metadata", "Data", '
                '"PersistenceVersion", "SagaTypeVersion", "Concurrency", '
                '"Correlation_order_id") SELECT gen_random_uuid(), \'{}\', \'{}\', \'1\', '
                "'1', 1, 'o' || i FROM generate_series(1, $1::bigint) AS i", sagas)
            await store.subscribe(connection, queue, f"queue{n}", f"shop.events:Event{n}")
            await store.subscribe(connection, QueueAddress(f"gone{n}"), f"gone{n}",
                                  f"shop.events:Event{n}")
        await connection.execute(
            "INSERT INTO endpoint_queue_lengths (endpoint, minute, length) "
            "SELECT 'queue' || n, date_trunc('minute', now()) - m * interval '1 minute', m % 50 "
            "FROM generate_series(0, $1 - 1) AS n, generate_series(0, 24 * 60 - 1) AS m",
            QUEUES)
        await connection.execute(
            "INSERT INTO endpoint_heartbeats (endpoint, deployment_id, host, state, "
            "receivers_by_node, processed, failed, estimate) SELECT 'queue' || n, 'd' || n, "
            "'node', 'running', '{\"n1\": 2}', 1000, 1, 0 FROM generate_series(0, $1 - 1) AS n",
            QUEUES)
    await pool.execute("ANALYZE")


async def endpoints_page(data: ConsoleData) -> None:
    """The database calls of the endpoints page."""
    await data.endpoints()
    await data.deployments()
    await data.subscriptions()
    await data.sagas()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def p95(call: Callable[[], Awaitable[Any]], loads: int) -> float:
    await call()  # warm-up
    times = []
    for _ in range(loads):
        began = time.perf_counter()
        await call()
        times.append((time.perf_counter() - began) * 1000)
    return percentile(times, 95.0)


async def measure(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    settings = TransportSettings(dsn=dsn)
    async with PostgresTransport.connect(settings) as transport:
        data = ConsoleData(transport)
        await transport.create_queue("error")
        await data.setup()
        progress(f"loading {args.audit_rows} audit rows and {args.failed} failed messages")
        began = time.perf_counter()
        await load_data(transport, args.audit_rows, args.failed)
        await load_endpoints(transport, args.delayed, args.sagas)
        progress(f"loaded in {time.perf_counter() - began:.1f} s")
        began = time.perf_counter()
        await data.record()
        first_recording = time.perf_counter() - began
        await transport.pool.execute("ANALYZE")
        group = (await data.groups())[0]["key"]
        message = (await data.group_messages(group))[0]["native_id"]

        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(settings, TOKEN), host="127.0.0.1",
                                               port=port, log_level="warning"))
        task = asyncio.create_task(server.serve())
        async with asyncio.timeout(30):
            while not server.started:
                if task.done():
                    task.result()  # raises what stopped it
                await asyncio.sleep(0.05)
        pages: dict[str, tuple[str, Callable[[], Awaitable[Any]]]] = {
            "failed": ("/failed", data.groups),
            "group": (f"/failed/group/{group}", lambda: data.group_messages(group)),
            "message": (f"/message/{message}", lambda: data.message(message)),
            "endpoints": ("/endpoints", lambda: endpoints_page(data)),
            "search": ("/messages?q=c1234", lambda: data.search("c1234")),
            "conversation": ("/conversation/c1234", lambda: data.conversation("c1234")),
            "actions": ("/actions", data.action_log),
        }
        results: dict[str, Any] = {}
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as web:
                for name, (path, queries) in pages.items():

                    async def load(path: str = path) -> None:
                        response = await web.get(path)
                        response.raise_for_status()

                    page_p95 = await p95(load, args.loads)
                    query_p95 = await p95(queries, args.loads)
                    results[name] = {"page_p95_ms": round(page_p95, 1),
                                     "queries_p95_ms": round(query_p95, 1),
                                     "ratio": round(page_p95 / query_p95, 2)}
                    progress(f"{name}: {results[name]}")
        finally:
            server.should_exit = True
            await task
    return {"benchmark": "console", "audit_rows": args.audit_rows, "failed": args.failed,
            "delayed_per_endpoint": args.delayed, "sagas_per_endpoint": args.sagas,
            "loads": args.loads, "first_recording_s": round(first_recording, 2),
            "pages": results,
            "all_under_300_ms": all(r["page_p95_ms"] < 300 for r in results.values())}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = await asyncio.to_thread(resolve_dsn, args.dsn)
    async with throwaway_database(server, "er_bench_console") as name:
        return await measure(args, with_database(server, name))


if __name__ == "__main__":
    run_benchmark("console", parse_args, main)
