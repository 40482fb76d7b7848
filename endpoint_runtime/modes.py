"""The transaction modes and what each allows: the one home of a mode's rules.

Settings check their fields and take their retry defaults from these rules, and the endpoint
checks a handler's retry options against them; ``transactions.assembly`` picks each mode's
strategy, whose unit tells the chain the rest (``Unit.retries``: whether a failed message comes
back). The modes themselves are NServiceBus's ``TransportTransactionMode``; the outbox is
not a mode but runs on receive-only transport transactions.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class TransactionMode(enum.StrEnum):
    """Transport transaction mode of an endpoint (NServiceBus ``TransportTransactionMode``);
    one strategy module per mode in ``endpoint_runtime.transactions``."""

    NONE = "none"
    """Receive commits before handling; a failed message is not retried (at-most-once)."""
    RECEIVE_ONLY = "receive_only"
    """Receive is rolled back on failure; sends already made stay sent."""
    SENDS_ATOMIC_WITH_RECEIVE = "sends_atomic_with_receive"
    """Receive, sends and handler writes through ``context.connection`` commit as one."""


class ModeRules(NamedTuple):
    """What a transaction mode allows."""

    retries: bool
    """A failed message comes back (else it goes to the error queue at once)."""
    batching: bool
    """Several messages per receive transaction (``batch_size > 1``)."""
    outbox_base: bool
    """The outbox can run on it."""
    sends_with_receive: bool
    """Outgoing messages are written in the receive transaction (else they leave at once;
    with the outbox: in its record, dispatched after the business commit)."""
    default_immediate_retries: int
    default_delayed_retries: int


RULES: dict[TransactionMode, ModeRules] = {
    TransactionMode.NONE: ModeRules(
        retries=False, batching=False, outbox_base=False, sends_with_receive=False,
        default_immediate_retries=0, default_delayed_retries=0),
    TransactionMode.RECEIVE_ONLY: ModeRules(
        retries=True, batching=False, outbox_base=True, sends_with_receive=False,
        default_immediate_retries=5, default_delayed_retries=3),
    TransactionMode.SENDS_ATOMIC_WITH_RECEIVE: ModeRules(
        retries=True, batching=True, outbox_base=False, sends_with_receive=True,
        default_immediate_retries=5, default_delayed_retries=3),
}


def rules_of(mode: TransactionMode) -> ModeRules:
    return RULES[mode]


def needing(rule: str) -> str:
    """The modes that allow ``rule``, for error messages."""
    return " or ".join(f"TransactionMode.{m.name}" for m, r in RULES.items() if getattr(r, rule))
