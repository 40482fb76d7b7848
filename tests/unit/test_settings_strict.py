"""Settings are strict: a misspelt name fails at once, naming the closest valid one."""

from __future__ import annotations

import pytest

from endpoint_runtime import ConfigurationError, Endpoint
from endpoint_runtime.settings import EndpointSettings, TransportSettings, load_settings, replace


@pytest.mark.parametrize(("options", "message"), [
    ({"max_concurency": 8}, "'max_concurency'; did you mean 'max_concurrency'?"),
    ({"transport": {"peek_dealy": 1}},
     "'transport.peek_dealy'; did you mean 'transport.peek_delay'?"),
    ({"colour": "blue"}, "unknown EndpointSettings setting 'colour'"),
])
def test_an_unknown_endpoint_setting_fails_naming_the_closest_name(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("?", r"\?")):
        Endpoint("typo", **options)  # type: ignore[arg-type]


def test_overrides_of_given_settings_and_outbox_options_are_checked_too() -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'max_concurrency'"):
        Endpoint("typo", settings=EndpointSettings(), max_concurency=3)
    with pytest.raises(ConfigurationError, match=r"did you mean 'outbox\.pessimistic'"):
        Endpoint("typo", transaction_mode="receive_only", outbox={"pesimistic": True})


def test_loaded_settings_are_checked_by_name_and_by_literal_values() -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'peek_delay'"):
        load_settings(TransportSettings, peek_dealy=2.0)
    with pytest.raises(ConfigurationError, match="on_critical_error"):
        load_settings(EndpointSettings, on_critical_error="ignore")
    with pytest.raises(ConfigurationError, match=r"did you mean 'outbox\.isolation'"):
        load_settings(EndpointSettings, transaction_mode="receive_only",
                      outbox={"isolaton": "serializable"})


def test_replace_validates_names_and_invariants() -> None:
    settings = EndpointSettings(max_concurrency=4)
    assert replace(settings, max_concurrency=8).max_concurrency == 8
    with pytest.raises(ConfigurationError, match="did you mean 'batch_size'"):
        replace(settings, batchsize=3)
    with pytest.raises(ConfigurationError, match="at least 1"):
        replace(settings, max_concurrency=0)
