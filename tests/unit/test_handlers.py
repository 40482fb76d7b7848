from __future__ import annotations

import msgspec
import pytest

from endpoint_runtime import ConfigurationError, Endpoint, HandlerContext


class PlaceOrder(msgspec.Struct):
    order_id: str


class NotAStruct:
    pass


def test_decorator_registers_and_returns_the_function_unchanged() -> None:
    endpoint = Endpoint("sales")

    async def place(message: PlaceOrder, context: HandlerContext) -> None:
        return None

    assert endpoint.handler(place) is place
    assert endpoint.registry.handlers_for(PlaceOrder) == [place]


def test_decorator_with_options_and_several_handlers_keep_order() -> None:
    endpoint = Endpoint("sales")

    @endpoint.handler
    async def first(message: PlaceOrder, context: HandlerContext) -> None: ...

    @endpoint.handler(message_type=PlaceOrder)
    async def second(message, context):  # type: ignore[no-untyped-def]
        ...

    assert endpoint.registry.handlers_for(PlaceOrder) == [first, second]


def test_invalid_registrations_fail_at_once() -> None:
    endpoint = Endpoint("sales")

    async def handle(message: PlaceOrder, context: HandlerContext) -> None: ...

    endpoint.register(handle)
    with pytest.raises(ConfigurationError, match="already registered"):
        endpoint.register(handle)

    def not_async(message: PlaceOrder, context: HandlerContext) -> None: ...

    with pytest.raises(ConfigurationError, match="async"):
        endpoint.register(not_async)  # type: ignore[arg-type]

    async def unannotated(message, context):  # type: ignore[no-untyped-def]
        ...

    with pytest.raises(ConfigurationError, match="annotate"):
        endpoint.register(unannotated)

    async def wrong_type(message: NotAStruct, context: HandlerContext) -> None: ...

    with pytest.raises(ConfigurationError, match=r"not a msgspec\.Struct"):
        endpoint.register(wrong_type)

    async def three_parameters(message: PlaceOrder, context: HandlerContext, x: int) -> None: ...

    with pytest.raises(ConfigurationError, match=r"\(message, context\) or \(message\) alone"):
        endpoint.register(three_parameters)

    async def keyword_only(message: PlaceOrder, *, context: HandlerContext) -> None: ...

    with pytest.raises(ConfigurationError, match=r"\(message, context\) or \(message\) alone"):
        endpoint.register(keyword_only)


def test_send_only_endpoint_cannot_have_handlers() -> None:
    endpoint = Endpoint("web", send_only=True)

    async def handle(message: PlaceOrder, context: HandlerContext) -> None: ...

    with pytest.raises(ConfigurationError, match="send-only"):
        endpoint.register(handle)


def test_endpoint_settings_are_checked_when_built() -> None:
    with pytest.raises(ConfigurationError, match="transaction_mode"):
        Endpoint("sales", transaction_mode="sometimes")
    with pytest.raises(ConfigurationError, match="NONE"):
        Endpoint("sales", transaction_mode="none", immediate_retries=3)
    with pytest.raises(ConfigurationError, match="batched"):
        Endpoint("sales", transaction_mode="receive_only", batch_size=10)
    with pytest.raises(ConfigurationError):
        Endpoint("sales", max_concurrency=0)
    assert Endpoint("sales", transaction_mode="none").settings.retries == 0
    assert Endpoint("sales").settings.retries == 5


def test_import_path_is_found_for_module_level_endpoints() -> None:
    from tests.unit import module_endpoint

    assert module_endpoint.endpoint.import_path == "tests.unit.module_endpoint:endpoint"
    local = Endpoint("nowhere")
    with pytest.raises(ConfigurationError, match="module-level"):
        _ = local.import_path


def test_a_deployment_cannot_move_an_endpoint_to_another_schema() -> None:
    import asyncio

    from endpoint_runtime import EndpointDeployment, TransportSettings
    from tests.unit import module_endpoint

    with pytest.raises(ConfigurationError, match="schema"):
        asyncio.run(EndpointDeployment.start(
            module_endpoint.endpoint, transport=TransportSettings(schema="elsewhere")))
