"""Progress of a report on stderr: one line per stage as it starts and ends, with its time.

Spark's own console progress bar (``spark.ui.showConsoleProgress``) draws the tasks of each
Spark stage below it when stderr is a terminal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    """Times named stages and says so.

    Example::

        progress = Progress(total=3)
        with progress.stage("read", "reading audit_log"):
            ...
        progress.timings  # {"read": 1.2}
    """

    def __init__(self, total: int, stream: TextIO | None = None, prefix: str = "report") -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.prefix = prefix
        self.timings: dict[str, float] = {}
        self.entered: Callable[[str], None] | None = None
        """Called with a stage's key as it starts (the job names the Spark jobs after it)."""
        self._started = time.perf_counter()

    @contextmanager
    def stage(self, key: str, text: str) -> Iterator[None]:
        """Time the block under ``key`` (in :attr:`timings`), announcing ``text``."""
        number = len(self.timings) + 1
        self.say(f"[{number}/{self.total}] {text} ...")
        if self.entered is not None:
            self.entered(key)
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.timings[key] = round(elapsed, 3)
        self.say(f"[{number}/{self.total}] {text}: {elapsed:.1f} s")

    def say(self, text: str) -> None:
        print(f"{self.prefix}: {text}", file=self.stream, flush=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._started
