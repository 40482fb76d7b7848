"""Group actions in the background: a retry or archive of many messages runs as a task of the
console's process, one message (one transaction) at a time, and its page shows the progress.

The jobs of one console live in its :class:`Jobs` (no global state); when the console stops,
running jobs are awaited a little and then cancelled: every message moved so far stays moved,
the others stay in the error queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections.abc import Awaitable, Callable

import msgspec

STOP_GRACE = 5.0
KEPT = 100
"""Finished jobs kept for their pages."""

MoveOne = Callable[[uuid.UUID], Awaitable[str | None]]
"""Moves one message; returns why it stayed, or None when it moved."""


class Job(msgspec.Struct, kw_only=True):
    id: str
    action: str
    total: int
    done: int = 0
    stayed: list[str] = msgspec.field(default_factory=list)
    finished: bool = False

    @property
    def outcome(self) -> str:
        verb = {"retry": "retried", "archive": "archived", "restore": "restored"}[self.action]
        text = f"{self.done - len(self.stayed)} {verb}"
        if self.stayed:
            text += f"; {len(self.stayed)} stayed: {self.stayed[0]}"
        return text


class Jobs:
    """The background jobs of one console."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def start(self, action: str, native_ids: list[uuid.UUID], move: MoveOne,
              finished: Callable[[Job], Awaitable[None]]) -> Job:
        job = Job(id=secrets.token_hex(8), action=action, total=len(native_ids))
        self._jobs[job.id] = job
        while len(self._jobs) > KEPT:
            oldest = next(iter(self._jobs))
            if not self._jobs[oldest].finished:
                break
            del self._jobs[oldest]

        async def run() -> None:
            try:
                for native_id in native_ids:
                    why = await move(native_id)
                    if why is not None:
                        job.stayed.append(why)
                    job.done += 1
            finally:
                job.finished = True
                await finished(job)

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def stop(self) -> None:
        if not self._tasks:
            return
        _, running = await asyncio.wait(self._tasks, timeout=STOP_GRACE)
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError):
                await task
