"""The package's layers: the transport imports nothing of the runtime above it."""

from __future__ import annotations

import ast
from pathlib import Path

import endpoint_runtime

PACKAGE = Path(endpoint_runtime.__file__).parent
BELOW_TRANSPORT = {"endpoint_runtime.errors", "endpoint_runtime.messages"}


def runtime_imports(module: Path) -> set[str]:
    """The ``endpoint_runtime`` modules a source file imports, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant)):
            found.add(str(node.args[0].value))
    return {name for name in found if name.startswith("endpoint_runtime")}


def test_the_transport_imports_only_errors_and_messages_of_the_runtime() -> None:
    upward = {
        f"{module.relative_to(PACKAGE)} imports {name}"
        for module in (PACKAGE / "transport").rglob("*.py")
        for name in runtime_imports(module)
        if not name.startswith("endpoint_runtime.transport") and name not in BELOW_TRANSPORT
    }
    # The transport's __init__ hands out two moved names on demand (for earlier callers).
    assert upward == {"transport/__init__.py imports endpoint_runtime.connecting"}


def test_settings_import_nothing_above_them_but_the_dsn_redaction() -> None:
    names = runtime_imports(PACKAGE / "settings.py") | runtime_imports(
        PACKAGE / "settings_rules.py")
    assert {n for n in names if not n.startswith("endpoint_runtime.transport")} \
        <= {"endpoint_runtime.errors", "endpoint_runtime.embedded",
            "endpoint_runtime.settings_rules"}
