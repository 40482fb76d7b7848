"""``endpoint-runtime db url`` and ``db psql``: how a user reaches the server the commands use.

Run as the console script in a subprocess (``db psql`` replaces its process with psql).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from endpoint_runtime.cli.database import psql_binary

SCRIPT = Path(sys.executable).with_name("endpoint-runtime")


def _run(*argv: str, dsn: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENDPOINT_RUNTIME_", "PG"))}
    env["ENDPOINT_RUNTIME_DSN"] = dsn
    return subprocess.run([SCRIPT, *argv], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


async def test_db_url_prints_the_configured_dsn_with_its_password_redacted(
    database_dsn: str,
) -> None:
    parts = urlsplit(database_dsn)
    host = parts.netloc.rpartition("@")[2]
    with_password = urlunsplit(parts._replace(netloc=f"postgres:s3cret@{host}"))
    shown = _run("db", "url", dsn=with_password)
    revealed = _run("db", "url", "--show-password", dsn=with_password)

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == with_password.replace(":s3cret@", ":***@")
    assert "s3cret" not in shown.stdout + shown.stderr
    assert revealed.stdout.strip() == with_password


async def test_db_psql_runs_psql_on_the_configured_database(database_dsn: str) -> None:
    assert psql_binary() is not None, "neither psql on PATH nor the embedded server's psql"
    connection = await asyncpg.connect(database_dsn)
    try:
        await connection.execute("CREATE TABLE orders (order_id text PRIMARY KEY)")
        await connection.execute("INSERT INTO orders VALUES ('o-1'), ('o-2')")
    finally:
        await connection.close()

    outcome = _run("db", "psql", "--", "-At", "-c", "SELECT count(*) FROM orders", dsn=database_dsn)

    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout.strip() == "2"
