"""TransactionMode.RECEIVE_ONLY: the receive transaction stays open during the handler;
sends leave at once on other connections, so they stay sent if the handler then fails.

The audit copy is the exception: it is written with the COMMIT of the receive (in the same
simple query), so an attempt that rolls back (its COMMIT failed, a handler left the
transaction aborted) is never audited, and one that commits always is.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from endpoint_runtime.chain.pipeline import Pipeline
from endpoint_runtime.delayed.store import DelayedMessageStore
from endpoint_runtime.transactions.base import BufferedDispatcher, ImmediateDispatcher
from endpoint_runtime.transactions.single import SingleMessageStrategy
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.messages import Headers, OutgoingMessage


class AuditWithReceiveDispatcher(BufferedDispatcher):
    """One round's outgoing messages in receive-only mode: sends leave at once, as the mode
    promises; the audit copy (a message to the audit queue that carries the processing
    headers) waits for the COMMIT of the receive."""

    def __init__(
        self, pool: asyncpg.Pool, store: DelayedMessageStore | None, audit_address: QueueAddress,
    ) -> None:
        super().__init__(pool, store)
        self._audit_address = audit_address

    async def dispatch(
        self, address: QueueAddress, message: OutgoingMessage, *, immediate: bool,
        due: datetime | None = None,
    ) -> None:
        if (address == self._audit_address and due is None
                and Headers.PROCESSING_ENDED in message.headers):
            self.pending.append((address, message))
        else:
            await super().dispatch(address, message, immediate=True, due=due)


class ReceiveOnlyStrategy(SingleMessageStrategy):
    """One message per receive transaction, sends at once, the audit copy with the COMMIT."""

    def __init__(self, pipeline: Pipeline, pool: asyncpg.Pool) -> None:
        super().__init__(pipeline, pool, sends_atomic=False)

    def round_dispatcher(self) -> BufferedDispatcher | ImmediateDispatcher:
        audit = self.pipeline.audit_address
        if audit is None:
            return self.immediate
        return AuditWithReceiveDispatcher(self.pool, self.pipeline.delayed_store, audit)


def receive_only_strategy(pipeline: Pipeline, pool: asyncpg.Pool) -> SingleMessageStrategy:
    return ReceiveOnlyStrategy(pipeline, pool)
