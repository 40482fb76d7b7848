"""How many receivers an endpoint deployment needs and how much each may take at once.

Pure functions of the peek estimate and the settings, so the policy is testable without Ray.
The peeker applies allowance decreases before increases, so the sum of allowances (and hence
of messages in flight) never exceeds ``max_concurrency``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping, Sequence

import msgspec


class ScalingInput(msgspec.Struct, frozen=True, kw_only=True):
    estimate: int
    """Waiting messages (peek estimate)."""
    busy_slots: int
    """Slots of all receivers that were processing at the last status."""
    current_receivers: int
    idle_seconds: float
    """How long the queue has looked empty and slots idle."""
    max_concurrency: int
    slots_per_receiver: int
    min_receivers: int
    scale_down_after: float


def receivers_needed(state: ScalingInput) -> int:
    """Receivers to run: enough slots for the backlog (plus work in flight), within limits.

    Scaling up happens at once; scaling down only after ``scale_down_after`` idle seconds.
    """
    max_receivers = math.ceil(state.max_concurrency / state.slots_per_receiver)
    wanted_slots = min(state.max_concurrency, state.estimate + state.busy_slots)
    wanted = max(state.min_receivers, math.ceil(wanted_slots / state.slots_per_receiver))
    wanted = min(wanted, max(max_receivers, state.min_receivers))
    if wanted >= state.current_receivers:
        return wanted
    if state.idle_seconds >= state.scale_down_after:
        return wanted
    return state.current_receivers


def allowances(receivers: int, max_concurrency: int, slots_per_receiver: int) -> list[int]:
    """Slots for each of ``receivers`` receivers, summing to at most ``max_concurrency``."""
    left = max_concurrency
    result = []
    for _ in range(receivers):
        share = min(slots_per_receiver, left)
        result.append(share)
        left -= share
    return result


def spread_over_nodes(nodes: Sequence[str], placed: Iterable[str | None], count: int) -> list[str]:
    """Nodes for ``count`` new receivers: each on the node with the fewest receivers so far
    (``placed``: the node of each running receiver), ties broken by the order of ``nodes``.

    Ray's own SPREAD strategy is best effort (it may put two receivers on one node while
    another has none); this keeps the receivers of a deployment even across live nodes.
    """
    if not nodes:
        return []
    load = collections.Counter(node for node in placed if node in set(nodes))
    chosen = []
    for _ in range(count):
        node = min(nodes, key=lambda n: (load[n], nodes.index(n)))
        load[node] += 1
        chosen.append(node)
    return chosen


def has_resources(node: Mapping[str, float], request: Mapping[str, float]) -> bool:
    """Whether a node with ``node`` resources in all could run an actor asking ``request``."""
    return all(node.get(name, 0) >= amount for name, amount in request.items())


def unsatisfiable(request: Mapping[str, float], nodes: Sequence[Mapping[str, float]],
                  node_types: Mapping[str, Mapping[str, float]]) -> str | None:
    """Why no live node (``nodes``: each one's total resources) and no node type the
    autoscaler may start (``node_types``) can run an actor asking ``request``, naming the
    resources; ``None`` when one can (or nothing is asked).

    Example::

        unsatisfiable({"nope": 1}, [{"CPU": 2}], {})
        # "no live node has the resource 'nope' (live nodes have: CPU)"
    """
    if not request or any(has_resources(n, request) for n in [*nodes, *node_types.values()]):
        return None
    everywhere = [*nodes, *node_types.values()]
    missing = sorted(name for name, amount in request.items()
                     if not any(n.get(name, 0) >= amount for n in everywhere))
    known = sorted({name for n in nodes for name in n
                    if not name.startswith("node:") and "memory" not in name})
    where = f"live nodes have: {', '.join(known) or 'nothing'}"
    if node_types:
        where += "; nor does any node type of the autoscaler's configuration"
    if not missing:
        return (f"no live node has all of {', '.join(sorted(request))} in these amounts "
                f"({where})")
    names = ", ".join(repr(name) for name in missing)
    amounts = ", ".join(f"{name} >= {request[name]:g}" for name in missing)
    return (f"no live node has the resource{'s' if len(missing) > 1 else ''} {names} "
            f"(asked: {amounts}; {where})")
