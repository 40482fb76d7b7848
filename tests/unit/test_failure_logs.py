"""What a failing attempt cycle logs: one warning per attempt with a one-line summary of the
exception, and the traceback once, with the attempt that sends the message to the error queue
(issue 27: one failing message printed 24 warnings of up to 500 characters each, newlines
included, and a warning more per delayed retry)."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import structlog
from structlog.testing import capture_logs

from endpoint_runtime import Endpoint
from endpoint_runtime.chain.context import HandlerContext
from endpoint_runtime.chain.recoverability.policy import Failure
from tests.unit.test_pipeline import Ping, process, received


def failure(message: str) -> Failure:
    return Failure(attempts=1, exception_type="shop.CarrierTimeout", inner_exception_type="",
                   message=message, source="", stack_trace="", unrecoverable=False)


def test_a_summary_is_the_type_and_the_first_line_of_the_message() -> None:
    assert failure("booking timed out\nafter 3 tries\n").summary() == (
        "shop.CarrierTimeout: booking timed out")
    assert failure("").summary() == "shop.CarrierTimeout"
    long = failure("x" * 1_000).summary(width=60)
    assert len(long) == 60
    assert long.endswith("...")


async def test_each_attempt_warns_on_one_line_and_the_last_carries_the_traceback() -> None:
    async def fails(message: Ping, context: HandlerContext) -> None:
        raise RuntimeError("carrier booking timed out\n  at the carrier's gateway\n  retry later")

    endpoint = Endpoint("shipping", immediate_retries=2, delayed_retries=0)
    endpoint.register(fails, Ping)
    pipeline = endpoint.create_pipeline()
    message = received(1)
    saved = structlog.get_config()
    structlog.reset_defaults()  # capture whatever an earlier test configured and cached
    try:
        with capture_logs() as logs:
            for _ in range(3):  # the first attempt and its two immediate retries
                await process(pipeline, message)
    finally:
        structlog.configure(**saved)

    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert [entry["event"] for entry in warnings] == ["message_failed"] * 3
    assert all(entry["error"] == "builtins.RuntimeError: carrier booking timed out"
               for entry in warnings), warnings
    assert [entry["next_step"] for entry in warnings] == [
        "immediate_retry", "immediate_retry", "error_queue"]
    assert [_traceback(entry) for entry in warnings] == [None, None, "RuntimeError"]


def _traceback(entry: MutableMapping[str, Any]) -> str | None:
    exc = entry.get("exc_info")
    return type(exc).__name__ if isinstance(exc, BaseException) else None
