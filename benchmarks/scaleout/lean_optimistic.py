"""The leanest correct batched loop with the runtime's guarantee, without savepoints per message.

:class:`LeanOptimisticSide` drains with plain asyncpg what ``runtime_batched_50`` drains:
BEGIN; the transport's batched receive of up to N rows; a checkpoint (SAVEPOINT) before the
first write; per message the sink INSERT; COMMIT. On a failure the same recovery as the
runtime's optimistic batches: back to the checkpoint, the messages before the failing one again,
the checkpoint moved past them (RELEASE; SAVEPOINT in one query), on after it; the failing row
put back with its seq for its next attempt, or, after 1 + 5 attempts (the runtime's default
immediate retries, no delayed retries), copied to an error table. Attempts are counted in
memory, shared by the loop's connections as a receiver's slots share theirs.

With ``failing_every=100`` the message whose key is the last of each hundred fails on every
attempt after its write (as :func:`benchmarks.scaleout.endpoints.record_or_fail` does).
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from benchmarks.common import throwaway_database
from benchmarks.scaleout.endpoints import FAILING_EVERY, INSERT_SINK, fails
from benchmarks.scaleout.limits import DECODE, QUEUE, counted, prepare
from benchmarks.scaleout.side import DrainResult, LatencyResult, Load
from endpoint_runtime.connections.embedded import with_database
from endpoint_runtime.transport import statements

ATTEMPTS = 6
"""1 + the runtime's default immediate retries."""
CREATE_ERRORS = "CREATE TABLE scaleout_errors (id uuid, headers text, body bytea)"
COPY_TO_ERRORS = "INSERT INTO scaleout_errors (id, headers, body) VALUES ($1, $2, $3)"
CHECKPOINT = "SAVEPOINT checkpoint"
MOVE_CHECKPOINT = "RELEASE SAVEPOINT checkpoint; SAVEPOINT checkpoint"


@dataclass
class LeanOptimisticSide:
    """Optimistic batches of ``per_commit`` messages in plain asyncpg (module docstring)."""

    name: str
    per_commit: int = 50
    failing: bool = False

    @property
    def config(self) -> dict[str, Any]:
        return {"per_commit": self.per_commit, "isolation": "optimistic",
                "failing_every": FAILING_EVERY if self.failing else None}

    async def drain(self, dsn: str, load: Load) -> DrainResult:
        async with throwaway_database(dsn, prefix="er_scaleout_lean") as database:
            database_dsn = with_database(dsn, database)
            pool = await prepare(database_dsn, load)
            await pool.execute(CREATE_ERRORS)
            connections = [await asyncpg.connect(database_dsn) for _ in range(load.concurrency)]
            attempts: collections.Counter[int] = collections.Counter()
            try:
                started = time.perf_counter()
                await asyncio.gather(*(self._loop(connection, attempts)
                                       for connection in connections))
                seconds = time.perf_counter() - started
                handled, duplicates = await counted(pool)
                handled += await pool.fetchval("SELECT count(*) FROM scaleout_errors")
            finally:
                await asyncio.gather(*(connection.close() for connection in connections))
                await pool.close()
        return DrainResult(self.name, self.config, load, seconds, handled, duplicates)

    async def _loop(self, connection: asyncpg.Connection,
                    attempts: collections.Counter[int]) -> None:
        sql = statements.for_queue(QUEUE)
        while True:
            async with connection.transaction():
                rows = await connection.fetch(sql["receive_batch"], self.per_commit, 0)
                if not rows:
                    return
                failed = await self._batch(connection, rows)
                retry, dead = [], []
                for row in failed:
                    key = DECODE.decode(row["body"]).key
                    attempts[key] += 1
                    (dead if attempts[key] >= ATTEMPTS else retry).append(row)
                if retry:
                    await connection.executemany(sql["reinsert"], [
                        (r["id"], r["expires"], r["headers"], r["body"], r["seq"])
                        for r in retry])
                if dead:
                    await connection.executemany(COPY_TO_ERRORS, [
                        (r["id"], r["headers"], r["body"]) for r in dead])

    async def _batch(self, connection: asyncpg.Connection,
                     rows: list[asyncpg.Record]) -> list[asyncpg.Record]:
        """The sink rows of the batch's good messages; the failed rows."""
        await connection.execute(CHECKPOINT)
        since_checkpoint: list[asyncpg.Record] = []
        failed: list[asyncpg.Record] = []
        for row in rows:
            job = DECODE.decode(row["body"])
            await connection.execute(INSERT_SINK, job.key, job.sent_at, job.body.encode())
            if not (self.failing and fails(job.key)):
                since_checkpoint.append(row)
                continue
            failed.append(row)  # its handler raised: back to the checkpoint, others again
            await connection.execute("ROLLBACK TO SAVEPOINT checkpoint")
            for good in since_checkpoint:
                job = DECODE.decode(good["body"])
                await connection.execute(INSERT_SINK, job.key, job.sent_at, job.body.encode())
            if since_checkpoint:
                await connection.execute(MOVE_CHECKPOINT)
            since_checkpoint = []
        return failed

    async def open_loop(self, dsn: str, load: Load, rate_per_s: float,
                        seconds: float) -> LatencyResult:
        raise NotImplementedError("the limit sides are measured by drains only")
