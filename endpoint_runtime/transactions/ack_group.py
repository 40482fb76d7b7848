"""Grouped acknowledgements: the outbox's receive transaction commits once per group of messages.

With the outbox, a message's business transaction commits its record on the business connection,
and its dispatch (the record's operations inserted into their queues, the record marked) commits
right after it, in the same round trip (``chain.outbox.step``). What is left for the receive
transaction is the ack: the DELETE of the incoming row. Acks may wait: a message whose ack rolls
back comes again, finds its record, and is acknowledged without running its handlers (its
dispatch already happened, or happens then, once).

So the receive transaction stays open over several messages and commits after
``acks_per_commit`` messages, when the queue is empty, when the receive slot ends, and on
every other path (a duplicate, a poison message, retries used up, a dispatch that could not go
with the business commit): a round trip saved per message.

The open transaction holds only the deleted rows of the endpoint's own queue; receives skip them
(SKIP LOCKED). Nothing else the runtime does waits for them, unless a message reuses the id of a
row that is being received, in the same queue. Dispatches therefore wait at most
``DISPATCH_LOCK_TIMEOUT`` for a lock and are then made on the receive connection instead.

The price: a failure (a handler's exception, a lost connection, a killed process) rolls back the
acks of up to ``acks_per_commit - 1`` messages handled before it in the group. Those messages
come again, are recognised as duplicates and acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AckGroup:
    """The acks waiting in one receive connection's open transaction.

    ``open`` says that the last receive round ended leaving its ack uncommitted, for the next
    round or the slot's end to commit. It is cleared when a round begins: whatever that round
    does then commits the group, rolls it back, or opens it again. ``acks`` may still count acks
    that a commit or rollback the strategy did not see has ended; it then only makes the
    group shorter.
    """

    size: int
    acks: int = 0
    open: bool = False

    def begin_round(self) -> None:
        self.open = False

    def can_defer(self) -> bool:
        return self.acks + 1 < self.size

    def defer(self) -> None:
        """End the round leaving its ack for a later commit."""
        self.open = True
        self.acks += 1

    def committed(self) -> None:
        self.acks = 0
