"""The library entry points the CLI is a thin shell around."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, cast

from placeverify.cost import analyse
from placeverify.ir.lower import load
from placeverify.ir.strategy import Strategy
from placeverify.report.data import CheckResult
from placeverify.verdicts import Verification

DEFAULT_TIMEOUT_MS = 10_000  # per solver query; past it the obligation is 'unknown'


def verify(strategy: Strategy, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Verification:
    from placeverify.smt import verify as smt_verify  # z3 is imported only when verifying

    started = time.perf_counter()
    verification = smt_verify(strategy, timeout_ms=timeout_ms)
    return Verification(verification.obligations, verification.trace,
                        time.perf_counter() - started, verification.notes)


def check(path: str, *, verify_conditions: bool = True, formulas: bool = False,
          timeout_ms: int = DEFAULT_TIMEOUT_MS, imports: Any = None) -> CheckResult:
    """Check a .place file, or a framework configuration (importers; ``imports``: Options)."""
    from placeverify.importers import Options, is_importable

    if is_importable(path):
        from placeverify.importers.cli import load_strategy

        strategy = cast(Strategy, load_strategy(path, imports or Options()))
    else:
        strategy = load(path)
    return check_strategy(strategy, verify_conditions=verify_conditions, formulas=formulas,
                          timeout_ms=timeout_ms)


def check_strategy(strategy: Strategy, *, verify_conditions: bool = True, formulas: bool = False,
                   timeout_ms: int = DEFAULT_TIMEOUT_MS) -> CheckResult:
    costs = analyse(strategy)
    symbolic = analyse(strategy, symbolic=True) if formulas else None
    verification = verify(strategy, timeout_ms) if verify_conditions else None
    return CheckResult(strategy, costs, verification, symbolic)


def resize(strategy: Strategy, sizes: dict[str, int]) -> Strategy:
    """The same strategy on a mesh with some axes resized (pipeline micro-batches unchanged).

    A canonical step is derived again for the new mesh (it depends on which axes have more than
    one rank); a step written in the file is kept as written. Divisibility of the model's
    dimensions is not re-checked: replay and counterexample search use small meshes on purpose.
    """
    from placeverify.ir import canonical

    unknown = set(sizes) - set(strategy.mesh.names)
    if unknown:
        raise ValueError(f"no such axes: {sorted(unknown)}")
    resized = replace(strategy, mesh=strategy.mesh.with_sizes(sizes))
    if strategy.step.canonical:
        resized = replace(resized, step=canonical.derive(resized))
    return resized
