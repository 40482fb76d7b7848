"""The transaction modes the integration tests run an endpoint in: ``Endpoint`` keyword
options by name, each one transaction shape (``transaction=``)."""

from __future__ import annotations

from typing import Any

from endpoint_runtime import Atomic, NoTransaction, Outbox, ReceiveOnly

MODES: dict[str, dict[str, Any]] = {
    "atomic": {"transaction": Atomic()},
    "batched": {"transaction": Atomic(batch=4)},
    "receive_only": {"transaction": ReceiveOnly()},
    "outbox": {"transaction": Outbox()},
    "none": {"transaction": NoTransaction()},
}
