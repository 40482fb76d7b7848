"""Ingestion of audit copies and failed messages into audit_log and error_log (real
PostgreSQL, driven through the ingestion endpoint's receive strategy and storage, no Ray)."""

from __future__ import annotations

import uuid

import asyncpg
import msgspec

from endpoint_runtime import Endpoint
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.ingestion import IngestionEndpoint
from endpoint_runtime.ingestion.storage import CLEAN_BATCH, SCAN_BATCH
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.failure_groups import failure_group
from endpoint_runtime.wire.messages import Headers, encode_headers, from_wire_time
from tests.integration.test_publish_subscribe import prepare
from tests.support import pubsub_endpoints
from tests.support.draining import drain
from tests.support.pubsub_endpoints import PlaceOrder

ingestion = IngestionEndpoint("audit")


async def ingest(transport: PostgresTransport) -> None:
    async with transport.pool.acquire() as connection:
        await ingestion.data.setup(connection)
    await drain(transport, ingestion)


async def test_audit_copies_become_typed_rows_that_match_their_headers(
    transport: PostgresTransport,
) -> None:
    publisher: Endpoint = pubsub_endpoints.atomic
    await prepare(transport, publisher)
    sent = create_outgoing(PlaceOrder("o-1"), originating_endpoint="shop",
                           headers={"NServiceBus.Retries": "2"})
    await transport.send(publisher.name, sent)
    await drain(transport, publisher)
    copy = await transport.pool.fetchval("SELECT headers FROM audit")
    headers = msgspec.json.decode(copy, type=dict[str, str])

    await ingest(transport)

    assert await transport.depth("audit") == 0
    row = await transport.pool.fetchrow("SELECT * FROM audit_log")
    assert row["message_id"] == sent.message_id
    assert row["message_type"] == headers[Headers.ENCLOSED_MESSAGE_TYPES]
    assert row["intent"] == "Send"
    assert row["sending_endpoint"] == "shop"
    assert row["processing_endpoint"] == publisher.name
    assert row["processing_machine"] == headers[Headers.PROCESSING_MACHINE]
    assert row["conversation_id"] == headers[Headers.CONVERSATION_ID]
    assert row["time_sent"] == from_wire_time(headers[Headers.TIME_SENT])
    started = from_wire_time(headers[Headers.PROCESSING_STARTED])
    ended = from_wire_time(headers[Headers.PROCESSING_ENDED])
    assert (row["processing_started"], row["processing_ended"]) == (started, ended)
    assert row["processing_time_ms"] == (ended - started).total_seconds() * 1000
    assert row["critical_time_ms"] == (
        ended - from_wire_time(headers[Headers.TIME_SENT])).total_seconds() * 1000
    assert row["body_size"] == len(sent.body)
    assert row["retries"] == 2
    assert row["headers"] == copy


async def test_malformed_audit_copies_go_to_error_log_with_a_reason_and_ingestion_goes_on(
    transport: PostgresTransport,
) -> None:
    await transport.create_queue("audit")
    good = create_outgoing(PlaceOrder("ok"), headers={
        Headers.PROCESSING_STARTED: "2026-11-23 10:00:00:000000 Z",
        Headers.PROCESSING_ENDED: "2026-11-23 10:00:00:250000 Z"})
    no_times = create_outgoing(PlaceOrder("no-times"))
    bad_time = create_outgoing(PlaceOrder("bad-time"), headers={
        Headers.PROCESSING_STARTED: "yesterday\x1b[31m",
        Headers.PROCESSING_ENDED: "2026-11-23 10:00:00:250000 Z"})
    for message in (no_times, good, bad_time):
        await transport.send("audit", message)
    poison_id = uuid.uuid4()
    await transport.pool.execute("INSERT INTO audit (id, headers, body) VALUES ($1, $2, $3)",
                                 poison_id, "{not json", b"x" * 70_000)

    await ingest(transport)

    assert await transport.pool.fetchval("SELECT array_agg(message_id) FROM audit_log") == [
        good.message_id]
    assert await transport.pool.fetchval("SELECT processing_time_ms FROM audit_log") == 250.0
    rows = await transport.pool.fetch(
        "SELECT message_id, native_id, reason, body_size, source FROM error_log ORDER BY id")
    reasons = {row["message_id"] or str(row["native_id"]): row["reason"] for row in rows}
    assert "no NServiceBus.ProcessingStarted" in reasons[no_times.message_id]
    assert "not a wire time" in reasons[bad_time.message_id]
    assert reasons[str(poison_id)].startswith("malformed audit copy: ")
    assert {row["source"] for row in rows} == {"public.audit"}
    assert await transport.depth("audit") == 0


async def test_the_error_queue_is_recorded_once_per_row_and_its_rows_stay(
    transport: PostgresTransport,
) -> None:
    await transport.create_queue("error")
    data = ingestion.data
    async with transport.pool.acquire() as connection:
        await data.setup(connection)

    async def fail(n: int) -> str:
        message = create_outgoing(PlaceOrder(f"o-{n}"), originating_endpoint="shop")
        headers = {**message.headers, ErrorHeaders.FAILED_QUEUE: "sales",
                   ErrorHeaders.EXCEPTION_TYPE: "builtins.ValueError",
                   ErrorHeaders.MESSAGE: f"bad order {n}",
                   ErrorHeaders.TIME_OF_FAILURE: "2026-11-23 10:00:01:000000 Z"}
        await transport.pool.execute(
            "INSERT INTO error (id, headers, body) VALUES ($1, $2, $3)",
            uuid.UUID(message.message_id), encode_headers(headers), message.body)
        return message.message_id

    first = [await fail(n) for n in range(3)]
    error_queue = QueueAddress("error")
    async with transport.pool.acquire() as connection:
        assert await data.record_error_queue(connection, error_queue) == 3
        assert await data.record_error_queue(connection, error_queue) == 0  # once per row
        later = await fail(3)
        assert await data.record_error_queue(connection, error_queue) == 1

    assert await transport.depth("error") == 4  # still there for `errors retry`
    rows = await transport.pool.fetch(
        "SELECT message_id, failed_queue, exception_type, exception_message, time_of_failure, "
        "sending_endpoint, reason FROM error_log ORDER BY id")
    assert [row["message_id"] for row in rows] == [*first, later]
    assert rows[0]["failed_queue"] == "sales"
    assert rows[0]["exception_type"] == "builtins.ValueError"
    assert rows[0]["exception_message"] == "bad order 0"
    assert rows[0]["time_of_failure"] == from_wire_time("2026-11-23 10:00:01:000000 Z")
    assert rows[0]["sending_endpoint"] == "shop"
    assert rows[0]["reason"] is None


async def test_old_rows_are_cleaned_up(transport: PostgresTransport) -> None:
    await transport.create_queue("audit")
    await transport.send("audit", create_outgoing(PlaceOrder("ok"), headers={
        Headers.PROCESSING_STARTED: "2026-11-23 10:00:00:000000 Z",
        Headers.PROCESSING_ENDED: "2026-11-23 10:00:00:250000 Z"}))
    await ingest(transport)
    await transport.pool.execute("UPDATE audit_log SET ingested_at = now() - interval '2 days'")

    async with transport.pool.acquire() as connection:
        await ingestion.data.clean_up(connection, keep_seconds=86_400 * 3)
        assert await transport.pool.fetchval("SELECT count(*) FROM audit_log") == 1
        await ingestion.data.clean_up(connection, keep_seconds=86_400)
    assert await transport.pool.fetchval("SELECT count(*) FROM audit_log") == 0


async def test_retention_deletes_every_expired_row_however_many_batches_it_takes(
    transport: PostgresTransport,
) -> None:
    async with transport.pool.acquire() as connection:
        await ingestion.data.setup(connection)
    expired, kept = 2 * CLEAN_BATCH + 1, 3
    await transport.pool.execute(
        "INSERT INTO audit_log (message_id, body_size, retries, headers, ingested_at) "
        "SELECT 'm' || n, 0, 0, '{}', now() - interval '2 days' FROM generate_series(1, $1) n",
        expired)
    await transport.pool.execute(
        "INSERT INTO error_log (source, body_size, retries, headers, ingested_at) "
        "SELECT 'public.error', 0, 0, '{}', now() - interval '2 days' "
        "FROM generate_series(1, $1) n", CLEAN_BATCH + 1)
    for table in ("audit_log", "error_log"):
        await transport.pool.execute(
            f"INSERT INTO {table} (message_id, source, body_size, retries, headers) "
            "SELECT 'fresh', 'public.error', 0, 0, '{}' FROM generate_series(1, $1)"
            if table == "error_log" else
            f"INSERT INTO {table} (message_id, body_size, retries, headers) "
            "SELECT 'fresh', 0, 0, '{}' FROM generate_series(1, $1)", kept)

    async with transport.pool.acquire() as connection:
        deleted = await ingestion.data.clean_up(connection, keep_seconds=86_400)

    for table in ("audit_log", "error_log"):
        assert await transport.pool.fetchval(
            f"SELECT array_agg(DISTINCT message_id) FROM {table}") == ["fresh"]
        assert await transport.pool.fetchval(f"SELECT count(*) FROM {table}") == kept
    assert deleted == expired + CLEAN_BATCH + 1


async def test_a_failure_that_commits_after_a_scan_batch_of_later_ones_is_recorded(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    """A batched transaction moves a message to the error queue early and commits late: more
    than a scan batch of later failures commit and are recorded meanwhile. The late row, below
    every seq already seen, is recorded once it commits, and nothing is recorded twice."""
    await transport.create_queue("error")
    data = ingestion.data
    async with transport.pool.acquire() as connection:
        await data.setup(connection)
    error_queue = QueueAddress("error")
    insert = "INSERT INTO error (id, headers, body) VALUES ($1, $2, '')"

    def failed_headers(n: int) -> str:
        return encode_headers({Headers.MESSAGE_ID: f"m-{n}",
                               ErrorHeaders.FAILED_QUEUE: "sales"})

    async def record_all() -> int:
        recorded = 0
        async with transport.pool.acquire() as connection:
            while n := await data.record_error_queue(connection, error_queue):
                recorded += n
        return recorded

    late = await asyncpg.connect(database_dsn)
    try:
        await late.execute("BEGIN")
        await late.execute(insert, uuid.uuid4(), failed_headers(0))  # the lowest seq
        later = SCAN_BATCH + 500
        await transport.pool.executemany(
            insert, [(uuid.uuid4(), failed_headers(n)) for n in range(1, later + 1)])
        assert await record_all() == later
        assert await record_all() == 0
        await late.execute("COMMIT")
    finally:
        await late.close()

    assert await record_all() == 1
    assert await record_all() == 0
    assert await transport.pool.fetchval(
        "SELECT min(queue_seq) FROM error_log") == await transport.pool.fetchval(
        "SELECT min(seq) FROM error")
    recorded = await transport.pool.fetch("SELECT message_id FROM error_log")
    assert sorted(r["message_id"] for r in recorded) == sorted(
        f"m-{n}" for n in range(later + 1))


async def test_the_scan_floor_moves_up_once_the_writers_have_ended(
    transport: PostgresTransport,
) -> None:
    """The floor below which the scan no longer looks moves up to what was seen once the
    transactions writing to the queue at the time have ended (so a scan does not re-read the
    whole queue for ever)."""
    await transport.create_queue("error")
    data = ingestion.data
    async with transport.pool.acquire() as connection:
        await data.setup(connection)
    error_queue = QueueAddress("error")
    for n in range(5):
        await transport.send("error", create_outgoing(PlaceOrder(f"o-{n}")))

    async def floor() -> int:
        value: int = await transport.pool.fetchval(
            "SELECT last_seq FROM ingestion_progress WHERE queue = 'public.error'")
        return value

    async with transport.pool.acquire() as connection:
        assert await data.record_error_queue(connection, error_queue) == 5
        assert await floor() == 0  # a candidate is taken, not yet settled
        assert await data.record_error_queue(connection, error_queue) == 0
    assert await floor() == await transport.pool.fetchval("SELECT max(seq) FROM error")


async def test_a_progress_table_of_an_earlier_version_gets_the_candidate_columns(
    transport: PostgresTransport,
) -> None:
    await transport.create_queue("error")
    await transport.pool.execute(
        "CREATE TABLE ingestion_progress (queue text PRIMARY KEY, last_seq bigint NOT NULL);"
        "INSERT INTO ingestion_progress VALUES ('public.error', 0)")
    await transport.send("error", create_outgoing(PlaceOrder("o-1")))
    async with transport.pool.acquire() as connection:
        await ingestion.data.setup(connection)
        await ingestion.data.setup(connection)  # idempotent
        assert await ingestion.data.record_error_queue(connection, QueueAddress("error")) == 1
    assert await transport.pool.fetchval(
        "SELECT candidate_seq FROM ingestion_progress") == await transport.pool.fetchval(
        "SELECT max(seq) FROM error")


async def test_an_error_log_made_before_failure_groups_gets_them_at_the_next_set_up(
    transport: PostgresTransport,
) -> None:
    async with transport.pool.acquire() as connection:
        await ingestion.data.setup(connection)
    # The table as an older version made it: no group columns, rows across several batches.
    await transport.pool.execute(
        "ALTER TABLE error_log DROP COLUMN failure_group, DROP COLUMN failure_title")
    trace = ('Traceback (most recent call last):\n  File "/app/billing.py", line 9, in charge\n'
             "billing.CardDeclined: card declined\n")
    rows = SCAN_BATCH + 5
    await transport.pool.execute(
        "INSERT INTO error_log (source, body_size, retries, exception_type, exception_message, "
        "headers) SELECT 'public.error', 0, 0, 'billing.CardDeclined', "
        "'card declined for ' || n, $1 FROM generate_series(1, $2) n",
        encode_headers({ErrorHeaders.STACK_TRACE: trace}), rows)
    await transport.pool.execute(  # a row whose headers never parsed: grouped by its reason
        "INSERT INTO error_log (source, body_size, retries, headers, reason) "
        "VALUES ('public.error', 0, 0, '{broken', 'headers do not parse: x 1')")

    async with transport.pool.acquire() as connection:
        await ingestion.data.setup(connection)

    groups = await transport.pool.fetch(
        "SELECT failure_group, failure_title, count(*) AS n FROM error_log GROUP BY 1, 2 "
        "ORDER BY n DESC")
    declined = failure_group("billing.CardDeclined", "card declined for 1", trace)
    reason = failure_group(None, "headers do not parse: x 1", None)
    assert [tuple(row) for row in groups] == [(declined.key, "card declined for <n>", rows),
                                              (reason.key, reason.title, 1)]
