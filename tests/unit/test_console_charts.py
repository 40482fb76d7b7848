"""The console's pure parts: per-minute series and the conversation's lanes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from endpoint_runtime.console.charts import HEIGHT, MINUTES, series
from endpoint_runtime.console.diagram import diagram, short_type

NOW = datetime(2026, 1, 1, 12, 30, 42, tzinfo=UTC)


def test_a_series_has_one_value_per_minute_and_zeros_where_nothing_was_handled() -> None:
    minute = NOW.replace(second=0)
    rows = [{"minute": minute, "n": 4}, {"minute": minute - timedelta(minutes=2), "n": 2},
            {"minute": minute - timedelta(minutes=MINUTES), "n": 99}]  # too old: left out
    result = series(rows, NOW, "n")
    assert len(result.values) == MINUTES
    assert result.values[-3:] == [2.0, 0.0, 4.0]
    assert result.peak == 4.0
    assert result.samples == 2
    last_y = float(result.points.split()[-1].split(",")[1])
    assert last_y == 1.0  # the peak touches the top
    assert float(result.points.split()[0].split(",")[1]) == HEIGHT - 1  # zero at the bottom


def test_an_empty_series_is_flat_and_has_no_samples() -> None:
    empty = series([], NOW, "n")
    assert (empty.peak, empty.samples) == (0.0, 0)
    zeros = series([{"minute": NOW.replace(second=0), "n": 0}], NOW, "n")
    assert (zeros.peak, zeros.samples) == (0.0, 1)  # drawn: a queue that stayed empty
    assert {point.split(",")[1] for point in zeros.points.split()} == {f"{HEIGHT - 1:.1f}"}


def test_lanes_appear_in_order_and_a_message_to_itself_stays_in_its_lane() -> None:
    rows = [
        {"sending_endpoint": "sales", "processing_endpoint": "billing", "message_type":
         "shop.messages:PlaceOrder", "intent": "Send", "failed": False, "message_id": "1",
         "native_id": None},
        {"sending_endpoint": "billing", "processing_endpoint": "billing", "message_type": None,
         "intent": None, "failed": True, "message_id": "2", "native_id": None},
        {"sending_endpoint": None, "processing_endpoint": "shipping", "message_type":
         "Shop.Messages.Ship, Shop", "intent": "Publish", "failed": False, "message_id": "3",
         "native_id": None},
    ]
    drawn = diagram(rows)
    assert [lane.name for lane in drawn.lanes] == ["sales", "billing", "(unknown)", "shipping"]
    first, second, third = drawn.arrows
    assert first.x1 < first.x2
    assert (first.label, second.label, third.label) == ("PlaceOrder", "(unknown)", "Ship")
    assert second.x1 == second.x2
    assert second.failed
    assert first.y < second.y < third.y


def test_short_type_names_the_class() -> None:
    assert short_type("a.b:C") == "C"
    assert short_type("A.B.C, Asm, Version=1.0.0.0;A.B.IC, Asm") == "C"
    assert short_type("") == "(unknown)"
