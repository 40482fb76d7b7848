"""Helpers of the command-line tests: message types to name with ``--type``, and a runner.

``run_cli`` calls :func:`endpoint_runtime.cli.main` in this process and returns its exit
status with what it printed. ``main`` configures structlog once per process, binding the
``sys.stderr`` of the moment (pytest's capture, closed after the test) and the warning level
of the commands; ``quiet_logging`` keeps the test session's own logging configuration intact.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, MutableMapping
from typing import Any, NamedTuple

import msgspec
import pytest
import structlog

import endpoint_runtime.cli
from endpoint_runtime.cli import main


class ChargeCard(msgspec.Struct, kw_only=True):
    card: str
    amount: int
    note: str = ""


class NotAMessage:
    """A class that is not a msgspec Struct: ``send --type`` refuses it."""


CHARGE_CARD = f"{__name__}:ChargeCard"


class Outcome(NamedTuple):
    code: int
    out: str
    err: str


def quiet_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoint_runtime.cli, "configure_logging", lambda level: None)


@contextlib.contextmanager
def run_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MutableMapping[str, Any]]]:
    """Every event ``run`` logs, info level included, whatever an earlier test left behind.

    Logging is configured with ``cache_logger_on_first_use``: the module's logger keeps the
    level filter and processors of the configuration it was first used under (a command of an
    earlier test configures warnings only), so ``capture_logs`` alone may see nothing. Here
    the level filter is lifted and ``run`` gets a fresh logger for the duration.
    """
    import endpoint_runtime.cli.run as run_module

    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with structlog.testing.capture_logs() as logs:
            monkeypatch.setattr(run_module, "log", structlog.get_logger("endpoint_runtime.cli"))
            yield logs
    finally:
        structlog.configure(**saved)


# A line Ray forwards from a worker process: "(Peeker pid=42) ...", maybe coloured. Actors
# of a deployment that an earlier test stopped may still have lines on their way to this
# process's stderr; they are not the command's output.
RAY_FORWARDED = re.compile(r"^(\x1b\[[0-9;]*m)?\((\w+ )?pid=\d+[^)]*\)")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Outcome:
    """Run ``endpoint-runtime ARGV...`` in-process; earlier captured output is dropped."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    err = "".join(line for line in err.splitlines(keepends=True)
                  if not RAY_FORWARDED.match(line))
    return Outcome(code, out, err)
