"""The example order flow (``bin/dev examples``) end to end, as a subprocess against the test's
database, with a small order count: every endpoint, the outbox, delayed delivery and the
error queue in one run, checked through the summary it prints and the rows it wrote."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import asyncpg
import pytest

pytestmark = pytest.mark.ray

ORDERS = 5
REDELIVERIES = 2
FLOW_TIMEOUT = 120  # the examples' own --timeout: they exit 1 when the flow is not done
ROOT = Path(__file__).resolve().parents[2]


async def run_examples(dsn: str) -> tuple[int, str, str]:
    env = {**os.environ, "ENDPOINT_RUNTIME_DSN": dsn}
    env.pop("RAY_ADDRESS", None)  # the examples start a local Ray of their own
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "handlers_examples", "--orders", str(ORDERS),
        "--invalid-orders", "1", "--redeliveries", str(REDELIVERIES),
        "--timeout", str(FLOW_TIMEOUT),
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        # Start-up of Ray and five endpoints, the flow, the graceful stop: a margin on top.
        out, err = await asyncio.wait_for(process.communicate(), timeout=FLOW_TIMEOUT + 120)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_example_flow_completes_and_its_summary_says_so(database_dsn: str) -> None:
    status, out, err = await run_examples(database_dsn)

    assert status == 0, f"exit status {status}\n{out}\n{err[-4000:]}"
    summary = out.split("== summary", 1)[1]
    for table in ("orders", "invoices", "shipments", "points", "reminded", "replies"):
        assert re.search(rf"^{table}\s+{ORDERS} / {ORDERS}\b", summary, re.M), (table, summary)
    assert re.search(rf"^redelivered\s*{REDELIVERIES} / {REDELIVERIES}\b", summary, re.M), summary
    assert "redelivered AwardPoints reached no handler" in summary, summary
    assert "error queue: +1 this run (expected 1" in summary, summary
    assert f"OK: all {ORDERS} orders went through" in summary, summary
    # It ran against the test's database.
    connection = await asyncpg.connect(database_dsn)
    try:
        assert await connection.fetchval("SELECT count(*) FROM orders") == ORDERS
        assert await connection.fetchval(
            "SELECT count(*) FROM loyalty_points WHERE reminded_at IS NOT NULL") == ORDERS
    finally:
        await connection.close()
