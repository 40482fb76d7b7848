"""Endpoint: a logical endpoint's name (its queue), settings and handlers.

Example::

    endpoint = Endpoint("sales", max_concurrency=8)
    endpoint.route(OrderAccepted, to="billing")

    @endpoint.handler
    async def place_order(message: PlaceOrder, context: HandlerContext) -> None:
        await context.send(OrderAccepted(order_id=message.order_id))

The handlers' business tables can be the endpoint's too: ``schema_sql=`` or
``@endpoint.on_install`` (see :mod:`endpoint_runtime.database.business_schema`).

Handlers must live in an importable module: receiver actors import the endpoint by its path
(``package.module:endpoint``), never by pickling closures.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar, Unpack, overload

import asyncpg
import msgspec
import structlog

from endpoint_runtime.chain.composition import build_pipeline
from endpoint_runtime.chain.handlers import Handler, HandlerRegistry
from endpoint_runtime.chain.metrics import Metrics
from endpoint_runtime.chain.pipeline import Pipeline, Step, UserStep, check_user_step
from endpoint_runtime.chain.recoverability.policy import (
    CustomPolicy,
    RecoverabilityPolicy,
    RetryLimits,
)
from endpoint_runtime.chain.routing import RouteTable
from endpoint_runtime.chain.sagas import Saga, Sagas
from endpoint_runtime.chain.steps import InFlight
from endpoint_runtime.chain.subscriptions import (
    SubscriptionStore,
    prune_subscriptions,
    subscribe_to_handled_types,
    topics_of,
)
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.business_schema import BusinessSchema, InstallHook
from endpoint_runtime.delayed import DelayedMessageStore, PostgresDelayedMessageStore
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.modes import rules_of
from endpoint_runtime.runtime.sender import Sender
from endpoint_runtime.settings import (
    TRANSACTION_FIELDS,
    EndpointOptions,
    EndpointSettings,
    OutboxSettings,
    Transaction,
    TransportSettings,
    check_names,
    load_settings,
    transaction_fields,
    transaction_of,
)
from endpoint_runtime.settings import replace as replace_settings
from endpoint_runtime.transactions.assembly import strategy_for
from endpoint_runtime.transactions.base import ReceiveStrategy
from endpoint_runtime.transport.addresses import (
    ENDPOINT_NAME_SUFFIXES,
    TABLE_NAME_SUFFIXES,
    QueueAddress,
)
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.wire.message_kinds import check_subscribable, commands, subscribable

log = structlog.get_logger("endpoint_runtime.runtime.endpoint")

H = TypeVar("H", bound=Handler)
S = TypeVar("S", bound=type[Saga[Any]])


class Endpoint:
    """A logical endpoint: a handler registry, its settings, and a :class:`Sender` for use
    outside handlers (``await endpoint.send``, ``publish``, ``send_local``).

    Args:
        name: endpoint name, also the name of its input queue.
        settings: full settings; keyword overrides below win over it.
        transaction_mode, max_concurrency, ...: any :class:`EndpointSettings` field.
        send_only: the endpoint never receives (it can still send, but not defer).
        unrecoverable_exceptions: exception types that go straight to the error queue.
        delayed_store: where delayed messages wait (default: the built-in PostgreSQL store,
            table ``"<endpoint>.delayed"``); any :class:`DelayedMessageStore`.
        schema_sql: idempotent DDL of the handlers' business tables (``CREATE TABLE IF NOT
            EXISTS ...``), run by ``endpoint-runtime db install`` and at each start with
            installers; without installers the tables it creates are checked at start.
            More with :meth:`on_install`.
    """

    def __init__(
        self,
        name: str,
        *,
        settings: EndpointSettings | None = None,
        send_only: bool = False,
        unrecoverable_exceptions: tuple[type[BaseException], ...] = (),
        delayed_store: DelayedMessageStore | None = None,
        schema_sql: str | None = None,
        transaction: Transaction | None = None,
        **overrides: Unpack[EndpointOptions],
    ) -> None:
        if transaction is not None:
            both = sorted(set(TRANSACTION_FIELDS) & set(overrides))
            if both:
                raise ConfigurationError(
                    f"give the transaction shape once: transaction={transaction!r} stands for "
                    f"{', '.join(TRANSACTION_FIELDS)}; do not also pass {', '.join(both)}")
            overrides.update(transaction_fields(transaction))  # type: ignore[typeddict-item]
        transport_in_code = _transport_fields_in_code(settings, dict(overrides))
        if settings is None:
            settings = load_settings(EndpointSettings, **overrides)
        elif overrides:
            settings = replace_settings(settings, **overrides)
        self.settings = settings
        self.transport_in_code = transport_in_code
        """The transport fields this endpoint's code set (``endpoint-runtime run`` keeps them);
        the others came from the environment of the moment its module was imported."""
        self.name = name
        self.address = QueueAddress.parse(name, settings.transport.schema)
        self.address.check_room_for_suffixes(
            TABLE_NAME_SUFFIXES + ENDPOINT_NAME_SUFFIXES, "endpoint"
        )
        self.send_only = send_only
        self.delayed_store: DelayedMessageStore | None = None
        if not send_only:
            self.delayed_store = delayed_store or PostgresDelayedMessageStore.for_endpoint(
                self.address
            )
        self.unrecoverable_exceptions = tuple(unrecoverable_exceptions)
        self.custom_policy: CustomPolicy | None = None
        """The policy :meth:`recoverability_policy` set, if any."""
        self.registry = HandlerRegistry()
        self.sagas = Sagas(self.address, self.registry)
        """The endpoint's sagas (:meth:`saga`; ``sagas.on_not_found``)."""
        self.business_schema = BusinessSchema(name, schema_sql)
        """The handlers' business tables (:mod:`endpoint_runtime.database.business_schema`)."""
        self.critical_error_handlers: list[Callable[[str, BaseException], None]] = []
        self.throttling_started_handlers: list[Callable[[], None]] = []
        self.throttling_ended_handlers: list[Callable[[], None]] = []
        self.user_steps: list[UserStep] = []
        """Steps added with :meth:`add_step`, in the order they were added."""
        self._defined_in = sys._getframe(1).f_globals.get("__name__", "")
        self.routes = RouteTable(settings.routes)
        """Where commands go by type (:meth:`route`; the settings' ``routes`` first)."""
        self.sender = Sender(
            name, settings.transport, local_address=self.address, delayed_store=self.delayed_store,
            error_queue=settings.error_queue, tracing=settings.tracing, routes=self.routes,
        )

    @property
    def transaction(self) -> Transaction:
        """The one value of this endpoint's transaction shape (``Atomic(batch=50)``, ...)."""
        return transaction_of(self.settings)

    # -- routing ------------------------------------------------------------------------------

    def route(self, message_type: type[msgspec.Struct] | str, *, to: str) -> None:
        """Send ``message_type`` (or every message type of a module, by its dotted name) to
        the queue ``to`` whenever a handler, this endpoint's sender or a saga sends one
        without a ``destination=`` (docs/routing.md)::

            endpoint.route(PlaceOrder, to="sales")
            endpoint.route("my_app.billing.messages", to="billing")

        Raises:
            ConfigurationError: an event, an invalid queue name, or a second route for the
                same type or module to another queue.
        """
        self.routes.add(message_type, to)

    def recoverability_policy(self, policy: CustomPolicy) -> CustomPolicy:
        """Replace what recoverability decides after a failed attempt, as NServiceBus's
        ``recoverability.CustomPolicy`` does (docs/recoverability.md). A decorator::

            @endpoint.recoverability_policy
            def policy(failure: Failure, headers: dict[str, str], default: Decision) -> Decision:
                if failure.exception_type == "my_app.errors.CardDeclined":
                    return Decision(Action.ERROR_QUEUE)  # no retry can help
                return default

        ``default`` is the built-in decision. The policy runs in the receivers, may run more
        than once for one attempt and must not block: a pure function of its arguments. One
        that raises, or returns something that is not a :class:`Decision`, is logged
        (``recoverability_policy_failed``) and the built-in decision is used.

        Raises:
            ConfigurationError: not callable, or the endpoint has a policy already.
        """
        if not callable(policy):
            raise ConfigurationError(f"a recoverability policy must be callable, got {policy!r}")
        if self.custom_policy is not None:
            raise ConfigurationError(f"endpoint {self.name} has a recoverability policy already")
        self.custom_policy = policy
        return policy

    # -- sending from outside handlers (the endpoint's sender) ----------------------------

    async def send(self, message: msgspec.Struct, destination: str | None = None,
                   **options: Any) -> str:
        """:meth:`Sender.send` from this endpoint (``delay``/``deliver_at`` use its store;
        without ``destination``, the message's route)."""
        return await self.sender.send(message, destination, **options)

    async def send_local(self, message: msgspec.Struct, **options: Any) -> str:
        """:meth:`Sender.send_local`: to this endpoint's own queue."""
        return await self.sender.send_local(message, **options)

    async def publish(self, event: msgspec.Struct, **options: Any) -> str:
        """:meth:`Sender.publish` with this endpoint as the originator."""
        return await self.sender.publish(event, **options)

    async def transport(self) -> PostgresTransport:
        """The sender's pool, opened on first use in the running event loop."""
        return await self.sender.transport()

    @property
    def subscriptions(self) -> SubscriptionStore:
        return self.sender.subscriptions

    async def close(self) -> None:
        await self.sender.close()

    async def __aenter__(self) -> Endpoint:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- handlers -------------------------------------------------------------------------

    @overload
    def handler(self, function: H) -> H: ...

    @overload
    def handler(
        self,
        function: None = None,
        *,
        message_type: type[msgspec.Struct] | None = None,
        immediate_retries: int | None = None,
        delayed_retries: int | None = None,
    ) -> Callable[[H], H]: ...

    def handler(
        self,
        function: H | None = None,
        *,
        message_type: type[msgspec.Struct] | None = None,
        immediate_retries: int | None = None,
        delayed_retries: int | None = None,
    ) -> H | Callable[[H], H]:
        """Register an async handler; the function is returned unchanged.

        Works bare (``@endpoint.handler``) or with options
        (``@endpoint.handler(immediate_retries=1)``: retry counts when this handler fails).
        """

        def decorate(fn: H) -> H:
            self.register(fn, message_type, immediate_retries=immediate_retries,
                          delayed_retries=delayed_retries)
            return fn

        return decorate(function) if function is not None else decorate

    def register(
        self,
        handler: Handler,
        message_type: type[msgspec.Struct] | None = None,
        *,
        immediate_retries: int | None = None,
        delayed_retries: int | None = None,
    ) -> None:
        """Add ``handler`` (same as the decorator)."""
        if self.send_only:
            raise ConfigurationError(f"send-only endpoint {self.name!r} cannot have handlers")
        limits = None
        if immediate_retries is not None or delayed_retries is not None:
            retries = (immediate_retries or 0) + (delayed_retries or 0)
            mode = self.settings.mode
            if not rules_of(mode).retries and retries:
                raise ConfigurationError(f"retries cannot be used with TransactionMode.{mode.name}")
            limits = RetryLimits(immediate_retries=immediate_retries,
                                 delayed_retries=delayed_retries)
        self.registry.register(handler, message_type, limits)

    @overload
    def saga(self, saga_type: S) -> S: ...

    @overload
    def saga(self, saga_type: None = None, *, concurrency: str = "optimistic",
             table_name: str | None = None) -> Callable[[S], S]: ...

    def saga(self, saga_type: S | None = None, *, concurrency: str = "optimistic",
             table_name: str | None = None) -> S | Callable[[S], S]:
        """Register a saga class: ``@endpoint.saga`` or ``@endpoint.saga(concurrency=
        "pessimistic")`` (see :meth:`endpoint_runtime.sagas.Sagas.register`, docs/sagas.md);
        the class is returned unchanged."""
        if self.send_only:
            raise ConfigurationError(f"send-only endpoint {self.name!r} cannot have sagas")
        decorate = self.sagas.register(concurrency=concurrency, table_name=table_name)
        return decorate(saga_type) if saga_type is not None else decorate

    # -- steps of the chain ---------------------------------------------------------------

    def add_step(self, name: str, step: Step, *, before: str | None = None,
                 after: str | None = None) -> Step:
        """Add ``step`` to this endpoint's chain (see docs/pipeline.md); returned unchanged.

        ``step`` is ``async def step(context, next)`` (or an object with such a
        ``__call__``): it does its part and ``await next(context)`` to go on; a step that does
        not call ``next`` consumes the message. User steps run after screening and
        recoverability (and, with the outbox, inside its business transaction) and before the
        audit copy and the handler invocation; ``before``/``after`` name another user step,
        or ``after="recoverability"`` (first) / ``before="invoke_handlers"`` (last, the
        default). A step that raises fails the attempt like a handler.

        Example::

            async def tenant(context: IncomingContext, next: Next) -> None:
                tenant = context.headers.get("Acme.Tenant")
                if tenant:
                    context.on_outgoing(lambda headers: headers.setdefault("Acme.Tenant", tenant))
                await next(context)

            endpoint.add_step("tenant", tenant)
        """
        if self.send_only:
            raise ConfigurationError(f"send-only endpoint {self.name!r} has no chain")
        if not callable(step):
            raise ConfigurationError(f"step {name!r} must be callable as step(context, next)")
        check_user_step(name, before, after, (user.name for user in self.user_steps))
        self.user_steps.append(UserStep(name, step, before, after))
        return step

    # -- business tables ----------------------------------------------------------------------

    @overload
    def on_install(self, hook: InstallHook) -> InstallHook: ...

    @overload
    def on_install(
        self, hook: None = None, *, tables: Iterable[str] = ()
    ) -> Callable[[InstallHook], InstallHook]: ...

    def on_install(
        self, hook: InstallHook | None = None, *, tables: Iterable[str] = ()
    ) -> InstallHook | Callable[[InstallHook], InstallHook]:
        """Register ``async def hook(connection)``, run after ``schema_sql`` wherever the
        endpoint's tables are installed (``endpoint-runtime db install``, a start with
        installers), in the installation's transaction. It must be idempotent.

        Works bare or as ``@endpoint.on_install(tables=["orders"])``: ``tables`` are the
        tables the hook creates; a start without installers names each one that is missing.
        The function is returned unchanged.
        """

        def decorate(fn: InstallHook) -> InstallHook:
            self.business_schema.add_hook(fn, tables)
            return fn

        return decorate(hook) if hook is not None else decorate

    # -- hooks (run in the receiver and peeker processes) ----------------------------------

    def on_critical_error(
        self, hook: Callable[[str, BaseException], None]
    ) -> Callable[[str, BaseException], None]:
        """Call ``hook(message, exception)`` on a critical error (a circuit breaker
        triggered, a recoverability step failed), besides the ``on_critical_error`` setting's
        action ("stop" by default)."""
        self.critical_error_handlers.append(hook)
        return hook

    def on_throttling_started(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook()`` when repeated failures throttle processing to one at a time."""
        self.throttling_started_handlers.append(hook)
        return hook

    def on_throttling_ended(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook()`` when a success ends throttling."""
        self.throttling_ended_handlers.append(hook)
        return hook

    # -- publish/subscribe -------------------------------------------------------------------

    async def subscribe(self, event_type: type[msgspec.Struct]) -> None:
        """Subscribe this endpoint's queue to ``event_type`` and the types derived from it
        (deployments do this by themselves for every handled type but commands, unless
        ``auto_subscribe=False``). A command raises :class:`ConfigurationError`."""
        check_subscribable(event_type)
        transport = await self.transport()
        async with transport.pool.acquire() as connection:
            await subscribe_to_handled_types(connection, self.subscriptions, self.name,
                                             self.address, [event_type])

    async def unsubscribe(self, event_type: type[msgspec.Struct]) -> bool:
        """Remove the subscription to ``event_type``; ``False`` when there was none."""
        transport = await self.transport()
        return await self.subscriptions.unsubscribe(transport.pool, self.name,
                                                    topics_of(event_type)[0])

    async def subscribe_at_start(self, connection: DatabaseConnection,
                                 store: SubscriptionStore) -> list[str]:
        """What a deployment does at start with ``auto_subscribe``: subscribe to every handled
        type that is not a command (events, and types that declare neither), then delete this
        endpoint's stored subscriptions to the commands it handles (made by versions that
        subscribed to every handled type). Returns the topics pruned."""
        handled = self.registry.handled_types
        await subscribe_to_handled_types(connection, store, self.name, self.address,
                                         subscribable(handled), install=False)
        pruned = await prune_subscriptions(connection, store, self.name,
                                           [topics_of(command)[0] for command in commands(handled)])
        if pruned:
            log.info("command_subscriptions_pruned", endpoint=self.name, topics=pruned)
        return pruned

    # -- what receivers build from it -------------------------------------------------------

    def create_pipeline(
        self, settings: EndpointSettings | None = None, *, metrics: Metrics | None = None,
        in_flight: InFlight | None = None,
        guard_store: Callable[[DelayedMessageStore], DelayedMessageStore] | None = None,
    ) -> Pipeline:
        """The chain of this endpoint (:func:`endpoint_runtime.chain.composition.build_pipeline`); a
        receiver actor adds its metrics, its crash ledger (``in_flight``) and the circuit
        breaker of the delayed store (``guard_store``) here, as it builds it."""
        settings = settings or self.settings
        return build_pipeline(
            endpoint=self.name, address=self.address, registry=self.registry,
            settings=settings,
            policy=RecoverabilityPolicy(
                immediate_retries=settings.retries,
                delayed_retries=settings.delayed_retry_count,
                delayed_retry_delay=settings.delayed_retry_delay,
                give_up_after=settings.delayed_retries_give_up_after,
                unrecoverable=self.unrecoverable_exceptions,
                custom=self.custom_policy,
            ),
            delayed_store=self.delayed_store, user_steps=self.user_steps,
            metrics=metrics, in_flight=in_flight, guard_store=guard_store,
            sagas=self.sagas if len(self.sagas) else None, routes=self.routes,
        )

    @staticmethod
    def create_strategy(
        pipeline: Pipeline, pool: asyncpg.Pool, settings: EndpointSettings
    ) -> ReceiveStrategy:
        """The receive strategy of the settings' transaction mode (see
        :func:`endpoint_runtime.transactions.assembly.strategy_for`); built-in endpoints
        such as ingestion bring their own."""
        return strategy_for(settings, pipeline, pool)

    def background_tasks(
        self, pool: asyncpg.Pool, settings: EndpointSettings
    ) -> list[Coroutine[Any, Any, None]]:
        """Periodic work the deployment's peeker runs beside the receivers, cancelled at its
        stop (none here; built-in endpoints such as ingestion add theirs)."""
        return []

    def enable_outbox(self, **options: Any) -> OutboxSettings:
        """Turn the outbox on (any :class:`OutboxSettings` field as a keyword option).

        Deprecated: an endpoint is complete when it is built; give
        ``Endpoint(name, transaction=Outbox(**options))`` instead (or the ``outbox`` setting).
        Needs ``TransactionMode.RECEIVE_ONLY``; any other mode fails here, at once.
        """
        warnings.warn(
            "Endpoint.enable_outbox() changes an endpoint after it was built; give "
            "Endpoint(name, transaction=Outbox(...)) instead", DeprecationWarning, stacklevel=2)
        check_names(OutboxSettings, options)
        outbox = OutboxSettings(**options)
        settings = replace_settings(self.settings, outbox=outbox)
        self.settings = settings
        return outbox

    @property
    def import_path(self) -> str:
        """``module:attribute`` under which receivers find this endpoint."""
        module = sys.modules.get(self._defined_in)
        if module is None or self._defined_in == "__main__":
            raise ConfigurationError(
                f"endpoint {self.name!r} must be defined in an importable module (not __main__) "
                "so that receiver actors can import it"
            )
        for attribute, value in vars(module).items():
            if value is self:
                return f"{self._defined_in}:{attribute}"
        raise ConfigurationError(
            f"endpoint {self.name!r} is not a module-level name of {self._defined_in}"
        )

    def validate(self) -> None:
        """Fail at start, with a clear error, on what could not run."""
        if not self.send_only and len(self.registry) == 0:
            raise ConfigurationError(f"endpoint {self.name!r} has no handlers")


def _transport_fields_in_code(
    settings: EndpointSettings | None, overrides: dict[str, Any]
) -> frozenset[str]:
    """The :class:`TransportSettings` fields an Endpoint's code gave: those of a ``transport``
    override, and a full ``settings``' fields that differ from the defaults."""
    defaults = TransportSettings()
    given: set[str] = set()
    for transport in (settings.transport if settings else None, overrides.get("transport")):
        if isinstance(transport, TransportSettings):
            given.update(field for field in TransportSettings.__struct_fields__
                         if getattr(transport, field) != getattr(defaults, field))
        elif isinstance(transport, dict):
            given.update(transport)
    return frozenset(given)


def load_endpoint(import_path: str) -> Endpoint:
    """Import ``package.module:attribute`` and return the Endpoint it names."""
    module_name, _, attribute = import_path.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"endpoint path {import_path!r} must look like 'module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    endpoint = getattr(module, attribute, None)
    if not isinstance(endpoint, Endpoint):
        raise ConfigurationError(f"{import_path} is not an Endpoint (got {type(endpoint)!r})")
    return endpoint


__all__ = ["Endpoint", "TransportSettings", "load_endpoint"]
