"""The roles registry ``placeverify.roles.ROLES`` against the docs' table of the modes each role
realises.

The expected modes are parsed from docs/language/place.md (the page of `place`), not from the code.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import placeverify.roles
from placeverify.ir.placement import Mode, Role
from placeverify.ir.presets import TABLE, PresetSpec
from placeverify.roles import ROLES
from placeverify.roles.spec import RoleSpec

PAGE = Path(__file__).resolve().parents[1] / "docs" / "language" / "place.md"  # the docs page of `place`
HEADER = "| role | its ranks hold | Θ | Ω | G | A |"
SUPPORT = ("relations", "queries", "shapes", "spec")  # roles/ modules that are not a role


def readme_modes() -> dict[str, tuple[frozenset[Mode], ...]]:
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2
    table: dict[str, tuple[frozenset[Mode], ...]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        role, _, *columns = (c.strip() for c in line.strip().strip("|").split("|"))
        assert role not in table, f"the page lists the role {role} twice"
        table[role] = tuple(frozenset(Mode(m.strip()) for m in c.split(",")) for c in columns)
    return table


README_MODES = readme_modes()


def test_every_role_has_exactly_one_spec() -> None:
    assert set(ROLES) == set(Role)
    for role, spec in ROLES.items():
        assert spec.role is role


def test_every_role_module_defines_one_spec() -> None:
    """One module per role, each with one RoleSpec, all of them registered."""
    found: list[RoleSpec] = []
    for info in pkgutil.iter_modules(placeverify.roles.__path__):
        if info.name in SUPPORT:
            continue
        module = importlib.import_module(f"placeverify.roles.{info.name}")
        specs = [v for v in vars(module).values() if isinstance(v, RoleSpec)]
        assert len(specs) == 1, f"roles/{info.name}.py defines {len(specs)} RoleSpecs"
        found.extend(specs)
    assert sorted(s.role for s in found) == sorted(Role)
    assert all(ROLES[s.role] is s for s in found)


def test_readme_lists_every_role() -> None:
    assert set(README_MODES) == {role.value for role in Role}


@pytest.mark.parametrize("role", list(Role), ids=str)
def test_allowed_modes_match_readme(role: Role) -> None:
    assert ROLES[role].allowed_modes == README_MODES[role.value]


@pytest.mark.parametrize("preset", TABLE, ids=lambda p: p.name)
def test_every_preset_is_realisable_by_its_role(preset: PresetSpec) -> None:
    allowed = ROLES[preset.role].allowed_modes
    assert all(mode in column for mode, column in zip(preset.modes, allowed, strict=True))
