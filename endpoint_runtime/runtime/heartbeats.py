"""Heartbeats: every deployment's peeker writes its state to a table, so that tools outside
the deploying process (the console) can tell which endpoints run, where, and how.

A deployment's actors live in its own Ray namespace; only the database is shared by
everyone. Every :data:`BEAT_SECONDS` the peeker upserts one row per deployment into
``endpoint_heartbeats`` (in the transport's schema): its state (``running``, ``halted`` after
a critical error, ``stopped`` once stopped), receivers per Ray node, messages processed and
failed, the queue estimate, the critical error and when it was last seen. A deployment whose
row is older than :data:`SILENT_AFTER` seconds is silent (its process or node is gone). The
same statement keeps the queue's length per minute in ``endpoint_queue_lengths`` (the
estimate of the minute's last beat, per endpoint) and deletes the endpoint's minutes older
than :data:`HISTORY_HOURS`: the console's chart of queue length.

The tables are the installers' (``endpoint-runtime db install`` and a deployment with
installers create them: :func:`create_heartbeats_table`; ``db grants`` grants them); a
heartbeat runs no DDL, so a role that may create nothing writes its heartbeat all the same.
The console reads them with :func:`read_heartbeats` and :func:`read_queue_lengths`
(:mod:`endpoint_runtime.transport.heartbeat_tables`, with the tables' names and DDL).
A heartbeat never stops an endpoint and never holds up its peeker: whatever a write raises
(a role without the privilege, the database away, a connection the outage left broken) or
when it takes longer than :data:`BEAT_TIMEOUT_SECONDS`, the peeker logs it once and goes on.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import TYPE_CHECKING

import asyncpg
import structlog

from endpoint_runtime.transport.heartbeat_tables import (
    BEAT_SECONDS,
    BEAT_TIMEOUT_SECONDS,
    HISTORY_HOURS,
    HISTORY_TABLE,
    SILENT_AFTER,
    TABLE,
    create_heartbeats_table,
    heartbeat_tables,
    heartbeats_table,
    read_heartbeats,
    read_queue_lengths,
)

if TYPE_CHECKING:  # the console reads the table too: it needs no actor module
    from endpoint_runtime.runtime.actors.deployment_status import DeploymentStatus

log = structlog.get_logger("endpoint_runtime.heartbeats")

# The tables' names and statements are the transport's (the installers and the console use
# them without an actor module); importable from here as they always were.
__all__ = [
    "BEAT_SECONDS",
    "BEAT_TIMEOUT_SECONDS",
    "HISTORY_HOURS",
    "HISTORY_TABLE",
    "SILENT_AFTER",
    "TABLE",
    "Heartbeat",
    "create_heartbeats_table",
    "heartbeat_tables",
    "heartbeats_table",
    "read_heartbeats",
    "read_queue_lengths",
    "state_of",
]

def state_of(status: DeploymentStatus, stopped: bool = False) -> str:
    if stopped:
        return "stopped"
    return "halted" if status.halted else "running"


class Heartbeat:
    """The heartbeat of one deployment (held by its peeker)."""

    def __init__(self, schema: str, deployment_id: str) -> None:
        self.table, self.history = (table.qualified for table in heartbeat_tables(schema))
        self.deployment_id = deployment_id
        self._next = 0.0
        self._failing = False

    async def beat(self, pool: asyncpg.Pool, status: DeploymentStatus, *,
                   stopped: bool = False, force: bool = False) -> None:
        """Write the row if :data:`BEAT_SECONDS` have passed (or ``force``)."""
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + BEAT_SECONDS
        try:
            async with asyncio.timeout(BEAT_TIMEOUT_SECONDS):
                await self._write(pool, status, stopped)
            self._failing = False
        except Exception as exc:  # whatever it is: see the module's doc
            if not self._failing:
                log.warning("heartbeat_failed", error=f"{type(exc).__name__}: {exc}")
            self._failing = True

    async def _write(self, pool: asyncpg.Pool, status: DeploymentStatus, stopped: bool) -> None:
        async with pool.acquire() as connection:
            await connection.execute(
                f"WITH beat AS (INSERT INTO {self.table} (endpoint, deployment_id, host, "
                "state, receivers_by_node, processed, failed, estimate, critical_error) "
                "VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9) "
                "ON CONFLICT (endpoint, deployment_id) DO UPDATE SET host = $3, state = $4, "
                "receivers_by_node = $5::jsonb, processed = $6, failed = $7, estimate = $8, "
                "critical_error = $9, last_seen = now()), "
                f"minute AS (INSERT INTO {self.history} (endpoint, minute, length) "
                "VALUES ($1, date_trunc('minute', now()), $8) "
                "ON CONFLICT (endpoint, minute) DO UPDATE SET length = $8) "
                f"DELETE FROM {self.history} WHERE endpoint = $1 "
                f"AND minute < now() - interval '{HISTORY_HOURS} hours'",
                status.endpoint, self.deployment_id, socket.gethostname(),
                state_of(status, stopped), json.dumps(status.receivers_by_node),
                status.processed, status.failed, status.estimate, status.critical_error)
