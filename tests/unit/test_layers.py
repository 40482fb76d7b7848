"""The package's layers: the parts of ``endpoint_runtime`` and the imports that must never be.

The parts and the rules are those of the architecture (docs/architecture.md): the wire format
at the bottom, the transport above it, the chain of steps one message passes, the transaction
strategies, the delayed store, the runtime on Ray, ingestion, the report, the command line and
the operator's console.
A rule ``(A, B)`` says that no module of part A imports a module of part B, at any depth of its
code (a function-level import counts as much as a top-level one).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import endpoint_runtime

PACKAGE = Path(endpoint_runtime.__file__).parent
ROOT = PACKAGE.parent

# The parts and rules of the architecture's layer map (its parts and "never" rules, with the
# submit script on the command line's side and the heartbeat tables below the runtime), plus
# the shared page templates and the rules about them.
PARTS: dict[str, tuple[str, ...]] = {
    "Wire": (
        "endpoint_runtime/wire/", "endpoint_runtime/errors.py", "endpoint_runtime/settings.py",
        "endpoint_runtime/settings_rules.py", "endpoint_runtime/logging.py",
        "endpoint_runtime/redaction.py", "endpoint_runtime/arguments.py",
        "endpoint_runtime/modes.py",
    ),
    "Transport": ("endpoint_runtime/transport/", "endpoint_runtime/connections/"),
    "Chain": ("endpoint_runtime/chain/", "endpoint_runtime/sagas/__init__.py"),
    "Strategies": ("endpoint_runtime/transactions/",),
    "Delayed": ("endpoint_runtime/delayed/",),
    "Database": ("endpoint_runtime/database/",),
    "Runtime": ("endpoint_runtime/runtime/",),
    "Ingestion": ("endpoint_runtime/ingestion/",),
    "Analytics": ("endpoint_runtime/analytics/",),
    "Cli": ("endpoint_runtime/cli/", "endpoint_runtime/submission/", "endpoint_runtime/submit.py"),
    "Console": ("endpoint_runtime/console/",),
    "Pages": ("endpoint_runtime/pages/",),
}

NEVER: list[tuple[str, str, str]] = [
    ("Transport", "Chain", "the transport knows no handler"),
    ("Transport", "Strategies", "the transport knows no mode"),
    ("Transport", "Runtime", "no Ray below the chain"),
    ("Chain", "Runtime", "no Ray in the chain"),
    ("Chain", "Strategies", "the chain does not know the mode"),
    ("Analytics", "Cli", "the report is a library first"),
    ("Wire", "Transport", "the wire format has no SQL"),
    ("Delayed", "Chain", "the delayed store sits below the chain"),
    ("Console", "Cli", "the console is a library first"),
    ("Console", "Runtime", "the console reads the database, not Ray"),
    ("Database", "Runtime", "set-up knows no actors"),
    ("Runtime", "Console", "endpoints run without the console"),
    ("Ingestion", "Console", "ingestion runs without the console"),
    ("Analytics", "Console", "the report's page shares templates, not the console"),
    ("Pages", "Console", "the shared templates know no console"),
]

# Known exceptions, each to be removed by the change that ends it (never add one to pass).
KNOWN: set[str] = set()


def runtime_imports(module: Path) -> set[str]:
    """The ``endpoint_runtime`` modules a source file imports, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant)):
            found.add(str(node.args[0].value))
    return {name for name in found if name.startswith("endpoint_runtime")}


def module_path(name: str) -> str | None:
    """``endpoint_runtime.a.b`` as the file it names, relative to the checkout (a module or a
    package's ``__init__.py``); None for a name that is no module (an imported function)."""
    base = ROOT / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(ROOT).as_posix()
    return None


def part_of(path: str, parts: dict[str, tuple[str, ...]] = PARTS) -> str | None:
    for part, members in parts.items():
        if any(path == m or (m.endswith("/") and path.startswith(m)) for m in members):
            return part
    return None


def broken_nevers(parts: dict[str, tuple[str, ...]] = PARTS,
                  nevers: list[tuple[str, str, str]] = NEVER,
                  root: Path = ROOT) -> set[str]:
    """Every import of the package under ``root`` that breaks a rule, one line each (imported
    names are resolved against this checkout)."""
    forbidden = {(a, b): why for a, b, why in nevers}
    broken = set()
    for module in sorted((root / "endpoint_runtime").rglob("*.py")):
        source = module.relative_to(root).as_posix()
        source_part = part_of(source, parts)
        for name in runtime_imports(module) if source_part else ():
            target = module_path(name)
            if target is None or target == source:
                continue
            why = forbidden.get((source_part, part_of(target, parts) or ""))
            if why is not None:
                broken.add(f"{source} imports {dotted(target)}"
                           f" ({source_part} -> {part_of(target, parts)}: {why})")
    return broken


def dotted(path: str) -> str:
    return path.removesuffix("/__init__.py").removesuffix(".py").replace("/", ".")


def test_no_import_breaks_a_rule_of_the_layers() -> None:
    assert broken_nevers() == KNOWN


def test_every_module_of_the_package_belongs_to_a_part_or_is_a_known_free_module() -> None:
    # Modules on no part escape every rule: each is named here on purpose.
    free = {"endpoint_runtime/__init__.py", "endpoint_runtime/testing.py",
            "endpoint_runtime/sagas/testing.py"}
    unplaced = {
        module.relative_to(ROOT).as_posix() for module in PACKAGE.rglob("*.py")
        if part_of(module.relative_to(ROOT).as_posix()) is None
    }
    assert unplaced == free


def test_every_part_names_files_that_exist() -> None:
    missing = [m for members in PARTS.values() for m in members if not (ROOT / m).exists()]
    assert missing == []


@pytest.mark.parametrize("rule", NEVER, ids=[f"{a}-{b}" for a, b, _ in NEVER])
def test_the_check_catches_a_planted_import_for_each_rule(
        tmp_path: Path, rule: tuple[str, str, str]) -> None:
    """The checker's self-test: a module placed in part A that imports part B is caught."""
    source_part, target_part, why = rule
    # A module of the target part: its first file, else its first package's __init__.
    target = next((m for m in PARTS[target_part] if not m.endswith("/")),
                  PARTS[target_part][0] + "__init__.py")
    planted = tmp_path / "endpoint_runtime" / "planted.py"
    planted.parent.mkdir()
    planted.write_text(f"def late():\n    import {dotted(target)}\n")
    parts = {**PARTS, source_part: (*PARTS[source_part], "endpoint_runtime/planted.py")}
    assert broken_nevers(parts, [rule], tmp_path) == {
        f"endpoint_runtime/planted.py imports {dotted(target)}"
        f" ({source_part} -> {target_part}: {why})"}


def test_the_transport_imports_only_errors_and_messages_of_the_runtime() -> None:
    upward = {
        f"{module.relative_to(PACKAGE)} imports {name}"
        for module in (PACKAGE / "transport").rglob("*.py")
        for name in runtime_imports(module)
        if not name.startswith("endpoint_runtime.transport")
        and module_path(name) not in {"endpoint_runtime/errors.py",
                                      "endpoint_runtime/wire/messages.py"}
        and module_path(name) is not None
    }
    assert upward == set()
