"""The endpoints of the chaos run, one per transaction mode (receivers import them by path).

Every handler execution records its effect, ``(message id, attempt, mode, pid)``, in the
business table ``chaos_effects`` through ``context.connection`` (so in the receive or business
transaction where the mode has one), sends one ``ChaosEcho`` naming the message to the sink
queue, and then fails as the message's fate says (:class:`~benchmarks.chaos.schedule.Fate`).
In ``NONE`` mode, where ``context.connection`` autocommits, it fails first instead: a failed
attempt there must leave no effect to count, and the error queue has the copy.

A handler about to raise ``DiscardMessage`` first notes the discard on a connection of its own
(:mod:`benchmarks.chaos.observer`): the raise rolls its transaction back, so the note could
not live there, and the run counts only discards it saw.

In every mode but ``NONE`` the endpoint also runs the saga :class:`ChaosTally`: each message
that ``work`` let through adds its id to the saga instance of its key, in the same transaction
as its effect (``benchmarks.chaos.saga_checks`` compares the two at the end).

``attempt`` is the execution's number among the executions of that message id in the
receiver process (the runtime's failure count is per receiver and is not shown to handlers).
"""

from __future__ import annotations

import os
import uuid

import msgspec

from benchmarks.chaos.observer import observer
from benchmarks.chaos.schedule import Fate
from endpoint_runtime import Endpoint, HandlerContext, Outbox
from endpoint_runtime.errors import DiscardMessage
from endpoint_runtime.sagas import Saga, starts

SINK = "chaos_sink"
ERROR_QUEUE = "chaos_error"
EFFECTS_TABLE = "chaos_effects"
MODES = ("none", "receive_only", "atomic", "batched", "outbox")
SAGA_MODES = ("receive_only", "atomic", "batched", "outbox")
"""The modes whose endpoint also runs the saga :class:`ChaosTally`."""
SAGA_KEYS = 50
"""Saga instances per mode (messages spread over them by ``n``)."""
MAX_COUNTED_IDS = 200_000


class ChaosWork(msgspec.Struct):
    __message_type_name__ = "Chaos.Messages.ChaosWork"
    n: int
    fate: str


class ChaosEcho(msgspec.Struct):
    __message_type_name__ = "Chaos.Messages.ChaosEcho"
    origin: str


class ChaosTransientError(Exception):
    """A failure that goes away when the message comes again."""


class ChaosPermanentError(Exception):
    """A failure that never goes away: retries, then the error queue."""


class ChaosUnrecoverableError(Exception):
    """Listed in the endpoints' ``unrecoverable_exceptions``: the error queue at once."""


_executions: dict[str, int] = {}


def _count_execution(message_id: str) -> int:
    if len(_executions) >= MAX_COUNTED_IDS:
        _executions.clear()  # bounded; only transient fates need the count, and briefly
    attempt = _executions.get(message_id, 0) + 1
    _executions[message_id] = attempt
    return attempt


def _fail_as_fated(fate: str, attempt: int) -> None:
    if fate == Fate.TRANSIENT and attempt == 1:
        raise ChaosTransientError("transient failure (first execution in this process)")
    if fate == Fate.PERMANENT:
        raise ChaosPermanentError("permanent failure")
    if fate == Fate.UNRECOVERABLE:
        raise ChaosUnrecoverableError("unrecoverable failure")
    if fate == Fate.DISCARD:
        raise DiscardMessage("discarded by its fate")


async def work(message: ChaosWork, context: HandlerContext) -> None:
    """Record the effect, send the echo, fail as fated (see the module docstring)."""
    mode = context.endpoint.removeprefix("chaos_")
    attempt = _count_execution(context.message_id)
    if message.fate == Fate.DISCARD:
        await observer.record(uuid.UUID(context.message_id), mode, "discard")
    if mode == "none":
        _fail_as_fated(message.fate, attempt)
    await context.connection.execute(
        f"INSERT INTO {EFFECTS_TABLE} (message_id, attempt, mode, pid) VALUES ($1, $2, $3, $4)",
        uuid.UUID(context.message_id), attempt, mode, os.getpid(),
    )
    await context.send(ChaosEcho(origin=context.message_id), destination=SINK)
    _fail_as_fated(message.fate, attempt)


COMMON = {
    "max_concurrency": 6,
    "slots_per_receiver": 2,
    "min_receivers": 3,
    "error_queue": ERROR_QUEUE,
    "on_critical_error": "log",
    "stop_timeout": 5.0,
    "scale_down_after": 3600.0,
}
RETRYING = {"delayed_retries": 1, "delayed_retry_delay": 1.0}
UNRECOVERABLE = (ChaosUnrecoverableError,)

chaos_none = Endpoint("chaos_none", transaction_mode="none",
                      unrecoverable_exceptions=UNRECOVERABLE, **COMMON)
chaos_receive_only = Endpoint("chaos_receive_only", transaction_mode="receive_only",
                              unrecoverable_exceptions=UNRECOVERABLE, **COMMON, **RETRYING)
chaos_atomic = Endpoint("chaos_atomic", unrecoverable_exceptions=UNRECOVERABLE,
                        **COMMON, **RETRYING)
chaos_batched = Endpoint("chaos_batched", batch_size=20,
                         unrecoverable_exceptions=UNRECOVERABLE, **COMMON, **RETRYING)
chaos_outbox = Endpoint("chaos_outbox", transaction=Outbox(),
                        unrecoverable_exceptions=UNRECOVERABLE, **COMMON, **RETRYING)
for _endpoint in (chaos_none, chaos_receive_only, chaos_atomic, chaos_batched, chaos_outbox):
    _endpoint.register(work)


def tally_key(n: int) -> str:
    """The :class:`ChaosTally` instance a message of number ``n`` belongs to."""
    return f"k{n % SAGA_KEYS}"


class TallyState(msgspec.Struct):
    key: str = ""
    applied: list[str] = msgspec.field(default_factory=list)
    """The ids of the messages whose update committed, in order (a doubled update shows)."""
    numbers: list[int] = msgspec.field(default_factory=list)
    """Each applied message's number, beside its id: the key it belongs to
    (:func:`tally_key`), so that an update found in another key's instance shows."""


class ChaosTally(Saga[TallyState]):
    """After ``work`` returned (it is registered first), each message's id is added to the
    instance of its key: the update commits with the message's effect or not at all, so at
    the end the instances hold exactly the ids of the committed effects (``saga_checks``)."""

    correlation = "key"

    @starts(correlate=lambda message: tally_key(message.n))
    async def tally(self, message: ChaosWork, context: HandlerContext) -> None:
        self.state.applied.append(context.message_id)
        self.state.numbers.append(message.n)


# Not none: there the effect and the saga's save commit apart (each statement on its own).
for _endpoint in (chaos_receive_only, chaos_atomic, chaos_batched, chaos_outbox):
    _endpoint.saga(ChaosTally)


def endpoint_path(mode: str) -> str:
    """The import path of ``mode``'s endpoint, e.g. ``benchmarks.chaos.endpoints:chaos_atomic``."""
    return f"{__name__}:chaos_{mode}"
