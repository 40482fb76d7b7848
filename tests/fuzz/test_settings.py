"""Settings from anywhere (keyword arguments, the environment, a TOML file, ``replace``):
any value of any name is taken, or refused with a ConfigurationError; never another error,
never a setting of the wrong type."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.settings import (
    ENV_PREFIX,
    EndpointSettings,
    TransportSettings,
    load_settings,
    replace,
)
from tests.fuzz.conftest import outcome
from tests.fuzz.strategies import json_values, storable_text

FIELDS = [field.name for field in msgspec.structs.fields(EndpointSettings)]
TRANSPORT_FIELDS = [field.name for field in msgspec.structs.fields(TransportSettings)]

setting_names = st.one_of(st.sampled_from(FIELDS), st.sampled_from(TRANSPORT_FIELDS),
                          st.text(min_size=1, max_size=12))
# Values of the types settings have, of the wrong ones, and edge numbers.
setting_values = st.one_of(
    json_values, st.floats(), st.integers(-(2**70), 2**70), st.sampled_from([
        0, -1, 1, 0.0999, 1e308, float("inf"), float("nan"), "", "none", "stop", "log",
        "none", "receive_only", "sends_atomic_with_receive", True, False, None]),
)


def check_typed(settings: EndpointSettings | TransportSettings) -> None:
    """The settings hold values of their declared types: converting them back and forth
    through builtins is the identity (a string where a number belongs would fail here)."""
    builtins = msgspec.to_builtins(settings)
    assert msgspec.convert(builtins, type(settings)) == settings
    for struct in (settings, getattr(settings, "transport", None),
                   getattr(settings, "delayed_delivery", None), getattr(settings, "outbox", None)):
        for name in getattr(struct, "__struct_fields__", ()):
            value = getattr(struct, name)
            assert not isinstance(value, float) or math.isfinite(value), (name, value)


def loaded_or_refused(result: Any) -> None:
    if isinstance(result, ConfigurationError):
        assert str(result)
        return
    assert isinstance(result, EndpointSettings | TransportSettings), result
    check_typed(result)


@given(values=st.dictionaries(setting_names, setting_values, max_size=4))
@example(values={"circuit_breaker_time_to_trigger": float("nan")})  # taken before the fix
def test_keyword_settings_load_or_are_refused(values: dict[str, Any]) -> None:
    loaded_or_refused(outcome(lambda: load_settings(EndpointSettings, environ={}, **values)))


@given(values=st.dictionaries(setting_names, storable_text, max_size=4))
def test_environment_settings_load_or_are_refused(values: dict[str, str]) -> None:
    environ = {ENV_PREFIX + name.upper(): value for name, value in values.items()}
    loaded_or_refused(outcome(lambda: load_settings(EndpointSettings, environ=environ)))
    loaded_or_refused(outcome(lambda: load_settings(TransportSettings, environ=environ)))


@given(text=st.one_of(storable_text, st.dictionaries(setting_names, setting_values, max_size=4)
                      .map(lambda values: "\n".join(f"{k} = {v!r}" for k, v in values.items()))))
def test_a_settings_file_loads_or_is_refused(text: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "endpoint.toml"
        path.write_text(text, encoding="utf-8")
        loaded_or_refused(outcome(lambda: load_settings(EndpointSettings, path=path,
                                                        environ={})))


@given(changes=st.dictionaries(setting_names, setting_values, min_size=1, max_size=3))
@example(changes={"max_concurrency": None})  # TypeError in __post_init__ before the fix
@example(changes={"peek_delay": float("nan")})  # taken before the fix
def test_replace_takes_valid_changes_or_refuses_them(changes: dict[str, Any]) -> None:
    loaded_or_refused(outcome(lambda: replace(EndpointSettings(), **changes)))


def test_replace_converts_values_like_a_settings_file() -> None:
    """Found by the property above: ``replace`` (Endpoint(settings=..., **overrides),
    deployment overrides) kept values of any type, and a None or a string then failed the
    invariant checks with a TypeError, or was kept."""
    settings = replace(EndpointSettings(), max_concurrency="8",
                       transport={"peek_delay": "0.5"})
    assert settings.max_concurrency == 8
    assert settings.transport == TransportSettings(peek_delay=0.5)
    for wrong in ({"max_concurrency": None}, {"max_concurrency": "eight"},
                  {"delayed_retry_delay": float("nan")}, {"stop_timeout": float("inf")},
                  {"transport": {"peek_delay": float("nan")}}):
        with pytest.raises(ConfigurationError):
            replace(EndpointSettings(), **wrong)
