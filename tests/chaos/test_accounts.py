"""The chaos run's bookkeeping, without a database: fates and faults from a seed, the
placing of every message id by what was observed of it, the checks per mode (each planted
in a synthetic ledger, to show it can fail), recovery times."""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import random
import sys
import uuid

import pytest

from benchmarks.chaos.__main__ import parse
from benchmarks.chaos.checks import (
    CUT_WINDOW,
    CutAt,
    Observed,
    Place,
    Receive,
    account,
    expected_place,
    failed_checks,
)
from benchmarks.chaos.observations import receive_of
from benchmarks.chaos.pooler import client_port_of
from benchmarks.chaos.recovery import recovery_times
from benchmarks.chaos.schedule import (
    Fate,
    FaultKind,
    PoisonKind,
    Purpose,
    fates,
    fault_schedule,
    generator,
    message_ids,
)

MODES = ("none", "receive_only", "atomic", "batched", "outbox")


def test_the_same_seed_gives_the_same_fates_and_faults() -> None:
    first, second = random.Random(3), random.Random(3)
    assert fates(first, 500) == fates(second, 500)
    assert fault_schedule(first, 60.0) == fault_schedule(second, 60.0)


def test_each_mode_replays_alone_what_it_drew_beside_the_others() -> None:
    def draws(seed: int, mode: str) -> tuple[object, ...]:
        messages = generator(seed, mode, Purpose.MESSAGES)
        ids = message_ids(messages, 50)
        return (ids, fates(messages, 50),
                fault_schedule(generator(seed, mode, Purpose.SCHEDULE), 30.0))

    # Whatever ran before (here: the injector drew a thousand picks), atomic draws the same.
    injector = generator(7, "none", Purpose.INJECTOR)
    for _ in range(1000):
        injector.random()
    assert draws(7, "atomic") == draws(7, "atomic")
    assert draws(7, "atomic") != draws(7, "batched")
    assert draws(7, "atomic") != draws(8, "atomic")
    # The injector's own generator is not the schedule's: its picks never shift the faults.
    assert (generator(7, "atomic", Purpose.INJECTOR).random()
            != generator(7, "atomic", Purpose.SCHEDULE).random())


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


def test_where_each_fate_must_end_per_mode() -> None:
    for mode in MODES:
        assert expected_place(mode, Fate.OK) is Place.HANDLED
        assert expected_place(mode, Fate.PERMANENT) is Place.ERROR_QUEUE
        assert expected_place(mode, Fate.UNRECOVERABLE) is Place.ERROR_QUEUE
        assert expected_place(mode, Fate.DISCARD) is Place.DISCARDED
        assert expected_place(mode, PoisonKind.EXPIRED) is Place.EXPIRED
        assert expected_place(mode, PoisonKind.UNKNOWN_TYPE) is Place.ERROR_QUEUE
        assert expected_place(mode, Fate.TRANSIENT) is (
            Place.ERROR_QUEUE if mode == "none" else Place.HANDLED)


def _ids(count: int) -> list[uuid.UUID]:
    return [uuid.uuid4() for _ in range(count)]


class Ledger:
    """A synthetic ledger in which every message ends where its fate says (a clean run)."""

    def __init__(self, mode: str, per_fate: int = 3) -> None:
        self.mode = mode
        self.sent: dict[uuid.UUID, str] = {}
        self.effects: collections.Counter[uuid.UUID] = collections.Counter()
        self.error_queue: dict[uuid.UUID, str] = {}
        self.expired: set[uuid.UUID] = set()
        self.discards: set[uuid.UUID] = set()
        self.echoes: collections.Counter[uuid.UUID] = collections.Counter()
        for kind in [*Fate, *PoisonKind]:
            for message_id in _ids(per_fate):
                self.sent[message_id] = kind.value
                self.place(message_id, expected_place(mode, kind))

    def place(self, message_id: uuid.UUID, place: Place) -> None:
        if place is Place.HANDLED:
            self.effects[message_id] += 1
            self.echoes[message_id] += 1
        elif place is Place.ERROR_QUEUE:
            self.error_queue[message_id] = "benchmarks.chaos.endpoints.ChaosPermanentError"
        elif place is Place.EXPIRED:
            self.expired.add(message_id)
        else:
            self.discards.add(message_id)

    def of(self, kind: Fate | PoisonKind) -> uuid.UUID:
        return next(i for i, k in self.sent.items() if k == kind)

    def observed(self, **changes: object) -> Observed:
        fields: dict[str, object] = {
            "mode": self.mode, "sent": self.sent, "effects": self.effects,
            "error_queue": self.error_queue, "expired": self.expired,
            "discards": self.discards, "queued": set(), "echoes": self.echoes}
        return Observed(**{**fields, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_a_clean_ledger_passes_every_check(mode: str) -> None:
    accounts = account(Ledger(mode).observed())
    assert failed_checks(accounts) == []
    assert accounts.sent == 3 * (len(Fate) + len(PoisonKind))
    assert accounts.fate_mismatches == accounts.lost == accounts.accounted_twice == 0
    assert accounts.discarded == 3
    assert accounts.expired == 3


@pytest.mark.parametrize("mode", MODES)
def test_a_message_that_vanished_is_lost_and_named(mode: str) -> None:
    ledger = Ledger(mode)
    gone = ledger.of(Fate.OK)
    del ledger.effects[gone]
    accounts = account(ledger.observed())
    assert accounts.lost == 1
    assert accounts.lost_ids == [str(gone)]
    expected = "lost == lost_traced" if mode == "none" else "lost == 0"
    assert expected in failed_checks(accounts)
    assert "conservation" not in failed_checks(accounts)  # counted, not inferred


@pytest.mark.parametrize("mode", MODES)
def test_a_discard_fate_no_handler_was_seen_discarding_is_lost_not_discarded(mode: str) -> None:
    ledger = Ledger(mode)
    untouched = ledger.of(Fate.DISCARD)
    ledger.discards.discard(untouched)
    accounts = account(ledger.observed())
    assert accounts.discarded == 2
    assert accounts.lost_ids == [str(untouched)]
    assert failed_checks(accounts)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fate", [Fate.OK, Fate.TRANSIENT])
def test_a_message_that_should_succeed_in_the_error_queue_is_a_fate_mismatch(
        mode: str, fate: Fate) -> None:
    ledger = Ledger(mode)
    wrong = ledger.of(fate)
    if mode == "none" and fate is Fate.TRANSIENT:
        wrong = ledger.of(Fate.PERMANENT)  # none mode: transient fates belong there
        ledger.error_queue.pop(wrong)
        ledger.place(wrong, Place.HANDLED)
    else:
        ledger.effects.pop(wrong)
        ledger.echoes.pop(wrong)
        ledger.place(wrong, Place.ERROR_QUEUE)
    accounts = account(ledger.observed())
    assert accounts.fate_mismatches == 1
    assert accounts.mismatches[0].startswith(str(wrong))
    assert "fate_mismatches == 0" in failed_checks(accounts)


def test_a_receiver_death_in_the_error_queue_matches_any_fate() -> None:
    ledger = Ledger("atomic")
    doomed = ledger.of(Fate.OK)
    ledger.effects.pop(doomed)
    ledger.echoes.pop(doomed)
    ledger.error_queue[doomed] = "endpoint_runtime.runtime.actors.crash_ledger.ReceiverDiedError"
    accounts = account(ledger.observed())
    assert accounts.receiver_deaths == 1
    assert failed_checks(accounts) == []


@pytest.mark.parametrize("mode", MODES)
def test_an_id_in_two_places_fails_even_with_every_count_plausible(mode: str) -> None:
    ledger = Ledger(mode)
    both = ledger.of(Fate.OK)
    ledger.error_queue[both] = "benchmarks.chaos.endpoints.ChaosPermanentError"
    accounts = account(ledger.observed())
    assert accounts.accounted_twice == accounts.in_both == 1
    assert accounts.twice_ids == [str(both)]
    assert accounts.twice_why == [f"{both}: handled+error_queue; copy "
                                  "benchmarks.chaos.endpoints.ChaosPermanentError; "
                                  "0 receive(s) traced; nearest cut none"]
    assert {"accounted_twice == 0", "conservation"} <= set(failed_checks(accounts))


@pytest.mark.parametrize("mode", MODES)
def test_a_second_effect_fails_every_mode_and_is_named(mode: str) -> None:
    ledger = Ledger(mode)
    twice = ledger.of(Fate.OK)
    ledger.effects[twice] += 1
    accounts = account(ledger.observed())
    assert accounts.duplicate_effects == 1
    assert accounts.duplicate_ids == [str(twice)]
    assert failed_checks(accounts) == ["duplicate_effects == 0"]


@pytest.mark.parametrize("mode", ["atomic", "batched", "outbox"])
def test_exactly_once_modes_fail_on_a_ghost_send(mode: str) -> None:
    ledger = Ledger(mode)
    ledger.echoes[ledger.of(Fate.PERMANENT)] += 1
    accounts = account(ledger.observed())
    assert accounts.ghost_sends == 1
    assert failed_checks(accounts) == ["ghost_sends == 0"]


def test_receive_only_keeps_ghost_sends_but_not_a_handled_message_without_its_send() -> None:
    ledger = Ledger("receive_only")
    ledger.echoes[ledger.of(Fate.PERMANENT)] += 7
    assert failed_checks(account(ledger.observed())) == []
    ledger.echoes.pop(ledger.of(Fate.OK))
    assert failed_checks(account(ledger.observed())) == ["lost_sends == 0"]


def test_a_poison_row_with_an_effect_is_wrongly_handled() -> None:
    ledger = Ledger("none")
    poison = ledger.of(PoisonKind.UNKNOWN_TYPE)
    ledger.error_queue.pop(poison)
    ledger.place(poison, Place.HANDLED)
    accounts = account(ledger.observed())
    assert accounts.wrongly_handled == accounts.fate_mismatches == 1


def test_none_mode_may_lose_only_what_a_fault_cut_in_hand() -> None:
    ledger = Ledger("none")
    killed, terminated, restarted = [i for i, k in ledger.sent.items() if k == Fate.OK]
    untraced, too_early = _ids(2)  # sent, never handled
    for message_id in (untraced, too_early):
        ledger.sent[message_id] = Fate.OK.value
    for message_id in (killed, terminated, restarted):
        del ledger.effects[message_id]
    receives = [Receive(killed, backend=11, client_port=40001, at=100.0),
                Receive(terminated, backend=12, client_port=40002, at=200.0),
                Receive(restarted, backend=13, client_port=40003, at=300.0),
                Receive(untraced, backend=14, client_port=40004, at=100.0),
                Receive(too_early, backend=11, client_port=40001, at=100.0 - CUT_WINDOW - 1)]
    cuts = [CutAt(at=100.2, ports=frozenset({40001})),
            CutAt(at=200.5, backends=frozenset({12})),
            CutAt(at=301.0, backends=frozenset({13, 15}))]
    accounts = account(ledger.observed(receives=receives, cuts=cuts))
    assert accounts.lost == 5
    assert accounts.lost_traced == 3
    assert sorted(accounts.untraced_lost_ids) == sorted(map(str, (untraced, too_early)))
    assert failed_checks(accounts) == ["lost == lost_traced"]
    receives = receives[:3]
    ledger.sent.pop(untraced)
    ledger.sent.pop(too_early)
    assert failed_checks(account(ledger.observed(receives=receives, cuts=cuts))) == []



def test_behind_the_pooler_a_receive_is_traced_by_the_port_in_its_application_name() -> None:
    """Behind the run's PgBouncer the server's client port is the pooler's: the runtime's own
    port is the one ``application_name_add_host`` appended (``client_port_of``), and a loss
    is traced to a cut of that port; a name without it traces nothing by port."""
    assert client_port_of("endpoint_runtime/ab12cd34/1/chaos_none - 127.0.0.1:40101") == 40101
    assert client_port_of("endpoint_runtime/ab12cd34/1/chaos_none") is None
    assert client_port_of("") is None
    ledger = Ledger("none")
    lost = next(i for i, k in ledger.sent.items() if k == Fate.OK)
    del ledger.effects[lost]
    cuts = [CutAt(at=100.2, ports=frozenset({40101}), kind="restart_pooler")]
    row = {"message_id": lost, "backend": 11, "client_port": 6432, "at": 100.0,
           "application": "endpoint_runtime/ab12cd34/1/chaos_none - 127.0.0.1:40101"}
    assert receive_of(row).client_port == 40101
    traced = account(ledger.observed(receives=[receive_of(row)], cuts=cuts))
    assert (traced.lost, traced.lost_traced) == (1, 1)
    untagged = account(ledger.observed(receives=[receive_of({**row, "application": ""})],
                                       cuts=cuts))
    assert (untagged.lost, untagged.lost_traced) == (1, 0)
    assert "restart_pooler +0.20 s" in untagged.untraced_why[0]


@pytest.mark.parametrize("mode", MODES)
def test_handled_and_in_the_error_queue_passes_only_in_none_mode_when_a_cut_explains_it(
    mode: str,
) -> None:
    """Seen in the full run: a ``none`` receiver's effect committed, then a server restart cut
    its connection mid-send; the failed attempt's copy went to the error queue."""
    ledger = Ledger(mode)
    cut, uncut = [i for i, k in ledger.sent.items() if k == Fate.OK][:2]
    for message_id in (cut, uncut):
        ledger.error_queue[message_id] = "asyncpg.exceptions._base.InternalClientError"
    receives = [Receive(cut, backend=21, client_port=41001, at=50.0),
                Receive(uncut, backend=22, client_port=41002, at=50.0)]
    cuts = [CutAt(at=50.3, backends=frozenset({21}))]

    accounts = account(ledger.observed(receives=receives, cuts=cuts))

    assert accounts.in_both == 2
    assert accounts.twice_ids == ([str(uncut)] if mode == "none"
                                  else sorted(map(str, (cut, uncut))))
    assert accounts.handled_then_cut == (1 if mode == "none" else 0)
    assert failed_checks(accounts) == ["accounted_twice == 0", "conservation"]
    ledger.error_queue.pop(uncut)
    receives.pop()
    accounts = account(ledger.observed(receives=receives, cuts=cuts))
    assert failed_checks(accounts) == (
        [] if mode == "none" else ["accounted_twice == 0", "conservation"])

def test_in_none_mode_a_copy_charged_with_a_lost_connection_is_explained_by_any_cut() -> None:
    """Seen at CI size: backend terminations cut a ``none`` handler's pooled send connection,
    not its receive connection; its effect had committed and the runtime, finding that
    connection closed, charged the attempt as ``ConnectionLostError``. Any other copy, or one
    with no fault while it was in hand, still counts twice."""
    ledger = Ledger("none")
    lost, other_type, no_cut = [i for i, k in ledger.sent.items() if k == Fate.OK][:3]
    ledger.error_queue[lost] = "endpoint_runtime.errors.ConnectionLostError"
    ledger.error_queue[other_type] = "asyncpg.exceptions._base.InternalClientError"
    ledger.error_queue[no_cut] = "endpoint_runtime.errors.ConnectionLostError"
    receives = [Receive(lost, backend=31, client_port=41001, at=50.0),
                Receive(other_type, backend=32, client_port=41002, at=50.0),
                Receive(no_cut, backend=33, client_port=41003, at=20.0)]
    cuts = [CutAt(at=50.3, backends=frozenset({99}))]  # another backend: a pooled one

    accounts = account(ledger.observed(receives=receives, cuts=cuts))

    assert accounts.handled_then_cut == 1
    assert accounts.twice_ids == sorted(map(str, (other_type, no_cut)))
    why = {line.split(":")[0]: line for line in accounts.twice_why}
    assert "copy asyncpg.exceptions._base.InternalClientError" in why[str(other_type)]
    assert why[str(other_type)].endswith("1 receive(s) traced; nearest cut +0.30 s")
    assert why[str(no_cut)].endswith("nearest cut +30.30 s")
    assert failed_checks(accounts) == ["accounted_twice == 0", "conservation"]


def test_leftovers_fail_the_checks() -> None:
    ledger = Ledger("atomic")
    still = ledger.of(Fate.OK)
    del ledger.effects[still]
    del ledger.echoes[still]
    accounts = account(ledger.observed(queued={still}, left_in_queue=1, left_in_delayed=2))
    assert accounts.lost == 0
    assert failed_checks(accounts) == ["left_in_queue == 0", "left_in_delayed == 0",
                                       "conservation"]


def test_planting_options() -> None:
    args: argparse.Namespace = parse(["--messages", "10", "--plant-loss", "3"])
    assert args.plant_modes == list(MODES)
    args = parse(["--messages", "10", "--plant-duplicate", "3", "--modes", "atomic", "none",
                  "--plant-modes", "none"])
    assert (args.plant_loss, args.plant_duplicate, args.plant_modes) == (0, 3, ["none"])
    assert parse(["--messages", "10"]).plant_modes == []


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


def test_importing_the_chaos_program_leaves_the_environment_alone() -> None:
    """The suite imports ``parse`` from it: setting RAY_AUTH_MODE on import made every later
    local Ray of the session fail to start (its GCS wanted a token the driver never used),
    erroring the e2e tests of a clean clone's CI."""
    saved = os.environ.pop("RAY_AUTH_MODE", None)
    sys.modules.pop("benchmarks.chaos.__main__", None)
    try:
        importlib.import_module("benchmarks.chaos.__main__")
        assert "RAY_AUTH_MODE" not in os.environ
    finally:
        if saved is not None:
            os.environ["RAY_AUTH_MODE"] = saved
