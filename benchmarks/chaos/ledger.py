"""The ledger: what was sent (by the sender, in the send's transaction) and its tables.

``chaos_sent`` has one row per message id the run put into a queue, written in the same
transaction as the queue rows themselves: a send whose COMMIT is lost to a terminated backend
or a restarting server either happened with its ledger rows or did not happen at all, so the
sender looks the batch up after reconnecting and sends it again only when it is not there.
``chaos_effects`` (written by the handlers, :mod:`benchmarks.chaos.endpoints`) has one row per
committed handler execution; ``chaos_observed`` what handlers noted on a connection of their
own (:mod:`benchmarks.chaos.observer`); ``chaos_expired`` the rows deleted already expired and
``chaos_received`` (``none`` mode) every committed receive, both written by triggers on the
queue table in the deleting transaction (:func:`watch_queue`). The statements are in
``ledger.sql``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import msgspec

from benchmarks.chaos.endpoints import ChaosWork
from benchmarks.chaos.observer import OBSERVER_APPLICATION
from benchmarks.chaos.schedule import Fate, PoisonKind
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.transport import QueueAddress, sending
from endpoint_runtime.transport.addresses import quote_identifier
from endpoint_runtime.transport.connection import QUERY_ERRORS
from endpoint_runtime.transport.sql import parse_blocks
from endpoint_runtime.wire.messages import Headers, OutgoingMessage, encode_headers

DRIVER_APPLICATION = "chaos-driver"
"""``application_name`` of the run's own connections: the backend terminations spare them."""
RUN_APPLICATIONS = [DRIVER_APPLICATION, OBSERVER_APPLICATION]
"""The run's own connections (the driver's, the handlers' observers): never the runtime's."""
SEND_DEADLINE = 180.0
"""Seconds a batch may keep failing (database away) before the run gives up."""
TRANSIENT_ERRORS = (*QUERY_ERRORS, TimeoutError)
"""What a send meets while the server restarts or its backend is terminated: asyncpg's
``InternalClientError`` among them, when the loss catches the protocol mid-query (it once
ended a run: the driver left the gather and shut the cluster down)."""

SQL = parse_blocks((Path(__file__).parent / "ledger.sql").read_text(encoding="utf-8"))
"""The ledger's statements, by block name (``ledger.sql``)."""
SCHEMA = SQL["schema"]
UNKNOWN_TYPE = "Chaos.Messages.NoSuchType"


class Item(msgspec.Struct, frozen=True):
    """One row to send: a message, or a poison row (raw headers text, or already expired)."""

    message_id: uuid.UUID
    kind: str
    outgoing: OutgoingMessage | None = None
    raw_headers: str | None = None
    body: bytes = b""
    expired: bool = False


def work_item(message_id: uuid.UUID, n: int, fate: Fate) -> Item:
    return Item(message_id, fate.value, create_outgoing(
        ChaosWork(n=n, fate=fate.value), message_id=str(message_id),
        originating_endpoint=DRIVER_APPLICATION))


def poison_item(message_id: uuid.UUID, kind: PoisonKind) -> Item:
    """A row of ``kind``: headers that are not JSON, a body that is not one, a type no one
    handles, or a good message whose ``expires`` passed a minute ago."""
    good = work_item(message_id, -1, Fate.OK).outgoing
    assert good is not None
    if kind is PoisonKind.CORRUPT_HEADERS:
        return Item(message_id, kind.value, raw_headers='{"NServiceBus.MessageId": ', body=b"{}")
    if kind is PoisonKind.UNDECODABLE_BODY:
        return Item(message_id, kind.value, msgspec.structs.replace(good, body=b"\xff\xfe{"))
    if kind is PoisonKind.UNKNOWN_TYPE:
        headers = {**good.headers, Headers.ENCLOSED_MESSAGE_TYPES: UNKNOWN_TYPE}
        return Item(message_id, kind.value, msgspec.structs.replace(good, headers=headers))
    return Item(message_id, kind.value, good, expired=True)


async def connect(dsn: str) -> asyncpg.Connection:
    connection: asyncpg.Connection = await asyncpg.connect(
        dsn, server_settings={"application_name": DRIVER_APPLICATION})
    return connection


class LedgeredSender:
    """Sends batches into one queue with their ledger rows, surviving lost connections."""

    def __init__(self, dsn: str, mode: str, address: QueueAddress) -> None:
        self.dsn = dsn
        self.mode = mode
        self.address = address
        self.sent = 0
        self.resends = 0
        """Batches sent again after a failure that left no ledger rows."""
        self._connection: asyncpg.Connection | None = None

    async def send(self, items: Sequence[Item]) -> None:
        """Send ``items`` in one transaction with their ledger rows; on a lost connection or a
        refused one, wait and retry until :data:`SEND_DEADLINE`, never twice."""
        deadline = time.monotonic() + SEND_DEADLINE
        attempts = 0
        while True:
            try:
                connection = await self._connected()
                if attempts and await self._recorded(connection, items[0].message_id):
                    break
                await self._write(connection, items)
                break
            except TRANSIENT_ERRORS:
                await self._drop()
                attempts += 1
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(min(0.1 * attempts, 1.0))
        self.resends += attempts > 0
        self.sent += len(items)

    async def _write(self, connection: asyncpg.Connection, items: Sequence[Item]) -> None:
        messages = [i.outgoing for i in items
                    if i.outgoing is not None and not i.expired]
        async with connection.transaction():
            await sending.send_many(connection, self.address, messages)
            for item in items:
                if item.raw_headers is not None:
                    await sending.send_raw(connection, self.address, item.message_id,
                                           item.raw_headers, item.body)
                elif item.expired and item.outgoing is not None:
                    await connection.execute(
                        f"INSERT INTO {self.address.qualified} (id, expires, headers, body) "
                        "VALUES ($1, (statement_timestamp() AT TIME ZONE 'UTC') "
                        "- interval '1 minute', $2, $3)",
                        item.message_id, encode_headers(item.outgoing.headers),
                        item.outgoing.body)
            await connection.execute(SQL["record_sent"], [i.message_id for i in items], self.mode,
                                     [i.kind for i in items])

    async def _recorded(self, connection: asyncpg.Connection, message_id: uuid.UUID) -> bool:
        return bool(await connection.fetchval(SQL["is_recorded"], message_id))

    async def _connected(self) -> asyncpg.Connection:
        if self._connection is None or self._connection.is_closed():
            self._connection = await connect(self.dsn)
        return self._connection

    async def _drop(self) -> None:
        if self._connection is not None:
            self._connection.terminate()
            self._connection = None

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None


def sql(block: str, **names: str) -> str:
    """The statement ``block`` of ``ledger.sql`` with its ``{queue}``/``{trigger}`` names."""
    return SQL[block].format(**names)


async def watch_queue(connection: asyncpg.Connection, address: QueueAddress, *,
                      receives: bool) -> None:
    """Put the ledger's triggers on ``address``'s table: expired rows always, every
    committed receive too when ``receives`` (``none`` mode, where a receive is final)."""
    blocks = ["watch_expiry", *(["watch_receives"] if receives else [])]
    for block in blocks:
        trigger = quote_identifier(f"chaos_{block}")
        await connection.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {address.qualified}")
        await connection.execute(sql(block, queue=address.qualified, trigger=trigger))
