"""Settings: frozen, keyword-only msgspec Structs, from code, a TOML file, or the environment.

Precedence, highest first: keyword arguments in code, environment variables
(``ENDPOINT_RUNTIME_<FIELD>``), the TOML file's table, the defaults below. Values are validated
when loaded (``msgspec.convert``), and the structs are picklable so Ray actors can take them.

Example::

    settings = load_settings(TransportSettings, path="endpoint.toml", peek_delay=0.5)
"""

from __future__ import annotations

import os
import tomllib
import typing
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeAlias, TypedDict

import msgspec

from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.modes import TransactionMode as TransactionMode  # re-exported
from endpoint_runtime.modes import needing, rules_of
from endpoint_runtime.settings_rules import (
    S,
    check_finite,
    deep_merge,
    struct_type,
)
from endpoint_runtime.settings_rules import check_names as check_names  # re-exported
from endpoint_runtime.settings_rules import replace as replace  # re-exported

ENV_PREFIX = "ENDPOINT_RUNTIME_"

MIN_PEEK_DELAY = 0.1
MAX_RECOMMENDED_PEEK_DELAY = 10.0


class TransportSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the PostgreSQL transport reaches and uses the database.

    Attributes:
        dsn: PostgreSQL connection string. ``None``: ``ENDPOINT_RUNTIME_DSN``, else libpq
            ``PG*`` variables, else an embedded server (see
            :mod:`endpoint_runtime.connections.embedded`).
        schema: default schema of queue tables.
        create_body_string_column: add the human-readable ``body_string`` generated column.
        notify_on_send: queue tables NOTIFY on insert so idle receivers wake at once.
        peek_delay: seconds between peeks of an empty queue (below 0.1 rejected, above 10 warned).
        max_records_to_peek: cap on the peek estimate (``None``: no cap).
        allowed_schemas: schemas whose queue tables sends and replies may write to (``None``:
            any schema). Whatever it says, they write to queue tables only.
        purge_batch_size: rows deleted per statement when purging expired messages.
        pool_max_size: connections per process-level pool.
        subscription_table: publish/subscribe's table (``[schema.]name``, NServiceBus layout).
        subscription_cache_seconds: how long a process reuses a subscriber list (0: never).
        installers: a deployment creates its missing queues and tables at start; ``False``:
            it runs no DDL and only checks that they exist (a role without DDL rights, see
            docs/security.md and :mod:`endpoint_runtime.database.installation`).
        pooler_dsn: a connection pooler in transaction mode (PgBouncer ``pool_mode =
            transaction``) in front of the same database: every pool connects through it and
            no statement relies on the server session (no ``PREPARE``, no statement cache,
            no session ``SET``); ``dsn`` is then used only for ``LISTEN`` (one connection per
            deployment's peeker, which wakes its receivers through Ray) and the connection
            budget. ``None``: every connection goes to ``dsn``. See docs/operations.md.
    """

    dsn: str | None = None
    schema: str = "public"
    create_body_string_column: bool = False
    notify_on_send: bool = True
    peek_delay: float = 1.0
    max_records_to_peek: int | None = None
    allowed_schemas: tuple[str, ...] | None = None
    purge_batch_size: int = 10_000
    pool_max_size: int = 10
    subscription_table: str = "SubscriptionRouting"
    subscription_cache_seconds: float = 5.0
    installers: bool = True
    pooler_dsn: str | None = None

    def __post_init__(self) -> None:
        check_finite(self)
        if self.pooler_dsn is not None and not self.pooler_dsn.strip():
            raise ConfigurationError("pooler_dsn cannot be empty (None: no pooler)")
        if self.subscription_cache_seconds < 0:
            raise ConfigurationError("subscription_cache_seconds cannot be negative")
        if self.peek_delay < MIN_PEEK_DELAY:
            raise ConfigurationError(
                f"peek_delay must be at least {MIN_PEEK_DELAY} s (got {self.peek_delay}): "
                "shorter delays put needless load on the database"
            )
        if self.peek_delay > MAX_RECOMMENDED_PEEK_DELAY:
            warnings.warn(
                f"peek_delay {self.peek_delay} s is above the recommended "
                f"{MAX_RECOMMENDED_PEEK_DELAY} s; messages may back up or expire",
                stacklevel=2,
            )
        if self.max_records_to_peek is not None and self.max_records_to_peek < 1:
            raise ConfigurationError("max_records_to_peek must be at least 1")
        if self.purge_batch_size < 1:
            raise ConfigurationError("purge_batch_size must be at least 1")
        if self.pool_max_size < 1:
            raise ConfigurationError("pool_max_size must be at least 1")

    @property
    def transaction_pooling(self) -> bool:
        """Whether pools connect through a transaction-mode pooler (``pooler_dsn``)."""
        return self.pooler_dsn is not None

    def pool_dsn(self, direct: str) -> str:
        """The DSN pools connect with: the pooler's, else ``direct`` (the resolved ``dsn``)."""
        return self.pooler_dsn if self.pooler_dsn is not None else direct

    def __repr__(self) -> str:
        # Never show a password, even in a repr that ends up in a traceback.
        from endpoint_runtime.redaction import redact_dsn

        fields = {f: getattr(self, f) for f in self.__struct_fields__}
        fields["dsn"] = redact_dsn(self.dsn) if self.dsn else None
        fields["pooler_dsn"] = redact_dsn(self.pooler_dsn) if self.pooler_dsn else None
        return f"TransportSettings({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


def settings_from_env(
    settings_type: type[msgspec.Struct],
    environ: Mapping[str, str] | None = None,
    prefix: str = ENV_PREFIX,
) -> dict[str, Any]:
    """Fields of ``settings_type`` found as ``ENDPOINT_RUNTIME_<FIELD>`` variables.

    Nested settings read ``ENDPOINT_RUNTIME_<NESTED>_<FIELD>`` (e.g.
    ``ENDPOINT_RUNTIME_OUTBOX_PESSIMISTIC``); an endpoint's ``transport`` also reads the plain
    ``ENDPOINT_RUNTIME_<FIELD>`` names, so one variable configures endpoints and tools alike.
    """
    env = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for field in msgspec.structs.fields(settings_type):
        nested = struct_type(field.type)
        if nested is None:
            value = env.get(prefix + field.name.upper())
            if value is not None:
                found[field.name] = (pairs(prefix + field.name.upper(), value)
                                     if typing.get_origin(field.type) is dict else value)
            continue
        values = settings_from_env(nested, env, f"{prefix}{field.name.upper()}_")
        if nested is TransportSettings and prefix == ENV_PREFIX:
            values = {**settings_from_env(nested, env, ENV_PREFIX), **values}
        if values:
            found[field.name] = values
    return found


def pairs(variable: str, text: str) -> dict[str, str]:
    """A mapping from the environment: ``key=value,key=value`` (blank entries ignored)."""
    found = {}
    for entry in text.split(","):
        if not entry.strip():
            continue
        key, sep, value = entry.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigurationError(
                f"{variable}: {entry.strip()!r} must look like key=value "
                "(entries separated by commas)")
        found[key.strip()] = value.strip()
    return found


def load_settings(
    settings_type: type[S],
    *,
    path: str | Path | None = None,
    table: str | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> S:
    """Build validated settings from a TOML file, the environment and keyword overrides.

    ``table`` names the TOML table to read (default: none, i.e. the top level).
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            document = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"cannot read settings file {path}: {exc}") from exc
        section = document.get(table, {}) if table else document
        values.update(section)
    values = deep_merge(values, settings_from_env(settings_type, environ))
    values.update({k: v for k, v in overrides.items() if v is not None})
    check_names(settings_type, values)
    try:
        # strict=False lets "0.5" from the environment become a float, "true" a bool.
        return msgspec.convert(values, settings_type, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigurationError(f"invalid {settings_type.__name__}: {exc}") from exc


class DelayedDeliverySettings(msgspec.Struct, frozen=True, kw_only=True,
                             forbid_unknown_fields=True):
    """Delayed delivery through the endpoint's delayed-message store (seed 004 names).

    Attributes:
        enabled: run the mover in each deployment of the endpoint.
        batch_size: due messages dispatched per transaction.
        number_of_retries: failed dispatches of one message before the error queue.
        maximum_recovery_failures_per_second: rate limit on counting dispatch failures.
        time_to_trigger_*_circuit_breaker: seconds without success before the critical error.
        initial_backoff, max_backoff: polling back-off when the store is empty (seconds).
    """

    enabled: bool = True
    batch_size: int = 100
    number_of_retries: int = 0
    maximum_recovery_failures_per_second: float = 1.0
    time_to_trigger_store_circuit_breaker: float = 30.0
    time_to_trigger_fetch_circuit_breaker: float = 30.0
    time_to_trigger_dispatch_circuit_breaker: float = 30.0
    initial_backoff: float = 0.5
    max_backoff: float = 60.0

    def __post_init__(self) -> None:
        check_finite(self)
        if self.batch_size < 1:
            raise ConfigurationError("delayed delivery batch_size must be at least 1")
        if self.number_of_retries < 0:
            raise ConfigurationError("number_of_retries cannot be negative")
        if not 0 < self.initial_backoff <= self.max_backoff:
            raise ConfigurationError("need 0 < initial_backoff <= max_backoff")


class OutboxSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The outbox (SQL persistence names of the original).

    Attributes:
        pessimistic: insert a placeholder record first, so a concurrent duplicate blocks and
            the handler body runs once (default: optimistic, insert at commit).
        isolation: isolation level of the business transaction.
        table_name: outbox table (default ``"<endpoint>_OutboxData"``).
        keep_deduplication_data_for: seconds dispatched records are kept (default 7 days).
        cleanup_interval: seconds between cleanup rounds (default 60).
        cleanup_batch_size: records deleted per statement (default 4000).
        cleanup_enabled: run the cleaner in each deployment.
        acks_per_commit: handled messages whose receive transactions commit as one (see
            ``transactions.ack_group``; 1: each commits alone). A failure rolls back the acks
            of the others, and those messages come again only to be dispatched.
        synchronous_acks: the receive transactions (acks) and the dispatches wait for their
            WAL flush like the business transaction (default: they commit asynchronously; a
            crash may lose the last ones, and their messages come again, find their records
            and are dispatched and acked then). For measuring, or a server that must never
            redeliver after a crash.
    """

    pessimistic: bool = False
    isolation: Literal["read_committed", "repeatable_read", "serializable"] = "read_committed"
    table_name: str | None = None
    keep_deduplication_data_for: float = 7 * 86_400.0
    cleanup_interval: float = 60.0
    cleanup_batch_size: int = 4_000
    cleanup_enabled: bool = True
    acks_per_commit: int = 8
    synchronous_acks: bool = False

    def __post_init__(self) -> None:
        check_finite(self)
        if self.isolation not in ("read_committed", "repeatable_read", "serializable"):
            raise ConfigurationError(
                "outbox isolation must be read_committed, repeatable_read or serializable"
            )
        if self.cleanup_batch_size < 1 or self.cleanup_interval <= 0:
            raise ConfigurationError("outbox cleanup needs a positive batch size and interval")
        if self.keep_deduplication_data_for < 0:
            raise ConfigurationError("keep_deduplication_data_for cannot be negative")
        if not 1 <= self.acks_per_commit <= 1000:
            raise ConfigurationError("outbox acks_per_commit must be between 1 and 1000")


def _default_concurrency() -> int:
    return max(2, os.cpu_count() or 1)


class NoTransaction(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The receive commits before the handlers run: at most once, no retries (NServiceBus's
    ``TransportTransactionMode.None``)."""


class ReceiveOnly(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The receive rolls back on failure; sends leave at once (NServiceBus's
    ``TransportTransactionMode.ReceiveOnly``)."""


class Atomic(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Receive, business writes and sends commit as one (NServiceBus's
    ``TransportTransactionMode.SendsAtomicWithReceive``), the default; ``batch``: up to that
    many messages per transaction, ``isolation``: how a batch keeps one message's failure from
    the others (:attr:`EndpointSettings.batch_isolation`; batches only)."""

    batch: int = 1
    isolation: Literal["optimistic", "savepoint"] = "optimistic"

    def __post_init__(self) -> None:
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ConfigurationError(f"Atomic(batch=...) must be a whole number of at least 1 "
                                     f"(got {self.batch!r})")
        if self.isolation not in ("optimistic", "savepoint"):
            raise ConfigurationError(f"unknown isolation {self.isolation!r}; choose optimistic "
                                     "or savepoint")
        if self.batch == 1 and self.isolation != "optimistic":
            raise ConfigurationError(
                "isolation applies to batches: Atomic(batch=N, isolation=...) with N > 1")


class Outbox(OutboxSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Receive-only transport transactions with the outbox: an exactly-once effect on business
    data (NServiceBus's outbox); any :class:`OutboxSettings` field as a keyword."""


Transaction: TypeAlias = NoTransaction | ReceiveOnly | Atomic | Outbox
"""How an endpoint's transactions are shaped, as one value: ``Endpoint(name,
transaction=Atomic(batch=50))``. It stands for the settings ``transaction_mode``,
``batch_size``, ``batch_isolation`` and ``outbox`` (:func:`transaction_fields`), which it
replaces: an invalid combination of them cannot be written."""
TRANSACTION_FIELDS = ("transaction_mode", "batch_size", "batch_isolation", "outbox")


def transaction_fields(transaction: Transaction) -> dict[str, Any]:
    """The :class:`EndpointSettings` fields ``transaction`` stands for."""
    if isinstance(transaction, Outbox):
        outbox = OutboxSettings(**msgspec.structs.asdict(transaction))
        return {"transaction_mode": TransactionMode.RECEIVE_ONLY, "batch_size": 1,
                "batch_isolation": "optimistic", "outbox": outbox}
    if isinstance(transaction, Atomic):
        return {"transaction_mode": TransactionMode.SENDS_ATOMIC_WITH_RECEIVE,
                "batch_size": transaction.batch, "batch_isolation": transaction.isolation,
                "outbox": None}
    if isinstance(transaction, ReceiveOnly | NoTransaction):
        mode = (TransactionMode.RECEIVE_ONLY if isinstance(transaction, ReceiveOnly)
                else TransactionMode.NONE)
        return {"transaction_mode": mode, "batch_size": 1, "batch_isolation": "optimistic",
                "outbox": None}
    raise ConfigurationError(
        f"transaction= takes NoTransaction(), ReceiveOnly(), Atomic(...) or Outbox(...), "
        f"not {transaction!r}")


def transaction_of(settings: EndpointSettings) -> Transaction:
    """The one value for ``settings``' transaction shape."""
    if settings.outbox is not None:
        return Outbox(**msgspec.structs.asdict(settings.outbox))
    if settings.mode is TransactionMode.NONE:
        return NoTransaction()
    if settings.mode is TransactionMode.RECEIVE_ONLY:
        return ReceiveOnly()
    return Atomic(batch=settings.batch_size,
                  isolation=settings.batch_isolation if settings.batch_size > 1 else "optimistic")


class EndpointOptions(TypedDict, total=False):
    """The keyword settings of ``Endpoint(name, **options)``, typed: an editor completes them
    and mypy or pyright reject a misspelt name or a wrong type (each is the
    :class:`EndpointSettings` field of the same name; ``tests/unit/test_endpoint_options.py``
    keeps the two in step). A nested setting may also be given as a mapping of its fields."""

    transaction_mode: TransactionMode | Literal["none", "receive_only",
                                                "sends_atomic_with_receive"]
    max_concurrency: int
    slots_per_receiver: int
    min_receivers: int
    batch_size: int
    batch_isolation: Literal["optimistic", "savepoint"]
    immediate_retries: int | None
    delayed_retries: int | None
    delayed_retry_delay: float
    delayed_retries_give_up_after: float
    error_queue: str
    audit_queue: str | None
    auto_subscribe: bool
    circuit_breaker_time_to_trigger: float
    circuit_breaker_armed_delay: float
    circuit_breaker_triggered_delay: float
    throttle_after_failures: int
    throttle_delay: float
    on_critical_error: Literal["stop", "log"]
    delayed_delivery: DelayedDeliverySettings | Mapping[str, Any]
    outbox: OutboxSettings | Mapping[str, Any] | None
    stop_timeout: float
    connection_budget_wait: float
    handler_timeout: float | None
    scale_down_after: float
    receiver_num_cpus: float
    receiver_resources: dict[str, float]
    tracing: bool
    routes: dict[str, str]
    transport: TransportSettings | Mapping[str, Any]


class EndpointSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one logical endpoint receives and processes messages.

    Attributes:
        transaction_mode: see :class:`~endpoint_runtime.transactions.TransactionMode`.
        max_concurrency: most messages in flight across all receivers of one deployment.
        slots_per_receiver: most messages in flight in one receiver actor; the peeker starts
            ``ceil(max_concurrency / slots_per_receiver)`` receivers at most.
        min_receivers: receivers kept while the queue is idle (0 = wake on demand).
        batch_size: 1 receives one message per transaction; N > 1 enables batched atomic
            receive (atomic mode only): up to N messages per transaction, one commit.
        batch_isolation: how a batch keeps one message's failure from the others:
            ``"optimistic"`` (default) runs the handlers without a savepoint per message and,
            when one fails, rolls the batch back and runs it again without that message;
            ``"savepoint"`` takes a savepoint per message that uses the database (for
            handlers that must catch database errors without savepoints of their own; see
            docs/handlers.md).
        immediate_retries: attempts after the first before delayed retries (default 5;
            0 and not settable with ``TransactionMode.NONE``).
        delayed_retries: re-deliveries after a delay once immediate retries are used up
            (default 3; 0 with ``TransactionMode.NONE``).
        delayed_retry_delay: seconds; the n-th delayed retry waits ``delay * n``.
        delayed_retries_give_up_after: seconds since the first delayed retry after which the
            message goes to the error queue whatever the count (default one day).
        circuit_breaker_time_to_trigger: seconds without a successful receive (or
            processing) before the critical error.
        circuit_breaker_armed_delay, circuit_breaker_triggered_delay: waits after a failure.
        throttle_after_failures: consecutive processing failures that drop the endpoint to
            one message at a time (0 disables throttling).
        throttle_delay: seconds each further failure waits while throttled.
        on_critical_error: "stop" (log and stop the deployment) or "log".
        outbox: :class:`OutboxSettings` to enable the outbox (receive-only mode only).
        error_queue: where failed and poison messages go.
        audit_queue: where a copy of each successfully processed message goes, with its
            processing headers (``None``: no audit; conventionally ``"audit"``).
        auto_subscribe: at start, subscribe to every message type the endpoint handles but
            commands, and delete its stored subscriptions to the commands it handles.
        stop_timeout: the grace period of a graceful stop: seconds in-flight handlers may
            still run before they are cancelled and their messages rolled back.
        connection_budget_wait: seconds a deployment's start waits, when the connections it
            may open do not fit in what the server has left because other running
            deployments may open theirs, for those to release them (logged while it waits);
            then, or at once when it would not fit beside no other deployment, it fails with
            a :class:`~endpoint_runtime.errors.ConfigurationError` naming the numbers.
            ``0``: fail at once.
        handler_timeout: seconds one handler may run on one message (``None``, the default:
            no limit). A handler past it is cancelled (a statement it waits on is cancelled
            in PostgreSQL), its transaction rolled back and the attempt charged, as any
            failure: :class:`~endpoint_runtime.errors.HandlerTimeoutError`, then retries and
            the error queue. Its row stays locked until then, never longer.
        scale_down_after: seconds of empty peeks before surplus receivers are retired.
        receiver_num_cpus: Ray CPUs reserved per receiver (0: do not reserve).
        receiver_resources: Ray custom resources each receiver requires, which pins receivers
            to the nodes that have them (``{"queue_workers": 1}``); empty: spread receivers
            evenly over the live nodes (see docs/cluster.md).
        tracing: OpenTelemetry traces and metrics (``ENDPOINT_RUNTIME_TRACING=true``): the
            ``tracing`` step in the chain, ``traceparent`` on every outgoing message, the SDK
            set up from the ``OTEL_*`` variables in each receiver (docs/observability.md).
            Off: OpenTelemetry is not imported and the step is not in the chain.
        routes: where commands go by type, so handlers need not name queues: ``{message type
            or module dotted name: queue}`` (``routes = {"my_app.billing" = "billing"}`` in
            the settings file; ``ENDPOINT_RUNTIME_ROUTES=my_app.billing=billing,...`` in the
            environment); added to the routes of ``endpoint.route()`` (docs/routing.md).
    """

    transaction_mode: TransactionMode = TransactionMode.SENDS_ATOMIC_WITH_RECEIVE
    max_concurrency: int = msgspec.field(default_factory=_default_concurrency)
    slots_per_receiver: int = 4
    min_receivers: int = 1
    batch_size: int = 1
    batch_isolation: Literal["optimistic", "savepoint"] = "optimistic"
    immediate_retries: int | None = None
    delayed_retries: int | None = None
    delayed_retry_delay: float = 10.0
    delayed_retries_give_up_after: float = 86_400.0
    error_queue: str = "error"
    audit_queue: str | None = None
    auto_subscribe: bool = True
    circuit_breaker_time_to_trigger: float = 30.0
    circuit_breaker_armed_delay: float = 1.0
    circuit_breaker_triggered_delay: float = 10.0
    throttle_after_failures: int = 0
    throttle_delay: float = 1.0
    on_critical_error: Literal["stop", "log"] = "stop"
    delayed_delivery: DelayedDeliverySettings = msgspec.field(
        default_factory=DelayedDeliverySettings
    )
    outbox: OutboxSettings | None = None
    stop_timeout: float = 30.0
    connection_budget_wait: float = 60.0
    handler_timeout: float | None = None
    scale_down_after: float = 10.0
    receiver_num_cpus: float = 0.0
    receiver_resources: dict[str, float] = msgspec.field(default_factory=dict)
    tracing: bool = False
    routes: dict[str, str] = msgspec.field(default_factory=dict)
    transport: TransportSettings = msgspec.field(default_factory=TransportSettings)

    def __post_init__(self) -> None:
        check_finite(self)
        try:
            mode = TransactionMode(self.transaction_mode)
        except ValueError:
            choices = ", ".join(m.value for m in TransactionMode)
            raise ConfigurationError(
                f"unknown transaction_mode {self.transaction_mode!r}; choose one of {choices}"
            ) from None
        if self.max_concurrency < 1:
            raise ConfigurationError("max_concurrency must be at least 1")
        if self.slots_per_receiver < 1:
            raise ConfigurationError("slots_per_receiver must be at least 1")
        if self.min_receivers < 0:
            raise ConfigurationError("min_receivers cannot be negative")
        if self.batch_size < 1:
            raise ConfigurationError("batch_size must be at least 1")
        if self.batch_isolation not in ("optimistic", "savepoint"):
            raise ConfigurationError(f"unknown batch_isolation {self.batch_isolation!r}; "
                                     "choose optimistic or savepoint")
        rules = rules_of(mode)
        if self.batch_size > 1 and not rules.batching:
            raise ConfigurationError(
                f"batched receive (batch_size > 1) needs {needing('batching')}"
            )
        for name in ("immediate_retries", "delayed_retries"):
            value = getattr(self, name)
            if value is None:
                continue
            if value < 0:
                raise ConfigurationError(f"{name} cannot be negative")
            if not rules.retries and value > 0:
                raise ConfigurationError(
                    f"{name} cannot be used with TransactionMode.{mode.name}: the message is "
                    "already gone from the queue when the handler runs"
                )
        if self.outbox is not None and not rules.outbox_base:
            raise ConfigurationError(
                f"the outbox needs {needing('outbox_base')} transport transactions "
                f"(got {mode.value}): it replaces atomic sends with its own records"
            )
        if self.on_critical_error not in ("stop", "log"):
            raise ConfigurationError("on_critical_error must be 'stop' or 'log'")
        if self.throttle_after_failures < 0:
            raise ConfigurationError("throttle_after_failures cannot be negative")
        if self.stop_timeout < 0 or self.scale_down_after < 0:
            raise ConfigurationError("stop_timeout and scale_down_after cannot be negative")
        if self.connection_budget_wait < 0:
            raise ConfigurationError(
                f"connection_budget_wait cannot be negative (got {self.connection_budget_wait}); "
                "0 fails at once when the connections do not fit")
        if self.handler_timeout is not None and not self.handler_timeout > 0:
            raise ConfigurationError(
                f"handler_timeout must be a positive number of seconds or None (no limit), "
                f"got {self.handler_timeout!r}")

    @property
    def mode(self) -> TransactionMode:
        return TransactionMode(self.transaction_mode)

    @property
    def retries(self) -> int:
        """Immediate retries in force (the default depends on the mode)."""
        if self.immediate_retries is not None:
            return self.immediate_retries
        return rules_of(self.mode).default_immediate_retries

    @property
    def delayed_retry_count(self) -> int:
        """Delayed retries in force (the default depends on the mode)."""
        if self.delayed_retries is not None:
            return self.delayed_retries
        return rules_of(self.mode).default_delayed_retries

    @property
    def max_receivers(self) -> int:
        return -(-self.max_concurrency // self.slots_per_receiver)
