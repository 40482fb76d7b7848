"""SQL literals (statements that travel together in one simple query) read back exactly,
whatever standard_conforming_strings says, and nothing in them runs as SQL."""

from __future__ import annotations

import math

import pytest

from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport.literals import bytea_literal, float_literal, text_literal

NASTY_TEXT = ["plain", "", "it's", "back\\slash", "trailing\\", "'); DROP TABLE victims; --",
              "\\'; SELECT 1; --", "ünïcødé 😀", "$$ dollar $$", "line\nbreak\ttab"]
NASTY_BYTES = [b"", b"\x00\x01\xff", b"'; DROP TABLE victims; --", b"\\x41", bytes(range(256))]


@pytest.mark.parametrize("conforming", ["on", "off"])
async def test_literals_read_back_exactly(transport: PostgresTransport, conforming: str) -> None:
    async with transport.pool.acquire() as connection:
        await connection.execute(f"SET standard_conforming_strings = {conforming}")
        await connection.execute("CREATE TEMP TABLE victims (id int)")
        for text in NASTY_TEXT:
            assert await connection.fetchval(f"SELECT {text_literal(text)}") == text
        for data in NASTY_BYTES:
            assert await connection.fetchval(f"SELECT {bytea_literal(data)}") == data
        for number in (0.0, 1.5, 1e-7, 86_400.25, 1e300):
            assert await connection.fetchval(f"SELECT {float_literal(number)}::float8") == number
        assert await connection.fetchval("SELECT count(*) FROM victims") == 0
        await connection.execute("RESET standard_conforming_strings")


def test_values_that_have_no_literal_are_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        text_literal("a\x00b")
    for number in (math.inf, -math.inf, math.nan):
        with pytest.raises(ValueError, match="finite"):
            float_literal(number)
