"""How ``--follow`` stops: the first SIGINT or SIGTERM asks for a graceful stop, the second
stops at once.

A graceful stop lets the round in progress finish (an incremental run, or a micro-batch of the
streaming query), then stops the streaming query and returns: the output is whole up to its
horizon and the command exits 0. A second signal raises :class:`KeyboardInterrupt` at once
(the jobs running are cancelled); the output is still consistent (its manifest is the commit
point: the next run reads the same rows again), the command exits 130.

Signal handlers belong to the main thread: elsewhere (a thread of a test or of an embedding
application) nothing is installed and only ``request`` stops.

Example::

    with StopRequest(progress) as stop:
        while not stop.requested:
            ...
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from endpoint_runtime.analytics.progress import Progress

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Whether a stop was asked for (:attr:`requested`: the signal's name), from a signal or
    :meth:`request`."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        self.install()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def install(self) -> None:
        """(Re)install the handlers: starting Spark replaces the SIGINT handler with its own
        (it cancels the jobs and raises), so this is called again once Spark runs."""
        if threading.current_thread() is not threading.main_thread():
            return
        for number in SIGNALS:
            previous = signal.signal(number, self._on_signal)
            self._previous.setdefault(number, previous)

    def request(self, reason: str) -> None:
        if self.requested is None:
            self.requested = reason
            self.progress.say(f"live: {reason}: stopping after the round in progress "
                              f"(send it again to stop at once)")

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            self._at_once()
        self.request(signal.Signals(number).name)

    def _at_once(self) -> None:
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        if context is not None:
            context.cancelAllJobs()
        raise KeyboardInterrupt
