"""Connecting to Ray: ``RAY_ADDRESS`` when set (a cluster), else a local Ray started here."""

from __future__ import annotations

import os
import sys

import ray
import structlog

log = structlog.get_logger("endpoint_runtime.cluster")


def ensure_ray() -> None:
    """Initialise Ray once per process.

    A local Ray's workers get this process's import path, so endpoints defined in the working
    tree (not only installed packages) can be imported by receivers.
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
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}},
        configure_logging=False,
    )
    log.info("ray_started", resources=ray.cluster_resources())  # type: ignore[no-untyped-call]
