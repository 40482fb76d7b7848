"""structlog set-up: console output on a terminal, JSON lines otherwise.

Per-message context (endpoint, message_id, attempt) is bound with structlog's contextvars by
the pipeline at the start of each message, so every log line of a handler carries it.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

_configured = False


def configure_logging(level: str | None = None, *, json: bool | None = None) -> None:
    """Configure structlog once per process (drivers and Ray actors alike).

    ``ENDPOINT_RUNTIME_LOG_LEVEL`` (default ``info``) and ``ENDPOINT_RUNTIME_LOG_FORMAT``
    (``json`` or ``console``) override the defaults.
    """
    global _configured
    if _configured:
        return
    level_name = (level or os.environ.get("ENDPOINT_RUNTIME_LOG_LEVEL", "info")).upper()
    if json is None:
        chosen = os.environ.get("ENDPOINT_RUNTIME_LOG_FORMAT")
        json = chosen == "json" if chosen else not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level_name, logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    _configured = True
