"""The limit sides: the same work with nothing around it.

- :class:`LeanLoopSide`: the leanest asyncpg loop with the runtime's round trips. One message
  per transaction: BEGIN, the transport's receive DELETE, decode the body, the sink INSERT,
  COMMIT (the runtime's single-message atomic mode pipelines BEGIN with the receive; so does
  this loop, through asyncpg's transaction). N per commit: the transport's batched receive of
  up to N rows, then per message a SAVEPOINT, the sink INSERT and a RELEASE, one COMMIT (as the
  runtime's batched atomic mode does).
- :class:`PgbenchSide`: PostgreSQL's own client runs BEGIN, the receive DELETE (its row kept
  with ``\\gset``), the sink INSERT and COMMIT per transaction, prepared statements,
  ``-c concurrency``, exactly one transaction per message.

Both fill the backlog with the runtime's own sender (the same rows, headers and JSON bodies)
into a queue table the transport creates, in a fresh database per drain.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import msgspec

from benchmarks.common import throwaway_database
from benchmarks.scaleout.endpoints import INSERT_SINK, Job
from benchmarks.scaleout.peers.sink import COUNT_SINK, CREATE_SINK, DatabaseClock
from benchmarks.scaleout.runtime_sides import job_messages
from benchmarks.scaleout.side import DrainResult, LatencyResult, Load
from benchmarks.throughput import load_backlog
from endpoint_runtime.connections.embedded import with_database
from endpoint_runtime.transport import QueueAddress, statements

QUEUE = QueueAddress("scaleout_limit")
DECODE = msgspec.json.Decoder(Job)


async def prepare(database_dsn: str, load: Load) -> asyncpg.Pool:
    """The queue and sink tables, and the backlog (not timed); a pool of two for checks."""
    pool = await asyncpg.create_pool(database_dsn, min_size=2, max_size=2)
    sql = statements.for_queue(QUEUE)
    for step in ("create_queue", "create_seq_index", "create_expires_index"):
        await pool.execute(sql[step])
    await pool.execute(CREATE_SINK)
    async with pool.acquire() as connection:
        clock = await DatabaseClock.measure(connection)
    await load_backlog(pool, QUEUE, job_messages(load.messages, load.body_bytes, clock))
    await pool.execute(f"VACUUM ANALYZE {QUEUE.qualified}")
    return pool


async def counted(pool: asyncpg.Pool) -> tuple[int, int]:
    """Distinct messages in the sink and rows beyond one per message."""
    row = await pool.fetchrow(COUNT_SINK)
    return int(row["distinct_jobs"]), int(row["total"] - row["distinct_jobs"])


@dataclass
class LeanLoopSide:
    """The leanest asyncpg loop: ``per_commit`` 1 (single) or N (batched, savepoints)."""

    name: str
    per_commit: int = 1

    @property
    def config(self) -> dict[str, Any]:
        return {"per_commit": self.per_commit}

    async def drain(self, dsn: str, load: Load) -> DrainResult:
        async with throwaway_database(dsn, prefix="er_scaleout_lean") as database:
            database_dsn = with_database(dsn, database)
            pool = await prepare(database_dsn, load)
            connections = [await asyncpg.connect(database_dsn) for _ in range(load.concurrency)]
            try:
                started = time.perf_counter()
                await asyncio.gather(*(self.drain_connection(c) for c in connections))
                seconds = time.perf_counter() - started
                handled, duplicates = await counted(pool)
            finally:
                await asyncio.gather(*(connection.close() for connection in connections))
                await pool.close()
        return DrainResult(self.name, self.config, load, seconds, handled, duplicates)

    async def drain_connection(self, connection: asyncpg.Connection) -> None:
        """Receive and handle on ``connection`` until the queue is empty (any connection: a
        pooler's too, as ``benchmarks.pooler`` drains through one)."""
        if self.per_commit == 1:
            await self._one_by_one(connection)
        else:
            await self._batched(connection)

    async def _one_by_one(self, connection: asyncpg.Connection) -> None:
        receive = statements.for_queue(QUEUE)["receive"]
        while True:
            async with connection.transaction():
                row = await connection.fetchrow(receive)
                if row is None:
                    return
                job = DECODE.decode(row["body"])
                await connection.execute(INSERT_SINK, job.key, job.sent_at, job.body.encode())

    async def _batched(self, connection: asyncpg.Connection) -> None:
        receive = statements.for_queue(QUEUE)["receive_batch"]
        while True:
            async with connection.transaction():
                rows = await connection.fetch(receive, self.per_commit, 0)
                if not rows:
                    return
                for row in rows:
                    async with connection.transaction():  # a savepoint per message
                        job = DECODE.decode(row["body"])
                        await connection.execute(
                            INSERT_SINK, job.key, job.sent_at, job.body.encode())

    async def open_loop(self, dsn: str, load: Load, rate_per_s: float,
                        seconds: float) -> LatencyResult:
        raise NotImplementedError("the limit sides are measured by drains only")


PGBENCH_SCRIPT = """BEGIN;
WITH taken AS (
  DELETE FROM {queue}
  WHERE seq = (SELECT seq FROM {queue} ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED)
  RETURNING body)
SELECT (convert_from(body, 'UTF8')::json->>'key')::bigint AS job_key,
       (convert_from(body, 'UTF8')::json->>'sent_at')::float8 AS sent_at,
       body FROM taken \\gset
INSERT INTO scaleout_sink (job_key, sent_at, started_at, body)
  VALUES (:job_key, :sent_at, extract(epoch FROM clock_timestamp())::float8, :body);
COMMIT;
"""


def pgbench_binary() -> str:
    """pgbench from the PATH (Debian's postgresql-client) or the embedded server's wheel."""
    found = shutil.which("pgbench")
    if found:
        return found
    import pgserver  # the wheel ships PostgreSQL's client programs

    wheel = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pgbench"
    if wheel.exists():
        return str(wheel)
    raise RuntimeError("pgbench not found: apt-get install postgresql-client")


def pgbench_connection_args(database_dsn: str) -> tuple[list[str], str]:
    """pgbench's -h/-p/-U options for a URL DSN, and the database name."""
    parts = urlsplit(database_dsn)
    args: list[str] = []
    host = parts.hostname or dict(
        pair.split("=", 1) for pair in parts.query.split("&") if "=" in pair).get("host", "")
    if host:
        args += ["-h", host]
    if parts.port:
        args += ["-p", str(parts.port)]
    if parts.username:
        args += ["-U", parts.username]
    return args, parts.path.lstrip("/")


@dataclass
class PgbenchSide:
    """PostgreSQL's own client running the same statements per transaction."""

    name: str = "pgbench"

    @property
    def config(self) -> dict[str, Any]:
        return {"protocol": "prepared", "statements": "BEGIN; receive; sink insert; COMMIT"}

    async def drain(self, dsn: str, load: Load) -> DrainResult:
        if load.messages % load.concurrency:
            raise ValueError("pgbench runs messages / concurrency transactions per client")
        async with throwaway_database(dsn, prefix="er_scaleout_pgbench") as database:
            database_dsn = with_database(dsn, database)
            pool = await prepare(database_dsn, load)
            try:
                seconds = await asyncio.to_thread(self._run, database_dsn, load)
                handled, duplicates = await counted(pool)
            finally:
                await pool.close()
        return DrainResult(self.name, self.config, load, seconds, handled, duplicates)

    def _run(self, database_dsn: str, load: Load) -> float:
        connection, database = pgbench_connection_args(database_dsn)
        with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
            script.write(PGBENCH_SCRIPT.format(queue=QUEUE.qualified))
            script.flush()
            command = [pgbench_binary(), *connection, "-n", "-M", "prepared",
                       "-c", str(load.concurrency), "-j", str(min(load.concurrency, 2)),
                       "-t", str(load.messages // load.concurrency), "-f", script.name,
                       database]
            started = time.perf_counter()
            finished = subprocess.run(command, capture_output=True, text=True, check=False)
            seconds = time.perf_counter() - started
        if finished.returncode != 0:
            raise RuntimeError(f"pgbench failed: {finished.stderr.strip()[-500:]}")
        return seconds

    async def open_loop(self, dsn: str, load: Load, rate_per_s: float,
                        seconds: float) -> LatencyResult:
        raise NotImplementedError("the limit sides are measured by drains only")
