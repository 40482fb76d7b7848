"""Example endpoints: an order flow sales -> billing -> shipping -> notifications, and
sales -> loyalty -> notifications.

===============  ==========================================  ==================================
module           transaction mode                            shows
===============  ==========================================  ==================================
sales            SENDS_ATOMIC_WITH_RECEIVE                   business row + send + reply in one
                                                             transaction; unrecoverable errors
billing          RECEIVE_ONLY                                sends leave at once (ghosts)
shipping         SENDS_ATOMIC_WITH_RECEIVE, batch_size=10    batched receive; immediate retries
loyalty          RECEIVE_ONLY + outbox (pessimistic)         exactly-once effect: points row +
                                                             sends once per message id; a
                                                             reminder deferred with delay=
notifications    NONE                                        at-most-once, fire-and-forget
analytics        SENDS_ATOMIC_WITH_RECEIVE                   subscribes to sales' OrderPlaced
                                                             event (billing does too)
fulfilment       (a saga, run by sales)                      placed + paid in any order, ship
                                                             when both, cancel after a timeout
===============  ==========================================  ==================================

Every example endpoint sends an audit copy of each message it handles to the queue ``audit``;
the example run also deploys the ingestion endpoint (``endpoint_runtime.ingestion``), which turns
them into ``audit_log`` rows (``endpoint-runtime status``, ``endpoint-runtime report``).

``python -m handlers_examples`` (``bin/dev examples``) runs them all end to end.
"""
