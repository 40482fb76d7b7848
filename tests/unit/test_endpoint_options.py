"""``EndpointOptions`` (the typed keywords of ``Endpoint``) and ``EndpointSettings`` stay in
step: the same names, and every value a setting holds is one its keyword accepts."""

from __future__ import annotations

import types
import typing
from typing import Any

from endpoint_runtime.settings import EndpointOptions, EndpointSettings


def _members(annotation: Any) -> set[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(_members(a) for a in typing.get_args(annotation)))
    return {annotation}


def test_every_setting_is_a_typed_keyword_and_every_keyword_a_setting() -> None:
    options = typing.get_type_hints(EndpointOptions)
    settings = typing.get_type_hints(EndpointSettings)
    assert set(options) == set(settings)
    for name, annotation in settings.items():
        assert _members(annotation) <= _members(options[name]), name


def test_the_check_would_see_a_missing_keyword_and_a_narrower_type() -> None:
    class Missing(typing.TypedDict, total=False):  # the fault the test above looks for
        max_concurrency: int

    class Narrower(typing.TypedDict, total=False):
        audit_queue: str  # the setting also holds None

    settings = typing.get_type_hints(EndpointSettings)
    assert set(typing.get_type_hints(Missing)) != set(settings)
    narrower = typing.get_type_hints(Narrower)["audit_queue"]
    assert not _members(settings["audit_queue"]) <= _members(narrower)
