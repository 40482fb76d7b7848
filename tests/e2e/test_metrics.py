"""Live metrics: what a deployment records reaches Ray's Prometheus endpoint."""

from __future__ import annotations

import re
import urllib.request

import pytest
import ray

from endpoint_runtime import Sender
from endpoint_runtime.connections.connecting import PostgresTransport
from tests.e2e.conftest import Deployer, wait_for
from tests.integration.test_publish_subscribe import prepare
from tests.support import commit_failing_endpoints, pubsub_endpoints
from tests.support.commit_failing_endpoints import AddLine
from tests.support.pubsub_endpoints import PlaceOrder

pytestmark = pytest.mark.ray

MODULE = "tests.support.pubsub_endpoints"
ENDPOINT = "sales_atomic"


def scrape(endpoint: str = ENDPOINT) -> dict[str, float]:
    """Every sample of ``endpoint`` on every node, summed by name and distinguishing tags."""
    samples: dict[str, float] = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
            match = re.match(r"(ray_endpoint_runtime_\w+)\{(.*)\} (\S+)$", line)
            if not match or f'endpoint="{endpoint}"' not in match[2]:
                continue
            tags = dict(re.findall(r'(\w+)="([^"]*)"', match[2]))
            key = ",".join([match[1], *(f"{k}={tags[k]}" for k in ("message_type", "kind", "le")
                                        if k in tags)])
            samples[key] = samples.get(key, 0.0) + float(match[3])
    return samples


async def test_processed_failed_retried_and_timing_metrics_reach_prometheus(
    deployer: Deployer, transport: PostgresTransport, sender: Sender,
) -> None:
    await prepare(transport, pubsub_endpoints.atomic)
    await deployer.start("atomic", module=MODULE)
    for n in range(4):
        await sender.send(PlaceOrder(f"o-{n}"), destination=ENDPOINT)
    await sender.send(PlaceOrder("o-failing", fail=True), destination=ENDPOINT)
    type_name = "tests.support.pubsub_endpoints.PlaceOrder"

    def metric(name: str, *tags: str) -> float:
        return scrape().get(",".join([f"ray_endpoint_runtime_{name}", *tags]), 0.0)

    async def reported() -> bool:
        return (metric("messages_processed_total", f"message_type={type_name}") >= 4
                and metric("moved_to_error_total", f"message_type={type_name}") >= 1)

    await wait_for(reported, timeout=60, interval=1.0,
                   what="processed and moved-to-error counts on the metrics endpoint")
    assert metric("messages_processed_total", f"message_type={type_name}") == 4
    assert metric("messages_failed_total", f"message_type={type_name}") == 1
    assert metric("processing_seconds_count", f"message_type={type_name}") == 4
    assert metric("critical_time_seconds_count", f"message_type={type_name}") == 4
    assert metric("critical_time_seconds_bucket", f"message_type={type_name}", "le=+Inf") == 4
    assert "ray_endpoint_runtime_queue_length" in scrape()  # the peeker's gauge


async def test_an_attempt_whose_commit_fails_is_not_counted_as_processed(
    deployer: Deployer, transport: PostgresTransport, sender: Sender,
) -> None:
    """Receive-only mode: one message commits, one breaks a deferred foreign key at COMMIT
    (its handler returns normally) on both of its attempts, then goes to the error queue."""
    endpoint = commit_failing_endpoints.metered
    await transport.pool.execute(commit_failing_endpoints.TABLES)
    for queue in ("audit", "error"):
        await transport.create_queue(queue)
    await deployer.start("metered", module="tests.support.commit_failing_endpoints")
    await sender.send(AddLine(1), destination=endpoint.name)
    await sender.send(AddLine(2), destination=endpoint.name)  # no order 2
    type_name = "tests.support.commit_failing_endpoints.AddLine"

    def metric(name: str) -> float:
        return scrape(endpoint.name).get(
            f"ray_endpoint_runtime_{name},message_type={type_name}", 0.0)

    async def reported() -> bool:
        return metric("moved_to_error_total") >= 1 and metric("messages_processed_total") >= 1

    await wait_for(reported, timeout=60, interval=1.0,
                   what="processed and moved-to-error counts on the metrics endpoint")
    assert metric("messages_failed_total") == 2
    assert metric("messages_processed_total") == 1
    assert metric("processing_seconds_count") == 1
