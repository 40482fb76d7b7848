"""Sagas: long-running processes whose state lives in PostgreSQL (NServiceBus's model).

A saga is a class deriving from ``Saga[StateStruct]`` whose handler methods are marked
``@starts(correlate=...)`` or ``@handles(...)``, registered with ``@endpoint.saga``; see
:mod:`endpoint_runtime.chain.sagas.saga` and docs/sagas.md. Its state is stored by
:mod:`endpoint_runtime.chain.sagas.storage` (one table per saga type, NServiceBus SQL
persistence's layout), on the handlers' connection: it commits with the message. Users import
these names from :mod:`endpoint_runtime.sagas`.
"""

from __future__ import annotations

from endpoint_runtime.chain.sagas.registry import Sagas
from endpoint_runtime.chain.sagas.saga import Saga, handles, starts
from endpoint_runtime.chain.sagas.step import SagaStep

__all__ = ["Saga", "SagaStep", "Sagas", "handles", "starts"]
