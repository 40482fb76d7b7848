"""The tables an endpoint uses, and its installers (NServiceBus's name for them).

With ``TransportSettings.installers`` (the default) a deployment creates what is missing at
start: its queue, the error and audit queues, its delayed-message store, its outbox, the
subscription table, its committed-counts table (``transactions.counting``) and the heartbeat
tables its peeker writes (``transport.heartbeat_tables``, read by the console), then runs the
endpoint's business schema (``schema_sql`` and install hooks,
:mod:`endpoint_runtime.database.business_schema`). With ``installers=False`` it runs no DDL at
all and only checks that those tables, and the business tables the endpoint declares, exist,
so an endpoint can run under a role that may create nothing (docs/security.md);
:mod:`endpoint_runtime.database.privileges` writes the grants such a role needs.

Example::

    tables = EndpointTables.of(endpoint, endpoint.settings)
    async with PostgresTransport.connect(endpoint.settings.transport) as transport:
        await install(transport, endpoint, endpoint.settings)  # as a role that may create
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import msgspec

from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.subscriptions import subscription_store
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.business_schema import BusinessSchema
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transactions.counting import counts_table, create_counts_table
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.heartbeat_tables import create_heartbeats_table, heartbeat_tables
from endpoint_runtime.transport.waiting import waiting_table

if TYPE_CHECKING:
    from endpoint_runtime.chain.sagas import Sagas
    from endpoint_runtime.delayed.store import DelayedMessageStore


class InstallableEndpoint(Protocol):
    """What the set-up reads of an endpoint (``endpoint_runtime.Endpoint`` has it): the set-up
    sits below the runtime and knows no endpoint class."""

    @property
    def name(self) -> str: ...

    @property
    def address(self) -> QueueAddress: ...

    @property
    def settings(self) -> EndpointSettings: ...

    @property
    def delayed_store(self) -> DelayedMessageStore | None: ...

    @property
    def business_schema(self) -> BusinessSchema: ...

    @property
    def sagas(self) -> Sagas: ...


class EndpointTables(msgspec.Struct, frozen=True, kw_only=True):
    """Every table a deployment of one endpoint reads or writes, whatever its handlers do.

    ``delayed`` is ``None`` for a send-only endpoint, with delayed delivery off, or with a
    delayed-message store that is not a table of this database; ``outbox`` without the
    outbox; ``subscriptions`` without ``auto_subscribe``. ``committed_counts``: where its
    receivers count what committed (``transactions.counting.counts_table``).
    """

    queue: QueueAddress
    error_queue: QueueAddress
    audit_queue: QueueAddress | None = None
    delayed: QueueAddress | None = None
    outbox: QueueAddress | None = None
    subscriptions: QueueAddress | None = None
    committed_counts: QueueAddress | None = None
    heartbeats: QueueAddress | None = None
    queue_lengths: QueueAddress | None = None
    """Where its peeker writes its heartbeat and its queue's length per minute
    (``transport.heartbeat_tables``)."""
    waiting: QueueAddress | None = None
    """With ``notify_on_send``: the queue's schema's table of waiting channels, which its
    receivers and peeker mark and clear (``transport.waiting``)."""
    sagas: tuple[QueueAddress, ...] = ()
    """One table per saga type (``endpoint_runtime.chain.sagas.storage``)."""

    @classmethod
    def of(cls, endpoint: InstallableEndpoint, settings: EndpointSettings) -> EndpointTables:
        schema = settings.transport.schema
        heartbeats, queue_lengths = heartbeat_tables(endpoint.address.schema)
        delayed = None
        if endpoint.delayed_store is not None and settings.delayed_delivery.enabled:
            delayed = getattr(endpoint.delayed_store, "table", None)
        return cls(
            queue=endpoint.address,
            error_queue=QueueAddress.parse(settings.error_queue, schema),
            audit_queue=(QueueAddress.parse(settings.audit_queue, schema)
                         if settings.audit_queue else None),
            delayed=delayed if isinstance(delayed, QueueAddress) else None,
            outbox=(OutboxStorage.for_settings(endpoint.address, settings).table
                    if settings.outbox is not None else None),
            subscriptions=(subscription_store(settings.transport).table
                           if settings.auto_subscribe else None),
            committed_counts=counts_table(endpoint.address),
            heartbeats=heartbeats, queue_lengths=queue_lengths,
            waiting=(waiting_table(endpoint.address.schema)
                     if settings.transport.notify_on_send else None),
            sagas=endpoint.sagas.tables,
        )

    def named(self) -> list[tuple[str, QueueAddress]]:
        """``(what, table)`` for each table in use, in the order above."""
        return [(name, table) for name in self.__struct_fields__
                if isinstance(table := getattr(self, name), QueueAddress)] + [
            ("saga", table) for table in self.sagas]


async def install(transport: PostgresTransport, endpoint: InstallableEndpoint,
                  settings: EndpointSettings) -> None:
    """Create every table of ``EndpointTables.of(endpoint, settings)`` that is missing, then
    run the endpoint's business schema (idempotent and safe to run from several processes at
    once)."""
    tables = EndpointTables.of(endpoint, settings)
    for queue in (tables.queue, tables.error_queue, tables.audit_queue):
        if queue is not None:
            await transport.create_queue(queue)
    async with transport.pool.acquire() as connection:
        if endpoint.delayed_store is not None and settings.delayed_delivery.enabled:
            await endpoint.delayed_store.setup_infrastructure(connection)
        if settings.outbox is not None:
            await OutboxStorage.for_settings(endpoint.address, settings).setup(connection)
        if settings.auto_subscribe:
            await subscription_store(settings.transport).setup(connection)
        await create_counts_table(connection, counts_table(endpoint.address))
        await create_heartbeats_table(connection, endpoint.address.schema)
        await endpoint.sagas.setup(connection)
        await endpoint.business_schema.install(connection)


async def check_installed(connection: DatabaseConnection, tables: EndpointTables,
                          endpoint: str, business: BusinessSchema | None = None) -> None:
    """Fail with a :class:`ConfigurationError` naming every table of ``tables``, and every
    table ``business`` declares, that does not exist (the check of a deployment without
    installers; it runs no DDL)."""
    missing = [
        f"{what} {table}" for what, table in tables.named()
        if await connection.fetchval("SELECT to_regclass($1) IS NULL", table.qualified)
    ]
    if business is not None:
        missing += [f"business table {table}" for table in await business.missing(connection)]
    if missing:
        raise ConfigurationError(
            f"endpoint {endpoint!r} runs without installers (installers=False) but these "
            f"tables do not exist: {', '.join(missing)}; create them once as a role that may "
            f"(endpoint-runtime db install <module:endpoint>), or run with installers"
        )


async def prepare(transport: PostgresTransport, endpoint: InstallableEndpoint,
                  settings: EndpointSettings) -> None:
    """At the start of a deployment: install, or check that everything is installed."""
    if settings.transport.installers:
        await install(transport, endpoint, settings)
        return
    async with transport.pool.acquire() as connection:
        await check_installed(connection, EndpointTables.of(endpoint, settings), endpoint.name,
                              endpoint.business_schema)
