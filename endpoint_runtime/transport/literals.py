"""SQL literals, for statements that travel together in one simple query (no parameters).

Escape strings (``E'...'``) are used throughout: they read the same whatever the server's
``standard_conforming_strings`` says, and a constant (not an expression) lets indexes serve.
:func:`text_literal` is the one function that turns text into SQL text: every literal the
runtime writes (sends, the outbox, DDL such as a trigger's channel) goes through it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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


def inline_parameters(statement: str, literals: Sequence[str]) -> str:
    """``statement`` with each ``$n`` parameter replaced by ``literals[n - 1]``: a text that
    needs no prepared statement, for a connection whose server session may change between
    transactions (a transaction-mode pooler) and still travels with others in one simple query.

    Only parameters outside quoted identifiers (``"a$1"``, a queue's name) and string
    literals (``'...'``, ``E'...'``) are replaced, so a hostile name cannot take a value's
    place; comments are dropped (a value written into one could end it); a parameter
    without a literal raises ``ValueError``. The literals must come from
    this module's functions (or be numbers): they are written in as they are."""
    out: list[str] = []
    i, n = 0, len(statement)
    while i < n:
        char = statement[i]
        if char == '"' or char == "'":
            end = _quoted_end(statement, i)
            out.append(statement[i:end])
            i = end
        elif statement.startswith("--", i) or statement.startswith("/*", i):
            # A comment is left out: a value written into it could end it (a newline).
            if char == "-":
                end = statement.find("\n", i)
                end = n if end < 0 else end
            else:
                end = statement.find("*/", i + 2)
                if end < 0:
                    raise ValueError("unterminated comment in statement")
                end += 2
            out.append(" ")
            i = end
        elif char == "$" and i + 1 < n and statement[i + 1].isdigit() and (
                i == 0 or not (statement[i - 1].isalnum() or statement[i - 1] == "_")):
            j = i + 1
            while j < n and statement[j].isdigit():
                j += 1
            number = int(statement[i + 1:j])
            if not 1 <= number <= len(literals):
                raise ValueError(f"${number} has no value ({len(literals)} given)")
            out.append(literals[number - 1])
            i = j
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _quoted_end(statement: str, start: int) -> int:
    """The index just past the quoted identifier or string literal opened at ``start``
    (a doubled quote stays inside; an escape string, ``E'...'``, also escapes with ``\\``)."""
    quote = statement[start]
    escapes = quote == "'" and start > 0 and statement[start - 1] in "eE"
    i = start + 1
    while i < len(statement):
        char = statement[i]
        if escapes and char == "\\":
            i += 2
            continue
        if char == quote:
            if i + 1 < len(statement) and statement[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    raise ValueError(f"unterminated {quote} in statement")
