"""Endurance: a long backlog drained by one deployment, every receiver's RSS sampled.

A single-message atomic deployment (the mode with the most Python work per message) drains a
backlog of ``messages`` (1,000,000 in a full run). The backlog is written through the runtime's
sender in chunks, all in one transaction, so it becomes visible at once. Every
``sample_s`` the harness asks the peeker for its receivers' status (their PIDs and processed
counts: one Ray call per receiver, no message goes through Ray) and reads each receiver's
resident set size with psutil.

``rss_growth_pct`` is the largest growth over the receivers from their first sample after the
warm-up (``warmup_share`` of the backlog processed) to their last sample: a receiver that
leaks grows with the messages it handles, one that does not stays flat (the issue's target:
within 10%).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import psutil

from benchmarks.common import progress
from benchmarks.scaleout.endpoints import Job
from benchmarks.scaleout.peers.sink import random_body
from benchmarks.scaleout.runtime_sides import ATOMIC, Deployed, RuntimeSide
from benchmarks.scaleout.side import Load
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.transport import sending
from endpoint_runtime.wire.messages import OutgoingMessage

CHUNK = 1_000
"""Messages per send statement while the backlog is written."""
Sample = dict[str, Any]
"""One sample: ``t`` (s since the backlog became visible), ``processed``, ``rss_mb`` by PID."""


def chunked_messages(count: int, body_bytes: int,
                     sent_at: float) -> Iterator[list[OutgoingMessage]]:
    """The backlog as lists of ``CHUNK`` messages, made as they are sent (a million messages
    made at once would take gigabytes)."""
    body = random_body(body_bytes).decode()
    for start in range(0, count, CHUNK):
        yield [create_outgoing(Job(key, sent_at, body), originating_endpoint="scaleout")
               for key in range(start, min(count, start + CHUNK))]


async def write_backlog(running: Deployed, load: Load) -> float:
    """Send the backlog in one transaction; the time (perf_counter) it became visible."""
    async with running.pool.acquire() as connection, connection.transaction():
        for messages in chunked_messages(load.messages, load.body_bytes, running.clock.now()):
            await sending.send_many(connection, running.queue, messages)
    return time.perf_counter()


def resident_mb(pids: list[int]) -> dict[str, float]:
    """Each live PID's resident set size in MB (a receiver that exited is left out)."""
    sizes: dict[str, float] = {}
    for pid in pids:
        try:
            sizes[str(pid)] = round(psutil.Process(pid).memory_info().rss / 2**20, 1)
        except psutil.NoSuchProcess:
            continue
    return sizes


async def sample_until_drained(running: Deployed, load: Load, visible: float,
                               sample_s: float) -> list[Sample]:
    """Sample the receivers' RSS and the processed count until every message is processed
    and its sink row is there."""
    samples: list[Sample] = []
    deadline = visible + 120 + load.messages / 100
    while time.perf_counter() < deadline:
        status = await running.deployment.status(refresh=True)
        samples.append({"t": round(time.perf_counter() - visible, 2),
                        "processed": status.processed,
                        "rss_mb": resident_mb([r.pid for r in status.receivers])})
        if len(samples) % 30 == 0:
            progress(f"[endurance] {status.processed:,} of {load.messages:,} processed, "
                     f"receivers' RSS {samples[-1]['rss_mb']} MB")
        if status.processed >= load.messages and \
                await running.pool.fetchval("SELECT count(*) FROM scaleout_sink") >= load.messages:
            return samples
        await asyncio.sleep(sample_s)
    raise TimeoutError(f"endurance drain not done after {deadline - visible:.0f} s")


def rss_growth(samples: list[Sample], total: int, warmup_share: float) -> dict[str, Any]:
    """The receivers' RSS growth after warm-up: per PID, from its first sample at or past
    ``warmup_share * total`` processed to its last sample; the largest over the PIDs.

    Returns:
        ``rss_growth_pct`` (the largest, None without two samples after warm-up), the peak
        growth over any sample (``rss_peak_growth_pct``) and the first and last MB per PID.
    """
    after = [s for s in samples if s["processed"] >= warmup_share * total]
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    peak: dict[str, float] = {}
    for sample in after:
        for pid, mb in sample["rss_mb"].items():
            first.setdefault(pid, mb)
            last[pid] = mb
            peak[pid] = max(peak.get(pid, mb), mb)
    growth = [100.0 * (last[pid] - first[pid]) / first[pid] for pid in first if first[pid]]
    peaks = [100.0 * (peak[pid] - first[pid]) / first[pid] for pid in first if first[pid]]
    enough = len(after) >= 2 and bool(growth)
    return {"rss_growth_pct": round(max(growth), 2) if enough else None,
            "rss_peak_growth_pct": round(max(peaks), 2) if enough else None,
            "rss_first_mb": first, "rss_last_mb": last}


async def endurance(dsn: str, messages: int, concurrency: int = 4, sample_s: float = 1.0,
                    warmup_share: float = 0.1) -> dict[str, Any]:
    """Drain ``messages`` with one deployment, sampling its receivers' RSS; the figures."""
    load = Load(messages, concurrency)
    side = RuntimeSide("runtime_single", ATOMIC)
    async with side.deployed(dsn, load) as running:
        progress(f"[endurance] writing a backlog of {messages:,} messages")
        written = time.perf_counter()
        visible = await write_backlog(running, load)
        progress(f"[endurance] backlog visible after {visible - written:.0f} s; draining")
        samples = await sample_until_drained(running, load, visible, sample_s)
        seconds = time.perf_counter() - visible
        await running.stop()
        handled, duplicates = await running.counted()
    result = {"side": side.name, "config": side.config, "messages": messages,
              "seconds": round(seconds, 1), "msgs_per_s": round(handled / seconds, 1),
              "handled": handled, "duplicates": duplicates, "warmup_share": warmup_share,
              **rss_growth(samples, messages, warmup_share), "samples": samples}
    progress(f"[endurance] {handled:,} handled in {seconds:.0f} s, RSS growth after warm-up "
             f"{result['rss_growth_pct']}%")
    return result
