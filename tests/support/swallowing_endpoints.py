"""Endpoints whose handler catches a database error without a savepoint (importable by path).

``try: INSERT ... except UniqueViolationError: pass`` leaves the transaction aborted:
PostgreSQL then answers the COMMIT with ROLLBACK, not with an error. The handler also sends one
message, so that the tests can count how often its sends leave.
"""

from __future__ import annotations

import asyncpg
import msgspec

from endpoint_runtime import Endpoint, HandlerContext, TransactionMode
from endpoint_runtime.settings import OutboxSettings


class Claim(msgspec.Struct):
    key: int


class Claimed(msgspec.Struct):
    key: int


def make(name: str, mode: TransactionMode, **options: object) -> Endpoint:
    endpoint = Endpoint(name, transaction_mode=mode, immediate_retries=2, delayed_retries=0,
                        **options)  # type: ignore[arg-type]

    @endpoint.handler
    async def claim(message: Claim, context: HandlerContext) -> None:
        try:  # noqa: SIM105 - written as users write it
            await context.connection.execute("INSERT INTO claims (key) VALUES ($1)", message.key)
        except asyncpg.UniqueViolationError:
            pass  # "already claimed": the pattern that needs a savepoint
        await context.send(Claimed(message.key), destination="claimed")

    return endpoint


atomic = make("claims_atomic", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE)
receive_only = make("claims_receive_only", TransactionMode.RECEIVE_ONLY)
batched = make("claims_batched", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, batch_size=4)
with_outbox = make("claims_outbox", TransactionMode.RECEIVE_ONLY, outbox=OutboxSettings())
