"""SQL literals, for statements that travel together in one simple query (no parameters).

Escape strings (``E'...'``) are used throughout: they read the same whatever the server's
``standard_conforming_strings`` says, and a constant (not an expression) lets indexes serve.
"""

from __future__ import annotations

import math


def text_literal(text: str) -> str:
    """``text`` as an escape-string literal with backslashes and quotes escaped."""
    if "\x00" in text:
        raise ValueError("PostgreSQL text cannot hold NUL characters")
    return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def bytea_literal(data: bytes) -> str:
    """``data`` in bytea's hex format (``\\x`` + two hex digits per byte)."""
    return "E'\\\\x" + data.hex() + "'::bytea"


def float_literal(value: float) -> str:
    """A finite number as a numeric literal (``repr`` round-trips a float exactly)."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return repr(number)
