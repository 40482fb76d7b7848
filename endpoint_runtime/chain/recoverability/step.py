"""The chain's recoverability step: screening before the message goes on, counting after.

Before the steps below it run, a poison row (headers that do not parse) moves to the error
queue as it is, and a message whose failures recoverability has decided on (retries used up, a
delayed retry due, a discard, a receiver-death verdict) is moved instead of handled:
``CONSUMED``. Any exception a step below raises is a failed attempt, counted with the retry
limits of the handler that raised: ``FAILED`` (a lost connection is the transport's failure and
is raised instead). A failure of the commit itself is charged through the unit's
after-rollback hook. Where the mode cannot retry (``Unit.retries`` false), a failed message
goes to the error queue at once. The policy's decisions are values
(:mod:`endpoint_runtime.chain.recoverability.policy`), applied here only.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

import asyncpg
import structlog
from asyncpg.pool import PoolConnectionProxy

from endpoint_runtime.chain.metrics import UNKNOWN_TYPE, Metrics
from endpoint_runtime.chain.outgoing import delayed_message, due_in
from endpoint_runtime.chain.pipeline import IncomingContext, Next, Outcome, ProcessingStats, Unit
from endpoint_runtime.chain.recoverability.error_queue import move_failed, move_poison
from endpoint_runtime.chain.recoverability.policy import (
    Action,
    Decision,
    FailedMessages,
    Failure,
    RecoverabilityPolicy,
    RetryLimits,
    delayed_retry_headers,
)
from endpoint_runtime.chain.steps import TypeTags
from endpoint_runtime.chain.subscriptions import SubscriptionStore
from endpoint_runtime.delayed.store import DelayedMessageStore
from endpoint_runtime.errors import (
    ConnectionLostError,
    HandlerCancelledError,
    QueueNotFoundError,
    RecoverabilityFailedError,
    TransactionAbortedError,
)
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import found_lost, is_lost
from endpoint_runtime.transport.sending import Executor
from endpoint_runtime.wire.messages import PoisonMessage, RetryHeaders, TransportMessage

log = structlog.get_logger("endpoint_runtime.chain.pipeline")

CONNECTION_LOSS = (
    asyncpg.PostgresConnectionError,  # SQLSTATE class 08: the connection does not exist...
    asyncpg.OperatorInterventionError,  # 57: terminated by an administrator, shutdown
    ConnectionError,
)
"""Errors of the handlers' connection, not of the message: raised to the receive loop."""


class RecoverabilityStep:
    """Screening, failure counting and recoverability's moves (see the module docstring)."""

    name = "recoverability"

    def __init__(
        self, *, endpoint: str, local_address: QueueAddress, error_address: QueueAddress,
        policy: RecoverabilityPolicy, failures: FailedMessages, stats: ProcessingStats,
        metrics: Metrics, tags: TypeTags, delayed_store: DelayedMessageStore | None,
        subscriptions: SubscriptionStore | None,
    ) -> None:
        self.endpoint = endpoint
        self.local_address = local_address
        self.error_address = error_address
        self.policy = policy
        self.failures = failures
        self.stats = stats
        self.metrics = metrics
        self.tags = tags
        self.delayed_store = delayed_store
        self.subscriptions = subscriptions

    async def __call__(self, context: IncomingContext, next: Next) -> None:
        message, unit = context.message, context.unit
        if isinstance(message, PoisonMessage):
            await self.move_poison_to_error_queue(unit.executor, message)
            self._count_when_done(unit, self._moved, UNKNOWN_TYPE)
            unit.moved_to_error = True
            context.recoverability_action = Action.ERROR_QUEUE
            context.outcome = Outcome.CONSUMED
            return
        decision = self.pending_decision(message)
        if decision is not None:
            failure = self.failures.get(message.native_id)
            unit.moved_to_error = await self.apply_decision(unit.executor, message, decision)
            self._count_decision(unit, message, decision.action, unit.moved_to_error)
            context.recoverability_action = (Action.ERROR_QUEUE if unit.moved_to_error
                                             else decision.action)
            context.outcome = Outcome.CONSUMED
            # A move that rolls back is decided again when the message comes back.
            unit.after_rollback(lambda _: self.failures.restore(message.native_id, failure))
            return
        try:
            await next(context)
        except Exception as exc:
            if (isinstance(exc, RecoverabilityFailedError)
                    or await self._transport_failed(context, exc)):
                raise
            context.outcome = Outcome.FAILED
            if unit.tentative:  # counted by the strategy if the failure proves the message's
                context.failure = exc
                unit.keep_failure(exc, functools.partial(self.failed, message, exc,
                                                         context.limits, context))
                return
            self.failed(message, exc, context.limits, context, last=not unit.retries)
            if not unit.retries:  # the message is gone from the queue: nothing can retry it
                unit.moved_to_error = await self.give_up(unit.executor, message)
                self._count_decision(unit, message, Action.ERROR_QUEUE, unit.moved_to_error)
                context.recoverability_action = (Action.ERROR_QUEUE if unit.moved_to_error
                                                 else Action.DISCARD)
            return
        except asyncio.CancelledError:
            if not unit.retries and unit.spare is not None:
                # A stop cut the handlers short and the row is gone: keep a copy, then stop.
                # On the spare executor: the handlers may have left theirs mid-query.
                self.failed(message, HandlerCancelledError(), last=True)
                unit.moved_to_error = await asyncio.shield(self.give_up(unit.spare, message))
                self._count_decision(unit, message, Action.ERROR_QUEUE, unit.moved_to_error)
            raise
        self._settle_later(unit, message)

    def _count_decision(self, unit: Unit, message: TransportMessage, action: Action,
                        moved: bool) -> None:
        """Count what :meth:`apply_decision` did: a move (``moved``), a delayed retry, or
        else a discard."""
        if moved:
            self._count_when_done(unit, self._moved, self.tags.of(message))
        elif action is Action.DELAYED_RETRY and self.delayed_store is not None:
            self._count_when_done(unit, self._delayed_retry, self.tags.of(message))
        else:
            self._count_when_done(unit, self._discarded, "")

    @staticmethod
    def _count_when_done(unit: Unit, count: Callable[[str], None], tag: str) -> None:
        """Count a move once the work that carries it commits (a move that rolls back is made
        again at the next delivery, and counted then); without retries (``NONE``) the move
        committed on its own already."""
        if unit.retries:
            unit.after_commit(functools.partial(count, tag))
        else:
            count(tag)

    def _moved(self, tag: str) -> None:
        self.stats.moved_to_error += 1
        self.metrics.moved_to_error(tag)

    def _delayed_retry(self, tag: str) -> None:
        self.stats.delayed_retries += 1
        self.metrics.delayed_retry(tag)

    def _discarded(self, _tag: str) -> None:
        self.stats.discarded += 1

    def _settle_later(self, unit: Unit, message: TransportMessage) -> None:
        """After commit: the failure count goes. After a rollback the strategy charges to
        the message (its commit failed): a failed attempt."""
        if self.failures and self.failures.get(message.native_id) is not None:
            unit.after_commit(functools.partial(self.failures.forget, message.native_id))
        unit.after_rollback(functools.partial(self._charge, message))

    def _charge(self, message: TransportMessage, charged: BaseException | None) -> None:
        if charged is not None:
            self.failed(message, charged)

    @staticmethod
    async def _transport_failed(context: IncomingContext, exc: BaseException) -> bool:
        """Whether ``exc`` is the transport's failure, raised to the receive loop, rather than
        the message's, charged to it."""
        if isinstance(exc, CONNECTION_LOSS):
            return True
        connection = context.connection
        if connection is not None and is_lost(connection):  # type: ignore[arg-type]
            return True
        # The receive connection: the outbox dispatches there after the handlers.
        executor = context.unit.executor
        receive = executor if executor is not connection and isinstance(
            executor, asyncpg.Connection | PoolConnectionProxy) else None
        if receive is not None and is_lost(receive):
            return True
        if not context.unit.retries:
            # NONE: the message left its queue and nothing brings it back; charged, its copy
            # goes to the error queue rather than nowhere.
            return False
        if isinstance(exc, ConnectionLostError):
            return True
        # A client-state error may be a connection's loss that asyncpg has not seen yet: it is
        # the transport's when the handlers' or the receive connection is found lost right
        # after (connection.found_lost); a handler's own misuse of its connection is charged.
        return isinstance(exc, asyncpg.InternalClientError) and await found_lost(
            connection, receive)  # type: ignore[arg-type]

    def failed(self, message: TransportMessage, exc: BaseException,
               limits: RetryLimits | None = None,
               context: IncomingContext | None = None, *, last: bool = False) -> Failure:
        """Count a failed attempt (``limits``: those of the handler that raised). A database
        error "current transaction is aborted" is charged as :class:`TransactionAbortedError`:
        a handler caught an error without a savepoint. ``context`` (the attempt's) learns the
        exception and the next step. The stack trace is formatted only for an attempt that
        may be the message's last (``last``: it cannot be retried; or its next step is not an
        immediate retry, which decides the same again at the next delivery)."""
        exc = charged_exception(exc)
        if isinstance(exc, QueueNotFoundError) and self.subscriptions is not None:
            self.subscriptions.forget()  # a subscriber queue may be gone: read them again
        failure = self.failures.record(
            message.native_id, exc, unrecoverable=self.policy.is_unrecoverable(exc),
            limits=limits or RetryLimits(), with_trace=False,
        )
        self.stats.failed += 1
        self.stats.consecutive_failures += 1
        next_step = self.policy.decide(failure, message.headers).action
        if last or next_step is not Action.IMMEDIATE_RETRY:
            self.failures.keep_trace(message.native_id, exc)
        if context is not None:
            context.failure, context.recoverability_action = exc, next_step
        self.metrics.failed(self.tags.of(message),
                            immediate_retry=next_step is Action.IMMEDIATE_RETRY)
        log.warning(
            "message_failed",
            error=failure.summary(),  # one line; the traceback once, with the last attempt
            attempts=failure.attempts,
            next_step=next_step.value,
            exc_info=exc if next_step is Action.ERROR_QUEUE else None,
        )
        return failure

    def pending_decision(self, message: TransportMessage) -> Decision | None:
        """What this delivery must do instead of handling, or ``None`` to handle it."""
        if not self.failures:
            return None
        failure = self.failures.get(message.native_id)
        if failure is None:
            return None
        decision = self.policy.decide(failure, message.headers)
        return None if decision.action is Action.IMMEDIATE_RETRY else decision

    async def apply_decision(
        self, executor: Executor, message: TransportMessage, decision: Decision
    ) -> bool:
        """Carry out a delayed retry, an error-queue move or a discard (the message is
        consumed by the caller's commit); whether it went to the error queue."""
        failure = self.failures.get(message.native_id)
        assert failure is not None, "a decision needs a recorded failure"
        moved = False
        try:
            if decision.action is Action.DISCARD:
                log.warning("message_discarded", reason=failure.discard_reason)
            elif decision.action is Action.DELAYED_RETRY and self.delayed_store is not None:
                await self._store_delayed_retry(executor, message, decision.delay)
            else:
                await self.move_to_error_queue(executor, message, failure)
                moved = True
        except Exception as exc:
            raise RecoverabilityFailedError(message.native_id) from exc
        self.failures.forget(message.native_id)
        return moved

    async def give_up(self, executor: Executor, message: TransportMessage) -> bool:
        """At most once (``TransactionMode.NONE``): a failed message cannot be retried, so a
        copy goes to the error queue, unless the handler discarded it (``False``)."""
        decision = self.pending_decision(message)
        if decision is None or decision.action is not Action.DISCARD:
            decision = Decision(Action.ERROR_QUEUE)
        return await self.apply_decision(executor, message, decision)

    async def move_to_error_queue(
        self, executor: Executor, message: TransportMessage, failure: Failure
    ) -> None:
        await move_failed(executor, self.error_address, message, failure,
                                      str(self.local_address), self.endpoint)
        self.failures.forget(message.native_id)
        log.error("moved_to_error_queue", error_queue=str(self.error_address),
                  reason=failure.exception_type, attempts=failure.attempts)

    async def _store_delayed_retry(
        self, executor: Executor, message: TransportMessage, delay: float
    ) -> None:
        assert self.delayed_store is not None
        headers = delayed_retry_headers(message)
        delayed = delayed_message(self.local_address, headers, message.body, due_in(delay),
                                  native_id=message.native_id)
        if isinstance(executor, asyncpg.Pool):
            async with executor.acquire() as connection:
                await self.delayed_store.store(connection, delayed)
        else:
            await self.delayed_store.store(executor, delayed)
        # Info: the attempt's own warning (message_failed, next_step=delayed_retry) said it.
        log.info("delayed_retry_scheduled", delay_s=round(delay, 3),
                 retry=headers[RetryHeaders.RETRIES])

    async def move_poison_to_error_queue(self, executor: Executor, message: PoisonMessage) -> None:
        """Headers that do not parse: the raw row goes to the error queue as it is."""
        try:
            await move_poison(executor, self.error_address, message)
        except Exception as exc:
            raise RecoverabilityFailedError(message.native_id) from exc
        log.error("probable message metadata corruption", native_id=str(message.native_id),
                  reason=message.reason, error_queue=str(self.error_address))


def charged_exception(exc: BaseException) -> BaseException:
    """The exception a failed attempt is charged with: "current transaction is aborted" from
    any statement after a handler caught a database error says too little, so it becomes a
    :class:`TransactionAbortedError` that says what to do."""
    if isinstance(exc, asyncpg.InFailedSQLTransactionError):
        aborted = TransactionAbortedError()
        aborted.__cause__ = exc
        return aborted
    return exc
