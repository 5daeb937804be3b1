"""``placeverify replay`` and ``placeverify check --replay``: run, compare, judge, report.

A replay is asked to confirm a *claim*: the verdict at the file's declared mesh (``check
--replay``) or the refutation at the trace's mesh (``replay trace.json``). It runs on that mesh
when it has at most 8 devices; otherwise, or with ``--world N``, on a resized mesh, where Z3 is
asked again (:mod:`placeverify.replay.plan`). The real run *agrees* with Z3 at the replayed mesh
when a refuted strategy diverges (from the single-device reference beyond the tolerance, or
between ranks that must hold identical copies) and a proved one matches. The verdict, in order:

- *error* (exit 5): the replay could not run (torch missing, a rank crashed, hung or failed, or a
  strategy the replay model cannot split);
- *not confirmed* (exit 1): the real run disagrees with Z3 at the replayed mesh, or the control
  run (the fixed twin, or the canonical correct step of the same placement) does — a bug in
  placeverify, the verifier's or the replay's, reported loudly with both numbers;
- *unknown* (exit 3): Z3 said unknown at the replayed mesh, so there is nothing to confirm;
- *unconfirmed* (exit 3): the mesh was resized and Z3's verdict at the replayed mesh is not the
  claimed one (a constant right only at the declared size, a reduction order that needs three
  ranks): the run agrees with Z3 there, which says nothing about the claimed mesh — not
  replayable at the declared mesh;
- *confirmed* (exit 0): Z3's verdict at the replayed mesh is the claimed verdict (the replayed
  mesh is the claimed one, or a resized mesh where Z3 says the same) and the run agrees with it.

So a smaller mesh's verdict never stands in for the declared one's. A bad trace raises
:class:`placeverify.diagnostics.PlaceError` (exit 2 or 4, printed by the CLI).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from placeverify.backend.available import torch_available
from placeverify.backend.runtime import BackendFailure, FailureKind, pool
from placeverify.console import Progress, stderr_console, stop_cleanly_on_signals
from placeverify.diagnostics import ExitCode
from placeverify.replay.compare import outcome
from placeverify.replay.layout import Unsupported, layout_of
from placeverify.replay.plan import (
    DEFAULT_STEPS,
    Plan,
    plan_from_strategy,
    plan_from_trace,
    strategy_of,
)
from placeverify.replay.report import SCHEMA, Report, RunReport, document, render
from placeverify.trace import load

# ---- running ---------------------------------------------------------------------------------------


def execute(plan: Plan, *, timeout: float, source: str,
            progress: Callable[[str], None] | None = None) -> Report:
    """Run the plan's main run and control on real processes (a warm pool across calls)."""
    started = time.perf_counter()
    runs: list[RunReport] = []
    try:
        for spec, expect in ((plan.main, plan.expect), (plan.control, plan.control_expect)):
            if spec is None or expect is None:
                continue
            say = (lambda msg, label=spec.label, world=spec.world:
                   progress(f"replaying the {label} on {world} process"
                            f"{'es' if world != 1 else ''}: {msg}")) if progress else None
            t0 = time.perf_counter()
            results = pool().run(spec, timeout, say)
            runs.append(RunReport(spec, expect, outcome(results, spec.sizes, spec.steps,
                                                        time.perf_counter() - t0)))
    except BackendFailure as failure:
        return Report(plan, runs[0] if runs else None, None, failure,
                      time.perf_counter() - started, source)
    main = runs[0] if runs else None
    control = runs[1] if len(runs) > 1 else None
    return Report(plan, main, control, None, time.perf_counter() - started, source)


def _check_backend() -> None:
    if not torch_available():
        raise BackendFailure(FailureKind.NO_TORCH, "torch is not installed: install placeverify "
                             "with the torch extra (pip install 'placeverify[torch]')")


def _failure_report(failure: BackendFailure, source: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "verdict": "error", "file": source,
            "error": {"kind": failure.kind, "message": failure.message}}


def replay_trace(path: str, *, as_json: bool, steps: int, world: int | None, timeout: float,
                 console: Console, progress: Progress | None = None) -> ExitCode:
    """``placeverify replay trace.json``."""
    stop_cleanly_on_signals()
    trace = load(path)  # a bad trace raises PlaceError: the CLI prints it
    try:
        _check_backend()
        pool().prestart()
        plan = plan_from_trace(trace, world=world, steps=steps)
        _validate(plan)
    except (BackendFailure, Unsupported, ValueError) as error:
        return _fail(error, trace.file or path, as_json, console, console)
    return _run_and_report(plan, timeout, path, as_json, console, console, progress)


def replay_result(result: Any, *, as_json: bool, console: Console,
                  progress: Progress | None = None) -> ExitCode:
    """``placeverify check --replay``: replay the file's step at its declared mesh (or a smaller
    one, see the module doc), judged against the check's verdict there. With ``--json`` the
    replay document goes to stderr, so that stdout stays the check document."""
    verification = result.verification
    path = result.strategy.source.path
    out = stderr_console() if as_json else console
    if verification is None:
        return ExitCode.OK
    stop_cleanly_on_signals()
    try:
        _check_backend()
        pool().prestart()
        plan = plan_from_strategy(result.strategy, steps=DEFAULT_STEPS, known=verification)
        _validate(plan)
    except (BackendFailure, Unsupported, ValueError) as error:
        return _fail(error, path, as_json, out, console)
    return _run_and_report(plan, 120.0, path, as_json, out, console, progress)


def replay_document(result: Any, *, timeout: float = 120.0) -> tuple[ExitCode, dict[str, Any]]:
    """``check --replay --json``: the replay's document, to embed under "replay" in the check's."""
    verification = result.verification
    path = result.strategy.source.path
    stop_cleanly_on_signals()
    try:
        _check_backend()
        pool().prestart()
        plan = plan_from_strategy(result.strategy, steps=DEFAULT_STEPS, known=verification)
        _validate(plan)
    except (BackendFailure, Unsupported, ValueError) as error:
        failure = error if isinstance(error, BackendFailure) else BackendFailure(
            FailureKind.UNSUPPORTED, f"cannot replay {path}: {error}")
        return ExitCode.BACKEND_ERROR, _failure_report(failure, path)
    report = execute(plan, timeout=timeout, source=path)
    return report.exit_code, document(report)


def _validate(plan: Plan) -> None:
    """Fail early, in this process, on a strategy the replay model cannot split."""
    for spec in (plan.main, plan.control):
        if spec is not None:
            layout_of(strategy_of(spec))


def _fail(error: Exception, source: str, as_json: bool, out: Console,
          console: Console) -> ExitCode:
    failure = error if isinstance(error, BackendFailure) else BackendFailure(
        FailureKind.UNSUPPORTED, f"cannot replay {source}: {error}")
    if as_json:
        _emit(out, _failure_report(failure, source))
    else:
        stderr_console().print(f"placeverify: replay: {failure.message}", markup=False, emoji=False)
    return ExitCode.BACKEND_ERROR


def _emit(out: Console, doc: dict[str, Any]) -> None:
    out.file.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    out.file.flush()


def _run_and_report(plan: Plan, timeout: float, source: str, as_json: bool, out: Console,
                    console: Console, progress: Progress | None = None) -> ExitCode:
    """Run the plan with its progress on standard error (a status line on a terminal, plain
    lines off one, none with --quiet) and print the report."""
    with (progress or Progress()).task(f"replaying on {plan.main.world} process"
                                       f"{'es' if plan.main.world != 1 else ''}") as say:
        report = execute(plan, timeout=timeout, source=source, progress=say)
    if as_json:
        _emit(out, document(report))
    else:
        render(report, console)
    return report.exit_code
