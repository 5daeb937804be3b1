"""The module map (docs/architecture.md) names every module of the package, one line each, and
nothing else.

A package's ``__init__.py`` is listed as the package folder (``placeverify/lower/``). The test
reads the map from the "Module map" section of docs/architecture.md, so adding a module without a
line (or leaving a line for a module that is gone) fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "placeverify"
LINE = re.compile(r"^- `(placeverify/(?:[\w/]*(?:\.py|/))?)`: \S")


def _section() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = text.index("## Module map")
    end = text.find("\n#", start + 1)
    return text[start:end if end != -1 else None].splitlines()


def _documented() -> list[str]:
    names: list[str] = []
    for line in _section():
        if line.startswith("- `placeverify/"):
            match = LINE.match(line)
            assert match, f"module map line not in the form '- `path`: what it holds': {line!r}"
            names.append(match.group(1))
    return names


def _modules() -> set[str]:
    out = set()
    for path in PACKAGE.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(ROOT).as_posix()
        out.add(rel[: -len("__init__.py")] if path.name == "__init__.py" else rel)
    return out


def test_the_map_has_lines() -> None:
    assert len(_documented()) > 50


def test_every_module_has_one_line() -> None:
    documented = _documented()
    duplicates = sorted({n for n in documented if documented.count(n) > 1})
    assert duplicates == []
    actual = _modules()
    assert sorted(actual - set(documented)) == [], "modules without a line in the module map"
    assert sorted(set(documented) - actual) == [], "lines for modules that do not exist"
