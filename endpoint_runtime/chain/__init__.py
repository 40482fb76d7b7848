"""The chain: the path of one message as an ordered list of named steps, without Ray and
without knowing the transaction mode.

``pipeline`` runs the chain, ``composition`` decides which steps an endpoint gets and in which
order, ``steps`` holds the small built-in steps; ``recoverability/`` and ``outbox/`` are the
two larger features, each with its step and what it stores; ``context`` is what a handler
sees, ``outgoing`` the one path of messages that leave, ``subscriptions`` the publish side.
"""
