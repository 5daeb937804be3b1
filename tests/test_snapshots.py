"""Behaviour snapshots: the contract a restructuring must keep byte for byte.

For every bundled example, ``check --json`` (timings set to 0) and an IR golden (the mode matrix
after composition, the step as it runs — written or canonical — and each parameter group's view
of the mesh); for ``proofs/``, ``prove --json``. A change that alters one of them on purpose
regenerates them with ``PLACEVERIFY_UPDATE_GOLDENS=1`` and says why in its commit.

``check`` and ``prove`` run as the user runs them, one process per file: a Z3 model (the values
of a counterexample) depends on what the solver's context saw before, so in one long process
the same query can be answered with another model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from placeverify.ir.render import step_text
from placeverify.lower import load
from placeverify.semantics.groups import group_view
from tests.conftest import EXAMPLES, ROOT

SNAPSHOTS = ROOT / "tests" / "snapshots"
UPDATE = os.environ.get("PLACEVERIFY_UPDATE_GOLDENS") == "1"
FILES = sorted(EXAMPLES.glob("*/*.place"))
TIMINGS = {"seconds", "check_seconds", "solve_seconds"}


def _untimed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (0 if k in TIMINGS else _untimed(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _text(doc: Any) -> str:
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _compare(path: Path, actual: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    assert path.is_file(), f"no snapshot {path.relative_to(ROOT)}: run with PLACEVERIFY_UPDATE_GOLDENS=1"
    assert actual == path.read_text(encoding="utf-8"), f"{path.relative_to(ROOT)} changed"


def _name(path: Path) -> str:
    return f"{path.parent.name}__{path.stem}.json"


def ir_document(path: Path) -> dict[str, Any]:
    strategy = load(str(path))
    return {
        "modes": {p.axis: {"role": p.role.value, "tuple": p.tuple_text()}
                  for p in strategy.placements},
        "canonical": strategy.step.canonical,
        "microbatches": strategy.step.microbatches,
        "step": step_text(strategy),
        "groups": {g.value: {field: sorted(getattr(view, field)) for field in
                             ("batch", "samples", "extra", "ends", "routed", "complete", "owned")}
                   for g in strategy.model.groups_present()
                   for view in [group_view(strategy, g)]},
    }


def _json_of(*args: str) -> Any:
    """The JSON a fresh ``placeverify`` process prints (run from the repository root)."""
    done = subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_check_json_snapshot(path: Path) -> None:
    doc = _json_of("check", "--json", str(path.relative_to(ROOT)))
    _compare(SNAPSHOTS / "check" / _name(path), _text(_untimed(doc)))


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_ir_snapshot(path: Path) -> None:
    _compare(SNAPSHOTS / "ir" / _name(path), _text(ir_document(path)))


@pytest.mark.parametrize("path", sorted((ROOT / "proofs").glob("*.rule")), ids=lambda p: p.stem)
def test_prove_json_snapshot(path: Path) -> None:
    doc = _json_of("prove", "--json", str(path.relative_to(ROOT)))
    _compare(SNAPSHOTS / "prove" / f"{path.stem}.json", _text(_untimed(doc)))
