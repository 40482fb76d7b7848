"""``submit --replace`` finds the peekers of one endpoint by their actor names (pure)."""

from __future__ import annotations

from endpoint_runtime.submission.replacing import peekers_of


def test_the_peekers_of_the_endpoint_in_any_namespace_restarted_or_not() -> None:
    names = [
        {"name": "peeker-sales-1a2b3c4d", "namespace": "job-1"},
        {"name": "peeker-sales-5e6f7a8b-2", "namespace": "job-2"},  # restarted twice
        {"name": "peeker-sales-eu-9c0d1e2f", "namespace": "job-3"},  # another endpoint
        {"name": "peeker-billing-3a4b5c6d", "namespace": "job-1"},
        {"name": "sales-1a2b3c4d", "namespace": "job-1"},  # no peeker
        {"name": "peeker-sales-notahexid", "namespace": "job-1"},
    ]
    assert peekers_of("sales", names) == [
        ("1a2b3c4d", "peeker-sales-1a2b3c4d", "job-1"),
        ("5e6f7a8b", "peeker-sales-5e6f7a8b-2", "job-2"),
    ]
    assert peekers_of("sales-eu", names) == [
        ("9c0d1e2f", "peeker-sales-eu-9c0d1e2f", "job-3")]
    assert peekers_of("shipping", names) == []
