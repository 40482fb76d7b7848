"""PostgreSQL transport: a queue is a table; send = INSERT, receive = DELETE ... SKIP LOCKED.

Modules, in the order a message meets them:

- ``addresses``: queue addresses and identifier quoting
- ``queues``: create, drop, list, purge queue tables
- ``sending``: INSERT one or many messages
- ``receiving``: DELETE the lowest unlocked seq (one or a batch), peek, re-insert
- ``statements`` and ``sql/*.sql``: the SQL text, one named block per statement
- ``connection`` and ``literals``: statements prepared once per session and run as
  ``EXECUTE`` with literal values, so that they travel with BEGIN/COMMIT in one round trip
- ``listening``: LISTEN connections that come back after a lost connection

The package imports nothing of ``endpoint_runtime`` but ``errors`` and ``messages``:
:mod:`endpoint_runtime.connections.connecting` (pools,
:class:`~endpoint_runtime.connections.connecting.PostgresTransport`)
ties it to settings and to where the server comes from.
"""

from __future__ import annotations

from endpoint_runtime.transport import receiving, sending
from endpoint_runtime.transport.addresses import QueueAddress, quote_identifier
from endpoint_runtime.transport.queues import QueueInfo

__all__ = ["QueueAddress", "QueueInfo", "quote_identifier", "receiving", "sending"]
