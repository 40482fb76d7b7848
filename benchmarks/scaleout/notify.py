"""``notify_on_send`` on and off at a high send rate: what the queue's NOTIFY costs.

Every queue table has a statement-level trigger that NOTIFYs the queue's channel
(``TransportSettings.notify_on_send``, on by default), so that an idle receiver wakes at once
instead of at its next peek. In PostgreSQL 16 and earlier a transaction that notified takes a
database-wide lock while it queues its notifications at commit, so concurrent senders' commits
pass one at a time through that step. It shows where sends are many and small: here
``senders`` connections send ``Load.messages`` messages as fast as they can, one message per
transaction (the runtime's send statement), while a single-message atomic deployment handles
them (its receivers LISTEN when notify is on, and only peek when it is off).

Figures per drain: the send rate (messages over the time until the last send committed), the
end-to-end rate (``msgs_per_s``: from the first send until the sink holds every message), the
handler-start latency, p50 and p99, on the database's clock, and the NOTIFYs a listener of the
queue's channel heard (sends notify only while the endpoint waits: ``transport.waiting``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from benchmarks.scaleout.endpoints import Job
from benchmarks.scaleout.peers.sink import random_body
from benchmarks.scaleout.runtime_sides import ATOMIC, Deployed, RuntimeSide, wait_for_rows
from benchmarks.scaleout.side import DrainResult, LatencyResult, Load
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.transport import sending


async def send_as_fast_as_possible(running: Deployed, load: Load, senders: int) -> float:
    """``senders`` connections send the load's messages, one per transaction, taking keys
    from one shared sequence; the time (perf_counter) the last send committed."""
    body = random_body(load.body_bytes).decode()
    keys = iter(range(load.messages))

    async def sender(connection: asyncpg.Connection) -> None:
        for key in keys:  # one iterator for all senders: each key is sent once
            message = create_outgoing(Job(key, running.clock.now(), body),
                                      originating_endpoint="scaleout")
            await sending.send(connection, running.queue, message)

    async def acquired() -> None:
        async with running.pool.acquire() as connection:
            await sender(connection)

    await asyncio.gather(*(acquired() for _ in range(senders)))
    return time.perf_counter()


@dataclass
class NotifySide:
    """Closed-loop senders beside a single-message atomic deployment, notify on or off (a
    :class:`~benchmarks.scaleout.side.Side` whose drain starts with an empty queue)."""

    notify_on_send: bool
    senders: int = 16

    @property
    def name(self) -> str:
        return f"notify_{'on' if self.notify_on_send else 'off'}_senders_{self.senders}"

    @property
    def config(self) -> dict[str, Any]:
        return {"notify_on_send": self.notify_on_send, "senders": self.senders}

    async def drain(self, dsn: str, load: Load) -> DrainResult:
        """Send every message while the deployment handles them; time until the sink is full."""
        side = RuntimeSide(self.name, ATOMIC, transport={"notify_on_send": self.notify_on_send})
        async with side.deployed(dsn, load, pool_size=self.senders + 2) as running:
            heard: list[float] = []  # the queue's NOTIFYs, as a listener of its channel hears them
            listening = await asyncpg.connect(running.dsn)
            await listening.add_listener(running.queue.notify_channel,
                                         lambda *_: heard.append(time.perf_counter()))
            started = time.perf_counter()
            sent = await send_as_fast_as_possible(running, load, self.senders)
            done = await wait_for_rows(running.pool, load.messages, 60 + load.messages / 50)
            await listening.close()
            await running.stop()
            handled, duplicates = await running.counted()
            to_start, _ = await running.latencies()
        figures = {"send_msgs_per_s": round(load.messages / (sent - started), 1),
                   "to_handler_start_p50_ms": to_start.get("p50", 0.0),
                   "to_handler_start_p99_ms": to_start.get("p99", 0.0),
                   # Sends that notified (a NOTIFY per send transaction; the queue's channel
                   # is marked waiting only while the endpoint is idle: transport.waiting).
                   "notifies_heard": len(heard),
                   "notifies_heard_while_sending": sum(t <= sent for t in heard)}
        return DrainResult(self.name, self.config, load, done - started, handled, duplicates,
                           figures)

    async def open_loop(self, dsn: str, load: Load, rate_per_s: float,
                        seconds: float) -> LatencyResult:
        raise NotImplementedError("the notify phase is a closed loop of senders")


def notify_ratios(sides: dict[str, dict[str, Any]], senders: int) -> dict[str, float | None]:
    """Off against on, for the send rate and the end-to-end rate, from the phase's medians."""
    on = sides.get(NotifySide(True, senders).name)
    off = sides.get(NotifySide(False, senders).name)
    if not on or not off:
        return {"send_off_vs_on": None, "end_to_end_off_vs_on": None}
    return {
        "send_off_vs_on": round(off["figures"]["send_msgs_per_s"]
                                / on["figures"]["send_msgs_per_s"], 3),
        "end_to_end_off_vs_on": round(off["msgs_per_s"] / on["msgs_per_s"], 3),
    }
