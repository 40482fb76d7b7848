"""The chaos run's bookkeeping, without a database: fates and faults from a seed, the
classification of every message id, the checks per mode, recovery times."""

from __future__ import annotations

import collections
import random
import uuid

import pytest

from benchmarks.chaos.checks import account, failed_checks, recovery_times
from benchmarks.chaos.schedule import Fate, FaultKind, PoisonKind, fates, fault_schedule


def test_the_same_seed_gives_the_same_fates_and_faults() -> None:
    first, second = random.Random(3), random.Random(3)
    assert fates(first, 500) == fates(second, 500)
    assert fault_schedule(first, 60.0) == fault_schedule(second, 60.0)


def test_about_one_message_in_ten_fails_and_every_fault_kind_is_scheduled() -> None:
    drawn = collections.Counter(fates(random.Random(1), 20_000))
    assert 0.08 < 1 - drawn[Fate.OK] / 20_000 < 0.12
    schedule = fault_schedule(random.Random(1), 40.0, kill_interval=4.0)
    kinds = collections.Counter(fault.kind for fault in schedule)
    assert kinds[FaultKind.KILL_PEEKER] == 1
    assert kinds[FaultKind.RESTART_POSTGRES] == 1
    assert kinds[FaultKind.POISON_BURST] == 1
    assert kinds[FaultKind.TERMINATE_BACKENDS] == 2
    assert kinds[FaultKind.KILL_RECEIVER] == 9
    assert [f.at for f in schedule] == sorted(f.at for f in schedule)
    assert all(0 <= f.at <= 40.0 for f in schedule)


def _ids(count: int) -> list[uuid.UUID]:
    return [uuid.uuid4() for _ in range(count)]


def test_every_id_lands_in_exactly_one_account() -> None:
    ok, permanent, discard, expired, corrupt, gone = _ids(6)
    sent = {ok: Fate.OK.value, permanent: Fate.PERMANENT.value, discard: Fate.DISCARD.value,
            expired: PoisonKind.EXPIRED.value, corrupt: PoisonKind.CORRUPT_HEADERS.value,
            gone: Fate.OK.value}
    effects = collections.Counter({ok: 1, uuid.uuid4(): 1})  # another mode's effect ignored
    echoes = collections.Counter({ok: 1, permanent: 7})  # receive-only's ghosts
    accounts = account("receive_only", sent, effects, {permanent, corrupt}, echoes)
    assert (accounts.sent, accounts.handled, accounts.error_queue, accounts.expired,
            accounts.discarded, accounts.lost) == (6, 1, 2, 1, 1, 1)
    assert accounts.lost_ids == [str(gone)]
    assert accounts.ghost_sends == 7
    assert failed_checks(accounts) == ["lost == 0"]


@pytest.mark.parametrize("mode", ["atomic", "batched", "outbox"])
def test_exactly_once_modes_fail_on_a_duplicate_effect_or_a_ghost_send(mode: str) -> None:
    first, second = _ids(2)
    sent = {first: Fate.OK.value, second: Fate.TRANSIENT.value}
    clean = account(mode, sent, collections.Counter({first: 1, second: 1}), set(),
                    collections.Counter({first: 1, second: 1}))
    assert failed_checks(clean) == []
    twice = account(mode, sent, collections.Counter({first: 2, second: 1}), set(),
                    collections.Counter({first: 1, second: 2}))
    assert twice.duplicate_effects == 1
    assert twice.ghost_sends == 1
    assert failed_checks(twice) == ["duplicate_effects == 0", "ghost_sends == 0"]


def test_none_mode_counts_losses_but_not_a_second_effect() -> None:
    kept, lost = _ids(2)
    sent = {kept: Fate.OK.value, lost: Fate.OK.value}
    accounts = account("none", sent, collections.Counter({kept: 1}), set(),
                       collections.Counter({kept: 1}))
    assert accounts.lost == 1
    assert failed_checks(accounts) == []
    twice = account("none", sent, collections.Counter({kept: 2}), set(),
                    collections.Counter({kept: 2}))
    assert failed_checks(twice) == ["duplicate_effects == 0"]


def test_a_poison_row_or_a_permanent_failure_with_an_effect_fails_every_mode() -> None:
    poison, permanent = _ids(2)
    sent = {poison: PoisonKind.UNKNOWN_TYPE.value, permanent: Fate.PERMANENT.value}
    accounts = account("none", sent, collections.Counter({poison: 1, permanent: 1}), set(),
                       collections.Counter({poison: 1, permanent: 1}))
    assert accounts.wrongly_handled == 2
    assert "wrongly_handled == 0" in failed_checks(accounts)


def test_leftovers_fail_the_checks() -> None:
    accounts = account("atomic", {}, collections.Counter(), set(), collections.Counter())
    accounts.left_in_queue = 1
    accounts.left_in_delayed = 2
    assert failed_checks(accounts) == ["left_in_queue == 0", "left_in_delayed == 0"]


def test_recovery_is_the_time_until_throughput_is_back_to_ninety_percent() -> None:
    # 100 effects per second for 10 s, none from 10 to 12.5 s, then 100 per second again.
    times = [n / 100 for n in range(1000)] + [12.5 + n / 100 for n in range(1000)]
    # From 12.4 s the next second holds 90 effects (12.5 to 13.39 s): 90% of 100 per second.
    assert recovery_times(times, [10.0]) == [2.4]
    # A fault that changes nothing: recovered at once.
    assert recovery_times(times, [5.0]) == [0.0]
    # Nothing flowed before: nothing to recover.
    assert recovery_times(times, [-10.0]) == [0.0]


def test_a_fault_after_which_throughput_never_returns_has_no_recovery_time() -> None:
    times = [n / 100 for n in range(1000)] + [30.0 + n / 100 for n in range(10)]
    assert recovery_times(times, [10.0]) == [None]
