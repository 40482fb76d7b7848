"""Rules every settings struct follows: names checked with the closest valid one offered,
numbers finite, changes converted and validated like loaded settings, nested settings merged.

Kept apart from :mod:`endpoint_runtime.settings` (the settings themselves), which re-exports
them.
"""

from __future__ import annotations

import difflib
import math
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from endpoint_runtime.errors import ConfigurationError

S = TypeVar("S", bound=msgspec.Struct)


def struct_type(annotation: Any) -> type[msgspec.Struct] | None:
    """The Struct type of a field annotated ``SomeStruct`` or ``SomeStruct | None``."""
    candidates = typing.get_args(annotation) or (annotation,)
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def check_finite(settings: msgspec.Struct) -> None:
    """Fail on a number setting that is NaN or infinite: NaN passes every range check, and an
    infinite duration overflows what is computed from it."""
    for name in settings.__struct_fields__:
        value = getattr(settings, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigurationError(f"{name} must be a finite number (got {value})")


def check_names(settings_type: type[msgspec.Struct], values: Mapping[str, Any],
                where: str = "") -> None:
    """Fail on a setting name ``settings_type`` does not have, naming the closest valid one
    (``max_concurency`` -> ``max_concurrency``); nested settings are checked too."""
    fields = {field.name: field for field in msgspec.structs.fields(settings_type)}
    for name, value in values.items():
        field = fields.get(name)
        if field is None:
            close = difflib.get_close_matches(name, fields, n=1)
            hint = f"; did you mean {where + close[0]!r}?" if close else ""
            raise ConfigurationError(
                f"unknown {settings_type.__name__} setting {where + name!r}{hint}")
        nested = struct_type(field.type)
        if nested is not None and isinstance(value, Mapping):
            check_names(nested, value, f"{where}{name}.")


def replace(settings: S, **changes: Any) -> S:
    """A copy of ``settings`` with ``changes``, validated like settings loaded from a file:
    unknown names fail with the closest valid one, values take their field's type (``"8"``
    becomes 8) or fail, invariants are checked."""
    check_names(type(settings), changes)
    types = {field.name: field.type for field in msgspec.structs.fields(settings)}
    converted = {}
    for name, value in changes.items():
        try:
            converted[name] = msgspec.convert(value, types[name], strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigurationError(
                f"invalid {type(settings).__name__} setting {name!r}: {exc}") from exc
    changed = msgspec.structs.replace(settings, **converted)
    post_init = getattr(changed, "__post_init__", None)
    if post_init is not None:
        post_init()
    return changed
