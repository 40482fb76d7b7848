"""SQL statements of one queue, rendered once per address with quoted identifiers."""

from __future__ import annotations

import functools

from endpoint_runtime.transport import sql
from endpoint_runtime.transport.addresses import QueueAddress, quote_identifier
from endpoint_runtime.transport.literals import text_literal

WAITING_TABLE = "endpoint_runtime_waiting"
"""The table of waiting channels, one per schema, beside the schema's queues
(:mod:`endpoint_runtime.transport.waiting`)."""


# About 12 KB per queue: 512 queues in use at once is plenty, and the cache stays small.
@functools.lru_cache(maxsize=512)
def for_queue(address: QueueAddress) -> dict[str, str]:
    """Every statement of ``queue.sql`` with this queue's names filled in."""
    names = {
        "queue": address.qualified,
        "schema": quote_identifier(address.schema),
        "pkey": quote_identifier(address.derived_name("_pkey")),
        "seq_idx": quote_identifier(address.derived_name("_seq_idx")),
        "expires_idx": quote_identifier(address.derived_name("_expires_idx")),
        "notify": quote_identifier(address.derived_name("_notify")),
        "channel": text_literal(address.notify_channel),
        "waiting": QueueAddress(WAITING_TABLE, address.schema).qualified,
        "waiting_name": quote_identifier(WAITING_TABLE),
    }
    return {name: text.format(**names) for name, text in sql.load("queue.sql").items()}


def shared(name: str) -> str:
    """A statement that names no queue (e.g. ``list_queues``)."""
    return sql.load("queue.sql")[name]
