"""``submit --replace``: find the running deployments of an endpoint and ask them to stop.

Every peeker is a named Ray actor, ``peeker-<endpoint>-<deployment id>`` (``-<n>`` after the
n-th restart), in the namespace of the driver that started it. A new deployment that runs
asks each other peeker of its endpoint, in any namespace, to be replaced; that peeker's driver
(the submit script) sees it in its next status and stops the deployment gracefully: its
receivers finish what they hold within ``stop_timeout``, and what they could not finish rolls
back and comes to the new deployment's receivers. Both compete on the queue meanwhile, each
message taken once.
"""

from __future__ import annotations

import asyncio
import re

import structlog

from endpoint_runtime.runtime.deployment import EndpointDeployment

log = structlog.get_logger("endpoint_runtime.submit")

PEEKER_NAME = re.compile(r"^peeker-(?P<endpoint>.+)-(?P<deployment>[0-9a-f]{8})(?:-\d+)?$")


def peekers_of(endpoint: str, names: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    """``(deployment id, name, namespace)`` of every peeker of ``endpoint`` among ``names``
    (``ray.util.list_named_actors(all_namespaces=True)``)."""
    found = []
    for entry in names:
        match = PEEKER_NAME.match(entry.get("name", ""))
        if match is not None and match["endpoint"] == endpoint:
            found.append((match["deployment"], entry["name"], entry.get("namespace", "")))
    return found


async def replace_others(deployment: EndpointDeployment) -> list[str]:
    """Ask every other running deployment of ``deployment``'s endpoint to stop; returns their
    deployment ids."""
    import ray

    names = await asyncio.to_thread(ray.util.list_named_actors, all_namespaces=True)
    own = deployment.config.deployment_id
    replaced: list[str] = []
    for deployment_id, name, namespace in peekers_of(deployment.config.endpoint_name, names):
        if deployment_id == own:
            continue
        try:
            peeker = await asyncio.to_thread(ray.get_actor, name, namespace=namespace)
            await peeker.request_replacement.remote(own)
        except (ValueError, ray.exceptions.RayError) as exc:  # gone meanwhile
            log.warning("replacement_not_requested", peeker=name,
                        error=f"{type(exc).__name__}: {exc}"[:300])
            continue
        replaced.append(deployment_id)
    return replaced
