"""Connecting to Ray: ``RAY_ADDRESS`` when set (a cluster), else a local Ray started here."""

from __future__ import annotations

import os
import sys

import ray
import structlog

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
    address = os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=True)
        log.info("ray_connected", address=address)
        return
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if os.getcwd() not in paths:
        paths.insert(0, os.getcwd())
    ray.init(
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths), **actor_log_format()}},
        configure_logging=False,
        _system_config=LOCAL_RAY_CONFIG,
    )
    log.info("ray_started", resources=ray.cluster_resources())  # type: ignore[no-untyped-call]


def actor_log_format() -> dict[str, str]:
    """Actors log as the driver does: their stderr is never a terminal, so without this they
    would write JSON lines into a person's console output (Ray forwards them to the driver)."""
    chosen = os.environ.get("ENDPOINT_RUNTIME_LOG_FORMAT")
    if chosen:
        return {"ENDPOINT_RUNTIME_LOG_FORMAT": chosen}
    return {"ENDPOINT_RUNTIME_LOG_FORMAT": "console" if sys.stderr.isatty() else "json"}
