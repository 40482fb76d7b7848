"""A deployment's committed counts, read from the database: what its receivers processed, as
durable as the work itself.

Every receive slot of every receiver of a deployment adds to its own row of the endpoint's
``<endpoint>_CommittedCounts`` table in the transaction that commits the messages it counts
(:mod:`endpoint_runtime.transactions.counting`). So the sum of a deployment's rows is exactly
what committed: nothing is lost with a receiver killed mid-load or a node lost (their counts
committed with their work, or rolled back with it and come again with the redelivery), and
nothing is counted twice. None mode, at most once, may miss the last counts of a killed
receiver.

Rows are removed once their deployment has committed nothing for :data:`KEEP_FOR_SECONDS`
(:func:`clean_up`, run by each receiver as it starts).

Example::

    counts = await read_committed(pool, config.deployment_id, table=counts_table(config.address))
    print(counts.total, counts.failed, counts.by_node)
"""

from __future__ import annotations

import time
from collections.abc import Collection

import asyncpg
import msgspec
import structlog

from endpoint_runtime.transactions.base import ReceiveSlot
from endpoint_runtime.transactions.counting import SlotCounts, counts_table, statements
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import QUERY_ERRORS, DatabaseConnection

log = structlog.get_logger("endpoint_runtime.receiver")

KEEP_FOR_SECONDS = 7 * 86_400.0
"""A deployment's rows are removed once it has committed nothing for this long."""
ROW_CHECK_SECONDS = 3_600.0
"""A receiver makes sure of a slot's row (and marks it alive) when a slot of that number opens
and it last did so longer ago than this: a row removed while its deployment sat idle comes
back before the next count, which would otherwise update nothing."""

__all__ = [
    "KEEP_FOR_SECONDS", "CommittedCounts", "ReceiverCounts", "clean_up", "counts_table",
    "read_committed",
]


class CommittedCounts(msgspec.Struct, frozen=True, kw_only=True):
    """What the receivers of a deployment committed."""

    total: int = 0
    """Messages whose handlers ran and whose work committed."""
    by_node: dict[str, int] = {}
    """``total`` per Ray node id (hex) the receivers ran on."""
    failed: int = 0
    """Messages moved to the error queue (by recoverability, or as poison rows)."""


async def read_committed(
    source: asyncpg.Pool | DatabaseConnection, deployment_id: str | Collection[str], *,
    table: QueueAddress,
) -> CommittedCounts:
    """The committed counts of ``deployment_id`` (or of several deployment ids, summed) in
    ``table`` (:func:`counts_table` of the endpoint's queue). No rows: all zero."""
    ids = [deployment_id] if isinstance(deployment_id, str) else list(deployment_id)
    rows = await source.fetch(statements(table)["read"], ids)
    by_node = {row["node_id"]: int(row["processed"]) for row in rows}
    return CommittedCounts(total=sum(by_node.values()), by_node=by_node,
                           failed=sum(int(row["failed"]) for row in rows))


async def clean_up(source: asyncpg.Pool | DatabaseConnection, table: QueueAddress,
                   keep_for: float = KEEP_FOR_SECONDS) -> int:
    """Remove the rows of the deployments that have committed nothing for ``keep_for``
    seconds; returns how many rows went."""
    status: str = await source.execute(statements(table)["clean_up"], keep_for)
    return int(status.split()[-1])


class ReceiverCounts:
    """A receiver's rows: it numbers its running slots (the lowest number free first, so a
    receiver has at most as many rows as it ever ran slots at once) and gives each slot the
    row of its number, made before the slot's first round (:meth:`ensure_row`). Without a
    deployment id it counts nothing."""

    def __init__(self, table: QueueAddress, *, deployment_id: str, receiver_id: str,
                 node_id: str) -> None:
        self.table = table
        self._deployment_id = deployment_id
        self._receiver_id = receiver_id
        self._node_id = node_id
        self._numbers: set[int] = set()
        self._rows_checked: dict[int, float] = {}
        """Slot number: when its row was last made sure of (monotonic seconds)."""

    def slot_opened(self, slot: ReceiveSlot) -> int:
        """Number ``slot`` and have it count in its row; returns its number."""
        number = min(set(range(len(self._numbers) + 1)) - self._numbers)
        self._numbers.add(number)
        if self._deployment_id and isinstance(slot, ReceiveSlot):
            slot.count_with(SlotCounts(
                self.table, deployment_id=self._deployment_id, receiver_id=self._receiver_id,
                slot=number, node_id=self._node_id))
        return number

    async def ensure_row(self, slot: ReceiveSlot, number: int,
                         connection: DatabaseConnection) -> None:
        """Make sure of the row of slot ``number`` on ``connection`` (before the slot's first
        round), unless done in the last :data:`ROW_CHECK_SECONDS`."""
        checked = self._rows_checked.get(number)
        now = time.monotonic()
        if checked is not None and now - checked < ROW_CHECK_SECONDS:
            return
        await slot.counts.ensure_row(connection)
        self._rows_checked[number] = now

    def slot_closed(self, number: int) -> None:
        self._numbers.discard(number)

    async def clean_up(self, pool: asyncpg.Pool) -> None:
        """:func:`clean_up`, once per receiver start; a failure only leaves the rows for the
        next start."""
        if not self._deployment_id:
            return
        try:
            removed = await clean_up(pool, self.table)
        except QUERY_ERRORS as exc:
            log.warning("committed_counts_clean_up_failed", error=f"{type(exc).__name__}: {exc}")
            return
        if removed:
            log.info("committed_counts_cleaned_up", rows=removed)
