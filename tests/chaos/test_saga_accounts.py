"""The chaos run's saga check, without a database: instances that hold exactly the ids of the
committed effects pass; a planted lost update and a planted doubled update each fail their
check, naming the planted id; a mode without a saga has no saga check."""

from __future__ import annotations

import collections
import uuid

from benchmarks.chaos.endpoints import (
    ChaosTally,
    TallyState,
    chaos_atomic,
    chaos_none,
    tally_key,
)
from benchmarks.chaos.saga_checks import saga_account, saga_failed_checks


def ledger(count: int) -> tuple[list[uuid.UUID], collections.Counter[uuid.UUID]]:
    ids = [uuid.UUID(int=n + 1) for n in range(count)]
    return ids, collections.Counter(ids)


def instances(ids: list[uuid.UUID], keys: int = 3) -> list[TallyState]:
    """The instances of ``keys`` keys, message ``n`` of ``ids`` (its number) in key
    ``tally_key(n)``: with fewer keys than the run's, only keys below ``keys`` are used."""
    states = {f"k{k}": TallyState(key=f"k{k}") for k in range(keys)}
    for n, i in enumerate(ids):
        state = states[tally_key(n % keys)]
        state.applied.append(str(i))
        state.numbers.append(n % keys)
    return list(states.values())


def test_instances_holding_every_committed_effect_once_pass() -> None:
    ids, effects = ledger(10)
    accounts = saga_account(instances(ids), effects)
    assert (accounts.saga_instances, accounts.saga_updates) == (3, 10)
    assert saga_failed_checks(accounts) == []


def test_a_planted_lost_update_and_a_planted_doubled_update_fail_naming_their_ids() -> None:
    ids, effects = ledger(10)
    lost, doubled = ids[4], ids[7]
    states = instances([i for i in ids if i != lost] + [doubled])  # once missing, once extra
    accounts = saga_account(states, effects)
    assert saga_failed_checks(accounts) == ["saga_lost_updates == 0",
                                            "saga_doubled_updates == 0"]
    assert accounts.saga_misplaced_updates == 0
    assert (accounts.saga_lost_ids, accounts.saga_doubled_ids) == ([str(lost)], [str(doubled)])
    assert (accounts.saga_lost_updates, accounts.saga_doubled_updates) == (1, 1)


def test_the_saga_runs_in_the_transactional_modes_after_the_work_handler() -> None:
    assert saga_failed_checks(None) == []
    assert len(chaos_none.sagas) == 0
    (definition,) = chaos_atomic.sagas.definitions
    assert definition.saga_type is ChaosTally
    (work, tally) = chaos_atomic.registry.handlers_for(next(iter(definition.handlers)))
    assert (work.__name__, tally.__qualname__) == ("work", "ChaosTally.tally")


def test_a_planted_update_in_another_keys_instance_fails_naming_its_id() -> None:
    """Each id once, as the effects say, but one held by the instance of another key (a
    correlation that found the wrong instance): lost and doubled counts cannot see it."""
    ids, effects = ledger(10)
    states = instances(ids)
    moved = states[0].applied.pop(0)
    number = states[0].numbers.pop(0)
    states[1].applied.append(moved)
    states[1].numbers.append(number)
    accounts = saga_account(states, effects)
    assert (accounts.saga_lost_updates, accounts.saga_doubled_updates) == (0, 0)
    assert saga_failed_checks(accounts) == ["saga_misplaced_updates == 0"]
    assert accounts.saga_misplaced_ids == [moved]
