"""Sagas, as users import them: ``from endpoint_runtime.sagas import Saga, handles, starts``.

The saga code is part of the chain (:mod:`endpoint_runtime.chain.sagas`); this package names
its public API, and :mod:`endpoint_runtime.sagas.testing` runs a saga's method without a
database or Ray. See docs/sagas.md.
"""

from __future__ import annotations

from endpoint_runtime.chain.sagas import Saga, Sagas, SagaStep, handles, starts

__all__ = ["Saga", "SagaStep", "Sagas", "handles", "starts"]
