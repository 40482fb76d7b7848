"""The README's "A first handler" section, read as a new user reads it: its module (the path
in its first line, the code) and its commands (split as a shell would, comments off).

Example::

    path, code = readme_module(first_handler_section())
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## A first handler"


def first_handler_section() -> str:
    return readme_section(SECTION)


def readme_section(title: str, text: str | None = None) -> str:
    """The README's section ``title`` (``## ...``), up to the next one."""
    text = README.read_text(encoding="utf-8") if text is None else text
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:end if end != -1 else len(text)]


def fenced(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def readme_module(section: str) -> tuple[Path, str]:
    """The README's Python block and the path its first line names (``# my_app/sales.py``)."""
    (code,) = fenced(section, "python")
    first = code.splitlines()[0]
    assert first.startswith("# "), first
    assert first.endswith(".py"), first
    return Path(first[2:].strip()), code


def readme_commands(section: str) -> list[list[str]]:
    """Each command line of the README's bash block, split as a shell would, comments off."""
    commands = []
    for block in fenced(section, "bash"):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands
