"""The PostgreSQL transport against a real server: send, receive, peek, expiry, purge."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
import msgspec
import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import QueueNotFoundError
from endpoint_runtime.transport import QueueAddress, receiving, sending
from endpoint_runtime.wire.messages import Headers, PoisonMessage, TransportMessage
from tests.support.expiry import send_expiring, wait_until_expired


class OrderPlaced(msgspec.Struct):
    order_id: int
    note: str = ""


async def test_send_then_receive_keeps_standard_headers(transport: PostgresTransport) -> None:
    await transport.create_queue("sales")
    outgoing = create_outgoing(OrderPlaced(7), originating_endpoint="web", reply_to="web")
    await transport.send("sales", outgoing)

    received = await transport.receive("sales")

    assert isinstance(received, TransportMessage)
    assert received.body == b'{"order_id":7,"note":""}'
    assert received.message_id == outgoing.message_id
    assert received.native_id == uuid.UUID(outgoing.message_id)
    assert received.headers[Headers.ENCLOSED_MESSAGE_TYPES] == f"{__name__}.OrderPlaced"
    assert received.headers[Headers.ORIGINATING_ENDPOINT] == "web"
    assert received.headers[Headers.REPLY_TO_ADDRESS] == "web"
    assert received.headers[Headers.MESSAGE_INTENT] == "Send"
    assert await transport.receive("sales") is None


async def test_ten_thousand_messages_eight_receivers_each_received_once(
    transport: PostgresTransport,
) -> None:
    address = await transport.create_queue("load")
    total = 10_000
    messages = [create_outgoing(OrderPlaced(i)) for i in range(total)]
    for start in range(0, total, 1000):
        await transport.send_many(address, messages[start : start + 1000])
    seen: list[int] = []

    async def receiver() -> None:
        async with transport.pool.acquire() as connection:
            while True:
                async with connection.transaction():
                    message = await receiving.receive(connection, address)
                if message is None:
                    return
                seen.append(msgspec.json.decode(message.body, type=OrderPlaced).order_id)

    await asyncio.gather(*(receiver() for _ in range(8)))

    assert len(seen) == total
    assert sorted(seen) == list(range(total))
    assert await transport.depth(address) == 0


async def test_single_receiver_sees_fifo_order(transport: PostgresTransport) -> None:
    address = await transport.create_queue("fifo")
    for i in range(50):  # one by one, and in a batch: both keep order
        await transport.send(address, create_outgoing(OrderPlaced(i)))
    await transport.send_many(address, [create_outgoing(OrderPlaced(i)) for i in range(50, 300)])

    order = []
    while (message := await transport.receive(address)) is not None:
        assert isinstance(message, TransportMessage)
        order.append(msgspec.json.decode(message.body, type=OrderPlaced).order_id)

    assert order == list(range(300))


async def test_expired_messages_are_never_returned(transport: PostgresTransport) -> None:
    address = await transport.create_queue("ttbr")
    short = create_outgoing(OrderPlaced(1), time_to_be_received=timedelta(milliseconds=1))
    lasting = create_outgoing(OrderPlaced(2), time_to_be_received=timedelta(hours=1))
    await transport.send_many(address, [short, lasting])
    await wait_until_expired(transport, address, count=1)

    received = await transport.receive(address)

    assert isinstance(received, TransportMessage)
    assert received.message_id == lasting.message_id
    assert received.headers[Headers.TIME_TO_BE_RECEIVED] == "01:00:00.0000000"
    assert await transport.receive(address) is None
    assert await transport.depth(address) == 0  # the expired row was deleted on the way


async def test_a_batched_receive_never_returns_expired_messages(
    transport: PostgresTransport,
) -> None:
    address = await transport.create_queue("ttbr_batch")
    short = [create_outgoing(OrderPlaced(n), time_to_be_received=timedelta(milliseconds=1))
             for n in (1, 3)]
    lasting = [create_outgoing(OrderPlaced(2), time_to_be_received=timedelta(hours=1)),
               create_outgoing(OrderPlaced(4))]
    await transport.send_many(address, [short[0], lasting[0], short[1], lasting[1]])
    await wait_until_expired(transport, address, count=2)

    async with transport.pool.acquire() as connection, connection.transaction():
        batch = await receiving.receive_batch(connection, address, 10)

    assert [m.message_id for m in batch] == [m.message_id for m in lasting]
    assert await transport.depth(address) == 0  # the expired rows were deleted on the way


async def test_a_batch_of_expired_rows_only_is_not_mistaken_for_an_empty_queue(
    transport: PostgresTransport,
) -> None:
    """Found by the fuzz test of received rows: a batch whose rows had all expired came back
    empty, and the batched round reported an empty queue with live rows still behind it."""
    address = await transport.create_queue("ttbr_batch_all")
    short = [create_outgoing(OrderPlaced(n), time_to_be_received=timedelta(milliseconds=1))
             for n in range(4)]
    lasting = [create_outgoing(OrderPlaced(10 + n)) for n in range(2)]
    await transport.send_many(address, [*short, *lasting])
    await wait_until_expired(transport, address, count=4)

    async with transport.pool.acquire() as connection, connection.transaction():
        batch = await receiving.receive_batch(connection, address, 4)

    assert [m.message_id for m in batch] == [m.message_id for m in lasting]
    assert await transport.depth(address) == 0


@pytest.mark.parametrize("batched", [False, True])
async def test_a_receive_in_an_old_transaction_skips_what_expired_since_it_began(
    transport: PostgresTransport, batched: bool,
) -> None:
    """Expiry is judged at the receive's own statement, not at its transaction's start
    (``now()``): receive transactions can be older than the messages they take."""
    address = await transport.create_queue("ttbr_old")
    async with transport.pool.acquire() as connection, connection.transaction():
        await connection.execute("SELECT 1")  # the transaction has begun, and has a start
        await send_expiring(transport, address, OrderPlaced(1))
        live = create_outgoing(OrderPlaced(2))
        await transport.send(address, live)
        await wait_until_expired(transport, address, count=1)

        if batched:
            received = await receiving.receive_batch(connection, address, 10)
        else:
            received = [m for m in [await receiving.receive(connection, address)] if m]

    assert [m.message_id for m in received] == [live.message_id]
    assert await transport.depth(address) == 0


async def test_purge_expired_removes_only_expired_rows(transport: PostgresTransport) -> None:
    address = await transport.create_queue("purge")
    doomed = [
        create_outgoing(OrderPlaced(i), time_to_be_received=timedelta(milliseconds=1))
        for i in range(25)
    ]
    kept = [create_outgoing(OrderPlaced(100)),
            create_outgoing(OrderPlaced(101), time_to_be_received=timedelta(days=1))]
    await transport.send_many(address, doomed + kept)
    await wait_until_expired(transport, address, count=25)

    removed = await transport.purge_expired(address)

    assert removed == 25
    left = []
    while (message := await transport.receive(address)) is not None:
        left.append(message.message_id)
    assert left == [m.message_id for m in kept]


async def test_purge_expired_works_in_batches(database_dsn: str) -> None:
    from endpoint_runtime.settings import TransportSettings

    settings = TransportSettings(dsn=database_dsn, purge_batch_size=7)
    async with PostgresTransport.connect(settings) as transport:
        address = await transport.create_queue("batches")
        await transport.send_many(address, [
            create_outgoing(OrderPlaced(i), time_to_be_received=timedelta(milliseconds=1))
            for i in range(30)
        ])
        await wait_until_expired(transport, address, count=30)
        assert await transport.purge_expired(address) == 30
        assert await transport.depth(address) == 0


async def test_peek_ignores_rows_locked_by_an_inflight_receive(
    transport: PostgresTransport,
) -> None:
    address = await transport.create_queue("peek")
    await transport.send_many(address, [create_outgoing(OrderPlaced(1)),
                                        create_outgoing(OrderPlaced(2))])
    assert await transport.peek(address) == 2

    async with transport.pool.acquire() as connection, connection.transaction():
        held = await receiving.receive(connection, address)  # row stays locked until commit
        assert held is not None
        assert await transport.peek(address) == 1
    assert await transport.peek(address) == 1


async def test_peek_of_empty_queue_is_zero_and_missing_queue_is_clear(
    transport: PostgresTransport,
) -> None:
    await transport.create_queue("empty")
    assert await transport.peek("empty") == 0
    with pytest.raises(QueueNotFoundError, match="nowhere"):
        await transport.peek("nowhere")
    with pytest.raises(QueueNotFoundError):
        await transport.send("nowhere", create_outgoing(OrderPlaced(1)))


async def test_sql_looking_queue_name_and_reply_address_are_used_safely(
    transport: PostgresTransport,
) -> None:
    nasty = 'orders"; DROP TABLE victims; --'
    reply_to = "x'); DELETE FROM victims; --"
    await transport.pool.execute("CREATE TABLE victims (id int)")
    await transport.pool.execute("INSERT INTO victims VALUES (1)")
    address = QueueAddress(nasty)
    await transport.create_queue(address)
    await transport.send(address, create_outgoing(OrderPlaced(1), reply_to=reply_to))

    assert [q.address for q in await transport.list_queues()] == [address]
    received = await transport.receive(address)

    assert isinstance(received, TransportMessage)
    assert received.headers[Headers.REPLY_TO_ADDRESS] == reply_to
    assert await transport.pool.fetchval("SELECT count(*) FROM victims") == 1
    await transport.drop_queue(address)
    assert await transport.list_queues() == []


async def test_unicode_and_one_mib_headers_and_bodies_round_trip(
    transport: PostgresTransport,
) -> None:
    address = await transport.create_queue("große-😀")
    big_text = ("Grüße 😀 中文 \u2028 " * 60_000)[: 1 << 20]
    body = bytes(range(256)) * 4096  # 1 MiB, every byte value
    headers = {"x-big": big_text, "x-ключ": "значение", Headers.MESSAGE_ID: str(uuid.uuid4())}
    outgoing = create_outgoing(OrderPlaced(1), headers=headers)
    outgoing = msgspec.structs.replace(outgoing, body=body)
    await transport.send(address, outgoing)

    received = await transport.receive(address)

    assert isinstance(received, TransportMessage)
    assert received.body == body
    assert received.headers["x-big"] == big_text
    assert received.headers["x-ключ"] == "значение"


async def test_concurrent_creation_of_one_queue_by_eight_connections(
    transport: PostgresTransport, database_dsn: str
) -> None:
    connections = [await asyncpg.connect(database_dsn) for _ in range(8)]
    try:
        from endpoint_runtime.transport import queues

        address = QueueAddress("contended", "fresh_schema")
        await asyncio.gather(
            *(queues.create_queue(c, address, body_string_column=True) for c in connections)
        )
    finally:
        await asyncio.gather(*(c.close() for c in connections))
    assert [q.address for q in await transport.list_queues("fresh_schema")] == [address]
    await transport.send(address, create_outgoing(OrderPlaced(3)))
    assert await transport.pool.fetchval(
        f"SELECT body_string FROM {address.qualified}"
    ) == '{"order_id":3,"note":""}'


async def test_headers_that_do_not_parse_are_a_poison_message_with_the_raw_row(
    transport: PostgresTransport,
) -> None:
    address = await transport.create_queue("poison")
    row_id = uuid.uuid4()
    await transport.pool.execute(
        f"INSERT INTO {address.qualified} (id, headers, body) VALUES ($1, $2, $3)",
        row_id, "{not json", b"\x00raw",
    )

    received = await transport.receive(address)

    assert isinstance(received, PoisonMessage)
    assert received.native_id == row_id
    assert received.raw_headers == "{not json"
    assert received.body == b"\x00raw"
    assert "metadata corruption" in received.reason


async def test_row_written_like_nservicebus_is_received(transport: PostgresTransport) -> None:
    """A row as NServiceBus's PostgreSQL transport writes it (its columns, its headers)."""
    address = await transport.create_queue("interop")
    headers = msgspec.json.encode({
        "NServiceBus.MessageId": "0190b3a4-1f2e-7c3d-9a8b-1234567890ab",
        "NServiceBus.EnclosedMessageTypes":
            "Sales.OrderPlaced, Sales, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null",
        "NServiceBus.TimeSent": "2026-11-22 10:15:30:123456 Z",
        "NServiceBus.ContentType": "application/json",
    }).decode()
    await transport.pool.execute(
        f"INSERT INTO {address.qualified} (id, expires, headers, body) VALUES ($1, NULL, $2, $3)",
        uuid.UUID("0190b3a4-1f2e-7c3d-9a8b-1234567890ab"), headers, b'{"order_id":5}',
    )

    received = await transport.receive(address)

    assert isinstance(received, TransportMessage)
    assert received.message_id == "0190b3a4-1f2e-7c3d-9a8b-1234567890ab"
    assert received.body == b'{"order_id":5}'


async def test_batch_receive_takes_lowest_seqs_and_reinsert_restores_them(
    transport: PostgresTransport,
) -> None:
    address = await transport.create_queue("batch")
    sent = [create_outgoing(OrderPlaced(i)) for i in range(10)]
    await transport.send_many(address, sent)

    async with transport.pool.acquire() as connection, connection.transaction():
        batch = await receiving.receive_batch(connection, address, 4)
        assert [m.message_id for m in batch] == [m.message_id for m in sent[:4]]
        await receiving.reinsert(connection, address, batch[1:2])

    first = await transport.receive(address)
    assert first is not None
    assert first.message_id == sent[1].message_id


async def test_send_many_sends_into_the_callers_transaction(transport: PostgresTransport) -> None:
    address = await transport.create_queue("atomic")
    async with transport.pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        await sending.send_many(connection, address,
                                [create_outgoing(OrderPlaced(i)) for i in range(3)])
        await transaction.rollback()
    assert await transport.depth(address) == 0
