"""Type-check what users copy: ``handlers_examples`` and every Python snippet of README.md and
docs/ (:mod:`tests.typecheck.snippets`), under mypy's strict mode. Run by ``bin/dev test``.

    python -m tests.typecheck            # exit 0: clean; 1: errors, named by document and line
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from mypy import api

from tests.typecheck.snippets import ROOT, Snippet, documents, snippets, write

STRICT = ["--strict", "--no-error-summary", "--hide-error-context", "--no-color-output"]
WORK = ROOT / ".mypy_cache" / "snippets"
"""Where the snippets are written and mypy keeps its cache: always the same place, since
mypy's cache knows a module by its name (a snippet in a new place each run would be read from
the cache of the last)."""


def check(found: list[Snippet], *, examples: bool = True,
          work: Path = WORK) -> tuple[int, list[str]]:
    """mypy --strict over the snippets (and ``handlers_examples``), written under ``work``;
    its exit status and its error lines, each snippet's file named as its document and line."""
    shutil.rmtree(work / "modules", ignore_errors=True)
    written = write(found, work / "modules")
    targets = [str(path) for path in written]
    if examples:
        targets.append(str(ROOT / "handlers_examples"))
    out, err, status = api.run([*STRICT, "--cache-dir", str(work / "cache"), *targets])
    return status, [_located(line, written) for line in (out + err).splitlines()]


def _located(line: str, written: dict[Path, Snippet]) -> str:
    """A mypy line about a snippet's module as ``document:line: ...`` (others unchanged)."""
    for path, snippet in written.items():
        prefix = f"{path}:"
        if line.startswith(prefix):
            number, _, rest = line[len(prefix):].partition(": ")
            # The module is the prelude (if any), then the snippet: its first line is the
            # document's line of the snippet's first line.
            offset = snippet.prelude.count("\n") + 1 if snippet.prelude else 0
            at = snippet.line + int(number.split(":")[0]) - 1 - offset
            return f"{snippet.document.relative_to(ROOT)}:{at}: {rest}"
    return line


def main() -> int:
    found = snippets(documents())
    status, lines = check(found)
    for line in lines:
        print(line)
    print(f"typecheck: {len(found)} snippets of README.md and docs/, and handlers_examples: "
          + ("clean" if status == 0 else "errors above"), file=sys.stderr)
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
