"""The accounts of one mode's run and the checks on them (pure: unit-tested without a
database; :mod:`benchmarks.chaos.observations` reads their input from the run's database).

Every count is observed, none is what remains of another:

- ``handled``: ids with a committed handler effect (``chaos_effects``);
- ``error_queue``: ids with a row in the error queue;
- ``expired``: ids whose row was deleted already expired (a trigger saw the DELETE);
- ``discarded``: ids a handler was seen discarding (noted on its own connection) that are
  in none of the three places above and no longer queued;
- ``lost``: sent ids in none of these and not queued.

Each id is then compared with the place its planned fate gives it in its mode
(:func:`expected_place`): a mismatch is a ``fate_mismatch``. An error-queue copy charged with
``ReceiverDiedError`` is a receiver death observed by the crash ledger: it matches any fate.
``none`` mode may lose a message, by design, only one it had in hand when a fault cut its
connection: each lost id must have been received, on a connection a fault cut, shortly before
(:func:`traced_to_a_cut`). For the same reason a ``none`` mode message may be both handled
and in the error queue: its effect committed on its own (there is no transaction around the
handler), then the fault cut the connection before the handler ended, and its one failed
attempt was copied to the error queue. Such an id counts once, as handled, when it too is
traced to a cut (``handled_then_cut``), or when its copy is charged with a
``ConnectionLostError`` (the runtime found the connection of its send closed: a pooled one,
which the run does not trace) and a fault cut connections while it was in hand; any other id
in two places is ``accounted_twice``.
"""

from __future__ import annotations

import collections
import enum
import uuid

import msgspec

from benchmarks.chaos.schedule import Fate, PoisonKind

EXACTLY_ONCE_SENDS = frozenset({"atomic", "batched", "outbox"})
"""Sends exactly once per handled message (no ghost sends)."""
RECEIVER_DIED = "ReceiverDiedError"
"""The exception type (last part) of an error-queue copy the crash ledger sent there."""
CONNECTION_LOST = "endpoint_runtime.errors.ConnectionLostError"
"""The exception type of an error-queue copy whose handler met a pooled connection the runtime
found closed (its send's, not the receive connection the run traces): the runtime's own
evidence of a cut, which the run cannot see by connection (its backend is not recorded)."""
CUT_WINDOW = 10.0
"""Seconds before a fault within which a receive counts as still in hand at it (a ``none``
mode receiver handles a message at once after its receive, on the same connection)."""
CUT_SLACK = 0.5
"""Seconds after a fault's moment a receive may carry (commit time against the driver's
clock, on the same machine)."""
POISON = frozenset(PoisonKind)
LISTED = 20
"""Ids listed per kind of problem, to look them up."""


class Place(enum.StrEnum):
    HANDLED = "handled"
    ERROR_QUEUE = "error_queue"
    EXPIRED = "expired"
    DISCARDED = "discarded"


def expected_place(mode: str, kind: str) -> Place:
    """Where a message of fate or poison ``kind`` must end in ``mode``."""
    if kind == PoisonKind.EXPIRED:
        return Place.EXPIRED
    if kind in POISON or kind in (Fate.PERMANENT, Fate.UNRECOVERABLE):
        return Place.ERROR_QUEUE
    if kind == Fate.DISCARD:
        return Place.DISCARDED
    if kind == Fate.TRANSIENT and mode == "none":  # no retries: its one failure is final
        return Place.ERROR_QUEUE
    return Place.HANDLED


class Receive(msgspec.Struct, frozen=True):
    """A committed receive (``none`` mode): by which backend, from which client port, when."""

    message_id: uuid.UUID
    backend: int
    client_port: int | None
    at: float
    application: str = ""
    """The receiving connection's ``application_name`` (for the reports)."""


class CutAt(msgspec.Struct, frozen=True):
    """A fault's cut of connections at epoch second ``at`` (see ``drivers.Cut``)."""

    at: float
    ports: frozenset[int] = frozenset()
    backends: frozenset[int] = frozenset()
    kind: str = ""
    """The fault's kind (``FaultKind``), for the reports."""


class Observed(msgspec.Struct, kw_only=True):
    """What the ledger saw of one mode's run."""

    mode: str
    sent: dict[uuid.UUID, str]
    """id -> planned fate or poison kind."""
    effects: collections.Counter[uuid.UUID]
    error_queue: dict[uuid.UUID, str]
    """id -> the exception type its error-queue copy names ("" when none)."""
    expired: set[uuid.UUID]
    discards: set[uuid.UUID]
    queued: set[uuid.UUID]
    """Still in the queue or the delayed store."""
    echoes: collections.Counter[uuid.UUID]
    receives: list[Receive] = []
    cuts: list[CutAt] = []
    left_in_queue: int = 0
    left_in_delayed: int = 0


class Accounts(msgspec.Struct, kw_only=True):
    """Where every message id sent in one mode was observed, and what breaks its promises."""

    mode: str
    sent: int
    handled: int
    error_queue: int
    expired: int
    discarded: int
    lost: int
    left_in_queue: int = 0
    left_in_delayed: int = 0
    accounted_twice: int
    """Ids observed in two places (say, handled and in the error queue)."""
    in_both: int
    """Ids with a committed effect that are also in the error queue."""
    handled_then_cut: int = 0
    """``none`` mode: of ``in_both``, ids of a handled fate received on a connection a fault
    cut just after (the effect committed, the attempt then failed): counted once, handled."""
    fate_mismatches: int
    """Ids observed in one place, not the one their fate gives them."""
    wrongly_handled: int
    """Of those: poison rows and permanent, unrecoverable or discard fates with an effect."""
    receiver_deaths: int
    """Error-queue copies charged with ``ReceiverDiedError`` (deaths the crash ledger saw)."""
    lost_traced: int
    """``none`` mode: lost ids received on a connection a fault cut just after."""
    duplicate_effects: int
    """Committed handler effects beyond one per message id."""
    echoes: int
    ghost_sends: int
    """Echoes beyond one per handled message (sends of failed attempts that stayed sent)."""
    lost_sends: int
    """Handled messages without an echo."""
    lost_ids: list[str] = []
    untraced_lost_ids: list[str] = []
    untraced_why: list[str] = []
    """Of the first ``untraced_lost_ids``: each receive seen (client port, backend) and the
    faults' cuts after it (seconds after the receive; whether they held its port or its
    backend), to tell what cut it when the run could not."""
    duplicate_ids: list[str] = []
    twice_ids: list[str] = []
    twice_why: list[str] = []
    """Of the first ``twice_ids``: ``id: places; error-queue copy's exception type; receives
    traced; the nearest fault's cut (seconds after the receive)``, to tell why it is there."""
    mismatches: list[str] = []
    """``id: fate -> place`` of the first mismatches."""


def _listed(ids: set[uuid.UUID]) -> list[str]:
    return sorted(str(i) for i in ids)[:LISTED]


def traced_to_a_cut(receives: list[Receive], cuts: list[CutAt]) -> bool:
    """Whether one of ``receives`` (of one id) was on a connection a fault cut within
    :data:`CUT_WINDOW` seconds after it."""
    for receive in receives:
        for cut in cuts:
            if not -CUT_SLACK <= cut.at - receive.at <= CUT_WINDOW:
                continue
            if receive.backend in cut.backends or receive.client_port in cut.ports:
                return True
    return False


def cut_while_in_hand(receives: list[Receive], cuts: list[CutAt]) -> bool:
    """Whether a fault cut any connection within :data:`CUT_WINDOW` seconds after one of
    ``receives`` (of one id)."""
    return any(-CUT_SLACK <= cut.at - receive.at <= CUT_WINDOW
               for receive in receives for cut in cuts)


def account(observed: Observed) -> Accounts:
    """Place every sent id of ``observed.mode`` by what was observed of it."""
    o = observed
    sent = set(o.sent)
    handled = {i for i in o.effects if i in sent}
    errors = {i for i in o.error_queue if i in sent}
    expired = o.expired & sent
    physical = handled | errors | expired
    discarded = (o.discards & sent) - physical - o.queued
    places: dict[uuid.UUID, list[Place]] = collections.defaultdict(list)
    for place, ids in ((Place.HANDLED, handled), (Place.ERROR_QUEUE, errors),
                       (Place.EXPIRED, expired), (Place.DISCARDED, discarded)):
        for i in ids:
            places[i].append(place)
    lost = sent - set(places) - o.queued
    receives_of: dict[uuid.UUID, list[Receive]] = collections.defaultdict(list)
    for receive in o.receives:
        receives_of[receive.message_id].append(receive)
    cut_after_effect = {
        i for i in handled & errors
        if o.mode == "none" and expected_place(o.mode, o.sent[i]) is Place.HANDLED
        and (traced_to_a_cut(receives_of[i], o.cuts)
             or (o.error_queue[i] == CONNECTION_LOST and cut_while_in_hand(receives_of[i], o.cuts)))
    }
    for i in cut_after_effect:
        places[i] = [Place.HANDLED]
    twice = {i for i, where in places.items() if len(where) > 1}
    deaths = {i for i in errors if o.error_queue[i].endswith(RECEIVER_DIED)}
    mismatched = {i for i, where in places.items() if len(where) == 1
                  and where[0] is not expected_place(o.mode, o.sent[i]) and i not in deaths}
    traced = {i for i in lost if traced_to_a_cut(receives_of[i], o.cuts)}
    duplicates = {i for i in handled if o.effects[i] > 1}
    mine = {i: n for i, n in o.echoes.items() if i in sent}
    return Accounts(
        mode=o.mode, sent=len(sent), handled=len(handled), error_queue=len(errors),
        expired=len(expired), discarded=len(discarded), lost=len(lost),
        left_in_queue=o.left_in_queue, left_in_delayed=o.left_in_delayed,
        accounted_twice=len(twice), in_both=len(handled & errors),
        handled_then_cut=len(cut_after_effect),
        fate_mismatches=len(mismatched),
        wrongly_handled=sum(1 for i in mismatched if places[i][0] is Place.HANDLED),
        receiver_deaths=len(deaths), lost_traced=len(traced),
        duplicate_effects=sum(o.effects[i] - 1 for i in handled),
        echoes=sum(mine.values()),
        ghost_sends=sum(mine.values()) - sum(1 for i in handled if mine.get(i)),
        lost_sends=sum(1 for i in handled if not mine.get(i)),
        lost_ids=_listed(lost), untraced_lost_ids=_listed(lost - traced),
        untraced_why=[_why_untraced(i, receives_of[i], o.cuts)
                      for i in sorted(lost - traced, key=str)[:LISTED]],
        duplicate_ids=_listed(duplicates), twice_ids=_listed(twice),
        twice_why=[_why_twice(i, places[i], o, receives_of[i])
                   for i in sorted(twice, key=str)[:LISTED]],
        mismatches=[f"{i}: {o.sent[i]} -> {places[i][0].value}"
                    for i in sorted(mismatched, key=str)[:LISTED]],
    )


def _why_twice(message_id: uuid.UUID, places: list[Place], o: Observed,
               receives: list[Receive]) -> str:
    nearest = min((cut.at - receive.at for receive in receives for cut in o.cuts
                   if cut.at >= receive.at - CUT_SLACK), default=None)
    return (f"{message_id}: {'+'.join(p.value for p in places)}; "
            f"copy {o.error_queue.get(message_id) or '-'}; {len(receives)} receive(s) traced; "
            f"nearest cut {'none' if nearest is None else f'+{nearest:.2f} s'}")


def _why_untraced(message_id: uuid.UUID, receives: list[Receive], cuts: list[CutAt]) -> str:
    seen = []
    for receive in receives:
        after = [f"{cut.kind or 'cut'} +{cut.at - receive.at:.2f} s"
                 f"{' port' if receive.client_port in cut.ports else ''}"
                 f"{' backend' if receive.backend in cut.backends else ''}"
                 f"{f' (ports {sorted(cut.ports)})' if cut.at - receive.at < 1.0 else ''}"
                 for cut in sorted(cuts, key=lambda c: c.at)
                 if -CUT_SLACK <= cut.at - receive.at <= 3 * CUT_WINDOW]
        seen.append(f"port {receive.client_port} backend {receive.backend} "
                    f"({receive.application!r}): cuts "
                    f"{', '.join(after) or 'none'}")
    return f"{message_id}: {len(receives)} receive(s); {'; '.join(seen) or 'never received'}"


def failed_checks(accounts: Accounts) -> list[str]:
    """What ``accounts`` breaks of its mode's promises (empty: all hold).

    Every mode: nothing left in the queue or the delayed store, every id in exactly one
    place, each the place its fate gives it, no duplicate effect (``NONE``: at most once;
    the other modes' business writes commit with the receive or with the outbox record).
    ``NONE`` may lose only messages it had in hand when a fault cut their connection; every
    other mode loses nothing and no handled message lacks its send. Atomic, batched and
    outbox: no ghost send either.
    """
    a = accounts
    placed = a.handled + a.error_queue - a.handled_then_cut + a.expired + a.discarded
    checks = {
        "left_in_queue == 0": a.left_in_queue == 0,
        "left_in_delayed == 0": a.left_in_delayed == 0,
        "accounted_twice == 0": a.accounted_twice == 0,
        "fate_mismatches == 0": a.fate_mismatches == 0,
        "duplicate_effects == 0": a.duplicate_effects == 0,
        "conservation": a.sent == placed + a.lost + a.left_in_queue + a.left_in_delayed,
    }
    if a.mode == "none":
        checks["lost == lost_traced"] = a.lost == a.lost_traced
    else:
        checks |= {"lost == 0": a.lost == 0, "lost_sends == 0": a.lost_sends == 0}
    if a.mode in EXACTLY_ONCE_SENDS:
        checks["ghost_sends == 0"] = a.ghost_sends == 0
    return [name for name, held in checks.items() if not held]
