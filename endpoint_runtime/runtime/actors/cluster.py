"""Connecting to Ray: ``RAY_ADDRESS`` when set (a cluster), else a local Ray started here."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator

import ray
import structlog

from endpoint_runtime.logging import use_colors, whole_lines_output

log = structlog.get_logger("endpoint_runtime.cluster")

WORKER_NICENESS = 0
LOCAL_RAY_CONFIG = {
    "worker_niceness": WORKER_NICENESS,
    # Endpoints run actors only: no idle task workers kept warm beside them, taking CPU.
    "enable_worker_prestart": False,
    "prestart_worker_first_driver": False,
}


def ensure_ray() -> None:
    """Initialise Ray once per process.

    A local Ray's workers get this process's import path, so endpoints defined in the working
    tree (not only installed packages) can be imported by receivers. They also run at normal
    priority: Ray's default worker niceness (15) would starve receivers whenever PostgreSQL or
    anything else on the machine wants the CPU. On a cluster this is the cluster's setting
    (``RAY_worker_niceness=0`` in the environment of ``ray start``, as Ray Jobs does). No idle
    task workers are prestarted: endpoints use actors only.
    """
    if ray.is_initialized():
        return
    plain_actor_output()
    whole_lines_output()  # Ray's thread prints the actors' lines beside ours
    address = os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=True)
        log.info("ray_connected", address=address)
        return
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if os.getcwd() not in paths:
        paths.insert(0, os.getcwd())
    def start() -> None:
        with _without_token_notice():
            ray.init(
                include_dashboard=False,
                log_to_driver=True,
                runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths),
                                          **actor_log_format()}},
                configure_logging=False,
                _system_config=LOCAL_RAY_CONFIG,
            )

    start_with_retries(start, ray.shutdown)
    log.info("ray_started", resources=ray.cluster_resources())  # type: ignore[no-untyped-call]


LOCAL_START_ATTEMPTS = 3
"""Starts of a local Ray before giving up. Ray waits a fixed 30 s for its node to register
and then raises "The current node timed out during startup"; on a machine busy with other
work (seen in a clean clone's CI, the test suite's other worker starting its own Ray) a second
start goes through."""
NODE_START_TIMED_OUT = "timed out during startup"


def start_with_retries(start: Callable[[], None], shutdown: Callable[[], None],
                       attempts: int = LOCAL_START_ATTEMPTS) -> None:
    """``start()`` a local Ray, again (after ``shutdown()``, which ends what the failed start
    left) when Ray says its node timed out during startup, up to ``attempts`` times; any other
    error, and the last timeout, are raised."""
    for attempt in range(1, attempts + 1):
        try:
            start()
            return
        except Exception as exc:
            if NODE_START_TIMED_OUT not in str(exc) or attempt == attempts:
                raise
            log.warning("ray_start_timed_out", attempt=attempt, attempts=attempts,
                        error=str(exc)[:200])
            shutdown()


def actor_log_format() -> dict[str, str]:
    """Actors log as the driver does: their stderr is never a terminal, so without this they
    would write JSON lines into a person's console output (Ray forwards them to the driver),
    and colour codes into a file or pipe the driver's output goes to."""
    colors = {"ENDPOINT_RUNTIME_LOG_COLORS": "1" if use_colors() else "0"}
    chosen = os.environ.get("ENDPOINT_RUNTIME_LOG_FORMAT")
    if chosen:
        return {"ENDPOINT_RUNTIME_LOG_FORMAT": chosen, **colors}
    return {"ENDPOINT_RUNTIME_LOG_FORMAT": "console" if sys.stderr.isatty() else "json", **colors}


def plain_actor_output() -> None:
    """Actor lines reach the driver's output as they were written: without Ray's
    ``(Receiver pid=...)`` prefix (every line names its endpoint and receiver) and without
    Ray's deduplication, which folds lines that differ only in numbers and ids (the failures
    of different messages) into ``[repeated Nx across cluster]``.

    These are Ray's ``RAY_DISABLE_WORKER_LOG_PREFIX=1`` and ``RAY_DEDUP_LOGS=0``, which Ray
    reads once, when it is imported, before any code of ours runs; so their values are set on
    Ray's modules here, before ``ray.init``. A value given in the environment wins. If a Ray
    release moves them, Ray's own output (prefixes, deduplication) simply comes back.
    """
    from ray._private import ray_constants, ray_logging

    if "RAY_DISABLE_WORKER_LOG_PREFIX" not in os.environ:
        ray_constants.RAY_DISABLE_WORKER_LOG_PREFIX = True
    if "RAY_DEDUP_LOGS" not in os.environ:
        ray_logging.RAY_DEDUP_LOGS = False  # type: ignore[attr-defined]


@contextlib.contextmanager
def _without_token_notice() -> Iterator[None]:
    """Ray's warning that a new local cluster has token authentication on (its default) is
    printed by every command that starts one; it says nothing a user must act on. Ray's own
    logger for it shows errors only while Ray starts."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
