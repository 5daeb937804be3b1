"""The library entry points: every stage of the pipeline, and the CLI is a thin shell around them.

    text --parse--> AST --lower--> Strategy (Config + Step) --costs / verify--> CheckResult

Each stage can be called on its own, for people who use placeverify as a library:

- :func:`read` a file into a :class:`~placeverify.diagnostics.Source`, :func:`parse` a source into
  the AST (:mod:`placeverify.syntax.ast`, every node with its span);
- :func:`lower` the AST into the IR, or :func:`load` / :func:`load_text` for both steps at once
  (under ``--set`` overrides checked by :func:`overrides`);
- :func:`derive_step` the canonical step of a configuration (what a correct implementation of its
  presets does in one training step);
- :func:`costs` (memory and communication per device, exact or as SymPy expressions);
- :func:`verify` the three conditions with Z3; :func:`estimate_time` the step time;
- :func:`check` / :func:`check_strategy` all of the above; :func:`resize` a strategy's mesh.

Errors in the input raise :class:`~placeverify.diagnostics.PlaceError` with every diagnostic found.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from placeverify.cost import Costs, analyse, timed_mesh
from placeverify.diagnostics import Source
from placeverify.importers import Options, is_importable
from placeverify.ir.step import Step
from placeverify.ir.strategy import Config, Strategy
from placeverify.lower import canonical, load, load_text, lower
from placeverify.lower.overrides import Settings, parse_settings
from placeverify.lower.resize import resize
from placeverify.result import CheckResult
from placeverify.syntax import ast
from placeverify.syntax.parser import parse_source
from placeverify.syntax.source import read_source
from placeverify.verdicts import Verification

if TYPE_CHECKING:
    from placeverify.cost.time import StepTime

__all__ = [
    "DEFAULT_BUDGET_S", "DEFAULT_TIMEOUT_MS", "CheckResult", "check", "check_strategy", "costs",
    "derive_step", "estimate_time", "load", "load_text", "lower", "overrides", "parse", "read",
    "resize", "verify",
]

DEFAULT_TIMEOUT_MS = 10_000  # one solver query at most; past it the obligation is 'unknown'
DEFAULT_BUDGET_S = 30.0  # the whole verification of one strategy (check --timeout)


def read(path: str) -> Source:
    """A ``.place`` file's text, decoded and size-checked (errors point at the file)."""
    return read_source(path)


def parse(source: Source | str, path: str = "<text>") -> ast.File:
    """The AST of a source, or of a text named ``path`` in messages."""
    return parse_source(source if isinstance(source, Source) else Source(path, source))


def overrides(texts: list[str] | tuple[str, ...]) -> Settings:
    """``--set KEY=VALUE`` options, checked (``docs/overrides.md``); raises
    :class:`~placeverify.diagnostics.PlaceError` pointing into the ones that are malformed."""
    return parse_settings(texts)


def derive_step(config: Config) -> Step:
    """The canonical step of a configuration: what its presets do in one training step."""
    return canonical.derive(config)


def costs(strategy: Strategy, *, symbolic: bool = False) -> Costs:
    """Per-device memory and per-step communication; with ``symbolic`` as SymPy expressions."""
    return analyse(strategy, symbolic=symbolic)


def verify(strategy: Strategy, timeout_ms: int = DEFAULT_TIMEOUT_MS,
           budget_s: float | None = DEFAULT_BUDGET_S) -> Verification:
    """Gradient integrity, state consistency and composition safety, each proved, refuted or
    unknown. ``budget_s`` bounds the whole verification (what it leaves undecided is unknown,
    reason "time budget"; ``None`` for no bound), ``timeout_ms`` each solver query."""
    # Deferred so that z3 is loaded only by the commands that verify (check --no-verify and
    # compare without --verify start faster); placeverify.verify does not import this module.
    from placeverify.verify import verify as run_checks

    started = time.perf_counter()
    verification = run_checks(strategy, timeout_ms=timeout_ms, budget_s=budget_s)
    return Verification(verification.obligations, verification.trace,
                        time.perf_counter() - started, verification.notes)


def check(path: str, *, verify_conditions: bool = True, formulas: bool = False,
          timeout_ms: int = DEFAULT_TIMEOUT_MS, budget_s: float | None = DEFAULT_BUDGET_S,
          imports: Options | None = None, settings: Settings | None = None,
          every_size: tuple[str, ...] | None = None) -> CheckResult:
    """``placeverify check``: load a ``.place`` file, or a framework configuration through the
    importers (``imports`` their options), under ``settings`` (its ``--set`` overrides, from
    :func:`overrides`), derive its costs and verify it, all within ``budget_s``
    (:func:`placeverify.verify.budget.whole_check`: the verification ends early enough for the
    report). With ``every_size`` (the names held at the file's sizes: axes or ``microbatches``)
    the conditions are also judged for every other size (:mod:`placeverify.verify.every_size`)."""
    from placeverify.verify.budget import whole_check  # deferred with z3 (see verify)

    with whole_check(budget_s if verify_conditions else None):
        imported = None
        if is_importable(path):
            # Deferred: only configuration files need the format readers (check start-up time).
            from placeverify.importers.cli import load_import

            strategy, imported = load_import(path, imports or Options(), settings)
        else:
            strategy = load(path, settings)
        result = check_strategy(strategy, verify_conditions=verify_conditions, formulas=formulas,
                                timeout_ms=timeout_ms, budget_s=budget_s, every_size=every_size)
        return replace(result, imported=imported)


def check_strategy(strategy: Strategy, *, verify_conditions: bool = True, formulas: bool = False,
                   timeout_ms: int = DEFAULT_TIMEOUT_MS,
                   budget_s: float | None = DEFAULT_BUDGET_S,
                   every_size: tuple[str, ...] | None = None) -> CheckResult:
    """Costs (and with ``formulas`` their symbolic form) and verification of a lowered strategy;
    with ``every_size`` (the names held fixed) also for every size of the others."""
    sizes = None
    if verify_conditions and every_size is not None:
        from placeverify.verify.every_size import for_check, quantified  # deferred with z3

        sizes = quantified(strategy, every_size)  # a wrong --fixed name before any work
    exact = analyse(strategy)
    symbolic = analyse(strategy, symbolic=True) if formulas else None
    verification = verify(strategy, timeout_ms, budget_s) if verify_conditions else None
    sized = None if sizes is None else for_check(strategy, sizes, timeout_ms, budget_s, verification)
    return CheckResult(strategy, exact, verification, symbolic, estimate_time(strategy, exact),
                       every_size=sized)


def estimate_time(strategy: Strategy, exact: Costs | None = None) -> StepTime | None:
    """The step-time estimate (placeverify.cost.time) when the mesh names a device or gives
    link bandwidths; None otherwise or for a bare parameter count."""
    if not timed_mesh(strategy):
        return None
    # Deferred: the step-time model is loaded only for meshes that name a device or links.
    from placeverify.cost.time import step_time

    return step_time(strategy, exact if exact is not None else analyse(strategy))
