"""Each deployment's last status, fetched in the background: a status line never waits long.

When a node is lost, a call to its peeker (or the peeker's calls to its receivers there)
blocks until Ray declares the node dead (10-17 s measured), and recreating a lost peeker takes
longer still. The driver asks in a task of its own and, at each status line, waits at most
:data:`STATUS_CALL_SECONDS` for the answer; without one it reports the last known figures and
says why (``peeker="unreachable"`` or ``"restarting"``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog

from endpoint_runtime.runtime.actors.deployment_status import DeploymentStatus
from endpoint_runtime.runtime.actors.peeker import PeekerNotes
from endpoint_runtime.runtime.deployment import EndpointDeployment

log = structlog.get_logger("endpoint_runtime.submit")

STATUS_CALL_SECONDS = 2.0
"""Longest wait for a peeker's answer (or a queue depth) before a status line goes out with
the last known figures."""


class StatusWatch:
    """The latest status of one deployment and whether its peeker answers.

    Example::

        watch = StatusWatch(deployment)
        fresh = await watch.refresh(STATUS_CALL_SECONDS)
        print(watch.peeker, watch.status)
    """

    def __init__(self, deployment: EndpointDeployment) -> None:
        self.deployment = deployment
        self.status: DeploymentStatus | None = None
        self.notes = PeekerNotes()
        """Receivers the peeker could not reach at its last look; a replacement."""
        self.peeker = "ok"
        """``ok``, ``unreachable`` (no answer in time) or ``restarting``."""
        self._task: asyncio.Task[tuple[DeploymentStatus, PeekerNotes]] | None = None

    async def refresh(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Ask for the status (unless a question is still open) and wait up to ``timeout``
        seconds; ``True`` when a new status came. Raises what the supervisor gave up with
        (Ray's ``RayActorError``: the peeker could not be recreated)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._ask())
        done, _ = await asyncio.wait({self._task}, timeout=timeout)
        if not done:
            self.peeker = "restarting" if self.deployment.restarting else "unreachable"
            return False
        task, self._task = self._task, None
        self.status, self.notes = task.result()
        self.peeker = "ok"
        return True

    async def _ask(self) -> tuple[DeploymentStatus, PeekerNotes]:
        status = await self.deployment.supervised_status()
        notes = PeekerNotes()
        with contextlib.suppress(Exception):  # a peeker lost just now: next time
            notes = await self.deployment.peeker.notes.remote()
        return status, notes

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None


async def bounded(awaitable: Any, timeout: float) -> Any:  # noqa: ASYNC109
    """``awaitable``'s result, or ``None`` when it takes longer than ``timeout`` seconds or
    fails (logged): a figure of a status line, never worth waiting for."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        return None
    except Exception as exc:
        log.warning("status_figure_unavailable", error=f"{type(exc).__name__}: {exc}"[:300])
        return None
