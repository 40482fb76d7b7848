"""An open-loop sender in C: pgbench at a fixed rate, inserting the runtime's own rows.

The Python open-loop sender (:func:`benchmarks.scaleout.peers.base.send_at_rate`) needs about
as much CPU per send as the receiver needs per message, on the same two cores as PostgreSQL
and the deployment; at half a drain's peak it falls behind its schedule and the latency it
measures is mostly its own queue. pgbench's ``-R`` sends on a Poisson schedule from C, at a
small fraction of that CPU, and reports how far behind its schedule it fell (``schedule lag``).

Each pgbench transaction is one autocommitted INSERT of one message into the queue table, as
the runtime's ``send`` statement makes it: a fresh UUID as row id and as the message, conversation
and correlation ids in the headers (the headers of a message made by the runtime's sender,
with those ids and the time sent replaced), and the JSON body of a
:class:`~benchmarks.scaleout.endpoints.Job` whose ``sent_at`` is the INSERT's
``clock_timestamp()``: send-to-handler-start starts at the send statement, not at the
scheduled moment (pgbench's schedule lag is reported beside it).
"""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.scaleout.endpoints import Job
from benchmarks.scaleout.limits import pgbench_binary, pgbench_connection_args
from benchmarks.scaleout.peers.base import SETTLE_S
from benchmarks.scaleout.peers.sink import random_body
from benchmarks.scaleout.runtime_sides import Deployed, RuntimeSide, wait_for_rows
from benchmarks.scaleout.side import DrainResult, LatencyResult, Load
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.transport.sending import encode_headers

CLIENTS = 8
"""pgbench clients (sends in flight at once), as many as the Python sender's."""
PLACEHOLDER_ID = "00000000-0000-4000-8000-000000000000"
PLACEHOLDER_TIME = "scaleout-time-sent"  # no colon: see SEND_SCRIPT

# Headers, body and the time format travel base64-encoded: pgbench reads ``:name`` in a
# script as a variable, and they have colons. No other colon is in the statement but the
# casts' (``::``, which pgbench leaves alone).
SEND_SCRIPT = """INSERT INTO {queue} (id, expires, headers, body)
SELECT m.id, NULL,
       replace(replace(convert_from(decode('{headers}', 'base64'), 'UTF8'),
                       '{placeholder_id}', m.id::text),
               '{placeholder_time}',
               to_char(clock_timestamp() AT TIME ZONE 'UTC',
                       convert_from(decode('{time_format}', 'base64'), 'UTF8'))),
       convert_to(json_build_object('key', nextval('scaleout_keys'),
                                    'sent_at', extract(epoch FROM clock_timestamp())::float8,
                                    'body', convert_from(decode('{body}', 'base64'), 'UTF8'))::text,
                  'UTF8')
FROM (SELECT gen_random_uuid() AS id) AS m;
"""


def send_script(queue: str, body_bytes: int) -> str:
    """The pgbench script that sends one message into ``queue`` (its qualified name)."""
    message = create_outgoing(Job(0, 0.0, ""), originating_endpoint="scaleout")
    headers = {**message.headers, "NServiceBus.TimeSent": PLACEHOLDER_TIME}
    headers_text = encode_headers(headers).replace(message.message_id, PLACEHOLDER_ID)
    return SEND_SCRIPT.format(
        queue=queue, placeholder_id=PLACEHOLDER_ID, placeholder_time=PLACEHOLDER_TIME,
        headers=base64.b64encode(headers_text.encode()).decode(),
        time_format=base64.b64encode(b"YYYY-MM-DD HH24:MI:SS:US Z").decode(),
        body=base64.b64encode(random_body(body_bytes)).decode())


def parse_pgbench(output: str) -> dict[str, float]:
    """Transactions processed and the schedule lag (average and maximum, ms) of a run."""
    figures: dict[str, float] = {}
    processed = re.search(r"number of transactions actually processed: (\d+)", output)
    if processed:
        figures["sent"] = float(processed.group(1))
    lag = re.search(r"rate limit schedule lag: avg ([\d.]+) \(max ([\d.]+)\) ms", output)
    if lag:
        figures["schedule_lag_avg_ms"] = float(lag.group(1))
        figures["schedule_lag_max_ms"] = float(lag.group(2))
    return figures


def run_pgbench(running: Deployed, body_bytes: int, rate_per_s: float | None,
                seconds: float) -> dict[str, float]:
    """pgbench sending at ``rate_per_s`` (None: as fast as it can) for ``seconds``
    (blocking); its figures."""
    connection, database = pgbench_connection_args(running.dsn)
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(send_script(running.queue.qualified, body_bytes))
        script.flush()
        rate = [] if rate_per_s is None else ["-R", f"{rate_per_s:.1f}"]
        command = [pgbench_binary(), *connection, "-n", "-M", "prepared", "-c", str(CLIENTS),
                   "-j", "2", *rate, "-T", str(max(1, round(seconds))), "-f", script.name,
                   database]
        finished = subprocess.run(command, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        raise RuntimeError(f"pgbench sender failed: {finished.stderr.strip()[-500:]}")
    return parse_pgbench(finished.stdout)


@dataclass
class PgbenchSenderSide:
    """A runtime side whose open-loop messages come from pgbench (drains: the side's own)."""

    runtime: RuntimeSide

    @property
    def name(self) -> str:
        return f"{self.runtime.name}_pgbench_sender"

    @property
    def config(self) -> dict[str, Any]:
        return {**self.runtime.config, "sender": "pgbench", "clients": CLIENTS}

    async def drain(self, dsn: str, load: Load) -> DrainResult:
        return await self.runtime.drain(dsn, load)

    async def peak(self, dsn: str, load: Load, seconds: float) -> float:
        """The side's peak with sends and receives together: pgbench sends as fast as it can
        for ``seconds`` while the deployment handles; messages over the time from the first
        send to the last sink row. (A drain's peak leaves out the sends' own commits, which
        an open loop adds on the same server.)"""
        async with self.runtime.deployed(dsn, load) as running:
            await running.pool.execute("CREATE SEQUENCE scaleout_keys")
            started = time.perf_counter()
            figures = await asyncio.to_thread(run_pgbench, running, load.body_bytes, None,
                                              seconds)
            sent = int(figures.get("sent", 0))
            done = await wait_for_rows(running.pool, sent, SETTLE_S)
        return sent / (done - started)

    async def open_loop(self, dsn: str, load: Load, rate_per_s: float,
                        seconds: float) -> LatencyResult:
        """pgbench sends at ``rate_per_s`` to the running deployment; latencies per message
        from the sink rows, pgbench's schedule lag in the config."""
        async with self.runtime.deployed(dsn, load) as running:
            await running.pool.execute("CREATE SEQUENCE scaleout_keys")
            figures = await asyncio.to_thread(run_pgbench, running, load.body_bytes,
                                              rate_per_s, seconds)
            sent = int(figures.pop("sent", 0))
            await wait_for_rows(running.pool, sent, SETTLE_S)
            await running.stop()
            handled, _ = await running.counted()
            to_start, to_done = await running.latencies()
        return LatencyResult(self.name, {**self.config, **figures}, rate_per_s, sent, handled,
                             to_start, to_done)
