"""Transaction strategies: where the receive transaction begins and ends around one call into
the chain (``pipeline.run(message, unit)``) per message, and where outgoing messages go.

One strategy module per mode (what each mode allows: :mod:`endpoint_runtime.modes`):

- ``none``: the DELETE commits before the chain runs (at-most-once, no retries; a failed
  message goes to the error queue).
- ``receive_only``: the DELETE's transaction stays open during the handlers; sends leave at
  once on other connections and stay sent if the handler fails ("ghost messages"); the audit
  copy goes with the COMMIT.
- ``atomic``: sends are written in the receive transaction and commit or roll back with it
  (``single``: one message per transaction, shared with receive-only).
- ``batched``: atomic, with up to N messages per transaction (beyond the original).
- ``outbox_receive``: receive-only transport transactions with the outbox's business
  transaction and dispatch (the outbox step) and grouped acks (``ack_group``).

Shared: ``base`` (Round, ReceiveSlot, the dispatchers), ``receive_transaction`` (begin,
commit with the sends, roll back, settle the unit), ``assembly`` (the one place that picks
the strategy).
"""

from __future__ import annotations

# The mode is a setting (``modes.TransactionMode``): settings must not import the package
# that implements the modes. Re-exported here, where users look for it.
from endpoint_runtime.modes import TransactionMode

__all__ = ["TransactionMode"]
