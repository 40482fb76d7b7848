"""The placement policy of receivers over nodes (pure, no Ray)."""

from __future__ import annotations

from endpoint_runtime.actors.scaling import spread_over_nodes


def test_new_receivers_go_to_the_nodes_with_the_fewest() -> None:
    assert spread_over_nodes(["a", "b", "c"], [], 3) == ["a", "b", "c"]
    assert spread_over_nodes(["a", "b", "c"], ["a", "a", "b"], 2) == ["c", "b"]
    assert spread_over_nodes(["a", "b"], [], 5) == ["a", "b", "a", "b", "a"]


def test_receivers_on_nodes_no_longer_alive_do_not_count() -> None:
    assert spread_over_nodes(["a", "c"], ["b", "b", None], 2) == ["a", "c"]


def test_no_live_node_known_places_nothing() -> None:
    assert spread_over_nodes([], ["a"], 2) == []
