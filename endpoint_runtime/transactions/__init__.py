"""Transaction modes: where the receive transaction ends and where outgoing messages go.

One strategy module per mode:

- ``none``: the DELETE commits before the handler runs (at-most-once, no retries).
- ``receive_only``: the DELETE's transaction stays open during the handler; sends leave at
  once on other connections and stay sent if the handler fails ("ghost messages").
- ``atomic``: sends are written in the receive transaction and commit or roll back with it.
- ``batched``: atomic, with up to N messages per transaction (beyond the original).
"""

from __future__ import annotations

# The mode is a setting (``settings.TransactionMode``): settings must not import the
# package that implements the modes. Re-exported here, where users look for it.
from endpoint_runtime.settings import TransactionMode

__all__ = ["TransactionMode"]
