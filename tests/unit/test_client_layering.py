"""The client package's layering: the `Client` facade sits on top, and no module under it
imports it back, or goes through the package (whose __init__ loads the facade)."""

from __future__ import annotations

import ast
from pathlib import Path

import gpuhop.client

PACKAGE = Path(gpuhop.client.__file__).parent
FACADE = "gpuhop.client.client"


def imported(path: Path) -> set[str]:
    """Every module an import statement in `path` names, wherever the statement is."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_client_module_imports_the_facade_or_the_package():
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name in ("__init__.py", "client.py"):
            continue
        names = imported(path)
        assert FACADE not in names, f"{path.name} imports the Client facade"
        assert "gpuhop.client" not in names, f"{path.name} imports through the package"


def test_the_facade_imports_no_package_init():
    assert "gpuhop.client" not in imported(PACKAGE / "client.py")
