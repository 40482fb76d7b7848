"""A small audit set whose figures are known in advance.

Day 1, 2026-01-05 (UTC):

- 10:00: ``sales`` processes 100 ``Orders.PlaceOrder`` sent by ``web``: message i (1..100)
  takes i ms to process and 10 x i ms from send to end (critical time); every tenth was
  retried once. Each starts its own conversation ``c-i``.
- 10:01: ``billing`` processes 50 ``Orders.OrderPlaced`` sent by ``sales``, related to
  PlaceOrder 1..50 (same conversations), 2 ms each, 20 ms critical time, ending at
  10:01:00 + i/2 s: conversation c-i lasts 60 s + 10 i ms, so c-50 is the slowest.
- Failures: 5 ``Orders.OrderPlaced`` in billing (10:01, ``System.TimeoutException``), 1
  ``Orders.PlaceOrder`` in sales (10:00, ``System.ArgumentException`` with markup in its
  message).

Day 2, 2026-01-06 09:00: ``sales`` processes 20 more PlaceOrder (5 ms, 50 ms critical), each
its own conversation ``d-i``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from endpoint_runtime.ingestion.storage import AUDIT_FIELDS, ERROR_FIELDS, OperationalData
from endpoint_runtime.wire.failure_groups import failure_group

DAY1 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
DAY2 = datetime(2026, 1, 6, 9, 0, tzinfo=UTC)
HOSTILE = "<b>bad</b> order & more"


def audit_row(message_id: str, message_type: str, sender: str, receiver: str,
              conversation: str, related: str | None, ended: datetime, processing_ms: float,
              critical_ms: float, retries: int = 0) -> tuple[Any, ...]:
    started = ended - timedelta(milliseconds=processing_ms)
    sent = ended - timedelta(milliseconds=critical_ms)
    return (message_id, message_type, "Send", sender, "m1", receiver, "m2", conversation,
            related, sent, started, ended, processing_ms, critical_ms, 100, retries, "{}")


def error_row(seq: int, message_type: str, sender: str, receiver: str, failed_at: datetime,
              exception_type: str, message: str,
              conversation: str | None = None) -> tuple[Any, ...]:
    group = failure_group(exception_type, message, None)  # as ingestion computes it
    return ("error", uuid.uuid4(), seq, f"e-{seq}", message_type, "Send", sender, receiver,
            "m2", f"{receiver}@public", conversation or f"f-{seq}", None,
            failed_at - timedelta(seconds=1),
            failed_at, 3, exception_type, message, 100, "{}", None, group.key, group.title)


def place_order_end(i: int) -> datetime:
    return DAY1 + timedelta(seconds=0.5 * i)


def rows() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    audit = []
    for i in range(1, 101):
        audit.append(audit_row(f"p-{i}", "Orders.PlaceOrder", "web", "sales", f"c-{i}", None,
                            place_order_end(i), float(i), 10.0 * i, 1 if i % 10 == 0 else 0))
    for i in range(1, 51):
        audit.append(audit_row(f"b-{i}", "Orders.OrderPlaced", "sales", "billing", f"c-{i}",
                            f"p-{i}", billing_end(i), 2.0, 20.0))
    for i in range(1, 21):
        audit.append(audit_row(f"d-{i}", "Orders.PlaceOrder", "web", "sales", f"d-{i}", None,
                            DAY2 + timedelta(seconds=i), 5.0, 50.0))
    errors = [error_row(seq, "Orders.OrderPlaced", "sales", "billing",
                     DAY1 + timedelta(minutes=1, seconds=seq), "System.TimeoutException",
                     f"gateway timed out\n   at Billing.Handle() #{seq}")
              for seq in range(1, 6)]
    errors.append(error_row(6, "Orders.PlaceOrder", "web", "sales", DAY1 + timedelta(seconds=30),
                         "System.ArgumentException", HOSTILE))
    return audit, errors


def billing_end(i: int) -> datetime:
    return DAY1 + timedelta(minutes=1) + timedelta(seconds=i * 0.5)


def conversation_ms(i: int) -> float:
    """c-i: from PlaceOrder i's send to OrderPlaced i's end."""
    sent = place_order_end(i) - timedelta(milliseconds=10.0 * i)
    return (billing_end(i) - sent).total_seconds() * 1000


async def insert(dsn: str, audit: Sequence[tuple[Any, ...]],
                 errors: Sequence[tuple[Any, ...]] = (), setup: bool = True) -> None:
    """Create the tables if needed (``setup``: its DDL waits for open writers) and add the
    rows, in one transaction."""
    connection = await asyncpg.connect(dsn)
    try:
        if setup:
            await OperationalData("public").setup(connection)
        async with connection.transaction():
            if audit:
                await connection.copy_records_to_table("audit_log", records=list(audit),
                                                       columns=AUDIT_FIELDS)
            if errors:
                await connection.copy_records_to_table("error_log", records=list(errors),
                                                       columns=ERROR_FIELDS)
    finally:
        await connection.close()


async def load(dsn: str) -> None:
    audit, errors = rows()
    await insert(dsn, audit, errors)
