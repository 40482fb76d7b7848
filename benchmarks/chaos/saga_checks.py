"""The saga of the chaos run: every instance's final state against the ledger of effects.

Each handled message of a saga mode adds its id to the ``applied`` list of its
:class:`~benchmarks.chaos.endpoints.ChaosTally` instance in the transaction of its effect
(``chaos_effects``). So at the end, over all instances, the ids applied must be exactly the ids
with a committed effect, as many times: an id applied fewer times is a lost update, one applied
more times a doubled update (a lost version check, a redelivery that got through). The
instances must hold the ids of no other mode, nor any id twice across instances.
"""

from __future__ import annotations

import collections
import uuid

import asyncpg
import msgspec

from benchmarks.chaos.endpoints import SAGA_MODES, TallyState, tally_key
from endpoint_runtime.transport import QueueAddress

LISTED = 20


class SagaAccounts(msgspec.Struct, kw_only=True):
    """A saga mode's instances against its effects."""

    saga_instances: int
    saga_updates: int
    """Ids applied, over all instances."""
    saga_lost_updates: int
    """Committed effects whose id the instances do not hold as often."""
    saga_doubled_updates: int
    """Ids the instances hold more often than they have committed effects."""
    saga_misplaced_updates: int = 0
    """Updates held by an instance that is not their message's key's."""
    saga_lost_ids: list[str] = []
    saga_doubled_ids: list[str] = []
    saga_misplaced_ids: list[str] = []


def saga_account(states: list[TallyState],
                 effects: collections.Counter[uuid.UUID]) -> SagaAccounts:
    """Compare the instances' ``states`` with the committed ``effects`` of the mode."""
    applied: collections.Counter[uuid.UUID] = collections.Counter(
        uuid.UUID(i) for state in states for i in state.applied)
    lost = effects - applied
    doubled = applied - effects
    misplaced = sorted(i for state in states
                       for i, n in zip(state.applied, state.numbers, strict=True)
                       if tally_key(n) != state.key)
    return SagaAccounts(
        saga_instances=len(states), saga_updates=sum(applied.values()),
        saga_lost_updates=sum(lost.values()), saga_doubled_updates=sum(doubled.values()),
        saga_misplaced_updates=len(misplaced),
        saga_lost_ids=sorted(map(str, lost))[:LISTED],
        saga_doubled_ids=sorted(map(str, doubled))[:LISTED],
        saga_misplaced_ids=misplaced[:LISTED])


def saga_failed_checks(accounts: SagaAccounts | None) -> list[str]:
    if accounts is None:
        return []
    checks = {"saga_lost_updates == 0": accounts.saga_lost_updates == 0,
              "saga_doubled_updates == 0": accounts.saga_doubled_updates == 0,
              "saga_misplaced_updates == 0": accounts.saga_misplaced_updates == 0}
    return [name for name, held in checks.items() if not held]


async def read_states(connection: asyncpg.Connection, mode: str,
                      queue: QueueAddress) -> list[TallyState] | None:
    """The final states of ``mode``'s instances (``None``: the mode runs no saga)."""
    if mode not in SAGA_MODES:
        return None
    table = QueueAddress(f"{queue.table}_ChaosTally", queue.schema)
    return [msgspec.json.decode(row["data"], type=TallyState) for row in
            await connection.fetch(f'SELECT "Data"::text AS data FROM {table.qualified}')]
