"""The placement policy of receivers over nodes (pure, no Ray)."""

from __future__ import annotations

from endpoint_runtime.runtime.actors.scaling import has_resources, spread_over_nodes, unsatisfiable


def test_new_receivers_go_to_the_nodes_with_the_fewest() -> None:
    assert spread_over_nodes(["a", "b", "c"], [], 3) == ["a", "b", "c"]
    assert spread_over_nodes(["a", "b", "c"], ["a", "a", "b"], 2) == ["c", "b"]
    assert spread_over_nodes(["a", "b"], [], 5) == ["a", "b", "a", "b", "a"]


def test_receivers_on_nodes_no_longer_alive_do_not_count() -> None:
    assert spread_over_nodes(["a", "c"], ["b", "b", None], 2) == ["a", "c"]


def test_no_live_node_known_places_nothing() -> None:
    assert spread_over_nodes([], ["a"], 2) == []


def test_pinned_receivers_spread_over_the_nodes_with_the_resource() -> None:
    # The peeker spreads over the live nodes that have the resources (live_nodes(resources)).
    nodes = {"a": {"CPU": 1.0}, "b": {"CPU": 1.0, "queue_workers": 1000.0},
             "c": {"CPU": 1.0, "queue_workers": 1000.0}}
    pinned = sorted(n for n, have in nodes.items() if has_resources(have, {"queue_workers": 1}))
    assert spread_over_nodes(pinned, ["b"], 3) == ["c", "b", "c"]


def test_a_request_no_node_can_satisfy_names_the_resource() -> None:
    nodes = [{"CPU": 1.0, "node:127.0.0.1": 1.0, "memory": 1e9, "queue_workers": 1000.0}]
    problem = unsatisfiable({"nope": 1, "queue_workers": 1}, nodes, {})
    assert problem is not None
    assert "'nope'" in problem
    assert "live nodes have: CPU, queue_workers" in problem
    assert "'queue_workers'" not in problem
    assert "resources 'nope', 'other'" in (unsatisfiable({"nope": 1, "other": 2}, nodes, {})
                                           or "")
    too_many = unsatisfiable({"queue_workers": 2000}, nodes, {})
    assert too_many is not None
    assert "queue_workers >= 2000" in too_many


def test_a_request_some_node_or_node_type_can_satisfy_passes() -> None:
    nodes = [{"CPU": 1.0}, {"CPU": 1.0, "queue_workers": 4.0}]
    assert unsatisfiable({"queue_workers": 1}, nodes, {}) is None
    assert unsatisfiable({}, nodes, {}) is None
    # A node type the autoscaler may start declares it.
    assert unsatisfiable({"gpu_box": 1}, nodes, {"gpu": {"CPU": 8.0, "gpu_box": 1.0}}) is None
    declared = unsatisfiable({"gpu_box": 1}, nodes, {"cpu": {"CPU": 8.0}})
    assert declared is not None
    assert "nor does any node type" in declared


def test_resources_must_be_on_one_node() -> None:
    nodes = [{"a": 1.0}, {"b": 1.0}]
    problem = unsatisfiable({"a": 1, "b": 1}, nodes, {})
    assert problem is not None
    assert "no live node has all of a, b" in problem
