"""The HTML pages' templates: one Jinja2 set-up shared by the operator's console and the
Spark report's page. Autoescaping everywhere (a name from the wire is text, never markup),
control characters shown as ``\\xNN`` (:func:`visible`), times as ``YYYY-MM-DD HH:MM:SS``
(:func:`moment`), and the macros of ``templates/shared.html`` (``when``, ``table``) beside
each user's own templates.

Example::

    templates = environment(Path(__file__).parent / "templates")
    html = templates.get_template("report.html").render(title=name_from_the_wire)
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, select_autoescape

SHARED = Path(__file__).parent / "templates"
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def visible(value: object) -> str:
    """Text with its control characters as ``\\xNN`` (``None``: empty); still to be escaped
    (the templates' autoescaping does)."""
    text = "" if value is None else str(value)
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def moment(value: object) -> str:
    """A time as ``YYYY-MM-DD HH:MM:SS``; anything else as :func:`visible` text; ``None``:
    ``-``."""
    if value is None:
        return "-"
    return value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else visible(value)


def environment(folder: Path) -> Environment:
    """Templates of ``folder``, then the shared ones, autoescaped, with the shared filters."""
    templates = Environment(
        loader=ChoiceLoader([FileSystemLoader(folder), FileSystemLoader(SHARED)]),
        autoescape=select_autoescape(default=True, default_for_string=True))
    templates.filters["visible"] = visible
    templates.filters["moment"] = moment
    return templates
