"""Receive-only transport transactions with the outbox: exactly-once effect on business data.

Per message, on the receive connection (A) and a business connection (B):

1. A: BEGIN; DELETE the lowest unlocked seq (receive); look up the message id in the outbox.
2. Absent: B: BEGIN (isolation setting); [pessimistic: insert a placeholder record, so a
   concurrent duplicate blocks]; run the handlers with ``context.connection`` = B, collecting
   every outgoing operation; store the record with its operations; COMMIT B. An optimistic
   duplicate that loses on the primary key rolls back its business work here.
3. A: lock the record (FOR UPDATE); unless already dispatched, insert its operations into their
   queues (delayed ones into the store) and mark it dispatched; COMMIT A.

Because the queues live in the same database, step 3 dispatches each record exactly once; if
the process dies between 2 and 3, the redelivered message finds its record and only step 3 runs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections import defaultdict

import asyncpg
import structlog

from endpoint_runtime.context import HandlerContext, OpenTransactionConnection, parse_address
from endpoint_runtime.messages import (
    OutgoingMessage,
    TransportMessage,
    encode_headers,
)
from endpoint_runtime.outbox import (
    OutboxStorage,
    TransportOperation,
    decode_operations,
    delayed_operation_of,
    encode_operations,
    operation_of,
)
from endpoint_runtime.pipeline import Pipeline
from endpoint_runtime.settings import OutboxSettings
from endpoint_runtime.transactions.base import BufferedDispatcher, Round, as_delayed
from endpoint_runtime.transactions.single import end_carried_transaction, receive_in_transaction
from endpoint_runtime.transport import sending
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.sending import row_id

log = structlog.get_logger("endpoint_runtime.outbox")


class OutboxStrategy:
    def __init__(
        self, pipeline: Pipeline, pool: asyncpg.Pool, storage: OutboxStorage,
        settings: OutboxSettings,
    ) -> None:
        self._pipeline = pipeline
        self._pool = pool
        self._storage = storage
        self._settings = settings
        self.handler_runs = 0
        self.duplicates = 0
        # One business connection per receive connection, kept for the receive slot's life:
        # returning a connection to the pool costs a reset round trip per message.
        self._business: dict[int, asyncpg.Connection] = {}

    async def slot_ended(self, connection: asyncpg.Connection) -> None:
        await end_carried_transaction(connection)
        business = self._business.pop(id(connection), None)
        if business is not None:
            await self._pool.release(business)

    async def _business_connection(self, connection: asyncpg.Connection) -> asyncpg.Connection:
        business = self._business.get(id(connection))
        if business is not None and business.is_closed():
            await self._pool.release(business)
            business = None
        if business is None:
            business = self._business[id(connection)] = await self._pool.acquire()
            # The receive transaction (dispatch + mark) may commit without waiting for its WAL
            # flush: if a crash loses it, it is lost whole, the message comes back, finds its
            # record undispatched and is dispatched then. The business transaction, on the
            # other connection, stays synchronous. Reset when the slot returns the connection.
            await connection.execute("SET synchronous_commit = off")
        return business

    async def receive_round(self, connection: asyncpg.Connection) -> Round:
        return await receive_in_transaction(self._pipeline, connection, self._handle)

    async def _handle(self, connection: asyncpg.Connection, message: TransportMessage) -> str:
        """Business transaction (unless the id is recorded), then dispatch in the receive's."""
        business = await self._business_connection(connection)
        operations = await self._run_handlers(message, business)
        if operations is not None and self._dispatch_in_one_statement(operations):
            await self._dispatch_fresh(connection, message.message_id, operations)
        else:
            await self._dispatch(connection, message.message_id)
        return ""

    async def _run_handlers(
        self, message: TransportMessage, business: asyncpg.Connection
    ) -> list[TransportOperation] | None:
        """The business transaction: handlers and the outbox record commit together.

        Returns the operations the handlers produced, or ``None`` when the message id was
        already recorded (a duplicate: the handlers did not run, or their work rolled back).
        """
        message_id = message.message_id
        pessimistic = self._settings.pessimistic
        try:
            status = await business.execute(self._storage.begin(
                message_id, pessimistic=pessimistic, isolation=self._settings.isolation
            ))
            if status in ("SELECT 1", "INSERT 0 0"):  # recorded by an earlier delivery
                await business.execute("ROLLBACK")
                self.duplicates += 1
                log.info("outbox_duplicate", concurrency="pessimistic" if pessimistic
                         else "optimistic")
                return None
            collected = BufferedDispatcher(self._pool, self._pipeline.delayed_store)
            context = HandlerContext(
                message=message, endpoint=self._pipeline.endpoint,
                local_address=self._pipeline.local_address, dispatcher=collected,
                connection=OpenTransactionConnection(business),
            )
            self.handler_runs += 1
            await self._pipeline.handle(message, context)
            operations = [operation_of(a, m) for a, m in collected.pending]
            operations += [delayed_operation_of(d) for d in collected.pending_delayed]
            record = self._storage.record_and_commit(
                message_id, encode_operations(operations), pessimistic=pessimistic
            )
            try:
                await business.execute(record)
            except asyncpg.UniqueViolationError:
                # An optimistic duplicate lost the race: its business work rolls back.
                await business.execute("ROLLBACK")
                self.duplicates += 1
                log.info("outbox_duplicate", concurrency="optimistic")
                return None
            return operations
        except BaseException:
            if not business.is_closed() and business.is_in_transaction():
                with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError):
                    await business.execute("ROLLBACK")
            raise

    @staticmethod
    def _dispatch_in_one_statement(operations: list[TransportOperation]) -> bool:
        return (bool(operations) and all(o.due is None for o in operations)
                and len({o.destination for o in operations}) == 1)

    async def _dispatch_fresh(
        self, connection: asyncpg.Connection, message_id: str,
        operations: list[TransportOperation],
    ) -> None:
        """Mark and dispatch in one round trip, from the operations this delivery produced."""
        destination = parse_address(operations[0].destination,
                                    self._pipeline.local_address.schema)
        await connection.execute(
            self._storage.dispatch_and_mark(destination),
            message_id,
            [row_id(o.message_id) for o in operations],
            [o.time_to_be_received for o in operations],
            [encode_headers(o.headers) for o in operations],
            [o.body for o in operations],
        )

    async def _dispatch(self, connection: asyncpg.Connection, message_id: str) -> None:
        """Dispatch a stored record's operations and mark it dispatched, once."""
        row = await connection.fetchrow(self._storage.sql["take_for_dispatch"], message_id)
        if row is None:
            return  # dispatched already (by an earlier delivery or a competing duplicate)
        by_queue: dict[QueueAddress, list[OutgoingMessage]] = defaultdict(list)
        schema = self._pipeline.local_address.schema
        for operation in decode_operations(row["operations"]):
            address = parse_address(operation.destination, schema)
            outgoing = OutgoingMessage(
                message_id=operation.message_id, headers=operation.headers,
                body=operation.body, time_to_be_received=operation.time_to_be_received,
            )
            if operation.due is None:
                by_queue[address].append(outgoing)
                continue
            store = self._pipeline.delayed_store
            assert store is not None, "delayed operations need a delayed-message store"
            due = dt.datetime.fromisoformat(operation.due)
            await store.store(connection, as_delayed(address, outgoing, due))
        for address, messages in by_queue.items():
            await sending.send_many(connection, address, messages)

