"""Saga registration (no database): what a saga class declares is read once, and what could
not run fails at once with a clear ConfigurationError; the state type's version follows its
fields; the decorator returns the class unchanged; the chain gets the saga step only with
sagas, and the endpoint's tables and grants list the saga tables."""

from __future__ import annotations

import uuid

import msgspec
import pytest

from endpoint_runtime import ConfigurationError, Endpoint, HandlerContext
from endpoint_runtime.chain.sagas.definition import state_version
from endpoint_runtime.database.installation import EndpointTables
from endpoint_runtime.database.privileges import endpoint_grants
from endpoint_runtime.sagas import Saga, handles, starts
from tests.support.saga_endpoints import OrderSaga


class Start(msgspec.Struct):
    key: str


class Other(msgspec.Struct):
    key: str


class Keyed(msgspec.Struct):
    key: str = ""
    count: int = 0


def test_the_decorator_returns_the_class_and_registers_a_handler_per_message_type() -> None:
    endpoint = Endpoint("shop")

    @endpoint.saga
    class Counter(Saga[Keyed]):
        correlation = "key"

        @starts(correlate="key")
        async def start(self, message: Start, context: HandlerContext) -> None: ...

        @handles(correlate=lambda message: message.key)
        async def other(self, message: Other, context: HandlerContext) -> None: ...

    assert isinstance(Counter, type)
    assert set(endpoint.registry.handled_types) == {Start, Other}
    (definition,) = endpoint.sagas.definitions
    assert str(definition.table.address) == "public.shop_Counter"
    assert definition.table.correlation_column == "Correlation_key"
    assert [h.__qualname__ for h in endpoint.registry.handlers_for(Start)] == [
        "test_the_decorator_returns_the_class_and_registers_a_handler_per_message_type."
        "<locals>.Counter.start"]
    assert "sagas" in endpoint.create_pipeline().steps
    assert "sagas" not in Endpoint("plain").create_pipeline().steps


def register(state: type[msgspec.Struct], correlation: str | None, **marks: object) -> None:
    """Register a one-method saga on ``state`` with the decorator ``marks['mark']``."""
    mark = marks.get("mark", starts(correlate="key"))

    class Broken(Saga[state]):  # type: ignore[valid-type]
        pass

    Broken.correlation = correlation

    async def start(self: object, message: Start, context: HandlerContext) -> None: ...

    Broken.start = mark(start)  # type: ignore[attr-defined, operator]
    Endpoint("shop").saga(Broken)


class NoDefaults(msgspec.Struct):
    key: str
    total: int


class FloatKey(msgspec.Struct):
    key: float = 0.0


@pytest.mark.parametrize(("state", "correlation", "mark", "says"), [
    (NoDefaults, "key", None, r"state fields \[.total.\] have no default and the starting "
                              r"message Start has no field"),
    (FloatKey, "key", None, "use one of str, int, UUID"),
    (Keyed, "missing", None, "is not a field of Keyed"),
    (Keyed, "key", handles(correlate="key"), "no message type starts it"),
    (Keyed, "key", starts(correlate="nope"), "is not a field of Start"),
    (Keyed, None, starts(correlate="key"), "has no correlation field"),
])
def test_a_saga_that_could_not_run_fails_at_registration(
    state: type[msgspec.Struct], correlation: str | None, mark: object, says: str,
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        register(state, correlation, **({"mark": mark} if mark else {}))


def test_two_methods_for_one_message_type_and_a_saga_registered_twice_fail() -> None:
    class Twice(Saga[Keyed]):
        correlation = "key"

        @starts(correlate="key")
        async def one(self, message: Start, context: HandlerContext) -> None: ...

        @handles(correlate="key")
        async def two(self, message: Start, context: HandlerContext) -> None: ...

    with pytest.raises(ConfigurationError, match="handled by another method"):
        Endpoint("shop").saga(Twice)
    endpoint = Endpoint("shop")
    endpoint.saga(OrderSaga)
    with pytest.raises(ConfigurationError, match="already registered"):
        endpoint.saga(OrderSaga)
    with pytest.raises(ConfigurationError, match="concurrency must be one of"):
        Endpoint("shop").saga(OrderSaga, concurrency="hopeful")
    with pytest.raises(ConfigurationError, match="cannot have sagas"):
        Endpoint("shop", send_only=True).saga(OrderSaga)

    class NeedsArguments(Twice):
        def __init__(self, db: object) -> None:
            self.db = db

    with pytest.raises(ConfigurationError, match="constructible without arguments"):
        Endpoint("shop").saga(NeedsArguments)


def test_the_state_version_changes_with_the_fields_only() -> None:
    class Same(msgspec.Struct):
        """Another docstring and name, the same fields."""

        key: str = ""
        count: int = 0

    class Wider(msgspec.Struct):
        key: str = ""
        count: float = 0

    assert state_version(Keyed) == state_version(Same)
    assert state_version(Keyed) != state_version(Wider)
    assert len(state_version(Keyed)) <= 23  # the SagaTypeVersion column


def test_uuid_and_int_correlation_values_get_their_column_types() -> None:
    class ById(msgspec.Struct):
        key: uuid.UUID = uuid.UUID(int=0)

    class ByNumber(msgspec.Struct):
        key: int = 0

    for state, column in ((ById, "uuid"), (ByNumber, "bigint")):
        endpoint = Endpoint("shop")

        class Typed(Saga[state]):  # type: ignore[valid-type]
            correlation = "key"

            @starts(correlate="key")
            async def start(self, message: Start, context: HandlerContext) -> None: ...

        endpoint.saga(Typed)
        assert f'"Correlation_key" {column}' in endpoint.sagas.definitions[0].table.sql[
            "add_column"]


def test_saga_tables_are_installed_and_granted() -> None:
    endpoint = Endpoint("fulfilment")
    endpoint.saga(OrderSaga)
    tables = EndpointTables.of(endpoint, endpoint.settings)
    assert ("saga", endpoint.sagas.tables[0]) in tables.named()
    grants = endpoint_grants(endpoint, endpoint.settings, "app")
    assert ('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "public"."fulfilment_OrderSaga" '
            'TO "app";') in grants
