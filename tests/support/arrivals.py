"""When delayed messages arrive, against when they were due, both by the database's clock.

A trigger on the destination queue records, for every row inserted, ``clock_timestamp()`` and
the due time that the delayed-message store holds for that row id (the mover inserts the row
and removes it from the store in one transaction, so the store row is still there; rows that
did not come through the store get no due time). Neither time comes from the test's clock or
from a header the sender wrote itself.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import asyncpg
import msgspec

from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.transport.addresses import quote_identifier

LATE_MARGIN = timedelta(seconds=5)
"""How late after its due time a message may arrive. The mover sleeps until the next due time
by the database's clock (and NOTIFY wakes it for a new one): lateness is a few milliseconds
(see the README's benchmark figures); the margin is for a loaded, shared 2-core machine."""


class Arrival(msgspec.Struct, frozen=True):
    id: uuid.UUID
    arrived: datetime
    due: datetime | None  # None: the row did not come from the store


async def record_arrivals(
    pool: asyncpg.Pool, queue: QueueAddress, store_table: QueueAddress
) -> None:
    """Record every row inserted into ``queue`` (an existing queue) in table ``arrivals``;
    ``store_table`` is the delayed-message store's table (it need not exist yet)."""
    await pool.execute(f"""
        CREATE TABLE IF NOT EXISTS arrivals (
            id uuid, arrived timestamptz NOT NULL, due timestamptz);
        CREATE OR REPLACE FUNCTION record_arrival() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO arrivals (id, arrived, due)
            VALUES (NEW.id, clock_timestamp(),
                    (SELECT min(due) FROM {store_table.qualified} WHERE id = NEW.id));
            RETURN NEW;
        END $$;
        CREATE TRIGGER {quote_identifier("record_arrival_" + queue.table)}
            AFTER INSERT ON {queue.qualified}
            FOR EACH ROW EXECUTE FUNCTION record_arrival()""")


async def arrivals(pool: asyncpg.Pool, *, delayed_only: bool = True) -> list[Arrival]:
    """What ``record_arrivals`` recorded, in order of arrival."""
    rows = await pool.fetch("SELECT id, arrived, due FROM arrivals ORDER BY arrived")
    return [Arrival(r["id"], r["arrived"], r["due"]) for r in rows
            if r["due"] is not None or not delayed_only]


def assert_on_time(arrival: Arrival) -> None:
    """Arrived from the store, not before its due time, and less than LATE_MARGIN after."""
    assert arrival.due is not None, f"{arrival.id} did not come through the store"
    assert arrival.arrived >= arrival.due, f"{arrival.id}: {arrival.due - arrival.arrived} early"
    assert arrival.arrived - arrival.due < LATE_MARGIN, f"{arrival.id}: late"
