"""How PostgreSQL runs the outbox's statements once the table is large and nearly all dispatched.

Plans are read with EXPLAIN on the server, under the plan a long-lived session caches
(``force_generic_plan``) and the one planned for each call (``force_custom_plan``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport import QueueAddress

RECORDS = 3_000
PLAN_MODES = ("force_generic_plan", "force_custom_plan")


def scans(plan: dict[str, Any]) -> Iterator[tuple[str, str | None]]:
    """(node type, index name) of every node of a JSON plan."""
    yield plan["Node Type"], plan.get("Index Name")
    for child in plan.get("Plans", []):
        yield from scans(child)


async def plan_of(connection: asyncpg.Connection, statement: str, types: str,
                  values: str, mode: str) -> list[tuple[str, str | None]]:
    await connection.execute(f"SET plan_cache_mode = {mode}")
    await connection.execute(f"PREPARE probe({types}) AS {statement}")
    try:
        text = await connection.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE probe({values})")
    finally:
        await connection.execute("DEALLOCATE probe")
    return list(scans(json.loads(text)[0]["Plan"]))


@pytest.fixture
async def storage(transport: PostgresTransport) -> OutboxStorage:
    """The outbox table of a busy endpoint: thousands of dispatched records, as the statistics
    say, and one that is not dispatched yet (in flight records come and go between ANALYZEs)."""
    storage = OutboxStorage(QueueAddress("busy_OutboxData"))
    await transport.create_queue("sink")
    async with transport.pool.acquire() as connection:
        await storage.setup(connection)
        table = storage.table.qualified
        await connection.execute(f"""
            INSERT INTO {table} (message_id, dispatched, dispatched_at, persistence_version)
            SELECT 'm-' || i, true, now() - make_interval(mins => i), 'v'
            FROM generate_series(1, {RECORDS}) AS i;
            ANALYZE {table};
            INSERT INTO {table} (message_id, dispatched, persistence_version, operations)
            VALUES ('pending', false, 'v', '[]')""")
    return storage


@pytest.mark.parametrize("mode", PLAN_MODES)
async def test_marking_a_record_finds_it_through_its_message_id(
    transport: PostgresTransport, storage: OutboxStorage, mode: str
) -> None:
    primary_key = f"{storage.table.table}_pkey"
    dispatched_index = f"{storage.table.table}_dispatched_idx"
    statements = [
        (storage.dispatch_and_mark(QueueAddress("sink")),
         "text, uuid[], float8[], text[], bytea[]",
         "'pending', ARRAY[gen_random_uuid()], ARRAY[NULL]::float8[], ARRAY['{}'],"
         " ARRAY['\\x00'::bytea]"),
        (storage.sql["take_for_dispatch"], "text", "'pending'"),
    ]
    async with transport.pool.acquire() as connection:
        for statement, types, values in statements:
            plan = await plan_of(connection, statement, types, values, mode)
            used = {index for _, index in plan if index}
            assert primary_key in used, plan
            assert dispatched_index not in used, plan


@pytest.mark.parametrize("mode", PLAN_MODES)
async def test_cleanup_walks_the_dispatched_at_index(
    transport: PostgresTransport, storage: OutboxStorage, mode: str
) -> None:
    async with transport.pool.acquire() as connection:
        plan = await plan_of(connection, storage.sql["cleanup_batch"], "float8, int",
                             "604800, 4000", mode)
    used = {index for _, index in plan if index}
    assert f"{storage.table.table}_dispatched_at_idx" in used, plan
    assert ("Seq Scan", None) not in plan, plan
