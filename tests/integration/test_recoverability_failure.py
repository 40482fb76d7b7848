"""A recoverability step that itself fails: critical error text, and the message is retried."""

from __future__ import annotations

import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import RecoverabilityFailedError
from tests.support.failing_endpoints import Doomed, doomed


async def test_error_queue_gone_raises_the_critical_error_and_keeps_the_message(
    transport: PostgresTransport,
) -> None:
    await transport.create_queue("doomed")  # no error queue: moving there must fail
    outgoing = create_outgoing(Doomed(1))
    await transport.send("doomed", outgoing)
    strategy = doomed.create_strategy(doomed.create_pipeline(), transport.pool, doomed.settings)

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        first = await slot.round()  # the handler fails, rolled back
        assert (first.taken, first.failed) == (1, 1)
        with pytest.raises(RecoverabilityFailedError) as info:
            await slot.round()  # the error-queue move fails

    assert str(info.value) == ("Failed to execute recoverability policy for message with "
                               f"native ID: `{outgoing.message_id}`")
    assert await transport.depth("doomed") == 1  # rolled back: the message is retried

    await transport.create_queue("error")  # the cause is fixed
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        third = await slot.round()
    assert (third.taken, third.failed) == (1, 1)
    assert await transport.depth("error") == 1
    assert await transport.depth("doomed") == 0


async def test_none_mode_sends_failures_to_the_error_queue_even_when_asked_to_retry(
    transport: PostgresTransport,
) -> None:
    from tests.support.failing_endpoints import none_mode

    for queue in ("fire_and_forget", "error"):
        await transport.create_queue(queue)
    await transport.send("fire_and_forget", create_outgoing(Doomed(2)))
    strategy = none_mode.create_strategy(none_mode.create_pipeline(), transport.pool,
                                         none_mode.settings)

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        result = await slot.round()

    assert (result.taken, result.failed) == (1, 1)
    assert await transport.depth("error") == 1  # not a delayed retry: NONE never retries
    assert await transport.depth("fire_and_forget") == 0


async def test_none_mode_keeps_a_poison_row_when_it_cannot_be_moved(
    transport: PostgresTransport,
) -> None:
    import uuid

    from tests.support.failing_endpoints import none_mode

    address = await transport.create_queue("fire_and_forget")  # no error queue
    await transport.pool.execute(
        f"INSERT INTO {address.qualified} (id, headers, body) VALUES ($1, '{{bad', 'x')",
        uuid.uuid4())
    strategy = none_mode.create_strategy(none_mode.create_pipeline(), transport.pool,
                                         none_mode.settings)

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        with pytest.raises(RecoverabilityFailedError):
            await slot.round()

    assert await transport.depth("fire_and_forget") == 1  # the receive rolled back with it


async def test_a_move_whose_commit_fails_is_counted_once_when_it_is_made_again(
    transport: PostgresTransport,
) -> None:
    """The move to the error queue is written, then its COMMIT fails (a deferred trigger on
    the error queue refuses the first one): the message comes back, is moved again, and the
    receiver's count says one move, as the error queue holds one row."""
    for queue in ("doomed", "error"):
        await transport.create_queue(queue)
    error = transport.address("error").qualified
    await transport.pool.execute(f"""
        CREATE SEQUENCE refusals;
        CREATE FUNCTION refuse_the_first() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('refusals') = 1 THEN RAISE EXCEPTION 'first move refused'; END IF;
            RETURN NULL;
        END $$;
        CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON {error}
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_the_first();
    """)
    await transport.send("doomed", create_outgoing(Doomed(3)))
    pipeline = doomed.create_pipeline()
    strategy = doomed.create_strategy(pipeline, transport.pool, doomed.settings)

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        for _ in range(6):
            await slot.round()
            if await transport.depth("doomed") == 0:
                break
        await slot.close()

    assert await transport.pool.fetchval("SELECT last_value FROM refusals") == 2  # refused once
    assert await transport.depth("error") == 1
    assert pipeline.stats.moved_to_error == 1
