"""The importers fit in a head: no module over 450 lines, no function over 80, no import cycle.

issue 31 (3): a module over ~450 lines usually holds two ideas, a function over ~80 lines hides a
table or a loop of cases, and ``importers/common`` <-> ``importers/rules`` was a cycle through a
type on the wrong side. ``shell.py`` and ``shell_syntax.py`` are left to the issue that replaces
them with tree-sitter-bash. The scan reads the source with :mod:`ast` and imports nothing; an
import under ``if TYPE_CHECKING:`` counts as an edge here (it was the cycle's second half).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

IMPORTERS = Path(__file__).resolve().parents[1] / "placeverify" / "importers"
LEFT_TO_ANOTHER_ISSUE = {"shell.py", "shell_syntax.py"}
MODULES = sorted(p for p in IMPORTERS.glob("*.py") if p.name not in LEFT_TO_ANOTHER_ISSUE)
MAX_LINES, MAX_FUNCTION = 450, 80


def _edges(path: Path) -> set[str]:
    """The importers modules ``path`` imports (``from placeverify.importers.x import ...`` and
    ``from placeverify.importers import x``), by name."""
    names = {p.stem for p in IMPORTERS.glob("*.py")}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        parts = node.module.split(".")
        if parts[:2] != ["placeverify", "importers"]:
            continue
        if len(parts) > 2:
            out.add(parts[2])
        else:
            out.update(alias.name for alias in node.names if alias.name in names)
    return out - {path.stem}


def test_the_scan_sees_the_modules_and_their_imports() -> None:
    # Without these, every test below would pass on nothing.
    assert len(MODULES) > 10
    assert "rules" in _edges(IMPORTERS / "common.py")
    assert "origins" in _edges(IMPORTERS / "rules.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_module_over_450_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_function_over_80_lines(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_FUNCTION]
    assert long == []


def test_no_import_cycle_among_the_importers() -> None:
    graph = {p.stem: _edges(p) for p in IMPORTERS.glob("*.py")}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str], done: set[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in done:
                done.add(nxt)
                visit(nxt, [*path, nxt], done)

    for start in sorted(graph):
        visit(start, [start], {start})
    assert cycles == []
