"""Planted faults: the run's self-test that its checks can fail.

``--plant-loss K`` deletes K queued messages behind the runtime's back (as a bug that drops
a message would); ``--plant-duplicate K`` writes a second business effect for K handled
messages (as a bug that handles a message twice would: re-sending the message itself would
be deduplicated by the outbox, correctly). Either must make the mode's ``ok`` false, naming
the planted ids (``lost_ids`` or ``untraced_lost_ids``, ``duplicate_ids``).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec

from benchmarks.chaos.ledger import TRANSIENT_ERRORS, connect, sql
from benchmarks.common import progress
from endpoint_runtime.transport import QueueAddress

PLANT_EVERY = 0.02
"""Seconds between tries while fewer than K ids could be planted."""


class Planted(msgspec.Struct, kw_only=True):
    """The ids planted in one mode's run."""

    loss: list[str] = []
    duplicate: list[str] = []


async def plant(dsn: str, mode: str, queue: QueueAddress, *, block: str, count: int,
                after: float, until: float) -> list[uuid.UUID]:
    """Run ``block`` (``plant_loss`` or ``plant_duplicate``) ``after`` seconds, again until
    ``count`` ids are planted or ``until`` seconds have passed; returns the planted ids."""
    started = time.monotonic()
    await asyncio.sleep(after)
    planted: list[uuid.UUID] = []
    while len(planted) < count and time.monotonic() - started < until:
        try:
            connection = await connect(dsn)
            try:
                rows = await connection.fetch(sql(block, queue=queue.qualified), mode,
                                              count - len(planted))
            finally:
                await connection.close()
            planted.extend(r[0] for r in rows)
        except TRANSIENT_ERRORS:
            pass  # a restart or a termination: try again
        if len(planted) < count:
            await asyncio.sleep(PLANT_EVERY)
    progress(f"chaos: {mode}: planted {block.removeprefix('plant_')} of {len(planted)} "
             f"messages: {', '.join(map(str, planted))}")
    return planted
