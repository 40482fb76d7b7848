"""SQL literals, for statements that travel together in one simple query (no parameters).

Escape strings (``E'...'``) are used throughout: they read the same whatever the server's
``standard_conforming_strings`` says, and a constant (not an expression) lets indexes serve.
:func:`text_literal` is the one function that turns text into SQL text: every literal the
runtime writes (sends, the outbox, DDL such as a trigger's channel) goes through it.
"""

from __future__ import annotations

import math


def text_literal(text: str) -> str:
    """``text`` as an escape-string literal with backslashes and quotes escaped.

    ``$`` is written ``\\$`` (which reads as ``$``), so that a literal inside a dollar-quoted
    body (a ``DO $tag$ ... $tag$`` block) can never end that body early.
    """
    if "\x00" in text:
        raise ValueError("PostgreSQL text cannot hold NUL characters")
    escaped = text.replace("\\", "\\\\").replace("'", "''")
    if "$" in escaped:
        escaped = escaped.replace("$", "\\$")
    return "E'" + escaped + "'"


def bytea_literal(data: bytes) -> str:
    """``data`` in bytea's hex format (``\\x`` + two hex digits per byte)."""
    return "E'\\\\x" + data.hex() + "'::bytea"


def float_literal(value: float) -> str:
    """A finite number as a numeric literal (``repr`` round-trips a float exactly)."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return repr(number)
