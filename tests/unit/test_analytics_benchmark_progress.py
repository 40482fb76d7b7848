"""The analytics benchmark's wait for the live stream's micro-batches: new progress events are
found by trigger, also once the query's bounded ``recentProgress`` is full (it hung there
before, counting by position, on a 10M-row run whose stream had run for 100 triggers)."""

from __future__ import annotations

from typing import Any

from benchmarks.analytics import newest_trigger, progress_after

KEPT = 100
"""Spark's default ``spark.sql.streaming.numRecentProgressUpdates``."""


def event(batch_id: int, second: int, rows: int = 0) -> dict[str, Any]:
    return {"batchId": batch_id, "timestamp": f"2026-11-28T08:{second // 60:02d}:"
            f"{second % 60:02d}.000Z", "numInputRows": rows}


def recent(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As ``query.recentProgress``: the newest ``KEPT`` events."""
    return events[-KEPT:]


def test_new_events_are_found_once_the_recent_progress_is_full() -> None:
    events = [event(batch_id=3, second=s) for s in range(150)]  # idle triggers
    after = newest_trigger(recent(events))
    events.append(event(batch_id=3, second=151, rows=10_000))  # the batch with the rows
    events.append(event(batch_id=4, second=152))
    found = progress_after(recent(events), after)
    assert len(recent(events)) == KEPT  # the list did not grow: position cannot tell
    assert [(e["batchId"], e["numInputRows"]) for e in found] == [(3, 10_000), (4, 0)]


def test_an_idle_trigger_then_rows_under_the_same_batch_id() -> None:
    events = [event(batch_id=0, second=1, rows=5), event(batch_id=1, second=2)]
    after = newest_trigger(events)
    events.append(event(batch_id=1, second=3, rows=7))
    assert [e["numInputRows"] for e in progress_after(events, after)] == [7]
    assert progress_after(events, newest_trigger(events)) == []


def test_before_any_event() -> None:
    assert newest_trigger([]) == (-1, "")
    assert progress_after([event(0, 1, rows=2)], newest_trigger([])) == [event(0, 1, rows=2)]
