"""What a handler records outside its transaction, on a connection of its own.

A handler that raises ``DiscardMessage`` rolls its transaction back (the message is dropped at
its next delivery by the chain's recoverability step), so a discard noted in that transaction
would vanish with it: the handler notes it here instead, on one connection per receiver process,
before it raises. The row says that the handler was seen discarding; the message itself is
accounted as discarded only if it is also gone from the queue and nowhere else
(:mod:`benchmarks.chaos.checks`).

The connection goes to the database named by :data:`DSN_VARIABLE` (set by the run in its Ray
nodes' environment). It survives the run's faults: a write that meets a terminated backend or
a restarting server is retried on a new connection until :data:`WRITE_DEADLINE`.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import asyncpg

from endpoint_runtime.transport.connection import QUERY_ERRORS

DSN_VARIABLE = "CHAOS_LEDGER_DSN"
OBSERVER_APPLICATION = "chaos-observer"
"""``application_name`` of these connections: the backend terminations spare them (they are
the ledger's, not the runtime's)."""
WRITE_DEADLINE = 120.0
OBSERVED_TABLE = "chaos_observed"
RECORD = (f"INSERT INTO {OBSERVED_TABLE} (message_id, mode, event, pid, started) "
          "VALUES ($1, $2, $3, $4, to_timestamp($5))")
RETRIED = (*QUERY_ERRORS, TimeoutError, OSError)


class Observer:
    """One connection per process, opened on first use, shared by the slots under a lock.

    Example::

        await observer.record(message_id, "atomic", "discard")
    """

    def __init__(self) -> None:
        self._connection: asyncpg.Connection | None = None
        self._lock: asyncio.Lock | None = None

    async def record(self, message_id: uuid.UUID, mode: str, event: str) -> None:
        """Insert one ``(message id, mode, event)`` row, committed at once; retried on a new
        connection until :data:`WRITE_DEADLINE` when the database is away."""
        started = time.time()
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            attempts = 0
            while True:
                try:
                    connection = await self._connected()
                    await connection.execute(RECORD, message_id, mode, event, os.getpid(),
                                             started)
                    return
                except RETRIED:
                    self._drop()
                    attempts += 1
                    if time.time() - started > WRITE_DEADLINE:
                        raise
                    await asyncio.sleep(min(0.1 * attempts, 1.0))

    async def _connected(self) -> asyncpg.Connection:
        if self._connection is None or self._connection.is_closed():
            dsn = os.environ.get(DSN_VARIABLE)
            if not dsn:
                raise RuntimeError(f"{DSN_VARIABLE} is not set: the chaos run sets it for "
                                   "its receivers")
            self._connection = await asyncpg.connect(
                dsn, timeout=10, server_settings={"application_name": OBSERVER_APPLICATION})
        return self._connection

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.terminate()
            self._connection = None


observer = Observer()
"""The receiver process's observer."""
