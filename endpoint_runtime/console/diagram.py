"""A conversation as a sequence diagram: endpoints as lanes, messages as arrows (pure).

The template draws it as SVG; every name stays text (the template escapes it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

LANE_WIDTH = 220
ROW_HEIGHT = 44
TOP = 50
UNKNOWN = "(unknown)"


class Lane(msgspec.Struct, frozen=True):
    name: str
    x: int


class Arrow(msgspec.Struct, frozen=True):
    label: str
    intent: str
    x1: int
    x2: int
    y: int
    failed: bool
    message_id: str
    native_id: str | None


class Diagram(msgspec.Struct, frozen=True):
    lanes: list[Lane]
    arrows: list[Arrow]
    width: int
    height: int


def short_type(message_type: str | None) -> str:
    """The class name of ``module:Class`` or ``Namespace.Class, Assembly``."""
    if not message_type:
        return UNKNOWN
    name = message_type.split(";", 1)[0].split(",", 1)[0]
    return name.replace(":", ".").rsplit(".", 1)[-1] or name


def diagram(rows: Iterable[Mapping[str, Any]] | Iterable[Any]) -> Diagram:
    """Lanes in the order the endpoints first appear; one arrow per message."""
    lanes: dict[str, Lane] = {}

    def lane(name: str | None) -> Lane:
        key = name or UNKNOWN
        if key not in lanes:
            lanes[key] = Lane(key, LANE_WIDTH // 2 + LANE_WIDTH * len(lanes))
        return lanes[key]

    arrows = []
    for index, row in enumerate(rows):
        source, target = lane(row["sending_endpoint"]), lane(row["processing_endpoint"])
        native_id = row["native_id"]
        arrows.append(Arrow(
            label=short_type(row["message_type"]), intent=row["intent"] or "",
            x1=source.x, x2=target.x, y=TOP + ROW_HEIGHT * (index + 1),
            failed=bool(row["failed"]), message_id=row["message_id"] or "",
            native_id=None if native_id is None else str(native_id),
        ))
    return Diagram(lanes=list(lanes.values()), arrows=arrows,
                   width=max(1, len(lanes)) * LANE_WIDTH,
                   height=TOP + ROW_HEIGHT * (len(arrows) + 1))
