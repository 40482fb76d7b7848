"""The Spark report (``endpoint-runtime report``) over a generated audit set.

A realistic set goes straight into ``audit_log`` and ``error_log`` of a throwaway database
with COPY: six endpoints and seven message types in an order saga (web -> sales -> billing
and inventory -> shipping -> notifications and back to sales), a diurnal load over several
days, background failures and a 20-minute failure burst in billing (its messages and their
follow-ups never get processed), delayed retries, and 2% long conversations (a shipment
timeout of 10-120 minutes). Then the report runs in this process, Spark's start included
(the first, full run into an empty output: every row goes to the extract). Then
``--incremental-rows`` more rows (the next ones in processing order) are loaded and a
second, incremental run into the same output is timed as a process of its own (``python -m
endpoint_runtime.analytics``: Python, JVM and Spark start included). The last line of stdout
is JSON: ``rows``, ``wall_s`` (the first report; generation not counted), ``rows_per_s``,
``stages`` (seconds per stage), ``peak_driver_rss_mb`` (the Spark driver JVM's peak resident
set), ``peak_python_rss_mb``, ``incremental_rows``, ``incremental_wall_s`` and
``incremental_days`` (days recomputed); then as many rows again and a third run in this
process's warm Spark session, as a ``--follow`` round does: ``warm_incremental_wall_s``;
then as many again once the live mode's stream runs (``--follow``, a micro-batch a second):
``live_wall_s`` from their commit until their minutes are published (the stream's first
micro-batch with rows, which also plans its reads once), ``live_micro_batches_s``, the
micro-batches that read them, and ``live_micro_batch_phases_ms``, Spark's phases of each;
then as many again into the stream that now runs warm, as in a ``--follow`` session kept
running: the same figures named ``live_warm_*``.

Run ``python -m benchmarks.analytics --help``; the targets on the 2-core machine: 1M rows in
under 60 s, an incremental run over 10,000 new rows in under 20 s, or under 5 s into a
kept-warm ``--follow`` session (``live_warm_wall_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import psutil

from benchmarks import spark_profile
from benchmarks.common import progress, run_benchmark, throwaway_database
from endpoint_runtime.analytics.options import ReportOptions
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.ingestion.storage import AUDIT_FIELDS, ERROR_FIELDS, OperationalData
from endpoint_runtime.wire.failure_groups import FailureGroup, failure_group

QUICK_ROWS = 50_000
CHUNK = 100_000
MACHINES = ("app-1", "app-2", "app-3")


@dataclass(frozen=True)
class Step:
    parent: int | None
    sender: str
    receiver: str
    message_type: str
    processing_ms: float
    """Median processing time (log-normal around it)."""


# One order's saga; step 7 only happens in long conversations (a deferred timeout).
SAGA = (
    Step(None, "web", "sales", "Sales.PlaceOrder", 12.0),
    Step(0, "sales", "billing", "Sales.OrderPlaced", 35.0),
    Step(0, "sales", "inventory", "Sales.OrderPlaced", 8.0),
    Step(1, "billing", "shipping", "Billing.OrderBilled", 6.0),
    Step(2, "inventory", "shipping", "Inventory.StockReserved", 5.0),
    Step(3, "shipping", "notifications", "Shipping.OrderShipped", 20.0),
    Step(3, "shipping", "sales", "Shipping.OrderShipped", 4.0),
    Step(3, "shipping", "shipping", "Shipping.ShipmentTimeout", 3.0),
)
LONG_SHARE = 0.02
BASE_FAILURE = 0.002
BURST_FAILURE = 0.35
BURST_MINUTES = 20
EXCEPTIONS = {
    "billing": [("System.TimeoutException", "payment gateway timed out after 30000 ms")],
    "inventory": [("Inventory.OutOfStockException", "no stock left for the product")],
    "shipping": [("Npgsql.PostgresException", "40001: could not serialize access")],
    "notifications": [("System.Net.Mail.SmtpException", "mailbox unavailable")],
    "sales": [("System.InvalidOperationException", "order already placed")],
}
HEADERS = ('{"NServiceBus.MessageId":"%s","NServiceBus.ContentType":"application/json",'
           '"NServiceBus.Version":"8.0.0","NServiceBus.OriginatingMachine":"app-1",'
           '"NServiceBus.MessageIntent":"Send","NServiceBus.TimeSent":"...",'
           '"NServiceBus.ProcessingStarted":"...","NServiceBus.ProcessingEnded":"..."}')


@dataclass
class AuditSet:
    audit: list[tuple[Any, ...]]
    errors: list[tuple[Any, ...]]
    start: datetime
    end: datetime


def diurnal_starts(rng: np.random.Generator, count: int, start: datetime,
                   days: float) -> np.ndarray:
    """Conversation start offsets (seconds), busier by day (peak 14:00 UTC) than by night."""
    seconds = days * 86400
    accepted = np.empty(0)
    while accepted.size < count:
        candidates = rng.uniform(0, seconds, size=count * 2)
        hour = ((start.hour * 3600 + candidates) % 86400) / 3600
        weight = 1 + 0.8 * np.sin(2 * np.pi * (hour - 8) / 24)
        accepted = np.concatenate([accepted, candidates[rng.uniform(0, 1.8, size=count * 2)
                                                        < weight]])
    return np.sort(accepted[:count])


def generate(rows: int, days: float, seed: int = 7) -> AuditSet:
    """``rows`` audit rows and their failed messages."""
    rng = np.random.default_rng(seed)
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(days=days)
    per_conversation = 7 * (1 - LONG_SHARE) + 8 * LONG_SHARE
    # A few more conversations than needed (failures cut some short), then the latest rows
    # are cut off so that exactly ``rows`` remain.
    count = max(1, math.ceil(rows / per_conversation * 1.01))
    began = diurnal_starts(rng, count, start, days)
    long_ones = rng.uniform(size=count) < LONG_SHARE
    burst_start = days * 86400 * 0.4
    conversation_ids = [str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(count)]
    sent = np.zeros((len(SAGA), count))
    ended = np.zeros((len(SAGA), count))
    alive = np.zeros((len(SAGA), count), dtype=bool)
    audit: list[tuple[Any, ...]] = []
    errors: list[tuple[Any, ...]] = []
    groups: dict[tuple[str, str], FailureGroup] = {}
    for index, step in enumerate(SAGA):
        if step.parent is None:
            sent[index] = began
            alive[index] = True
        else:
            parent = step.parent
            # Sent while the parent's handler ran: just before its end.
            sent[index] = ended[parent] - rng.uniform(0, 0.002, size=count)
            alive[index] = alive[parent]
        if index == 7:  # the deferred timeout: long conversations only
            alive[index] &= long_ones
        if index in (5, 6):  # long conversations wait for the shipment timeout first
            sent[index] += np.where(long_ones, rng.uniform(600, 7200, size=count), 0)
        # Queue wait grows with load (busy hours); then the handler's time.
        hour = ((start.hour * 3600 + sent[index]) % 86400) / 3600
        load = 1 + 0.8 * np.sin(2 * np.pi * (hour - 8) / 24)
        wait = rng.lognormal(np.log(15 * load), 0.9, size=count) / 1000
        delay = np.where(long_ones, rng.uniform(600, 7200, size=count), 0) if index == 7 else 0
        processing = rng.lognormal(np.log(step.processing_ms), 0.6, size=count)
        retries = np.where(rng.uniform(size=count) < 0.01, rng.integers(1, 4, size=count), 0)
        processing = processing + retries * rng.uniform(5, 50, size=count)
        started_at = sent[index] + delay + wait
        ended[index] = started_at + processing / 1000
        in_burst = (step.receiver == "billing") & (sent[index] >= burst_start) & \
            (sent[index] < burst_start + BURST_MINUTES * 60)
        failure = np.where(in_burst, BURST_FAILURE, BASE_FAILURE)
        failed = alive[index] & (rng.uniform(size=count) < failure) & (index > 0)
        processed = alive[index] & ~failed
        choices = EXCEPTIONS.get(step.receiver, [("System.Exception", "unexpected")])
        for n in np.flatnonzero(processed):
            message_id = f"{conversation_ids[n][:23]}-{index:012d}"
            related = None if step.parent is None else \
                f"{conversation_ids[n][:23]}-{step.parent:012d}"
            t_sent = start + timedelta(seconds=float(sent[index][n]))
            t_started = start + timedelta(seconds=float(started_at[n]))
            t_ended = start + timedelta(seconds=float(ended[index][n]))
            audit.append((
                message_id, step.message_type, "Send" if index in (0, 7) else "Publish",
                step.sender, MACHINES[n % 3], step.receiver, MACHINES[(n + index) % 3],
                conversation_ids[n], related, t_sent, t_started, t_ended,
                float(processing[n]), (t_ended - t_sent).total_seconds() * 1000,
                512, int(retries[n]), HEADERS % message_id))
        for n in np.flatnonzero(failed):
            message_id = f"{conversation_ids[n][:23]}-{index:012d}"
            exception_type, text = choices[int(n) % len(choices)] if not in_burst[n] else \
                EXCEPTIONS["billing"][0]
            failed_at = start + timedelta(seconds=float(ended[index][n]) + 60)
            message = f"{text}\n   at Handler.Handle(...) line {n % 97}"
            group = groups.get((exception_type, text))
            if group is None:  # as ingestion computes it (one per cause: cached)
                group = groups[(exception_type, text)] = failure_group(exception_type, message,
                                                                       None)
            errors.append((
                "error", uuid.uuid4(), len(errors) + 1, message_id, step.message_type, "Publish",
                step.sender, step.receiver, MACHINES[n % 3], step.receiver,
                conversation_ids[n], f"{conversation_ids[n][:23]}-{step.parent:012d}",
                start + timedelta(seconds=float(sent[index][n])), failed_at, 3,
                exception_type, message, 512, HEADERS % message_id, None, group.key,
                group.title))
        alive[index] = processed
    audit.sort(key=lambda row: row[11])  # ingestion order: by processing end
    del audit[rows:]
    if audit:
        last = audit[-1][11]
        errors = [row for row in errors if row[13] <= last]
    return AuditSet(audit=audit, errors=errors, start=start, end=end)


def split(data: AuditSet, rows: int) -> tuple[AuditSet, AuditSet]:
    """The first ``rows`` audit rows (and the failures until the last of them), and the rest:
    what arrives later."""
    first, later = data.audit[:rows], data.audit[rows:]
    last = first[-1][11] if first else data.start
    return (AuditSet(first, [r for r in data.errors if r[13] <= last], data.start, data.end),
            AuditSet(later, [r for r in data.errors if r[13] > last], data.start, data.end))


async def load(dsn: str, data: AuditSet) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await OperationalData("public").setup(connection)
        for offset in range(0, len(data.audit), CHUNK):
            await connection.copy_records_to_table(
                "audit_log", records=data.audit[offset:offset + CHUNK], columns=AUDIT_FIELDS)
        if data.errors:
            await connection.copy_records_to_table("error_log", records=data.errors,
                                                   columns=ERROR_FIELDS)
        await connection.execute("VACUUM ANALYZE audit_log")
        await connection.execute("VACUUM ANALYZE error_log")
    finally:
        await connection.close()


def jvm_peak_rss_mb() -> float:
    """Peak resident set of this process's Java children (the Spark driver in local mode)."""
    peak = 0
    for child in psutil.Process().children(recursive=True):
        try:
            if "java" not in child.name():
                continue
            with open(f"/proc/{child.pid}/status", encoding="ascii") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except (OSError, psutil.Error):
            continue
    return round(peak / 1024, 1)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.analytics",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="audit rows to generate (default 1,000,000)")
    parser.add_argument("--days", type=float, default=7.0, help="days of traffic (default 7)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--partitions", type=int, default=None,
                        help="JDBC read partitions (default: from rows and cores)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report directory, new or empty (default: a temporary one)")
    parser.add_argument("--dsn", default=None, help="server DSN (default: as the CLI)")
    parser.add_argument("--incremental-rows", type=int, default=10_000,
                        help="rows for the second, incremental run (default 10,000; 0: none)")
    parser.add_argument("--event-log", type=Path, default=None, metavar="DIR",
                        help="write Spark's event logs under DIR and add a profile of each "
                        "timed run to the JSON (jobs, stages, tasks and job seconds per "
                        "report stage: 'profile_*')")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_ROWS:,} rows, result not kept in results/")
    args = parser.parse_args(argv)
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out} is not empty: the report starts from an empty output")
    if args.quick:
        args.rows = min(args.rows, QUICK_ROWS)
    return args


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from endpoint_runtime.analytics.job import run
    from endpoint_runtime.analytics.progress import Progress

    server = resolve_dsn(args.dsn)
    started = time.perf_counter()
    data, rest = split(generate(args.rows + 4 * args.incremental_rows, args.days), args.rows)
    later, rest = split(rest, args.incremental_rows)
    last, rest = split(rest, args.incremental_rows)
    streamed, streamed_warm = split(rest, args.incremental_rows)
    progress(f"generated {len(data.audit):,} audit rows and {len(data.errors):,} failed "
             f"messages (then {len(later.audit):,} and {len(later.errors):,}) in "
             f"{time.perf_counter() - started:.1f} s")
    async with throwaway_database(server, "er_bench_analytics") as name:
        dsn = with_database(server, name)
        started = time.perf_counter()
        await load(dsn, data)
        loaded = time.perf_counter() - started
        progress(f"loaded with COPY in {loaded:.1f} s")
        with tempfile.TemporaryDirectory(prefix="er-report-") as scratch:
            out = args.out or Path(scratch) / "report"
            logs = args.event_log
            options = ReportOptions(dsn=dsn, master=args.master, out=out,
                                    partitions=args.partitions,
                                    conf=tuple(spark_profile.conf(logs / "in-process"))
                                    if logs else ())
            reporter = Progress(total=8, prefix="benchmark")
            windows: dict[str, tuple[float, float]] = {}
            started = time.perf_counter()
            since = time.time() * 1000
            result = run(options, progress=reporter)
            wall = time.perf_counter() - started
            windows["profile_full"] = (since, time.time() * 1000)
            driver_peak = jvm_peak_rss_mb()
            progress(f"report: {result.html}")
            incremental: dict[str, Any] = {}
            if later.audit:
                await load(dsn, later)
                incremental = incremental_run(dsn, args.master, out, logs)
                await load(dsn, last)
                started = time.perf_counter()
                since = time.time() * 1000
                warm = run(options, progress=Progress(total=8, prefix="warm round"))
                windows["profile_warm_incremental"] = (since, time.time() * 1000)
                incremental["warm_incremental_wall_s"] = round(time.perf_counter() - started, 2)
                incremental["warm_incremental_rows"] = warm.audit_rows
                since = time.time() * 1000
                incremental.update(await live_rows(options, dsn, streamed, streamed_warm))
                windows["profile_live"] = (since, time.time() * 1000)
            if logs:
                log = spark_profile.newest_log(logs / "in-process")
                incremental.update({name: spark_profile.profile(log, *window)
                                    for name, window in windows.items()})
    python_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "benchmark": "analytics",
        "rows": result.audit_rows,
        "error_rows": result.error_rows,
        "days": args.days,
        "master": args.master,
        "read_partitions": result.read_partitions,
        "wall_s": round(wall, 2),
        "rows_per_s": round(result.audit_rows / wall, 1),
        "stages": result.timings,
        "peak_driver_rss_mb": driver_peak,
        "peak_python_rss_mb": round(python_peak, 1),
        "load_s": round(loaded, 2),
        "target_wall_s": 60,
        **incremental,
    }


async def live_rows(options: ReportOptions, dsn: str, cold: AuditSet,
                    warm: AuditSet) -> dict[str, Any]:
    """The live mode (``--follow``'s stream): ``cold``, the first rows the stream reads after
    it started (its first micro-batch with rows also plans the source's reads once: a
    Python planning process, about 1.5 s), then ``warm``, rows arriving while the stream
    already runs, as in a kept-warm ``--follow`` session; each from its commit (the end of
    its load) until the micro-batches that read it have published their minutes."""
    from pyspark.sql import SparkSession

    from endpoint_runtime.analytics.live import stream

    spark = SparkSession.getActiveSession()
    assert spark is not None
    live = replace(options, micro_batch=1.0)
    figures: dict[str, Any] = {}
    with stream(spark, live) as query:
        for name, label, data in (("live", "first rows", cold), ("live_warm", "warm", warm)):
            await load(dsn, data)
            started = time.perf_counter()
            rows, batches, phases = await _streamed(query, len(data.audit) + len(data.errors))
            latency = time.perf_counter() - started
            progress(f"live mode ({label}): "
                     f"{rows:,} rows in their minutes {latency:.1f} s after their commit "
                     f"({len(batches)} micro-batches, {sum(batches):.1f} s)")
            figures.update({f"{name}_rows": rows, f"{name}_wall_s": round(latency, 2),
                            f"{name}_micro_batches_s": [round(b, 2) for b in batches],
                            # Spark's own phases: latestOffset (the read), addBatch, ...
                            f"{name}_micro_batch_phases_ms": phases,
                            f"target_{name}_wall_s": 5})
    return figures


async def _streamed(query: Any, expected: int) -> tuple[int, list[float], list[dict[str, int]]]:
    """Wait until the query's micro-batches after now have read ``expected`` rows."""
    after = newest_trigger(query.recentProgress)
    rows, batches, phases = 0, [], []
    while rows < expected:
        for event in progress_after(query.recentProgress, after):
            after = trigger(event)
            if event["numInputRows"]:
                rows += event["numInputRows"]
                batches.append(event["durationMs"]["triggerExecution"] / 1000)
                phases.append(dict(event["durationMs"]))
        if query.exception() is not None:
            raise RuntimeError(f"the live stream failed: {query.exception()}")
        await asyncio.sleep(0.1)
    return rows, batches, phases


Trigger = tuple[int, str]
"""A progress event's micro-batch id and trigger time (ISO text, in order as text): an idle
trigger reports the id of the next micro-batch with rows, so the id alone repeats."""


def trigger(event: dict[str, Any]) -> Trigger:
    return event["batchId"], event["timestamp"]


def newest_trigger(events: list[dict[str, Any]]) -> Trigger:
    """The newest trigger of ``events`` (a query's progress), before any if none."""
    return max((trigger(event) for event in events), default=(-1, ""))


def progress_after(events: list[dict[str, Any]], after: Trigger) -> list[dict[str, Any]]:
    """The progress events of triggers after ``after``, oldest first. By trigger, not by
    position: ``recentProgress`` keeps only the newest events (100 by default), so once it is
    full its length stays the same while new events arrive."""
    return sorted((event for event in events if trigger(event) > after), key=trigger)


def incremental_run(dsn: str, master: str, out: Path, logs: Path | None) -> dict[str, Any]:
    """The second run into the same output, as a process of its own, timed whole (with
    ``logs``, profiled: its Spark start is from the launch to the application's start)."""
    command = [sys.executable, "-m", "endpoint_runtime.analytics", "--dsn", dsn,
               "--master", master, "--out", str(out)]
    for key, value in spark_profile.conf(logs / "incremental") if logs else ():
        command += ["--conf", f"{key}={value}"]
    started = time.perf_counter()
    launched = time.time() * 1000
    subprocess.run(command, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - started
    ended = time.time() * 1000
    profiled: dict[str, Any] = {}
    if logs:
        figures = spark_profile.profile(spark_profile.newest_log(logs / "incremental"))
        application, first, last = (figures["application_started_ms"],
                                    figures["first_job_ms"], figures["last_job_end_ms"])
        figures["until_application_start_s"] = round((application - launched) / 1000, 2)
        figures["until_first_job_s"] = round((first - application) / 1000, 2)
        figures["after_last_job_s"] = round((ended - last) / 1000, 2)
        profiled = {"profile_incremental": figures}
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    progress(f"incremental run: {summary['audit_rows']:,} new audit rows, days "
             f"{', '.join(summary['days'])}, {wall:.1f} s")
    return {"incremental_rows": summary["audit_rows"],
            "incremental_error_rows": summary["error_rows"],
            "incremental_wall_s": round(wall, 2), "incremental_days": summary["days"],
            "target_incremental_wall_s": 20, **profiled}


if __name__ == "__main__":
    run_benchmark("analytics", parse, main)
