"""The connection class of the transport's pools: an asyncpg connection that remembers which
SQL-level prepared statements (``PREPARE``) its server session holds.

Such a statement is run as ``EXECUTE name(literal values)``, a short text that can travel with
other statements in one simple query (e.g. just before COMMIT), while the server parses and
plans the statement itself only once per session. ``DISCARD ALL`` or ``DEALLOCATE ALL`` on the
connection, or a pooler that moves sessions between clients, would break this bookkeeping.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import asyncpg


class QueueConnection(asyncpg.Connection):  # type: ignore[misc]
    """Also keeps, per queue, where its receives start (``receiving.ReceivePosition``)."""

    __slots__ = ("receive_positions", "sql_prepared")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sql_prepared: set[str] = set()
        self.receive_positions: dict[Any, Any] = {}


async def prepared_name(
    connection: asyncpg.Connection, statement: str, parameter_types: str
) -> str | None:
    """The name under which ``statement`` (with ``$n`` parameters of ``parameter_types``) is
    prepared in the connection's session, preparing it on first use. ``None`` when the
    connection does not track its session's statements (it is no :class:`QueueConnection`)."""
    prepared: set[str] | None = getattr(connection, "sql_prepared", None)
    if prepared is None:
        return None
    name = _name(statement, parameter_types)
    if name not in prepared:
        text = statement.strip().rstrip(";")
        await connection.execute(f"PREPARE {name} ({parameter_types}) AS {text}")
        prepared.add(name)
    return name


@functools.lru_cache(maxsize=1024)
def _name(statement: str, parameter_types: str) -> str:
    """A name derived from the statement itself, so that one name never means two texts."""
    text = statement.strip().rstrip(";")
    digest = hashlib.blake2b(f"{parameter_types}|{text}".encode(), digest_size=10)
    return "endpoint_runtime_" + digest.hexdigest()
