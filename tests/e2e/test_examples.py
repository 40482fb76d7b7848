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
    # Console lines into a pipe: readable, and without colour codes (checked below).
    env = {**os.environ, "ENDPOINT_RUNTIME_DSN": dsn, "ENDPOINT_RUNTIME_LOG_FORMAT": "console"}
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_DEDUP_LOGS", "ENDPOINT_RUNTIME_LOG_COLORS"):
        env.pop(name, None)  # the examples start a local Ray of their own, with its defaults
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
    # Piped output a person can read: no colour codes, no Ray prefixes or deduplication
    # notices on the actors' lines, no Ray start-up notice; the actors' lines do arrive.
    both = out + err
    assert "\x1b" not in both, [line for line in both.splitlines() if "\x1b" in line][:3]
    assert not re.search(r"\((Peeker|Receiver)\w* pid=", both), both[:2000]
    assert "[repeated" not in both
    assert "Token authentication" not in both
    assert re.search(r"\breceiver_started\b.*\bendpoint=sales\b", both), both[:2000]
    # Commands go by route: the handlers name no queue (docs/routing.md).
    assert re.search(r"^routes \(by type; the handlers name no queue\): sales: "
                     r"AwardPoints -> loyalty, OrderAccepted -> billing; billing: "
                     r"OrderBilled -> shipping;", out, re.M), out[:2000]
    summary = out.split("== summary", 1)[1]
    for table in ("orders", "invoices", "shipments", "points", "reminded", "replies", "tenant"):
        assert re.search(rf"^{table}\s+{ORDERS} / {ORDERS}\b", summary, re.M), (table, summary)
    assert re.search(rf"^redelivered\s*{REDELIVERIES} / {REDELIVERIES}\b", summary, re.M), summary
    assert "redelivered AwardPoints reached no handler" in summary, summary
    assert "error queue: +1 this run (expected 1" in summary, summary
    # the saga: every fifth order is never paid and is cancelled by the saga's timeout
    assert re.search(r"^fulfilment\s+4 / 4\s+shipped, 1 / 1 cancelled, 0 running", summary,
                     re.M), summary
    assert f"OK: all {ORDERS} orders went through" in summary, summary
    # It ran against the test's database.
    connection = await asyncpg.connect(database_dsn)
    try:
        assert await connection.fetchval("SELECT count(*) FROM orders") == ORDERS
        assert await connection.fetchval(
            "SELECT count(*) FROM loyalty_points WHERE reminded_at IS NOT NULL") == ORDERS
    finally:
        await connection.close()
