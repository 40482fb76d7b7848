"""Property-based tests (hypothesis) of hostile input: headers, bodies, message type names,
queue and schema names, settings.

Profiles: ``ci`` (the default) is derandomized, keeps no example database and bounds the
number of examples, so that every run tries the same inputs and a failure is reproducible;
``dev`` (``HYPOTHESIS_PROFILE=dev``) explores ten times as many, at random. Tests that touch
the database take a fraction of the profile's examples (:func:`examples`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from hypothesis import HealthCheck, settings

from endpoint_runtime.errors import EndpointRuntimeError

# Tests that share one database (or one Ray) across their examples take a function-scoped
# fixture on purpose: each example resets the tables it uses.
_SHARED_FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                    HealthCheck.data_too_large]
settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          max_examples=100, suppress_health_check=_SHARED_FIXTURES,
                          print_blob=True)
settings.register_profile("dev", max_examples=1_000, deadline=None,
                          suppress_health_check=_SHARED_FIXTURES, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(fraction: float) -> settings:
    """The loaded profile with ``fraction`` of its examples (at least 5): for tests whose
    examples cost database round trips or a deployment."""
    current = settings()
    return settings(current, max_examples=max(5, int(current.max_examples * fraction)))


T = TypeVar("T")


def outcome(call: Callable[[], T]) -> T | EndpointRuntimeError:
    """What ``call`` returns, or the runtime's error it raises (any other exception fails
    the test: input must be rejected with the runtime's own, clear errors)."""
    try:
        return call()
    except EndpointRuntimeError as exc:
        return exc
