from __future__ import annotations

import asyncio

import structlog

from endpoint_runtime.logging import (
    _stderr_logger,
    add_component,
    bind_message_context,
    merge_message_context,
)


def test_message_context_is_added_to_log_events() -> None:
    bind_message_context("sales", "m-1", 2)

    event = merge_message_context(None, "info", {"event": "handled"})

    assert event == {"event": "handled", "endpoint": "sales", "message_id": "m-1", "attempt": 2}


def test_each_task_has_its_own_message_context() -> None:
    seen: dict[str, object] = {}

    async def slot(message_id: str) -> None:
        bind_message_context("sales", message_id, 1)
        await asyncio.sleep(0)  # the other slot binds its message meanwhile
        seen[message_id] = merge_message_context(None, "info", {})["message_id"]

    async def both() -> None:
        await asyncio.gather(slot("a"), slot("b"))

    asyncio.run(both())
    assert seen == {"a": "a", "b": "b"}


def test_explicit_fields_win_over_the_message_context() -> None:
    bind_message_context("sales", "m-1", 1)
    event = merge_message_context(None, "info", {"message_id": "other"})
    assert event["message_id"] == "other"


def test_each_line_names_the_logger_that_wrote_it() -> None:
    capture = structlog.testing.LogCapture()
    named = structlog.wrap_logger(_stderr_logger("endpoint_runtime.chain.pipeline"),
                                  processors=[add_component, capture])
    unnamed = structlog.wrap_logger(_stderr_logger(), processors=[add_component, capture])

    named.warning("message_failed")
    unnamed.info("started")
    named.info("explicit", component="mine")

    assert capture.entries == [
        {"event": "message_failed", "log_level": "warning",
         "component": "endpoint_runtime.chain.pipeline"},
        {"event": "started", "log_level": "info"},
        {"event": "explicit", "log_level": "info", "component": "mine"},
    ]
