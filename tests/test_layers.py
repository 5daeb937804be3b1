"""The package layers: imports go one way, and the torch backends are reached only lazily.

The order (STRUCTURE.md, P4; README's module map) is

    diagnostics → syntax → ir → roles → lower → {semantics, cost} → verify → {prove, report} → api → cli

A module may import from its own layer or a lower one, never from a higher one. ``replay/``,
``measure/`` and ``backend/`` are the torch backends: no core module imports them, and the CLI
imports them only inside the command that runs them, so ``placeverify check`` never loads torch.
A function-local import of a placeverify module in the core is allowed only where it defers a
heavy dependency (z3, torch), listed below with its reason; one that only breaks an import cycle
is a layering error. (Backend modules defer freely: a rank's worker process imports only what the
rank runs.) Imports under ``if TYPE_CHECKING:`` name types for annotations only and are not edges
of the layer order; they are edges of the cycle test (no module imports, at any level, a module
that imports it back: issue 31). The scan reads the source with :mod:`ast` and imports nothing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "placeverify"

# Lowest first; a module belongs to the layer of its first dotted component below placeverify.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(names) for names in (
    ("errors", "diagnostics", "files", "obligations", "verdicts", "node", "__init__"),
    ("syntax",),
    ("ir",),
    ("roles",),
    ("lower",),
    ("semantics", "cost"),
    ("evidence", "trace", "verify"),
    ("result", "prove", "report", "console", "importers"),
    ("api",),
    ("search",),
    ("cli", "compare_cli", "__main__"),
))
BACKENDS = frozenset({"replay", "measure", "backend"})
TYPE_ONLY = {"TYPE_CHECKING", "typing.TYPE_CHECKING"}

# Function-local imports that defer a heavy dependency, with the reason. Everything else local
# is a cycle being broken, which the layer order should make unnecessary.
DEFERRED: dict[str, tuple[frozenset[str], str]] = {
    "verify": (frozenset({"trace", "verify", "semantics"}),
               "only a refutation builds a trace, searches for a counterexample, runs the exact "
               "interpreter, explains it, suggests a fix or looks for a float32 witness "
               "(start-up time)"),
    "report": (frozenset({"report"}), "only a refutation renders its trace (start-up time)"),
    "lower": (frozenset({"ir"}), "device profiles are loaded only for a mesh that names a device "
              "or a matmul dtype (start-up time)"),
    "api": (frozenset({"verify", "importers", "cost"}),
            "z3 is loaded only by the commands that verify, the format readers only for "
            "configuration files, the step-time model only for meshes that name a device or links"),
    "search": (frozenset({"api", "cost", "importers", "report"}),
               "a search loads the full model, z3, the format readers and its report only when "
               "it runs"),
    "__main__": (frozenset({"cli", "console"}), "a Ctrl-C while the command loads is exit 130, "
                 "not a traceback: the load is inside the handler (console: loaded by then)"),
    "cli": (frozenset({"api", "report", "prove", "trace", "replay", "measure", "backend",
                       "importers", "compare_cli", "search"}),
            "each command loads only what it runs: z3, sympy and torch stay out of start-up"),
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported placeverify module, dotted
    line: int
    local: bool  # inside a function


def _component(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(component: str) -> int | None:
    for index, names in enumerate(LAYERS):
        if component in names:
            return index
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _from_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` names, relative imports resolved in ``package``."""
    base = node.module or ""
    if node.level:
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def _imports(path: Path) -> list[Import]:
    module = _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in TYPE_ONLY:
                continue  # annotations only: no import at run time
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                targets = [_from_base(child, package)]
            for target in targets:
                if target == "placeverify" or target.startswith("placeverify."):
                    found.append(Import(module, target, child.lineno, inner))
            visit(child, inner)

    visit(tree, False)
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
ALL_IMPORTS = [i for path in MODULES for i in _imports(path)]


def test_every_module_has_a_layer_or_is_a_backend() -> None:
    unplaced = sorted({_component(_module_name(p)) for p in MODULES}
                      - BACKENDS - {c for names in LAYERS for c in names})
    assert unplaced == [], f"add these packages to LAYERS or BACKENDS: {unplaced}"


def test_the_scan_sees_imports() -> None:
    # The scanner must find what is plainly there, or every other test here passes vacuously.
    seen = {(i.module, i.target) for i in ALL_IMPORTS}
    assert ("placeverify.api", "placeverify.lower") in seen
    assert ("placeverify.cli", "placeverify.api") in seen


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down_the_layers(path: Path) -> None:
    module = _module_name(path)
    own = _component(module)
    if own in BACKENDS:
        return  # the backends sit above every core layer and may use any of it
    mine = _layer(own)
    assert mine is not None
    wrong = []
    for imp in _imports(path):
        target = _component(imp.target)
        if target == own:
            continue
        if target in BACKENDS:
            if not (own == "cli" and imp.local):
                wrong.append(f"line {imp.line}: {imp.target} is a torch backend; only the CLI "
                             "may import it, inside the command that runs it")
            continue
        theirs = _layer(target)
        if theirs is None or theirs > mine:
            wrong.append(f"line {imp.line}: {imp.target} is in a higher layer than {module}")
    assert wrong == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_local_import_breaks_a_cycle(path: Path) -> None:
    module = _module_name(path)
    own = _component(module)
    allowed, _reason = DEFERRED.get(own, (frozenset(), ""))
    wrong = []
    for imp in _imports(path):
        if not imp.local:
            continue
        target = _component(imp.target)
        if own in BACKENDS:
            continue  # a rank's worker process imports only what that rank runs (start-up time)
        if target not in allowed:
            wrong.append(f"line {imp.line}: import of {imp.target} inside a function")
    assert wrong == []


def test_check_never_reaches_torch() -> None:
    # Modules that `placeverify check` loads at import time: everything but the backends and the
    # CLI's deferred commands. None of them names torch at module level.
    for path in MODULES:
        if _component(_module_name(path)) in BACKENDS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "torch" or n.startswith("torch.") for n in names), path


def test_check_never_reaches_matplotlib() -> None:
    # The plot extra is imported only inside the functions of report/plot.py that draw, and the
    # CLI reaches that module only for --plot: no module names matplotlib at module level.
    # (tests/test_plot.py runs `check` with an unimportable matplotlib first on the path.)
    drawing = 0
    for path in MODULES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "matplotlib" or n.startswith("matplotlib.") for n in names), path
        drawing += sum(1 for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                       and (node.module or "").startswith("matplotlib"))
    assert drawing > 0  # the scan sees the deferred imports of report/plot.py


def test_check_without_plot_does_not_import_matplotlib() -> None:
    import subprocess
    import sys

    code = ("import sys\nfrom placeverify.cli import main\n"
            "try:\n    main(['check', 'examples/strategies/llama3-70b-1f1b.place', '--no-verify',"
            " '-q'])\nexcept SystemExit as stop:\n    assert stop.code == 0, stop.code\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def _module_graph() -> dict[str, set[str]]:
    """Import edges between placeverify modules, wherever the import stands: at module level, in
    a function or under ``if TYPE_CHECKING:`` (a type on the wrong side of a cycle is still a
    cycle to a reader). A package's ``__init__`` is the package's name; ``from pkg import name``
    names the submodule when ``name`` is one."""
    known = {_module_name(p) for p in MODULES}
    graph: dict[str, set[str]] = {m: set() for m in known}
    for path in MODULES:
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):  # every import: module level, in a function, for types
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(node, package)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                           for a in node.names]
            else:
                continue
            graph[module].update(t for t in targets if t in known and t != module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_scan_finds_a_cycle() -> None:
    # The detector must see a cycle that is plainly there, or the next test passes vacuously.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    # A package's __init__ that re-exports its submodules and a submodule importing a sibling
    # through the package are the same cycle to a reader: both count. Each cycle is a type or a
    # helper on the wrong side: move it down a layer (STRUCTURE.md).
    assert _cycles(_module_graph()) == []
