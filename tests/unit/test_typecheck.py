"""The type check of what users copy (``python -m tests.typecheck``, run by ``bin/dev test``)
catches a misspelt setting in a snippet, and names the document and line."""

from __future__ import annotations

import shutil
import uuid
from dataclasses import replace
from pathlib import Path

from tests.typecheck.__main__ import WORK, check
from tests.typecheck.snippets import ROOT, snippets


def test_a_misspelt_setting_in_the_readme_fails_the_type_check_at_its_line(
        tmp_path: Path) -> None:
    [first] = [s for s in snippets([ROOT / "README.md"]) if "Endpoint(" in s.code]
    assert "max_concurrency=8" in first.code
    # Each planted copy a module of a name of its own, so that mypy's cache (copied from the
    # last `python -m tests.typecheck`, when there was one) never stands in for it.
    tag = f"_planted_{uuid.uuid4().hex[:8]}"
    planted = replace(first, code=first.code.replace("max_concurrency=8", "max_concurency=8"),
                      tag=tag)
    [traced] = snippets([ROOT / "docs" / "observability.md"])  # one with a prelude
    assert traced.prelude
    assert 'Endpoint("sales", tracing=True)' in traced.code
    misspelt = replace(traced, code=traced.code.replace("tracing=True", "tracng=True"),
                       tag=tag)
    if (WORK / "cache").is_dir():
        shutil.copytree(WORK / "cache", tmp_path / "cache")
    status, lines = check([first, planted, misspelt], examples=False, work=tmp_path)
    assert status == 1
    call = first.line + planted.code.splitlines().index(
        next(x for x in planted.code.splitlines() if x.startswith("endpoint = Endpoint(")))
    errors = [line for line in lines if ": error: " in line]
    assert sorted(errors) == [  # the call's first line; the unplanted copy is clean
        f'README.md:{call}: error: Unexpected keyword argument "max_concurency" for '
        '"Endpoint"; did you mean "max_concurrency"?  [call-arg]',
        f'docs/observability.md:{traced.line}: error: Unexpected keyword argument "tracng" for '
        '"Endpoint"; did you mean "tracing"?  [call-arg]']
