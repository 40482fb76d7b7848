"""Wake-ups only for an endpoint that waits for one.

A queue's insert trigger NOTIFYs its channel only while the channel has a row in the schema's
``endpoint_runtime_waiting`` table (``queue.sql``). PostgreSQL takes a database-wide lock at
the commit of every transaction that notified, so concurrent senders' commits pass that step
one at a time; a busy endpoint needs no wake-up, and its senders no longer pay for one.

Who marks and who clears:

- a receiver whose last receive slot found the queue empty marks its channel waiting; so does
  a peeker whose cycle finds nothing queued and nothing in flight (an endpoint with no
  receiver left);
- a peeker whose peek finds messages queued clears the mark, then wakes its idle receivers
  (which mark it again once they find the queue empty).

Whoever *makes* the mark (``INSERT 0 1``) looks at the queue once more right after: a send
committed between its empty receive and the mark notified nobody. A mark that was already
there was made by someone who looked after making it, and every send since notified. What is
left is a send whose transaction inserted before the mark and committed after that second
look (a long transaction around the send): it waits for the next peek, at most
``peek_delay``, as every message did before LISTEN/NOTIFY. A mark left by an endpoint that
stopped costs its queue's senders what every send cost before (a NOTIFY nobody hears) until
a peeker of that queue clears it.
"""

from __future__ import annotations

import asyncpg
import structlog

from endpoint_runtime.transport import statements
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection

log = structlog.get_logger(__name__)

_LOST = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


def waiting_table(schema: str) -> QueueAddress:
    """The waiting channels' table of ``schema``."""
    return QueueAddress(statements.WAITING_TABLE, schema)


class Waiting:
    """The waiting mark of one queue's channel."""

    def __init__(self, address: QueueAddress) -> None:
        sql = statements.for_queue(address)
        self._mark = sql["mark_waiting"]
        self._clear = sql["clear_waiting"]
        self._is_waiting = sql["is_waiting"]
        self.address = address

    async def mark(self, connection: DatabaseConnection | asyncpg.Pool) -> bool:
        """Mark the channel waiting (in a transaction of its own: ``connection`` must not be
        in one); ``True`` when this call made the mark, ``False`` when it was there, or when
        the database could not be reached (logged: the next peek finds what came)."""
        status = await self._execute(connection, self._mark, "waiting_mark_failed")
        return status is not None and status.endswith(" 1")

    async def clear(self, connection: DatabaseConnection | asyncpg.Pool) -> bool:
        """Clear the mark (the endpoint is busy); ``True`` when there was one."""
        status = await self._execute(connection, self._clear, "waiting_clear_failed")
        return status is not None and not status.endswith(" 0")

    async def _execute(self, connection: DatabaseConnection | asyncpg.Pool, statement: str,
                       failed: str) -> str | None:
        """The statement's status, or ``None`` (logged as ``failed``) when it could not run."""
        try:
            status: str = await connection.execute(statement)
        except _LOST as exc:
            log.warning(failed, queue=str(self.address), error=f"{type(exc).__name__}: {exc}")
            return None
        return status

    async def is_waiting(self, connection: DatabaseConnection | asyncpg.Pool) -> bool:
        waiting: bool = await connection.fetchval(self._is_waiting)
        return waiting
