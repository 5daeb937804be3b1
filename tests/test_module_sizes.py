"""Modules that fit in a head (issue 31, item 3), for the command line and the verdict types:
no module over 450 lines, no function over 80, and no import cycle through them, counting the
imports made for annotations only (``if TYPE_CHECKING:``), which a reader follows as well."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "placeverify"
CHECKED = sorted([*(PACKAGE / "cli").glob("*.py"), *(PACKAGE / name for name in (
    "compare_cli.py", "console.py", "trace.py", "verdicts.py", "obligations.py", "errors.py",
    "api.py", "result.py", "evidence.py", "node.py", "files.py", "__main__.py"))])
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_and_function_sizes(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def _imports(path: Path) -> set[str]:
    """Every placeverify module ``path`` imports, at run time or for annotations."""
    module = _name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {name for name in found if name.startswith("placeverify.")}


def test_no_import_cycle_through_these_modules() -> None:
    modules = {_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    graph = {name: {t for t in _imports(path) if t in modules and t != name}
             for name, path in modules.items()}
    assert "placeverify.trace" in graph["placeverify.verdicts"]  # the scan sees type-only imports
    cycles = []
    for start in sorted(_name(p) for p in CHECKED):
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for target in sorted(graph[node]):
                if target == start:
                    cycles.append(" -> ".join((*path, start)))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, (*path, target)))
    assert cycles == []
