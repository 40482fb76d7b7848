"""Passwords kept out of sight: a DSN as logs, reprs and error messages show it.

Below everything that handles a DSN (settings, the embedded server, connecting, the CLI), so
that each of them can redact without importing the others.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlsplit, urlunsplit

# A keyword DSN's settings: key = value, the value bare or in single quotes (in which \\ escapes
# the next character; an unterminated quote runs to the end).
_KEYWORD_SETTING = re.compile(r"(?P<key>[A-Za-z_]\w*)(?P<equals>\s*=\s*)"
                              r"(?P<value>'(?:\\.|[^\\'])*(?:'|\\?$)|[^\s']\S*|)")
_SECRET_KEYS = frozenset({"password", "sslpassword"})
REDACTED = "***"


def redact_dsn(dsn: str) -> str:
    """The DSN with every password replaced by ``***``: the URL's user info, ``password=`` in
    its query string, and keyword settings, quoted values (spaces, escaped quotes) included.
    Also fit for error messages that quote a DSN."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        if parts.password is not None:
            user = parts.username or ""
            host = parts.netloc.rpartition("@")[2]
            parts = parts._replace(netloc=f"{user}:{REDACTED}@{host}")
        query = "&".join(
            f"{pair.partition('=')[0]}={REDACTED}" if _is_secret(pair.partition("=")[0]) else pair
            for pair in parts.query.split("&")
        )
        return urlunsplit(parts._replace(query=query))
    return _KEYWORD_SETTING.sub(
        lambda m: f"{m['key']}{m['equals']}{REDACTED}" if _is_secret(m["key"]) else m[0], dsn
    )


def _is_secret(key: str) -> bool:
    return unquote(key).strip().lower() in _SECRET_KEYS


class RedactedDsn(str):
    """A DSN whose ``repr`` hides its password: in a config struct's repr, a traceback, a
    log line or a Ray actor's error, only ``***`` shows (``str()`` is the DSN itself, which
    the driver needs)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(redact_dsn(str(self)))


class OtelEnvironment(dict[str, str]):
    """``OTEL_*`` variables handed to Ray actors, whose ``repr`` hides the values of the
    ``..._HEADERS`` ones (an OTLP exporter's headers carry API keys): a deployment's config
    shows ``***`` there. Like a DSN's password, they still travel pickled inside the actors'
    arguments; set them in each node's environment instead to keep them off Ray."""

    @classmethod
    def of(cls, environ: dict[str, str] | os._Environ[str]) -> OtelEnvironment:
        """The ``OTEL_*`` variables of ``environ``."""
        return cls({key: value for key, value in environ.items() if key.startswith("OTEL_")})

    def __repr__(self) -> str:
        return repr({key: REDACTED if "HEADERS" in key else value for key, value in self.items()})

    def __reduce__(self) -> tuple[type[OtelEnvironment], tuple[dict[str, str]]]:
        return (OtelEnvironment, (dict(self),))
