"""Settings: frozen, keyword-only msgspec Structs, from code, a TOML file, or the environment.

Precedence, highest first: keyword arguments in code, environment variables
(``ENDPOINT_RUNTIME_<FIELD>``), the TOML file's table, the defaults below. Values are validated
when loaded (``msgspec.convert``), and the structs are picklable so Ray actors can take them.

Example::

    settings = load_settings(TransportSettings, path="endpoint.toml", peek_delay=0.5)
"""

from __future__ import annotations

import os
import tomllib
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from endpoint_runtime.errors import ConfigurationError

ENV_PREFIX = "ENDPOINT_RUNTIME_"

MIN_PEEK_DELAY = 0.1
MAX_RECOMMENDED_PEEK_DELAY = 10.0


class TransportSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the PostgreSQL transport reaches and uses the database.

    Attributes:
        dsn: PostgreSQL connection string. ``None``: ``ENDPOINT_RUNTIME_DSN``, else libpq
            ``PG*`` variables, else an embedded server (see :mod:`endpoint_runtime.embedded`).
        schema: default schema of queue tables.
        create_body_string_column: add the human-readable ``body_string`` generated column.
        notify_on_send: queue tables NOTIFY on insert so idle receivers wake at once.
        peek_delay: seconds between peeks of an empty queue (below 0.1 rejected, above 10 warned).
        max_records_to_peek: cap on the peek estimate (``None``: no cap).
        purge_batch_size: rows deleted per statement when purging expired messages.
        pool_max_size: connections per process-level pool.
    """

    dsn: str | None = None
    schema: str = "public"
    create_body_string_column: bool = False
    notify_on_send: bool = True
    peek_delay: float = 1.0
    max_records_to_peek: int | None = None
    purge_batch_size: int = 10_000
    pool_max_size: int = 10

    def __post_init__(self) -> None:
        if self.peek_delay < MIN_PEEK_DELAY:
            raise ConfigurationError(
                f"peek_delay must be at least {MIN_PEEK_DELAY} s (got {self.peek_delay}): "
                "shorter delays put needless load on the database"
            )
        if self.peek_delay > MAX_RECOMMENDED_PEEK_DELAY:
            warnings.warn(
                f"peek_delay {self.peek_delay} s is above the recommended "
                f"{MAX_RECOMMENDED_PEEK_DELAY} s; messages may back up or expire",
                stacklevel=2,
            )
        if self.max_records_to_peek is not None and self.max_records_to_peek < 1:
            raise ConfigurationError("max_records_to_peek must be at least 1")
        if self.purge_batch_size < 1:
            raise ConfigurationError("purge_batch_size must be at least 1")
        if self.pool_max_size < 1:
            raise ConfigurationError("pool_max_size must be at least 1")

    def __repr__(self) -> str:
        # Never show a password, even in a repr that ends up in a traceback.
        from endpoint_runtime.embedded import redact_dsn

        fields = {f: getattr(self, f) for f in self.__struct_fields__}
        fields["dsn"] = redact_dsn(self.dsn) if self.dsn else None
        return f"TransportSettings({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


S = TypeVar("S", bound=msgspec.Struct)


def settings_from_env(
    settings_type: type[msgspec.Struct], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Fields of ``settings_type`` found as ``ENDPOINT_RUNTIME_<FIELD>`` variables."""
    env = os.environ if environ is None else environ
    found = {}
    for field in settings_type.__struct_fields__:
        value = env.get(ENV_PREFIX + field.upper())
        if value is not None:
            found[field] = value
    return found


def load_settings(
    settings_type: type[S],
    *,
    path: str | Path | None = None,
    table: str | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> S:
    """Build validated settings from a TOML file, the environment and keyword overrides.

    ``table`` names the TOML table to read (default: none, i.e. the top level).
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            document = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"cannot read settings file {path}: {exc}") from exc
        section = document.get(table, {}) if table else document
        values.update(section)
    values.update(settings_from_env(settings_type, environ))
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        # strict=False lets "0.5" from the environment become a float, "true" a bool.
        return msgspec.convert(values, settings_type, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigurationError(f"invalid {settings_type.__name__}: {exc}") from exc
