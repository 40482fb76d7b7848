"""The accounts of one mode's run, the checks on them, and recovery times after faults.

:func:`account` and :func:`recovery_times` are pure (unit-tested without a database);
:func:`read_accounts` gathers their input from the run's database.
"""

from __future__ import annotations

import bisect
import collections
import statistics
import uuid
from collections.abc import Sequence

import asyncpg
import msgspec

from benchmarks.chaos.endpoints import EFFECTS_TABLE, ERROR_QUEUE, SINK
from benchmarks.chaos.schedule import Fate, PoisonKind
from endpoint_runtime.messages import Headers, decode_headers
from endpoint_runtime.transport import QueueAddress

EXACTLY_ONCE_MODES = frozenset({"atomic", "batched", "outbox"})
"""Business effects and sends exactly once per handled message."""
NEVER_HANDLED = frozenset({Fate.PERMANENT, Fate.UNRECOVERABLE, Fate.DISCARD, *PoisonKind})
RECOVERY_SHARE = 0.9
BASELINE_SECONDS = 3.0
WINDOW_SECONDS = 1.0
STEP_SECONDS = 0.1


class Accounts(msgspec.Struct, kw_only=True):
    """Where every message id sent in one mode ended up (each id counted once, in the first
    of handled, error queue, expired, discarded, lost that holds it)."""

    mode: str
    sent: int
    handled: int
    error_queue: int
    expired: int
    discarded: int
    lost: int
    duplicate_effects: int
    """Committed handler effects beyond one per message id."""
    in_both: int
    """Ids with a committed effect that are also in the error queue."""
    wrongly_handled: int
    """Poison rows and permanent, unrecoverable or discard fates with a committed effect."""
    echoes: int
    ghost_sends: int
    """Echoes beyond one per handled message (sends of failed attempts that stayed sent)."""
    lost_sends: int
    """Handled messages without an echo."""
    left_in_queue: int = 0
    left_in_delayed: int = 0
    lost_ids: list[str] = []
    """Up to ten lost ids, to look them up."""


def account(mode: str, sent: dict[uuid.UUID, str], effects: collections.Counter[uuid.UUID],
            in_error_queue: set[uuid.UUID], echoes: collections.Counter[uuid.UUID]) -> Accounts:
    """Classify every sent id (``sent``: id -> fate or poison kind) of ``mode``."""
    handled = {i for i in effects if i in sent}
    errors = {i for i in in_error_queue if i in sent}
    rest = set(sent) - handled - errors
    expired = {i for i in rest if sent[i] == PoisonKind.EXPIRED}
    discarded = {i for i in rest - expired if sent[i] == Fate.DISCARD}
    lost = rest - expired - discarded
    mine = {i: n for i, n in echoes.items() if i in sent}
    return Accounts(
        mode=mode, sent=len(sent), handled=len(handled), error_queue=len(errors - handled),
        expired=len(expired), discarded=len(discarded), lost=len(lost),
        duplicate_effects=sum(effects[i] - 1 for i in handled),
        in_both=len(handled & errors),
        wrongly_handled=sum(1 for i in handled if sent[i] in NEVER_HANDLED),
        echoes=sum(mine.values()),
        ghost_sends=sum(mine.values()) - sum(1 for i in handled if mine.get(i)),
        lost_sends=sum(1 for i in handled if not mine.get(i)),
        lost_ids=sorted(str(i) for i in lost)[:10],
    )


def failed_checks(accounts: Accounts) -> list[str]:
    """What ``accounts`` breaks of its mode's promises (empty: all hold).

    Every mode: nothing left in the queue or the delayed store, no effect of a message that
    must not have one, no duplicate effect (``NONE``: at most once). Every mode but ``NONE``
    (whose receiver deaths lose the message in hand, by design): nothing lost, no id both
    handled and in the error queue, no handled message without its send. Atomic, batched and
    outbox: no ghost send either.
    """
    a = accounts
    checks = {
        "left_in_queue == 0": a.left_in_queue == 0,
        "left_in_delayed == 0": a.left_in_delayed == 0,
        "wrongly_handled == 0": a.wrongly_handled == 0,
        "duplicate_effects == 0": a.duplicate_effects == 0 or a.mode == "receive_only",
        "conservation": a.sent == a.handled + a.error_queue + a.expired + a.discarded + a.lost,
    }
    if a.mode != "none":
        checks |= {"lost == 0": a.lost == 0, "in_both == 0": a.in_both == 0,
                   "lost_sends == 0": a.lost_sends == 0}
    if a.mode in EXACTLY_ONCE_MODES:
        checks["ghost_sends == 0"] = a.ghost_sends == 0
    return [name for name, held in checks.items() if not held]


def recovery_times(effect_times: Sequence[float], faults: Sequence[float]) -> list[float | None]:
    """Seconds from each fault until throughput is back to 90% of what it was before.

    Throughput before: effects per second over the :data:`BASELINE_SECONDS` before the fault.
    Back: the first moment ``t`` (in steps of 0.1 s) from which the next second holds at
    least 90% of that rate. ``None``: not back before the effects end. ``0.0``: no dip (or
    nothing flowed before the fault).

    Args:
        effect_times: Sorted epoch seconds of the committed effects.
        faults: Epoch seconds of the faults.
    """
    def count(start: float, end: float) -> int:
        return bisect.bisect_left(effect_times, end) - bisect.bisect_left(effect_times, start)

    last = effect_times[-1] if effect_times else 0.0
    times: list[float | None] = []
    for at in faults:
        baseline = count(at - BASELINE_SECONDS, at) / BASELINE_SECONDS
        wanted = RECOVERY_SHARE * baseline * WINDOW_SECONDS
        found: float | None = None
        t = at
        while t + WINDOW_SECONDS <= last:
            if count(t, t + WINDOW_SECONDS) >= wanted:
                found = round(t - at, 1)
                break
            t += STEP_SECONDS
        times.append(0.0 if baseline == 0 else found)
    return times


def summarize_recovery(by_kind: dict[str, list[float | None]]) -> dict[str, object]:
    """Per fault kind: every recovery time, their median and maximum, and how many never
    came back before the end of the run."""
    summary: dict[str, object] = {}
    for kind, values in by_kind.items():
        known = [v for v in values if v is not None]
        summary[kind] = {
            "each": values,
            "median": statistics.median(known) if known else None,
            "max": max(known) if known else None,
            "not_recovered": len(values) - len(known),
        }
    return summary


async def read_accounts(connection: asyncpg.Connection, mode: str, queue: QueueAddress,
                        delayed: QueueAddress) -> tuple[Accounts, list[float]]:
    """The accounts of ``mode`` from the database, and the sorted times of its effects."""
    sent = {r["message_id"]: r["kind"] for r in await connection.fetch(
        "SELECT message_id, kind FROM chaos_sent WHERE mode = $1", mode)}
    effects: collections.Counter[uuid.UUID] = collections.Counter()
    times = []
    for row in await connection.fetch(
            f"SELECT message_id, extract(epoch FROM at)::float8 AS at FROM {EFFECTS_TABLE} "
            "WHERE mode = $1 ORDER BY at", mode):
        effects[row["message_id"]] += 1
        times.append(row["at"])
    errors = {_original_id(r["id"], r["headers"]) for r in await connection.fetch(
        f"SELECT id, headers FROM {QueueAddress.parse(ERROR_QUEUE).qualified}")}
    echoes: collections.Counter[uuid.UUID] = collections.Counter({
        uuid.UUID(r["origin"]): r["n"] for r in await connection.fetch(
            "SELECT convert_from(body, 'UTF8')::json->>'origin' AS origin, count(*) AS n "
            f"FROM {QueueAddress.parse(SINK).qualified} GROUP BY 1")})
    accounts = account(mode, sent, effects, errors, echoes)
    accounts.left_in_queue = await connection.fetchval(f"SELECT count(*) FROM {queue.qualified}")
    accounts.left_in_delayed = await connection.fetchval(
        f"SELECT count(*) FROM {delayed.qualified}")
    return accounts, times


def _original_id(row_id: uuid.UUID, raw_headers: str) -> uuid.UUID:
    """The native id a row of the error queue had (a copy under a fresh id names it)."""
    try:
        original = decode_headers(raw_headers).get(Headers.ORIGINAL_NATIVE_ID)
    except Exception:  # headers that never parsed: the raw row kept its id
        return row_id
    return uuid.UUID(original) if original else row_id
