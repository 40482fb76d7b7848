"""The endpoints the scale-out benchmark deploys (receivers import them by path).

Each handles :class:`Job` with the sink work every side does: one row in ``scaleout_sink``
(the peers' table, :mod:`benchmarks.scaleout.peers.sink`), here inside the receive transaction
(atomic and batched modes) or the outbox's business transaction.
"""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, Outbox

INSERT_SINK = (
    "INSERT INTO scaleout_sink (job_key, sent_at, started_at, body) "
    "VALUES ($1, $2, extract(epoch FROM clock_timestamp())::float8, $3)"
)


class Job(msgspec.Struct):
    """One message: its key, its send time (database clock, epoch s) and its body."""

    __message_type_name__ = "Benchmarks.Scaleout.Job"
    key: int
    sent_at: float
    body: str


async def record(message: Job, context: HandlerContext) -> None:
    """The business effect: one sink row, in the handler's transaction."""
    await context.connection.execute(
        INSERT_SINK, message.key, message.sent_at, message.body.encode())


atomic = Endpoint("scaleout_atomic")
atomic.register(record)

receive_only = Endpoint("scaleout_receive_only", transaction_mode="receive_only")
receive_only.register(record)

outbox = Endpoint("scaleout_outbox", transaction=Outbox())
outbox.register(record)


FAILING_EVERY = 100
"""The 1%-failing sides: the message whose key is the last of each hundred fails on every
attempt, after its write (so its batch has work to roll back)."""


class JobFailedError(Exception):
    """The failure of a failing side's message (every attempt)."""


def fails(key: int) -> bool:
    return key % FAILING_EVERY == FAILING_EVERY - 1


async def record_or_fail(message: Job, context: HandlerContext) -> None:
    """:func:`record`, then the failure of one message in a hundred."""
    await record(message, context)
    if fails(message.key):
        raise JobFailedError(f"job {message.key} fails on every attempt")


# Default immediate retries (5), delayed retries off: 6 attempts, then the error queue.
failing = Endpoint("scaleout_failing", delayed_retries=0)
failing.register(record_or_fail)
