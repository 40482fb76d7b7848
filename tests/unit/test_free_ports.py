"""The test clusters' ports: distinct within one node's start (a node once got the same port
for its node manager and its object manager, and ``ray start`` refused it)."""

from __future__ import annotations

from tests.cluster.nodes import free_ports


def test_ports_chosen_together_are_distinct_and_outside_what_is_reserved() -> None:
    gcs = free_ports(1)[0]
    ports = free_ports(200, exclude={gcs})
    assert len(set(ports)) == 200
    assert gcs not in ports
    assert not [port for port in ports if 10002 <= port <= 19999 or port == 6379]
