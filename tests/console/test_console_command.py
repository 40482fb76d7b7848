"""``endpoint-runtime console`` as a user starts it: a process whose printed address works.

The address used to be printed before the server started (before its database connection
and tables, which on a first start of the embedded PostgreSQL take many seconds), so opening
it at once was refused. It is printed once the server accepts connections. Ctrl-C, the way a
console is stopped, ends it with status 0 and no traceback (uvicorn raised the signal again:
130 and a traceback before).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import httpx

from endpoint_runtime.connections.connecting import PostgresTransport
from tests.cluster.nodes import free_port

TOKEN = "command-token-93b1"
LINE_TIMEOUT = 60.0


async def test_the_printed_address_answers_at_once_and_ctrl_c_ends_the_console_cleanly(
        database_dsn: str, db: PostgresTransport) -> None:
    await db.create_queue("error")
    port = free_port()
    env = {**os.environ, "ENDPOINT_RUNTIME_DSN": database_dsn,
           "ENDPOINT_RUNTIME_CONSOLE_TOKEN": TOKEN}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "endpoint_runtime.cli", "console", "--port", str(port),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        async with asyncio.timeout(LINE_TIMEOUT):
            while not (line := (await process.stdout.readline()).decode()).startswith(
                    "console: "):
                assert line, "the console ended without printing its address"
        url = line.removeprefix("console: ").strip()
        assert url == f"http://127.0.0.1:{port}/?token={TOKEN}"
        async with httpx.AsyncClient(timeout=10, follow_redirects=True) as client:
            opened = await client.get(url)  # at once: no retry, no wait
        assert opened.status_code == 200, (opened.url, opened.text[-800:])
        assert "failed" in opened.text.lower()
        process.send_signal(signal.SIGINT)  # Ctrl-C: the console's normal end
        async with asyncio.timeout(20):
            _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()[-2000:]
        assert b"Traceback" not in stderr, stderr.decode()[-2000:]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(20):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
