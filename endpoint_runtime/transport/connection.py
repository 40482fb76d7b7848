"""The connection class of the transport's pools: an asyncpg connection that remembers which
SQL-level prepared statements (``PREPARE``) its server session holds.

Such a statement is run as ``EXECUTE name(literal values)``, a short text that can travel with
other statements in one simple query (see ``sending.send_statement``), while the server parses
and plans the statement itself only once per session. ``DISCARD ALL`` or ``DEALLOCATE ALL`` on
the connection, or a pooler that moves sessions between clients, would break this bookkeeping.
"""

from __future__ import annotations

from typing import Any

import asyncpg


class QueueConnection(asyncpg.Connection):  # type: ignore[misc]
    __slots__ = ("sql_prepared",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sql_prepared: set[str] = set()
