"""The transaction modes the integration tests run an endpoint in: ``Endpoint`` keyword
options by name (``outbox`` also needs ``endpoint.enable_outbox()``)."""

from __future__ import annotations

from typing import Any

MODES: dict[str, dict[str, Any]] = {
    "atomic": {"transaction_mode": "sends_atomic_with_receive"},
    "batched": {"transaction_mode": "sends_atomic_with_receive", "batch_size": 4},
    "receive_only": {"transaction_mode": "receive_only"},
    "outbox": {"transaction_mode": "receive_only"},
    "none": {"transaction_mode": "none"},
}
