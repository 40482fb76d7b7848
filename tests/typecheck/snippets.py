"""The Python snippets of README.md and docs/*.md, as modules a type checker can read.

Every fenced ``python`` block is one module. A snippet that uses names defined elsewhere (a
message type the page introduced earlier, an endpoint) declares them in an HTML comment right
above its block, which readers do not see::

    <!-- typecheck: prelude
    import msgspec
    class PlaceOrder(msgspec.Struct):
        order_id: str
    -->
    ```python
    ...
    ```

The prelude goes before the snippet in the module, so the snippet is checked as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(
    r"(?:<!-- typecheck: prelude\n(?P<prelude>.*?)-->\n)?```python\n(?P<code>.*?)```",
    re.DOTALL)


@dataclass(frozen=True)
class Snippet:
    """One block: where it is (``README.md``, line) and the module made of it."""

    document: Path
    line: int
    prelude: str
    code: str
    tag: str = ""
    """Added to the module's name (a changed copy of a snippet that must not be taken for
    the snippet in mypy's cache)."""

    @property
    def name(self) -> str:
        stem = re.sub(r"\W", "_", self.document.relative_to(ROOT).with_suffix("").as_posix())
        return f"snippet_{stem}_{self.line}{self.tag}"

    def module(self) -> str:
        return f"{self.prelude}\n{self.code}" if self.prelude else self.code


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def snippets(paths: list[Path]) -> list[Snippet]:
    found = []
    for path in paths:
        text = path.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("code")) + 1
            found.append(Snippet(path, line, match["prelude"] or "", match["code"]))
    return found


def write(found: list[Snippet], directory: Path) -> dict[Path, Snippet]:
    """Each snippet as ``<directory>/<name>.py``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for snippet in found:
        path = directory / f"{snippet.name}.py"
        path.write_text(snippet.module())
        written[path] = snippet
    return written
