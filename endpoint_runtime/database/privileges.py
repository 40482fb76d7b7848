"""The least a database role needs to run one endpoint, as GRANT statements, and the
row-level security that keeps it to its own subscriptions.

The role may use the endpoint's own queue, delayed store and outbox; insert into the error
and audit queues and into the queues it sends to; read every subscription (to publish); change
only its own endpoint's subscriptions. It gets no CREATE anywhere: run the deployment with
``TransportSettings(installers=False)`` after the tables were made once by a role that may
(see :mod:`endpoint_runtime.database.installation` and docs/security.md). Grants on the handlers'
business tables are the application's to add.

The role-to-endpoint mapping is a policy on the subscription table per (role, endpoint):
the role may insert, update and delete the rows whose ``endpoint`` column is that endpoint's
name; every role with ``SELECT`` reads every row. Row-level security does not bind the table's
owner, superusers and roles with ``BYPASSRLS``: they change every row.

Example::

    for statement in endpoint_grants(endpoint, endpoint.settings, "sales_app",
                                     sends_to=["billing"]):
        print(statement)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from endpoint_runtime.chain.subscriptions import subscription_store
from endpoint_runtime.database.installation import EndpointTables, InstallableEndpoint
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transport import QueueAddress, quote_identifier
from endpoint_runtime.transport.literals import text_literal

RECEIVE = "SELECT, INSERT, UPDATE, DELETE"
"""The own queue: receive is DELETE ... RETURNING of rows picked FOR UPDATE SKIP LOCKED (which
asks for UPDATE), a batch re-inserts a failed row, the peek reads."""
SEND = "INSERT"
"""A queue sent, published or replied to; the notify trigger's function is EXECUTE to PUBLIC."""
FAIL = "INSERT, SELECT (id)"
"""The error queue: its insert returns the id it kept (and reads no one else's messages)."""
STORE = "SELECT, INSERT, UPDATE, DELETE"
"""The delayed store, the outbox, the saga tables, the committed counts, the heartbeat tables
and the subscription table: read and written (the subscription table's rows only as the
row-level security of :func:`subscription_policies` allows; the committed counts: each receive
slot adds to its row, receivers delete the rows of deployments long idle; the heartbeats: the
peeker upserts its row and its queue's length per minute and deletes the minutes past their
retention)."""
WAIT = "SELECT, INSERT, DELETE"
"""The schema's table of waiting channels: receivers and the peeker mark their queue's channel
waiting and clear it (``transport.waiting``); the notify trigger reads it as its owner."""
READ = "SELECT"
"""The subscription table of an endpoint that does not subscribe: a publish reads it."""
READ_POLICY = "endpoint_runtime_subscriptions_readable"
"""The policy that lets every role with ``SELECT`` read every subscription (publishers)."""


def grant_statements(tables: EndpointTables, role: str, *, sends_to: Iterable[str] = (),
                     database: str | None = None) -> list[str]:
    """GRANT statements (identifiers quoted) that let ``role`` run the endpoint of ``tables``
    and send to the queues ``sends_to`` (``[schema.]table``, in the queue's schema when bare).

    ``database``: also grant CONNECT on it. Nothing here grants CREATE or ownership.
    """
    who = quote_identifier(role)
    grants: dict[QueueAddress, str] = {tables.queue: RECEIVE, tables.error_queue: FAIL}
    for queue in (tables.audit_queue, *(QueueAddress.parse(q, tables.queue.schema)
                                        for q in sends_to)):
        if queue is not None:
            grants.setdefault(queue, SEND)
    for table in (tables.delayed, tables.outbox, tables.subscriptions, tables.committed_counts,
                  tables.heartbeats, tables.queue_lengths, *tables.sagas):
        if table is not None:
            grants[table] = STORE  # a table listed twice gets the widest grant
    if tables.waiting is not None:
        grants.setdefault(tables.waiting, WAIT)
    statements = []
    if database is not None:
        statements.append(f"GRANT CONNECT ON DATABASE {quote_identifier(database)} TO {who};")
    for schema in sorted({table.schema for table in grants}):
        statements.append(f"GRANT USAGE ON SCHEMA {quote_identifier(schema)} TO {who};")
    statements += [f"GRANT {privileges} ON TABLE {table.qualified} TO {who};"
                   for table, privileges in grants.items()]
    return statements


def subscription_policies(table: QueueAddress, role: str, endpoint: str) -> list[str]:
    """One statement (for the table's owner; several lines, one transaction, so that no
    reader sees the table without its read policy) that turns on row-level security on the
    subscription ``table`` and lets ``role`` change the rows of ``endpoint`` only; every role
    keeps reading every row. Idempotent. Works for any endpoint name, an NServiceBus
    endpoint's too."""
    name = quote_identifier(own_policy_name(role, endpoint))
    read = quote_identifier(READ_POLICY)
    mine = f"endpoint = {text_literal(endpoint)}"
    on = f"ON {table.qualified}"
    return ["\n".join([
        "BEGIN;",
        f"ALTER TABLE {table.qualified} ENABLE ROW LEVEL SECURITY;",
        f"DROP POLICY IF EXISTS {read} {on};",
        f"CREATE POLICY {read} {on} FOR SELECT USING (true);",
        f"DROP POLICY IF EXISTS {name} {on};",
        f"CREATE POLICY {name} {on} FOR ALL TO {quote_identifier(role)} USING ({mine}) "
        f"WITH CHECK ({mine});",
        "COMMIT;",
    ])]


def own_policy_name(role: str, endpoint: str) -> str:
    """The name of the policy of (``role``, ``endpoint``): a digest, as both names together
    may pass PostgreSQL's 63 bytes."""
    digest = hashlib.blake2b(f"{role}\x00{endpoint}".encode(), digest_size=8).hexdigest()
    return f"endpoint_runtime_own_{digest}"


def endpoint_grants(endpoint: InstallableEndpoint, settings: EndpointSettings, role: str, *,
                    sends_to: Iterable[str] = (), database: str | None = None) -> list[str]:
    """What ``endpoint-runtime db grants`` prints: :func:`grant_statements`, ``SELECT`` on the
    subscription table for an endpoint that does not subscribe (it may publish), and for one
    that does the row-level security of :func:`subscription_policies`."""
    tables = EndpointTables.of(endpoint, settings)
    statements = grant_statements(tables, role, sends_to=sends_to, database=database)
    subscriptions = subscription_store(settings.transport).table
    if tables.subscriptions is None:
        if subscriptions.schema not in {t.schema for _, t in tables.named()}:
            statements.append(f"GRANT USAGE ON SCHEMA {quote_identifier(subscriptions.schema)} "
                              f"TO {quote_identifier(role)};")
        statements.append(f"GRANT {READ} ON TABLE {subscriptions.qualified} "
                          f"TO {quote_identifier(role)};")
        return statements
    return statements + subscription_policies(subscriptions, role, endpoint.name)
