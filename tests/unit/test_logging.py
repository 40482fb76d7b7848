from __future__ import annotations

import asyncio

from endpoint_runtime.logging import bind_message_context, merge_message_context


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
