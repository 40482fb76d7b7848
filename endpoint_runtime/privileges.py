"""The least a database role needs to run one endpoint, as GRANT statements.

The role may use the endpoint's own queue, delayed store and outbox; insert into the error
and audit queues and into the queues it sends to; keep its subscriptions. It gets no CREATE
anywhere: run the deployment with ``TransportSettings(installers=False)`` after the tables
were made once by a role that may (see :mod:`endpoint_runtime.installation` and
docs/security.md). Grants on the handlers' business tables are the application's to add.

Example::

    for statement in grant_statements(EndpointTables.of(endpoint, endpoint.settings),
                                      "sales_app", sends_to=["billing"]):
        print(statement)
"""

from __future__ import annotations

from collections.abc import Iterable

from endpoint_runtime.installation import EndpointTables
from endpoint_runtime.transport import QueueAddress, quote_identifier

RECEIVE = "SELECT, INSERT, UPDATE, DELETE"
"""The own queue: receive is DELETE ... RETURNING of rows picked FOR UPDATE SKIP LOCKED (which
asks for UPDATE), a batch re-inserts a failed row, the peek reads."""
SEND = "INSERT"
"""A queue sent, published or replied to; the notify trigger's function is EXECUTE to PUBLIC."""
FAIL = "INSERT, SELECT (id)"
"""The error queue: its insert returns the id it kept (and reads no one else's messages)."""
STORE = "SELECT, INSERT, UPDATE, DELETE"
"""The delayed store, the outbox and the subscription table: read and written."""


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
    for table in (tables.delayed, tables.outbox, tables.subscriptions):
        if table is not None:
            grants[table] = STORE  # a table listed twice gets the widest grant
    statements = []
    if database is not None:
        statements.append(f"GRANT CONNECT ON DATABASE {quote_identifier(database)} TO {who};")
    for schema in sorted({table.schema for table in grants}):
        statements.append(f"GRANT USAGE ON SCHEMA {quote_identifier(schema)} TO {who};")
    statements += [f"GRANT {privileges} ON TABLE {table.qualified} TO {who};"
                   for table, privileges in grants.items()]
    return statements
