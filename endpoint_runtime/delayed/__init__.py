"""Delayed delivery: messages held until a due time, then dispatched to their destination.

- ``store``: the :class:`DelayedMessageStore` protocol (seed 004) and :class:`DelayedMessage`.
- ``postgres``: the built-in store, a ``"<endpoint>.delayed"`` table beside the queues.
- ``mover``: the loop that dispatches due messages (one per endpoint deployment).
"""

from endpoint_runtime.delayed.postgres import PostgresDelayedMessageStore
from endpoint_runtime.delayed.store import DelayedMessage, DelayedMessageStore

__all__ = ["DelayedMessage", "DelayedMessageStore", "PostgresDelayedMessageStore"]
