"""One value for an endpoint's transaction shape (no database): what each stands for, what it
refuses, and that it is not given twice."""

from __future__ import annotations

import pytest

from endpoint_runtime import (
    Atomic,
    ConfigurationError,
    Endpoint,
    NoTransaction,
    Outbox,
    ReceiveOnly,
    TransactionMode,
)
from endpoint_runtime.settings import OutboxSettings


@pytest.mark.parametrize(("transaction", "mode", "batch", "isolation", "outbox"), [
    (NoTransaction(), TransactionMode.NONE, 1, "optimistic", None),
    (ReceiveOnly(), TransactionMode.RECEIVE_ONLY, 1, "optimistic", None),
    (Atomic(), TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, 1, "optimistic", None),
    (Atomic(batch=50), TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, 50, "optimistic", None),
    (Atomic(batch=50, isolation="savepoint"), TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, 50,
     "savepoint", None),
    (Outbox(), TransactionMode.RECEIVE_ONLY, 1, "optimistic", OutboxSettings()),
    (Outbox(pessimistic=True), TransactionMode.RECEIVE_ONLY, 1, "optimistic",
     OutboxSettings(pessimistic=True)),
])
def test_each_shape_stands_for_its_settings_and_reads_back(
        transaction: object, mode: TransactionMode, batch: int, isolation: str,
        outbox: OutboxSettings | None) -> None:
    endpoint = Endpoint("orders", transaction=transaction)  # type: ignore[arg-type]
    settings = endpoint.settings
    assert (settings.mode, settings.batch_size, settings.batch_isolation, settings.outbox) == (
        mode, batch, isolation, outbox)
    assert type(settings.outbox) is (OutboxSettings if outbox else type(None))
    assert endpoint.transaction == transaction


def test_the_old_settings_read_back_as_one_value() -> None:
    assert Endpoint("a", transaction_mode="receive_only").transaction == ReceiveOnly()
    assert Endpoint("b", batch_size=8).transaction == Atomic(batch=8)
    legacy = Endpoint("c", transaction_mode="receive_only")
    with pytest.warns(DeprecationWarning, match="changes an endpoint after it was built"):
        legacy.enable_outbox(pessimistic=True)
    assert legacy.transaction == Outbox(pessimistic=True)


@pytest.mark.parametrize(("make", "says"), [
    (lambda: Atomic(batch=0), r"batch=\.\.\.\) must be a whole number of at least 1"),
    (lambda: Atomic(batch=True), "whole number"),
    (lambda: Atomic(isolation="savepoint"), "isolation applies to batches"),
    (lambda: Atomic(batch=4, isolation="hopeful"), "unknown isolation"),
    (lambda: Outbox(acks_per_commit=1, nonsense=1), "nonsense"),
])
def test_an_invalid_shape_cannot_be_made(make: object, says: str) -> None:
    with pytest.raises((ConfigurationError, TypeError), match=says):
        make()  # type: ignore[operator]


def test_the_shape_and_its_settings_are_not_given_together() -> None:
    with pytest.raises(ConfigurationError, match=r"give the transaction shape once.*batch_size"):
        Endpoint("orders", transaction=Atomic(batch=4), batch_size=8)
    with pytest.raises(ConfigurationError, match="transaction= takes NoTransaction"):
        Endpoint("orders", transaction="atomic")  # type: ignore[arg-type]
