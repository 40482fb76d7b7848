"""Console fixtures: the console served by uvicorn on a free port of 127.0.0.1, in the test's
event loop, over the test's database; failed messages planted the way recoverability moves
them (``move_failed``)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import msgspec
import pytest
import uvicorn

from endpoint_runtime import TransportSettings
from endpoint_runtime.analytics.page import render
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.error_queue import move_failed
from endpoint_runtime.chain.recoverability.policy import Failure
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.console import create_app
from endpoint_runtime.console.security import CSRF_FIELD, csrf_token
from endpoint_runtime.wire.messages import TransportMessage

TOKEN = "test-token-5f2c"
STARTUP_TIMEOUT = 10.0


class Console(msgspec.Struct):
    url: str
    token: str

    @property
    def csrf(self) -> dict[str, str]:
        return {CSRF_FIELD: csrf_token(self.token)}

    def client(self, *, authorised: bool = True) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.token}"} if authorised else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def serve(
    dsn: str, *, read_only: bool = False, report: Path | None = None,
) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    app = create_app(TransportSettings(dsn=dsn), TOKEN, read_only=read_only, report=report)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(STARTUP_TIMEOUT):
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
            await asyncio.sleep(0.02)
    return server, task


async def _stop(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    server.should_exit = True
    await asyncio.wait_for(task, STARTUP_TIMEOUT)


@pytest.fixture
async def console(database_dsn: str) -> AsyncIterator[Console]:
    server, task = await serve(database_dsn)
    yield Console(f"http://127.0.0.1:{server.config.port}", TOKEN)
    await _stop(server, task)


@pytest.fixture
async def read_only_console(database_dsn: str) -> AsyncIterator[Console]:
    server, task = await serve(database_dsn, read_only=True)
    yield Console(f"http://127.0.0.1:{server.config.port}", TOKEN)
    await _stop(server, task)


HOSTILE_ENDPOINT = "<script>alert('report')</script>"
SAMPLE_PLOT = Path(__file__).resolve().parents[2] / "docs" / "report" / "plots" / "throughput.png"
"""A plot the report drew (docs/report: the 1M-row benchmark's report)."""


@pytest.fixture
async def report_console(database_dsn: str, tmp_path: Path) -> AsyncIterator[Console]:
    """A console serving a report page rendered by the report's own code (an endpoint with
    a hostile name) in ``tmp_path/report``, one plot, and files outside the plots folder: a
    ``secret.png`` beside the report, a ``leak.png`` in the plots folder linking to it."""
    report = tmp_path / "report"
    (report / "plots").mkdir(parents=True)
    (report / "report.html").write_text(render(
        title="endpoint-runtime report", window="the last hour", generated=datetime.now(UTC),
        facts=[("audit rows read", "3")],
        summary=[{"endpoint": HOSTILE_ENDPOINT, "message_type": None, "processed": 3,
                  "failed": 0, "failure_rate": 0.0, "per_second": 0.1, "retries": 0,
                  **{f"{m}_{p}": 1.0 for m in ("processing_ms", "critical_ms")
                     for p in ("p50", "p95", "p99")}}],
        exceptions=[], edges=[], slowest=[], plots={"Throughput": "plots/throughput.png"}))
    (report / "plots" / "throughput.png").write_bytes(SAMPLE_PLOT.read_bytes())
    (report / "secret.png").write_bytes(b"not a plot")
    (tmp_path / "outside.html").write_text("not the report")
    (report / "plots" / "leak.png").symlink_to(report / "secret.png")
    server, task = await serve(database_dsn, report=report)
    yield Console(f"http://127.0.0.1:{server.config.port}", TOKEN)
    await _stop(server, task)


@pytest.fixture
async def db(database_dsn: str) -> AsyncIterator[PostgresTransport]:
    async with PostgresTransport.connect(TransportSettings(dsn=database_dsn)) as transport:
        for name in ("error", "billing", "shipping"):
            await transport.create_queue(name)
        yield transport


async def plant_failed(
    db: PostgresTransport, queue: str, message: msgspec.Struct, exception_type: str,
    text: str, *, conversation_id: str | None = None, headers: dict[str, str] | None = None,
) -> TransportMessage:
    """Send ``message`` to ``queue``, take it off and move it to the error queue as the
    recoverability step does; returns it as it was received (its native id is the one the
    retry restores)."""
    outgoing = create_outgoing(message, originating_endpoint="sales",
                               conversation_id=conversation_id, headers=headers)
    await db.send(queue, outgoing)
    received = await db.receive(queue)
    assert isinstance(received, TransportMessage)
    failure = Failure(attempts=1, exception_type=exception_type, inner_exception_type="",
                      message=text, source="tests", stack_trace=f"Traceback: {text}",
                      unrecoverable=False)
    await move_failed(db.pool, db.address("error"), received, failure, str(db.address(queue)),
                      queue)
    return received
