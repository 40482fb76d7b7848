"""The status lines of ``endpoint-runtime run``: one when something changed, not one per poll.

``run`` asks each deployment for its status every ``--status-interval`` seconds; an idle
endpoint would otherwise repeat the same line forever. :class:`StatusLines` logs a line at
info level when one of the figures a person watches changed since the last line it logged
(queue depth, peek estimate, receivers, messages in flight, the concurrency limit, processed
and failed counts), and otherwise at most one line a minute, at debug level.

Example::

    lines = StatusLines()
    level = lines.level_for(figures, now=time.monotonic())  # "info", "debug" or None
"""

from __future__ import annotations

from typing import Literal

import msgspec

UNCHANGED_EVERY_SECONDS = 60.0
"""How often an unchanged status is logged anyway (at debug level)."""

Level = Literal["info", "debug"]


class StatusFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What a status line says about one endpoint, but the rate (which moves by itself)."""

    endpoint: str
    depth: int | None
    estimate: int
    receivers: int
    in_flight: int
    max_concurrency: int
    processed: int
    failed: int


class StatusLines:
    """Decides, per endpoint, whether a status line is worth logging."""

    def __init__(self, unchanged_every: float = UNCHANGED_EVERY_SECONDS) -> None:
        self._unchanged_every = unchanged_every
        self._last: dict[str, tuple[StatusFigures, float]] = {}

    def level_for(self, figures: StatusFigures, *, now: float) -> Level | None:
        """``"info"`` when the figures changed since the endpoint's last line (or there was
        none), ``"debug"`` when they did not for ``unchanged_every`` seconds, else ``None``
        (no line). A line logged at either level counts as the last one."""
        last = self._last.get(figures.endpoint)
        level: Level | None
        if last is None or last[0] != figures:
            level = "info"
        elif now - last[1] >= self._unchanged_every:
            level = "debug"
        else:
            level = None
        if level is not None:
            self._last[figures.endpoint] = (figures, now)
        return level
