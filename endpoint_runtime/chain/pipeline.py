"""The chain: the path of one message as an ordered list of named steps, without Ray or SQL.

A transaction strategy (``endpoint_runtime.transactions``) enters it once per message,
``await pipeline.run(message, unit)``, where the :class:`Unit` carries what its mode provides
(NServiceBus's transport transaction): the executor of recoverability's moves, the dispatcher of
outgoing messages, the handlers' connection, and the hooks the steps leave for the end of the
transaction. Each step is ``async def __call__(context, next)`` and calls ``await
next(context)`` to go on (NServiceBus's behaviors, dramatiq's middleware). The built-in steps,
in order (``endpoint_runtime.chain.steps``, ``recoverability.step``, ``outbox.step``; which ones an
endpoint gets: ``endpoint_runtime.chain.composition``):

==================  ============================================================================
``log_context``     the per-message log context (endpoint, message id, attempt)
``tracing``         (``settings.tracing``) the OpenTelemetry span of the attempt
``recoverability``  screening (poison rows, decided failures: moved, not handled) and the
                    counting of every failure raised below it
``crash_ledger``    (receiver actors) the message's native id noted while it is in the steps
``metrics``         processing counters and metrics, counted once the work committed
``outbox``          (outbox mode) deduplication, the business transaction, the record and its
                    dispatch
(user steps)        :meth:`endpoint_runtime.runtime.endpoint.Endpoint.add_step`
``audit``           (with ``audit_queue``) the audit copy, once the handlers ran
``sagas``           (with sagas) the per-message saga session and its audit headers
``invoke_handlers`` decode the body, run every handler of its type in registration order
==================  ============================================================================

:meth:`Pipeline.run` returns an :class:`Outcome`: the strategy commits after ``HANDLED`` and
``CONSUMED`` and rolls back after ``FAILED``; then it calls :meth:`Unit.committed` or
:meth:`Unit.rolled_back`, which run the hooks the steps registered.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from endpoint_runtime.chain.context import HandlerConnection, OutgoingDispatcher
from endpoint_runtime.chain.outgoing import OutgoingHook
from endpoint_runtime.chain.recoverability.policy import RetryLimits
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.sending import Executor
from endpoint_runtime.wire.messages import PoisonMessage, TransportMessage

if TYPE_CHECKING:
    from endpoint_runtime.chain.recoverability.policy import FailedMessages
    from endpoint_runtime.delayed.store import DelayedMessageStore


class Outcome(enum.Enum):
    """How :meth:`Pipeline.run` left a message."""

    HANDLED = "handled"
    """The steps ran to their end (or a step consumed the message): commit, with the outgoing
    messages."""
    CONSUMED = "consumed"
    """Moved by recoverability (error queue, delayed retry, discard): commit."""
    FAILED = "failed"
    """An attempt failed and was counted: roll back (the row comes back)."""


class ProcessingStats:
    """Counters a receiver reports to the peeker; ``processed`` counts messages whose work
    committed."""

    def __init__(self) -> None:
        self.processed = 0
        self.failed = 0
        self.moved_to_error = 0
        self.delayed_retries = 0
        self.discarded = 0
        self.consecutive_failures = 0
        self.processing_seconds = 0.0
        self.outbox_duplicates = 0
        """Messages whose id the outbox had recorded already: acknowledged without handlers."""


class Unit:
    """What a transaction mode provides for one message, and what happens when it ends.

    ``executor`` runs recoverability's moves (the receive transaction's connection);
    ``dispatcher`` takes the outgoing messages and ``connection`` is the handlers', as the mode
    wants. ``retries``: whether a failed message comes back (not in ``TransactionMode.NONE``);
    ``spare``: where moves go when the handlers were cancelled mid-query (the pool).

    Steps leave hooks with :meth:`after_commit` and :meth:`after_rollback`; the strategy runs
    them once the message's transaction ended (:meth:`committed`, :meth:`rolled_back`). Before
    that, what the chain did is here for the strategy to count with its COMMIT: ``handled``
    (the handlers ran and every step after them returned), ``moved_to_error`` (the message, or
    a poison row, went to the error queue).

    ``tentative`` (an optimistic batch, ``transactions.optimistic_batch``): a failure is not
    counted by the chain when it is raised; it is kept in ``failure``, and the strategy
    counts it (:meth:`charge_failure`) only once it found that the message's own run fails,
    else drops the attempt (:meth:`rolled_back`).
    """

    __slots__ = ("_charge", "_on_commit", "_on_rollback", "connection", "dispatcher",
                 "executor", "failure", "handled", "moved_to_error", "retries", "spare",
                 "tentative")

    def __init__(
        self, executor: Executor, dispatcher: OutgoingDispatcher,
        connection: HandlerConnection | None, *, retries: bool = True,
        spare: Executor | None = None,
    ) -> None:
        self.executor = executor
        self.dispatcher = dispatcher
        self.connection = connection
        self.retries = retries
        self.spare = spare
        self.handled = False
        self.moved_to_error = False
        self.tentative = False
        self.failure: BaseException | None = None
        self._charge: Callable[[], object] | None = None
        self._on_commit: list[Callable[[], None]] | None = None
        self._on_rollback: list[Callable[[BaseException | None], None]] | None = None

    def after_commit(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` once the message's work committed."""
        if self._on_commit is None:
            self._on_commit = []
        self._on_commit.append(hook)

    def after_rollback(self, hook: Callable[[BaseException | None], None]) -> None:
        """Run ``hook(charged)`` once the message's work rolled back: ``charged`` is the
        failure of the commit itself, charged to the message, else ``None``."""
        if self._on_rollback is None:
            self._on_rollback = []
        self._on_rollback.append(hook)

    def keep_failure(self, failure: BaseException, charge: Callable[[], object]) -> None:
        """A tentative unit's failure, and how to count it if it proves the message's own."""
        self.failure, self._charge = failure, charge

    def charge_failure(self) -> None:
        """Count the kept failure as the message's failed attempt, then roll back."""
        charge, self._charge = self._charge, None
        if charge is not None:
            charge()
        self.rolled_back()

    def committed(self) -> None:
        hooks, self._on_commit, self._on_rollback = self._on_commit, None, None
        for hook in hooks or ():
            hook()

    def rolled_back(self, charged: BaseException | None = None) -> None:
        hooks, self._on_commit, self._on_rollback = self._on_rollback, None, None
        for hook in hooks or ():
            hook(charged)


class IncomingContext:
    """One message on its way through the steps.

    Attributes:
        message: the received message (a :class:`PoisonMessage` only until screening).
        unit: what the mode provides (:class:`Unit`).
        dispatcher, connection: what the handlers get: the unit's (a step may replace them
            for the steps after it; the outbox's unit brings a collecting dispatcher and its
            business connection).
        outgoing_hooks: called with the headers of every message the handlers send; a step
            adds one with :meth:`on_outgoing`.
        items: free room for user steps' state.
        failure, recoverability_action: what recoverability did with this delivery: the
            exception of a failed attempt, and the action taken or decided next
            (:class:`~endpoint_runtime.chain.recoverability.policy.Action` value), else ``None``.
    """

    __slots__ = ("connection", "dispatcher", "ended", "failure", "items", "limits", "message",
                 "message_type", "outcome", "outgoing_hooks", "recoverability_action",
                 "started", "unit")

    def __init__(self, message: TransportMessage | PoisonMessage, unit: Unit) -> None:
        self.message = message
        self.unit = unit
        self.dispatcher = unit.dispatcher
        self.connection = unit.connection
        self.outcome = Outcome.HANDLED
        self.limits: RetryLimits | None = None
        """The retry limits of the handler running (or that raised)."""
        self.message_type: type | None = None
        self.started: float | None = None
        """Epoch seconds when the handlers started; ``ended``: when they returned."""
        self.ended: float | None = None
        self.outgoing_hooks: list[OutgoingHook] | None = None
        self.items: dict[str, Any] = {}
        self.failure: BaseException | None = None
        self.recoverability_action: str | None = None

    @property
    def transport_message(self) -> TransportMessage:
        """The message past screening (poison rows never get there)."""
        assert isinstance(self.message, TransportMessage)
        return self.message

    @property
    def headers(self) -> dict[str, str]:
        return self.transport_message.headers

    def on_outgoing(self, hook: OutgoingHook) -> None:
        """Call ``hook(headers)`` for every message the handlers send, reply or publish,
        before it is written: add or change headers there."""
        if self.outgoing_hooks is None:
            self.outgoing_hooks = []
        self.outgoing_hooks.append(hook)

    @property
    def handlers_ran(self) -> bool:
        return self.ended is not None


Next = Callable[[IncomingContext], Awaitable[None]]


class Step(Protocol):
    """A step of the chain: does its part and calls ``await next(context)`` to go on; a step
    that does not call it consumes the message (the steps after it do not run)."""

    def __call__(self, context: IncomingContext, next: Next) -> Awaitable[None]: ...


BUILT_IN = ("log_context", "tracing", "recoverability", "crash_ledger", "metrics", "outbox",
            "audit", "sagas", "invoke_handlers")
"""The built-in steps in their order; the ones a chain does not need are left out."""
FIRST_USER_ANCHOR = "recoverability"
"""``after=`` this: the first of the user steps."""
LAST_USER_ANCHOR = "invoke_handlers"
"""``before=`` this: the last of the user steps."""


class UserStep:
    """A step a user added: its name and where it goes among the other user steps."""

    __slots__ = ("after", "before", "name", "step")

    def __init__(self, name: str, step: Step, before: str | None, after: str | None) -> None:
        self.name, self.step, self.before, self.after = name, step, before, after


def order_user_steps(added: Sequence[UserStep]) -> list[UserStep]:
    """The user steps in chain order: each where its ``before``/``after`` puts it (by the
    other user steps' names, or the anchors ``after="recoverability"`` = first,
    ``before="invoke_handlers"`` = last), else in the order they were added."""
    ordered: list[UserStep] = []
    for user in added:
        if user.before is not None and user.before != LAST_USER_ANCHOR:
            index = _index(ordered, user.before, user.name)
        elif user.after is not None and user.after != FIRST_USER_ANCHOR:
            index = _index(ordered, user.after, user.name) + 1
        elif user.after == FIRST_USER_ANCHOR:
            index = 0
        else:
            index = len(ordered)
        ordered.insert(index, user)
    return ordered


def _index(ordered: list[UserStep], anchor: str, name: str) -> int:
    for index, user in enumerate(ordered):
        if user.name == anchor:
            return index
    raise ConfigurationError(f"step {name!r}: no step {anchor!r} added before it")


def check_user_step(name: str, before: str | None, after: str | None,
                    known: Iterable[str]) -> None:
    """Fail at once on a name that is taken or a position outside the documented ones."""
    taken = set(known)
    if name in BUILT_IN or name in taken:
        raise ConfigurationError(f"a step named {name!r} exists already")
    if before is not None and after is not None:
        raise ConfigurationError(f"step {name!r}: give before= or after=, not both")
    for anchor, allowed in ((before, LAST_USER_ANCHOR), (after, FIRST_USER_ANCHOR)):
        if anchor is not None and anchor != allowed and anchor not in taken:
            raise ConfigurationError(
                f"step {name!r}: user steps run after recoverability and before the handler "
                f"invocation; place it {'before' if anchor is before else 'after'} "
                f"{allowed!r} or another user step (got {anchor!r}; steps: {sorted(taken)})")


def compose(steps: Sequence[Step]) -> Next:
    """The entry of ``steps``: each step's ``next`` is the one after it (built once)."""

    async def end(context: IncomingContext) -> None:
        return None

    entry: Next = end
    for step in reversed(steps):
        entry = _link(step, entry)
    return entry


def _link(step: Step, following: Next) -> Next:
    # A plain function returning the step's coroutine: no coroutine frame of its own.
    return lambda context: step(context, following)


class ReceivedBatch:
    """What a batched strategy tells the chain about one batch (no-op here: the ``tracing``
    step's kind, :class:`endpoint_runtime.chain.tracing.step.TracedBatch`, makes the batch's
    receive span that each message's span links to).

    Example (a strategy)::

        with pipeline.batch() as received:
            messages = await receiving.receive_batch(...)
            received.taken(len(messages))  # the receive ends here
            for message in messages:
                await pipeline.run(message, unit)  # inside the ``with``: linked to it
    """

    __slots__ = ()

    def __enter__(self) -> ReceivedBatch:
        return self

    def taken(self, count: int) -> None:
        """The receive took ``count`` messages."""

    def __exit__(self, *exc_info: object) -> None:
        return None


_UNOBSERVED = ReceivedBatch()


class Pipeline:
    """The chain of one endpoint: its steps in order, entered by :meth:`run`.

    Built by :meth:`endpoint_runtime.runtime.endpoint.Endpoint.create_pipeline`. ``stats``,
    ``failures``, ``local_address``, ``audit_address`` and ``delayed_store`` are read by the
    strategies and the receiver; nothing outside the chain calls its steps.
    """

    def __init__(
        self, *, endpoint: str, local_address: QueueAddress,
        steps: Sequence[tuple[str, Step]],
        stats: ProcessingStats, failures: FailedMessages,
        audit_address: QueueAddress | None = None,
        delayed_store: DelayedMessageStore | None = None,
        batches: Callable[[], ReceivedBatch] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._batches = batches
        self.local_address = local_address
        self.audit_address = audit_address
        self.delayed_store = delayed_store
        self.stats = stats
        self.failures = failures
        self.steps = dict(steps)
        """The steps by name, in chain order."""
        self._entry = compose(list(self.steps.values()))

    def batch(self) -> ReceivedBatch:
        """The scope of one received batch (see :class:`ReceivedBatch`)."""
        return _UNOBSERVED if self._batches is None else self._batches()

    def step(self, name: str) -> Any:
        """The step called ``name`` (for tests and status)."""
        return self.steps[name]

    async def run(self, message: TransportMessage | PoisonMessage, unit: Unit) -> Outcome:
        """Take ``message`` through every step (see the module docstring)."""
        context = IncomingContext(message, unit)
        await self.enter(context)
        return context.outcome

    def enter(self, context: IncomingContext) -> Awaitable[None]:
        """:meth:`run` for a strategy's own context: the first step's coroutine itself, no
        coroutine around it (each frame between a receive slot and a handler's round trip
        costs CPU at every suspension and resumption); ``context.outcome`` says how the
        message left the steps.

        Example (a strategy)::

            context = IncomingContext(received, unit)
            await pipeline.enter(context)
            if context.outcome is Outcome.FAILED: ...
        """
        return self._entry(context)
