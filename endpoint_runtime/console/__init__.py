"""The operator's web console: failed messages grouped by exception (retry, archive,
restore, each action logged), a message's headers, body and stack trace, queues and endpoints,
message search and a conversation's sequence diagram.

A Starlette app rendering Jinja2 templates (autoescaped) on the server; no JavaScript build.
``endpoint-runtime console`` serves it with uvicorn. See docs/console.md.

Example::

    app = create_app(TransportSettings(dsn=...), token="secret", read_only=True)
"""

from __future__ import annotations

from endpoint_runtime.console.app import create_app

__all__ = ["create_app"]
