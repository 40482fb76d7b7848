"""``run``'s status lines (no database): a line when an endpoint's figures change, nothing
while they do not but one debug line a minute; and the endpoints ``run`` deploys."""

from __future__ import annotations

import argparse

import msgspec
import pytest

from endpoint_runtime.cli.run import INGESTION_ENDPOINT, endpoint_paths
from endpoint_runtime.cli.status_lines import StatusFigures, StatusLines
from endpoint_runtime.errors import ConfigurationError

IDLE = StatusFigures(endpoint="sales", depth=0, estimate=0, receivers=1, in_flight=0,
                     max_concurrency=8, processed=3, failed=0)


def test_an_idle_endpoint_logs_its_first_line_then_one_debug_line_a_minute() -> None:
    lines = StatusLines(unchanged_every=60.0)

    levels = [lines.level_for(IDLE, now=t) for t in (0.0, 5.0, 30.0, 59.9, 60.0, 65.0, 120.0)]

    assert levels == ["info", None, None, None, "debug", None, "debug"]


@pytest.mark.parametrize("field", ["depth", "estimate", "receivers", "in_flight",
                                   "max_concurrency", "processed", "failed"])
def test_any_changed_figure_logs_a_line_at_once(field: str) -> None:
    lines = StatusLines()
    assert lines.level_for(IDLE, now=0.0) == "info"
    changed = msgspec.structs.replace(IDLE, **{field: 99})

    assert lines.level_for(changed, now=1.0) == "info"
    assert lines.level_for(changed, now=2.0) is None
    assert lines.level_for(IDLE, now=3.0) == "info"  # and back


def test_endpoints_are_judged_apart() -> None:
    lines = StatusLines()
    billing = msgspec.structs.replace(IDLE, endpoint="billing")

    assert lines.level_for(IDLE, now=0.0) == "info"
    assert lines.level_for(billing, now=0.5) == "info"
    assert lines.level_for(IDLE, now=1.0) is None
    assert lines.level_for(billing, now=1.5) is None


def test_ingest_adds_the_ingestion_endpoint_and_no_endpoint_runs_twice() -> None:
    args = argparse.Namespace(endpoints=["a:endpoint", "b:endpoint"], ingest=True)
    assert endpoint_paths(args) == ["a:endpoint", "b:endpoint", INGESTION_ENDPOINT]

    args = argparse.Namespace(endpoints=["a:endpoint", INGESTION_ENDPOINT], ingest=True)
    with pytest.raises(ConfigurationError, match="more than once"):
        endpoint_paths(args)
