"""What happens when: the fates of the messages and the faults of a run, from one seed.

Pure logic (no database, no Ray): the same seed gives the same fates and the same fault
schedule, so a failed run can be replayed with ``--seed``. Each mode draws from generators of
its own, derived from the seed and the mode's name (:func:`generator`): ``--seed 7 --modes
atomic`` replays atomic's messages, fates and fault schedule of ``--seed 7`` with every mode.
The fault injector's choices during the run (which receiver, which backends) come from yet
another generator, so they never shift the others' draws.
"""

from __future__ import annotations

import enum
import random
import uuid

import msgspec


class Fate(enum.StrEnum):
    """What the handler does with a message (carried in its body)."""

    OK = "ok"
    TRANSIENT = "transient"
    """Fails the first time each receiver process sees it, then succeeds (retries)."""
    PERMANENT = "permanent"
    """Always fails: immediate retries, a delayed retry, then the error queue."""
    UNRECOVERABLE = "unrecoverable"
    """Raises an exception type the endpoint lists as unrecoverable: the error queue at once."""
    DISCARD = "discard"
    """Raises ``DiscardMessage``: dropped on purpose, counted as discarded."""


FATE_WEIGHTS: dict[Fate, float] = {
    Fate.OK: 0.90,
    Fate.TRANSIENT: 0.05,
    Fate.PERMANENT: 0.02,
    Fate.UNRECOVERABLE: 0.02,
    Fate.DISCARD: 0.01,
}
"""10% of the messages' handlers fail (transient, permanent, unrecoverable, discard)."""


class FaultKind(enum.StrEnum):
    KILL_RECEIVER = "kill_receiver"
    KILL_PEEKER = "kill_peeker"
    TERMINATE_BACKENDS = "terminate_backends"
    RESTART_POSTGRES = "restart_postgres"
    POISON_BURST = "poison_burst"
    RESTART_POOLER = "restart_pooler"
    """A run behind PgBouncer: the pooler killed and started again (every client cut)."""


class PoisonKind(enum.StrEnum):
    """Rows no handler can take, written straight into the queue table."""

    CORRUPT_HEADERS = "corrupt_headers"
    UNDECODABLE_BODY = "undecodable_body"
    UNKNOWN_TYPE = "unknown_type"
    EXPIRED = "expired"


class Fault(msgspec.Struct, frozen=True):
    at: float
    """Seconds after the start of the send stream."""
    kind: FaultKind


class Purpose(enum.StrEnum):
    """What a generator of :func:`generator` is for (each draws from its own)."""

    MESSAGES = "messages"
    """The message ids and their fates."""
    SCHEDULE = "schedule"
    """When each fault happens."""
    INJECTOR = "injector"
    """The injector's picks at run time (a receiver to kill, backends, poison ids)."""


def generator(seed: int, mode: str, purpose: Purpose) -> random.Random:
    """The generator of ``mode``'s ``purpose`` under ``seed``: the same for the same three,
    whichever other modes run (a string seed is hashed with SHA-512, stable across runs)."""
    return random.Random(f"chaos:{seed}:{mode}:{purpose.value}")


def message_ids(rng: random.Random, count: int) -> list[uuid.UUID]:
    """``count`` version-4 UUIDs drawn from ``rng`` (the same seed, the same ids)."""
    return [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(count)]


def fates(rng: random.Random, count: int) -> list[Fate]:
    """The fates of ``count`` messages, drawn with :data:`FATE_WEIGHTS`."""
    kinds = list(FATE_WEIGHTS)
    return rng.choices(kinds, weights=[FATE_WEIGHTS[k] for k in kinds], k=count)


def fault_schedule(rng: random.Random, duration: float, *,
                   kill_interval: float = 4.0, pooler: bool = False) -> list[Fault]:
    """The faults of one mode's run over ``duration`` seconds of send stream, by time.

    A receiver is killed every ``kill_interval`` s (jittered by a quarter either way); the
    peeker once, at about a third; the runtime's backends terminated at about a fifth and at
    four fifths; the server restarted once, at about the middle; one poison burst early.
    With ``pooler`` (a run behind PgBouncer) the pooler is restarted too, at about 45% and
    70%, drawn after the rest so that the other faults keep their times under a seed.
    """
    def near(fraction: float) -> float:
        return duration * fraction + rng.uniform(-0.05, 0.05) * duration

    faults = [
        Fault(near(0.10), FaultKind.POISON_BURST),
        Fault(near(0.20), FaultKind.TERMINATE_BACKENDS),
        Fault(near(0.35), FaultKind.KILL_PEEKER),
        Fault(near(0.55), FaultKind.RESTART_POSTGRES),
        Fault(near(0.80), FaultKind.TERMINATE_BACKENDS),
    ]
    at = kill_interval
    while at < duration:
        faults.append(Fault(at + rng.uniform(-0.25, 0.25) * kill_interval,
                            FaultKind.KILL_RECEIVER))
        at += kill_interval
    if pooler:
        faults += [Fault(near(0.45), FaultKind.RESTART_POOLER),
                   Fault(near(0.70), FaultKind.RESTART_POOLER)]
    return sorted(faults, key=lambda fault: fault.at)
