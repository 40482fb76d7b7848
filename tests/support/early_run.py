"""A long command a test waits for: started once, read by several tests.

The chaos run (``python -m benchmarks.chaos`` at CI size) is a process of about two and a half
minutes that spends most of them waiting: for its send stream, its kill intervals, Ray's node
health checks and its drains. The tests that read it are one unit of work of the suite's
workers (``tests/conftest.py``), handed out last: their fixture starts it
(:meth:`EarlyRun.finished`) and waits for it.

Its standard output and error go to files (a pipe nobody reads while it runs could fill and
stall it); a run still going when the session ends is killed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Finished:
    """What the command left: its exit status, standard output and the tail of its errors."""

    returncode: int
    stdout: str
    stderr_tail: str


class EarlyRun:
    """``command`` run in ``cwd``, with ``RAY_*`` variables of the suite's own Ray removed."""

    def __init__(self, command: Sequence[str], cwd: Path, timeout: float) -> None:
        self.command = list(command)
        self.cwd = cwd
        self.timeout = timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._started = 0.0
        self._directory: Path | None = None

    @property
    def started(self) -> bool:
        return self._process is not None

    def start(self) -> None:
        """Start the command (once; later calls do nothing)."""
        if self._process is not None:
            return
        self._directory = Path(tempfile.mkdtemp(prefix="endpoint-runtime-early-run-"))
        environment = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        with (self._directory / "stdout").open("wb") as stdout, \
                (self._directory / "stderr").open("wb") as stderr:
            self._process = subprocess.Popen(self.command, cwd=self.cwd, env=environment,
                                             stdout=stdout, stderr=stderr)
        self._started = time.monotonic()

    def finished(self) -> Finished:
        """Start the command unless started, wait for it (``timeout`` s from its start, then
        it is killed and the wait fails) and return what it left."""
        self.start()
        assert self._process is not None
        assert self._directory is not None
        left = self.timeout - (time.monotonic() - self._started)
        try:
            returncode = self._process.wait(timeout=max(left, 0.0))
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            raise AssertionError(f"{' '.join(self.command)} did not end within "
                                 f"{self.timeout:g} s of its start; its errors: "
                                 f"{self._tail()}") from None
        return Finished(returncode, (self._directory / "stdout").read_text(errors="replace"),
                        self._tail())

    def stop(self) -> None:
        """Kill the command if it still runs, and remove its files."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    def _tail(self, lines: int = 60) -> str:
        assert self._directory is not None
        text = (self._directory / "stderr").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])
