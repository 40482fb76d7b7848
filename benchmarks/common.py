"""Helpers shared by the benchmarks: statistics, result files, throwaway databases, progress."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import psutil
import structlog

from endpoint_runtime.transport.addresses import quote_identifier

T = TypeVar("T")

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def progress(text: str) -> None:
    """Write one progress line to stderr (stdout is kept for the result JSON).

    Args:
        text: The line to write.
    """
    print(text, file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (mean of the two middle values for an even count).

    Args:
        values: At least one number.

    Returns:
        The median.
    """
    return percentile(values, 50.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile with linear interpolation between closest ranks.

    Args:
        values: At least one number.
        q: Percentile between 0 and 100.

    Returns:
        The interpolated percentile.

    Raises:
        ValueError: If ``values`` is empty or ``q`` is outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles and extremes of a series of per-run figures.

    Args:
        values: At least one number.

    Returns:
        A mapping with ``median``, ``p25``, ``p75``, ``min`` and ``max``.
    """
    return {
        "median": median(values),
        "p25": percentile(values, 25.0),
        "p75": percentile(values, 75.0),
        "min": min(values),
        "max": max(values),
    }


def utc_stamp() -> str:
    """The current UTC time as a compact file-name-safe stamp, e.g. ``20250101T120000Z``."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def write_result(name: str, payload: dict[str, Any], directory: Path = RESULTS_DIR) -> Path:
    """Write a result as JSON to ``<directory>/<name>-<UTC timestamp>.json``.

    Args:
        name: Benchmark name, the file name's prefix.
        payload: JSON-serializable result.
        directory: Where to write; created if missing.

    Returns:
        The path written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{utc_stamp()}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


@asynccontextmanager
async def throwaway_database(dsn: str, prefix: str = "er_bench") -> AsyncIterator[str]:
    """Create a fresh database on the server of ``dsn`` and drop it on exit.

    Connect to it with ``asyncpg.connect(dsn, database=name)`` (an explicit ``database``
    overrides the one in the DSN).

    Args:
        dsn: Any DSN of the server (its own database is only used for CREATE/DROP DATABASE);
            ``""`` means the libpq ``PG*`` environment.
        prefix: Start of the database name; a process id and random suffix follow.

    Yields:
        The new database's name.
    """
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    quoted = quote_identifier(name)
    admin = await asyncpg.connect(dsn or None)
    try:
        await admin.execute(f"CREATE DATABASE {quoted}")
    finally:
        await admin.close()
    try:
        yield name
    finally:
        admin = await asyncpg.connect(dsn or None)
        try:
            # WITH (FORCE) (PostgreSQL 13+) ends sessions a failed run may have left behind.
            await admin.execute(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
        finally:
            await admin.close()


def provenance() -> dict[str, Any]:
    """What a result was measured on: the commit (``-dirty`` with uncommitted changes) and the
    machine, so that a result file says which code and which box its figures belong to."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, check=True).stdout
        commit += "-dirty" if dirty.strip() else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "commit": commit,
        "machine": {"node": platform.node(), "cpus": os.cpu_count(),
                    "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
                    "system": platform.platform()},
    }


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a benchmark's coroutine on uvloop, the loop the receivers and peekers run on (Ray
    picks it whenever it can be imported, and it is a dependency): the raw and lean sides are
    measured on the same event loop as the runtime (docs/performance.md, "uvloop")."""
    import uvloop

    return uvloop.run(coroutine)


def run_benchmark(
    name: str,
    parse: Callable[[list[str] | None], argparse.Namespace],
    main: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
    argv: list[str] | None = None,
) -> None:
    """Parse arguments, run ``main`` quietly (warnings only), keep the result unless
    ``--quick``, and print it as the last line of stdout (one JSON object)."""
    args = parse(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = {**run_async(main(args)), **provenance()}
    if not args.quick:
        progress(f"wrote {write_result(name, result)}")
    print(json.dumps(result), flush=True)
