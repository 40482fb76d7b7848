"""structlog set-up: console output on a terminal, JSON lines otherwise.

Per-message context (endpoint, message_id, attempt) is bound with structlog's contextvars by
the chain's first step (``log_context``) for each message, so every log line of a handler
carries it. Each line names the logger that wrote it (``component``, e.g.
``endpoint_runtime.chain.pipeline``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import threading
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

_configured = False

_message_context: contextvars.ContextVar[tuple[str, str, int] | None] = contextvars.ContextVar(
    "endpoint_runtime_message", default=None
)


def bind_message_context(endpoint: str, message_id: str, attempt: int) -> None:
    """Set the per-message log context of the current task (one ContextVar write: this runs
    for every message). Keys a handler binds itself with ``structlog.contextvars`` are not
    cleared between messages; bind them with ``bound_contextvars(...)`` as a context manager."""
    _message_context.set((endpoint, message_id, attempt))


def merge_message_context(
    logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor adding ``endpoint``, ``message_id`` and ``attempt``."""
    context = _message_context.get()
    if context is not None:
        event_dict.setdefault("endpoint", context[0])
        event_dict.setdefault("message_id", context[1])
        event_dict.setdefault("attempt", context[2])
    return event_dict


class WholeLines:
    """A text stream that passes on what each thread writes as whole lines, one write each.

    ``print`` writes a line and its newline in two calls. In a driver process Ray's thread
    prints the actors' lines while the main thread logs its own, so without this a line of
    one could land inside a line of the other ("...}{"event": ...}"): two JSON log lines
    neither of which parses. Here each thread's text waits until its newline (or its own
    ``flush``), then goes out whole under a lock. Everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._lock = threading.Lock()
        self._partial = threading.local()

    def write(self, text: str) -> int:
        pending = getattr(self._partial, "text", "") + text
        lines, newline, rest = pending.rpartition("\n")
        self._partial.text = rest
        if newline:
            with self._lock:
                self.stream.write(lines + newline)
        return len(text)

    def flush(self) -> None:
        rest = getattr(self._partial, "text", "")
        self._partial.text = ""
        with self._lock:
            if rest:
                self.stream.write(rest)
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def whole_lines_output() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` :class:`WholeLines` (once): for a process whose
    output several threads write, as a Ray driver's does (``runtime.actors.cluster``)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, WholeLines):
            setattr(sys, name, WholeLines(stream))


class StderrLogger:
    """Writes each line to the ``sys.stderr`` of the moment (not the one at configuration:
    a test runner or a daemon may replace or close it), and never fails: a log line that
    cannot be written is dropped rather than failing the message being processed. ``name``:
    the name given to ``structlog.get_logger``, shown as ``component``."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name

    def msg(self, message: str) -> None:
        with contextlib.suppress(ValueError, OSError):  # closed or broken stream
            print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = error = err = critical = fatal = exception = msg
    failure = msg


def _stderr_logger(*args: Any) -> StderrLogger:
    return StderrLogger(str(args[0]) if args else None)


def add_component(
    logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor adding ``component``: the name of the logger that wrote the line."""
    if isinstance(logger, StderrLogger) and logger.name:
        event_dict.setdefault("component", logger.name)
    return event_dict


def use_colors() -> bool:
    """Colour codes only for a terminal: ``ENDPOINT_RUNTIME_LOG_COLORS`` (``1``/``0``) when set
    (Ray actors get the driver's choice, their own stderr being a file), else whether stderr
    is a terminal."""
    chosen = os.environ.get("ENDPOINT_RUNTIME_LOG_COLORS")
    if chosen is not None:
        return chosen == "1"
    return sys.stderr.isatty()


def configure_logging(level: str | None = None, *, json: bool | None = None) -> None:
    """Configure structlog once per process (drivers and Ray actors alike).

    ``ENDPOINT_RUNTIME_LOG_LEVEL`` (default ``info``) and ``ENDPOINT_RUNTIME_LOG_FORMAT``
    (``json`` or ``console``) override the defaults; console lines carry colour codes only on a
    terminal (:func:`use_colors`).
    """
    global _configured
    if _configured:
        return
    level_name = (level or os.environ.get("ENDPOINT_RUNTIME_LOG_LEVEL", "info")).upper()
    if json is None:
        chosen = os.environ.get("ENDPOINT_RUNTIME_LOG_FORMAT")
        json = chosen == "json" if chosen else not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json
        else structlog.dev.ConsoleRenderer(colors=use_colors())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            merge_message_context,
            add_component,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level_name, logging.INFO)
        ),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=True,
    )
    _configured = True
