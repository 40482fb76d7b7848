"""The pieces of the committed counts that need no database: the statement a slot sends with
its COMMIT when its connection keeps no prepared statements, the counts none mode carries,
and how a receiver numbers its slots (one row each)."""

from __future__ import annotations

from endpoint_runtime.runtime.actors.committed_counts import ReceiverCounts
from endpoint_runtime.transactions.base import ReceiveSlot
from endpoint_runtime.transactions.counting import (
    NO_COUNTS,
    PendingCounts,
    SlotCounts,
    counts_table,
)
from endpoint_runtime.transport.addresses import QueueAddress

TABLE = counts_table(QueueAddress("sales", "shop"))


class UntrackedConnection:
    """A connection that keeps no SQL-level prepared statements: the statement is sent with
    its values as literals (no statement runs here)."""


async def test_without_prepared_statements_the_count_is_one_statement_of_literals() -> None:
    counts = SlotCounts(TABLE, deployment_id="d'1", receiver_id="sales-1", slot=2,
                        node_id="n1")
    statement = await counts.statement(UntrackedConnection(), processed=3,  # type: ignore[arg-type]
                                       failed=1)
    assert TABLE.qualified == '"shop"."sales_CommittedCounts"'
    assert statement == (
        f"UPDATE {TABLE.qualified}\n"
        "SET processed = processed + 3, failed = failed + 1, updated_at = now()\n"
        "WHERE deployment_id = E'd''1' AND receiver_id = E'sales-1' AND slot = 2")
    assert await counts.statement(UntrackedConnection()) == ""  # type: ignore[arg-type]
    assert await NO_COUNTS.statement(UntrackedConnection(), processed=1) == ""  # type: ignore[arg-type]


def test_pending_counts_keep_what_a_failed_statement_carried() -> None:
    pending = PendingCounts()
    pending.add(processed=2)
    carried = pending.snapshot()
    pending.add(processed=1, failed=1)  # counted while the statement was on its way
    pending.sent(carried)
    assert pending.snapshot() == (1, 1)


def test_a_receiver_gives_each_running_slot_the_lowest_free_number_and_its_row() -> None:
    counts = ReceiverCounts(TABLE, deployment_id="d1", receiver_id="sales-1", node_id="n1")
    slots = [ReceiveSlot(None) for _ in range(3)]  # type: ignore[arg-type]
    assert [counts.slot_opened(slot) for slot in slots] == [0, 1, 2]
    counts.slot_closed(1)
    again = ReceiveSlot(None)  # type: ignore[arg-type]
    assert counts.slot_opened(again) == 1
    assert isinstance(again.counts, SlotCounts)
    assert again.counts is not NO_COUNTS
    unnamed = ReceiverCounts(TABLE, deployment_id="", receiver_id="sales-2", node_id="n1")
    outside = ReceiveSlot(None)  # type: ignore[arg-type]
    unnamed.slot_opened(outside)
    assert outside.counts is NO_COUNTS  # no deployment: nothing counted
