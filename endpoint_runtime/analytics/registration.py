"""The extract's horizon in the database (``report_extracts``), so that ingestion's retention
deletes only rows every extract already holds.

The key is the output directory (with the host name). A directory given up for good should
leave the table: ``DELETE FROM report_extracts WHERE extract = 'host:/path'``, else retention
keeps every row above its horizon. A database without the table (made by an older ingestion)
or a role that may not write it leaves retention as it was; the run says so and goes on.
"""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg

from endpoint_runtime.analytics.options import ReportOptions
from endpoint_runtime.analytics.progress import Progress
from endpoint_runtime.transport.addresses import QueueAddress

UPSERT = """INSERT INTO {table} (extract, horizon) VALUES ($1, $2::text::xid8)
ON CONFLICT (extract) DO UPDATE SET horizon = greatest({table}.horizon, excluded.horizon),
    updated_at = statement_timestamp()"""


def extract_key(out: Path) -> str:
    return f"{socket.gethostname()}:{out}"


async def _register(dsn: str, table: str, key: str, horizon: int) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(UPSERT.format(table=table), key, str(horizon))
    finally:
        await connection.close()


def register_horizon(options: ReportOptions, out: Path, horizon: int | None,
                     progress: Progress) -> None:
    if horizon is None:
        return
    table = QueueAddress("report_extracts", options.schema).qualified
    # A thread of its own: the command line calls the report on its event loop's thread.
    with ThreadPoolExecutor(1) as pool:
        try:
            pool.submit(asyncio.run, _register(options.dsn, table, extract_key(out),
                                               horizon)).result()
        except (asyncpg.UndefinedTableError, asyncpg.InsufficientPrivilegeError) as exc:
            progress.say(f"the horizon is not recorded in {table} ({exc}): retention "
                         f"deletes rows whether the extract holds them or not")
