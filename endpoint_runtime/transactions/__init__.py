"""Transaction modes: where the receive transaction ends and where outgoing messages go.

One strategy module per mode:

- ``none``: the DELETE commits before the handler runs (at-most-once, no retries).
- ``receive_only``: the DELETE's transaction stays open during the handler; sends leave at
  once on other connections and stay sent if the handler fails ("ghost messages").
- ``atomic``: sends are written in the receive transaction and commit or roll back with it.
- ``batched``: atomic, with up to N messages per transaction (beyond the original).
"""

from __future__ import annotations

import enum


class TransactionMode(enum.StrEnum):
    """Transport transaction mode of an endpoint (NServiceBus ``TransportTransactionMode``)."""

    NONE = "none"
    """Receive commits before handling; a failed message is not retried (at-most-once)."""
    RECEIVE_ONLY = "receive_only"
    """Receive is rolled back on failure; sends already made stay sent."""
    SENDS_ATOMIC_WITH_RECEIVE = "sends_atomic_with_receive"
    """Receive, sends and handler writes through ``context.connection`` commit as one."""
