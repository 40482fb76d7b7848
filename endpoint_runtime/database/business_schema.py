"""An endpoint's business tables: the SQL or hooks that create them, and the tables they own.

The runtime creates the tables a deployment needs for messaging (see
:mod:`endpoint_runtime.database.installation`); the handlers' own tables (``orders``, ``invoices``)
are the endpoint's. It declares them with ``Endpoint(..., schema_sql=...)``, ``CREATE TABLE
IF NOT EXISTS`` statements, or with install hooks, async functions given a connection; both
run by ``endpoint-runtime db install`` and at every deployment start with installers on.
Without installers a start runs none of it and names each declared table that is missing.

This is not a migration tool: the SQL runs whole, every time, so it must be idempotent, and a
table that exists is left as it is (a new column needs ``ALTER TABLE ... ADD COLUMN IF NOT
EXISTS`` in the SQL, or a migration tool of your choice run before the endpoint).

Example::

    endpoint = Endpoint("sales", schema_sql='''
        CREATE TABLE IF NOT EXISTS orders (order_id text PRIMARY KEY, amount numeric NOT NULL);
    ''')

    @endpoint.on_install(tables=["order_totals"])
    async def create_totals(connection: DatabaseConnection) -> None:
        await connection.execute("CREATE TABLE IF NOT EXISTS order_totals (day date, n int)")
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterable

import asyncpg

from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.queues import ddl_lock

InstallHook = Callable[[DatabaseConnection], Awaitable[None]]
"""An async function that creates business tables on the connection it is given (in the
installation's transaction: never commit it yourself)."""

_IDENTIFIER = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
_CREATE_TABLE = re.compile(
    r"\bCREATE\s+(?:(?:GLOBAL|LOCAL)\s+)?(?P<kind>(?:TEMP|TEMPORARY|UNLOGGED)\s+)?TABLE\s+"
    rf"(?:IF\s+NOT\s+EXISTS\s+)?(?P<name>{_IDENTIFIER}(?:\s*\.\s*{_IDENTIFIER})?)",
    re.IGNORECASE,
)
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
_LITERALS = re.compile(r"'(?:[^']|'')*'")


def tables_created_by(sql: str) -> list[str]:
    """The names of the tables ``sql`` creates (``CREATE [UNLOGGED] TABLE [IF NOT EXISTS]
    name``), as written, in order; temporary tables and the text of comments and string
    literals are left out.

    >>> tables_created_by('CREATE TABLE IF NOT EXISTS orders (id int); '
    ...                   'CREATE TABLE sales."Totals" (n int)')
    ['orders', 'sales."Totals"']
    """
    text = _LITERALS.sub("''", _COMMENTS.sub(" ", sql))
    names: list[str] = []
    for match in _CREATE_TABLE.finditer(text):
        kind = (match["kind"] or "").strip().upper()
        name = re.sub(r"\s*\.\s*", ".", match["name"])
        if kind not in ("TEMP", "TEMPORARY") and name not in names:
            names.append(name)
    return names


class BusinessSchema:
    """The business tables of one endpoint: its ``schema_sql``, its install hooks and the
    tables they declare (those of the SQL's ``CREATE TABLE`` statements, and each hook's
    ``tables``).

    Args:
        endpoint: the endpoint's name (for error messages).
        sql: idempotent DDL (``CREATE TABLE IF NOT EXISTS ...``), run as one script.
    """

    def __init__(self, endpoint: str, sql: str | None = None) -> None:
        self.endpoint = endpoint
        self.sql = sql.strip() if sql else None
        self.hooks: list[InstallHook] = []
        self.tables: list[str] = tables_created_by(self.sql) if self.sql else []

    def add_hook(self, hook: InstallHook, tables: Iterable[str] = ()) -> None:
        """Run ``hook(connection)`` at installation, after the SQL and the hooks added
        before; ``tables``: the tables it creates (checked at a start without installers)."""
        if hook in self.hooks:
            raise ConfigurationError(
                f"install hook {getattr(hook, '__qualname__', hook)!r} is already added to "
                f"endpoint {self.endpoint!r}")
        if isinstance(tables, str):
            raise ConfigurationError("tables= is a list of table names, not one string")
        if not inspect.iscoroutinefunction(hook):
            raise ConfigurationError(
                f"install hook {getattr(hook, '__qualname__', hook)!r} must be an async "
                "function taking a connection (async def)")
        self.hooks.append(hook)
        self.tables.extend(table for table in tables if table not in self.tables)

    def __bool__(self) -> bool:
        return bool(self.sql or self.hooks)

    async def install(self, connection: DatabaseConnection) -> None:
        """Run the SQL, then every hook, in one transaction under the runtime's DDL lock
        (so that several deployments starting at once do not collide on the catalog).

        Raises:
            ConfigurationError: the SQL tried to create something that exists (it is not
                idempotent), or is otherwise wrong (SQLSTATE class 42, but a missing
                privilege: that asyncpg error is raised as it is), or a declared table does
                not exist afterwards. Nothing of the installation is then committed.
        """
        if not self:
            return
        async with ddl_lock(connection):
            try:
                if self.sql:
                    await connection.execute(self.sql)
                for hook in self.hooks:
                    await hook(connection)
            except (asyncpg.DuplicateTableError, asyncpg.DuplicateObjectError) as exc:
                raise ConfigurationError(
                    f"the business schema of endpoint {self.endpoint!r} is not idempotent "
                    f"({exc}): it runs at every install and every start with installers; "
                    "write CREATE TABLE IF NOT EXISTS (and CREATE INDEX IF NOT EXISTS)"
                ) from exc
            except asyncpg.InsufficientPrivilegeError as exc:  # the role's rights, as is
                exc.add_note(f"while installing the business schema of endpoint "
                             f"{self.endpoint!r}")
                raise
            except asyncpg.SyntaxOrAccessError as exc:  # class 42: the SQL's fault
                raise ConfigurationError(
                    f"the business schema of endpoint {self.endpoint!r} failed: "
                    f"{type(exc).__name__}: {exc}") from exc
            missing = await self.missing(connection)
            if missing:  # raised in the transaction: nothing of it is committed
                raise ConfigurationError(
                    f"endpoint {self.endpoint!r} declares business tables that its schema "
                    f"SQL and install hooks did not create: {', '.join(missing)}")

    async def missing(self, connection: DatabaseConnection) -> list[str]:
        """The declared tables that do not exist (resolved as the handlers' statements
        resolve them: through the connection's ``search_path`` when unqualified)."""
        return [table for table in self.tables
                if await connection.fetchval("SELECT to_regclass($1) IS NULL", table)]
