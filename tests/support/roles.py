"""Login roles with a password on the test server, for the least-privilege and secrets tests.

A role is made for one test and dropped after it (its connections ended, what it was granted
in the test's database revoked). Roles belong to the whole server, so names carry the
process id and a counter. The password travels in the DSN; a server whose ``pg_hba.conf``
trusts local connections does not check it, but it goes everywhere a DSN goes all the same.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from collections.abc import AsyncIterator
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import msgspec

from endpoint_runtime.transport import quote_identifier
from endpoint_runtime.transport.literals import text_literal

_counter = itertools.count()


class Role(msgspec.Struct, frozen=True):
    name: str
    password: str
    dsn: str
    """The test database's DSN, logging in as this role with its password."""


def as_user(dsn: str, user: str, password: str) -> str:
    """``dsn`` (URL or keyword form) logging in as ``user`` with ``password``."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        host = parts.netloc.rpartition("@")[2]
        netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
        return urlunsplit(parts._replace(netloc=netloc))
    return f"{dsn} user={user} password={password}"


@contextlib.asynccontextmanager
async def login_role(admin_dsn: str, *, attributes: str = "") -> AsyncIterator[Role]:
    """A new ``LOGIN`` role with a random password (and ``attributes`` such as CREATEDB) on
    the server of ``admin_dsn``, whose database the role's DSN names."""
    name = f"er_role_{os.getpid()}_{next(_counter)}"
    password = f"pw-{secrets.token_hex(16)}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f"CREATE ROLE {quote_identifier(name)} LOGIN {attributes} "
                            f"PASSWORD {text_literal(password)}")
        yield Role(name, password, as_user(admin_dsn, name, password))
    finally:
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE usename = $1", name)
        await admin.execute(f"DROP OWNED BY {quote_identifier(name)}")
        await admin.execute(f"DROP ROLE {quote_identifier(name)}")
        await admin.close()
