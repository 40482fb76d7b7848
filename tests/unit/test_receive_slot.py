"""The receive slot's life: what a mode keeps for a slot is released once, on every exit."""

from __future__ import annotations

from typing import Any

import pytest

from endpoint_runtime.transactions.base import ReceiveSlot, Round


class CountingSlot(ReceiveSlot):
    def __init__(self) -> None:
        super().__init__(connection=None)
        self.released = 0

    async def round(self) -> Round:
        return Round(taken=1, handled=1)

    async def release(self) -> None:
        self.released += 1


async def test_close_releases_once_however_often_it_is_called() -> None:
    slot = CountingSlot()
    await slot.close()
    await slot.close()
    assert slot.released == 1


async def test_leaving_the_context_releases_after_an_explicit_close_too() -> None:
    async with CountingSlot() as slot:
        assert await slot.round() == Round(taken=1, handled=1)
        await slot.close()
    assert slot.released == 1


async def test_a_failing_round_still_releases_the_slot() -> None:
    class FailingSlot(CountingSlot):
        async def round(self) -> Round:
            raise OSError("connection lost")

    slot: Any = None
    with pytest.raises(OSError, match="connection lost"):
        async with FailingSlot() as slot:
            await slot.round()
    assert slot.released == 1
