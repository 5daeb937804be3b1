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
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from placeverify.backend.available import torch_available
from placeverify.backend.runtime import BackendFailure, FailureKind, pool
from placeverify.diagnostics import ExitCode
from placeverify.replay.compare import Outcome, outcome
from placeverify.replay.plan import (
    DEFAULT_STEPS,
    MAX_DEFAULT_WORLD,
    Expectation,
    Plan,
    RunSpec,
    plan_from_strategy,
    plan_from_trace,
)
from placeverify.verdicts import Verdict

SCHEMA = "placeverify.replay/1"


@dataclass(frozen=True, slots=True)
class RunReport:
    spec: RunSpec
    expect: Expectation
    outcome: Outcome

    @property
    def replay(self) -> str:
        return "diverges" if self.outcome.diverges else "matches"

    @property
    def agrees(self) -> bool | None:
        """Does the real run agree with Z3? None when Z3 said unknown."""
        if self.expect.verdict is Verdict.REFUTED:
            return self.outcome.diverges
        if self.expect.verdict is Verdict.PROVED:
            return not self.outcome.diverges
        return None


@dataclass(frozen=True, slots=True)
class Report:
    plan: Plan
    main: RunReport | None
    control: RunReport | None
    error: BackendFailure | None
    seconds: float
    source: str  # the trace's path, or the strategy file's

    @property
    def verdict(self) -> str:
        if self.error is not None or self.main is None:
            return "error"
        if self.main.agrees is False or (self.control is not None and self.control.agrees is False):
            return "not_confirmed"
        if self.main.agrees is None:
            return "unknown"
        if not self.plan.same_verdict:
            return "unconfirmed"
        return "confirmed"

    @property
    def exit_code(self) -> ExitCode:
        return {"error": ExitCode.BACKEND_ERROR, "not_confirmed": ExitCode.REFUTED,
                "unknown": ExitCode.UNKNOWN, "unconfirmed": ExitCode.UNKNOWN,
                "confirmed": ExitCode.OK}[self.verdict]


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
                 console: Console) -> ExitCode:
    """``placeverify replay trace.json``."""
    from placeverify.replay.layout import Unsupported
    from placeverify.trace import load

    doc = load(path)  # a bad trace raises PlaceError: the CLI prints it
    try:
        _check_backend()
        pool().prestart()
        plan = plan_from_trace(doc, world=world, steps=steps)
        _validate(plan)
    except (BackendFailure, Unsupported, ValueError) as error:
        return _fail(error, str(doc.get("file") or path), as_json, console, console)
    return _run_and_report(plan, timeout, path, as_json, console, console)


def replay_result(result: Any, *, as_json: bool, console: Console) -> ExitCode:
    """``placeverify check --replay``: replay the file's step at its declared mesh (or a smaller
    one, see the module doc), judged against the check's verdict there. With ``--json`` the
    replay document goes to stderr, so that stdout stays the check document."""
    from placeverify.replay.layout import Unsupported

    verification = result.verification
    path = result.strategy.source.path
    out = Console(stderr=True, highlight=False, markup=False, soft_wrap=True) if as_json else console
    if verification is None:
        return ExitCode.OK
    try:
        _check_backend()
        pool().prestart()
        plan = plan_from_strategy(result.strategy, steps=DEFAULT_STEPS, known=verification)
        _validate(plan)
    except (BackendFailure, Unsupported, ValueError) as error:
        return _fail(error, path, as_json, out, console)
    return _run_and_report(plan, 120.0, path, as_json, out, console)


def replay_document(result: Any, *, timeout: float = 120.0) -> tuple[ExitCode, dict[str, Any]]:
    """``check --replay --json``: the replay's document, to embed under "replay" in the check's."""
    from placeverify.replay.layout import Unsupported

    verification = result.verification
    path = result.strategy.source.path
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
    from placeverify.replay.layout import layout_of
    from placeverify.replay.plan import strategy_of

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
        _error_console().print(f"placeverify: replay: {failure.message}", markup=False)
    return ExitCode.BACKEND_ERROR


def _emit(out: Console, doc: dict[str, Any]) -> None:
    out.file.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    out.file.flush()


def _error_console() -> Console:
    return Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def _run_and_report(plan: Plan, timeout: float, source: str, as_json: bool, out: Console,
                    console: Console) -> ExitCode:
    if as_json:
        report = execute(plan, timeout=timeout, source=source)
        _emit(out, document(report))
    else:
        status_console = _error_console()
        with status_console.status(f"replaying on {plan.main.world} process"
                                   f"{'es' if plan.main.world != 1 else ''}") as status:
            report = execute(plan, timeout=timeout, source=source,
                             progress=lambda msg: status.update(msg))
        render(report, console)
    return report.exit_code


# ---- the document ----------------------------------------------------------------------------------


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else ("nan" if x != x else "inf")


def _run_doc(run: RunReport) -> dict[str, Any]:
    o = run.outcome
    return {
        "z3_verdict": run.expect.verdict.value,
        "replay": run.replay,
        "agrees": run.agrees,
        "world_size": o.world,
        "mesh": o.sizes,
        "max_abs_diff_vs_reference": _num(o.max_vs_reference),
        "max_abs_diff_across_ranks": _num(o.max_across_ranks),
        "tolerance": o.tolerance,
        "states": {kind: {"vs_reference": _num(o.vs_reference.get(kind, 0.0)),
                          "across_ranks": _num(o.across_ranks.get(kind, 0.0))}
                   for kind in ("params", "optimizer")},
        "worst": o.worst,
        "skipped_steps": o.skipped,
        "seconds": round(o.seconds, 3),
    }


def document(report: Report) -> dict[str, Any]:
    plan, main = report.plan, report.main
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "verdict": report.verdict,
        "file": report.source,
        "strategy_file": plan.main.path,
        "z3_verdict": plan.expect.verdict.value,
        "condition": plan.expect.condition,
        "kind": plan.expect.kind,
        "claim": plan.expect.claim,
        "line": plan.expect.line,
        "world_size": plan.main.world,
        "mesh": plan.main.sizes,
        "declared_verdict": plan.claim.verdict.value,
        "declared_mesh": plan.claim.sizes,
        "declared_mesh_origin": plan.claim.origin,
        "declared_world_size": math.prod(plan.claim.sizes.values()),
        "resized": plan.resized,
        "resize_reason": plan.resize_reason,
        "microbatches": plan.main.microbatches,
        "steps": plan.main.steps,
        "dtype": plan.main.dtype,
        "replay": main.replay if main else None,
        "max_abs_diff_vs_reference": _num(main.outcome.max_vs_reference) if main else None,
        "max_abs_diff_across_ranks": _num(main.outcome.max_across_ranks) if main else None,
        "tolerance": main.outcome.tolerance if main else None,
        "states": _run_doc(main)["states"] if main else None,
        "worst": main.outcome.worst if main else None,
        "skipped_steps": main.outcome.skipped if main else None,
        "backend": main.outcome.backend if main else None,
        "control": None,
        "notes": list(plan.notes),
        "seconds": round(report.seconds, 3),
    }
    if plan.control is not None and plan.control_expect is not None:
        control: dict[str, Any] = {"origin": plan.control_origin,
                                   "z3_verdict": plan.control_expect.verdict.value}
        if report.control is not None:
            control.update(_run_doc(report.control))
        doc["control"] = control
    if report.error is not None:
        doc["error"] = {"kind": report.error.kind, "message": report.error.message}
    return doc


# ---- text --------------------------------------------------------------------------------------------


def _g(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else ("nan" if x != x else "inf")


def _mesh(sizes: dict[str, int]) -> str:
    return ", ".join(f"{a} = {n}" for a, n in sizes.items())


def _numbers(o: Outcome) -> str:
    return (f"max |distributed - reference| = {_g(o.max_vs_reference)} (params "
            f"{_g(o.vs_reference.get('params', 0.0))}, optimizer "
            f"{_g(o.vs_reference.get('optimizer', 0.0))}; tolerance {_g(o.tolerance)}), "
            f"max difference across ranks = {_g(o.max_across_ranks)} (bitwise)")


def render(report: Report, console: Console) -> None:
    plan = report.plan
    spec = plan.main
    world = spec.world
    claim = plan.claim
    console.print(f"replay of {report.source}: {world} process{'es' if world != 1 else ''} "
                  f"({_mesh(spec.sizes)}), {spec.microbatches} micro-batch"
                  f"{'es' if spec.microbatches != 1 else ''}, {spec.steps} step"
                  f"{'s' if spec.steps != 1 else ''}, {spec.dtype}", markup=False)
    if plan.resized:
        console.print(f"  RESIZED: the {claim.mesh_name} is {_mesh(claim.sizes)} "
                      f"({math.prod(claim.sizes.values())} devices); replayed at "
                      f"{_mesh(spec.sizes)} because {plan.resize_reason}", markup=False)
    for note in plan.notes:
        console.print(f"  note: {note}", markup=False)
    expect = plan.expect
    where = ""
    if expect.condition:
        where = f" ({expect.condition.replace('_', ' ')}" + (f", line {expect.line}" if expect.line
                                                            else "") + ")"
    if plan.resized:
        console.print(f"  Z3 at the {claim.mesh_name}: {claim.verdict.value}", markup=False)
        console.print(f"  Z3 at the replayed mesh: {expect.verdict.value}{where}", markup=False)
    else:
        console.print(f"  Z3 at this mesh: {expect.verdict.value}{where}", markup=False)
    if report.error is not None:
        console.print(f"  error: {report.error.message}", markup=False)
        if report.error.detail and os.environ.get("PLACEVERIFY_DEBUG"):
            console.print(report.error.detail, markup=False)
        return
    main = report.main
    assert main is not None
    console.print(f"  real run ({main.outcome.backend}): {main.replay}: {_numbers(main.outcome)}",
                  markup=False)
    if main.outcome.skipped:
        console.print(f"  skipped steps (dynamic loss scaling, overflow injected on rank 0): "
                      f"{main.outcome.skipped}", markup=False)
    _judge(main, "the replay", console, plan.resized)
    if report.control is not None:
        control = report.control
        console.print(f"  control ({plan.control_origin}, Z3: {control.expect.verdict.value}): "
                      f"{control.replay}: {_numbers(control.outcome)}", markup=False)
        _judge(control, "the control", console, plan.resized)
    if report.verdict == "unconfirmed":
        headline = (f"NOT REPLAYABLE AT THE {claim.mesh_name.upper()}"
                    if math.prod(claim.sizes.values()) > MAX_DEFAULT_WORLD
                    else f"UNCONFIRMED FOR THE {claim.mesh_name.upper()}")
        console.print(
            f"  {headline}: Z3 says {claim.verdict.value} at {_mesh(claim.sizes)} but "
            f"{expect.verdict.value} at the replayed {_mesh(spec.sizes)}; the run agrees with Z3 "
            f"there, which confirms nothing about the {claim.mesh_name} (the step is right at "
            "some sizes and wrong at others)", markup=False)
    elif report.verdict == "confirmed" and plan.resized:
        console.print(f"  Z3 says {claim.verdict.value} at both meshes: the run on the replayed "
                      f"mesh stands for the {claim.mesh_name}", markup=False)
    console.print(f"  {report.verdict.replace('_', ' ')} in {report.seconds:.1f} s", markup=False)


def _judge(run: RunReport, what: str, console: Console, resized: bool) -> None:
    at = " at the replayed mesh" if resized else ""
    if run.agrees is None:
        console.print(f"  {what}: Z3 said unknown at this mesh, so there is nothing to confirm",
                      markup=False)
    elif run.agrees:
        said = "refuted" if run.expect.verdict is Verdict.REFUTED else "proved"
        console.print(f"  {what} agrees with Z3{at} ({said}; the real run {run.replay})",
                      markup=False)
    else:
        o = run.outcome
        console.print(
            f"  VERIFIER BUG: Z3 says {run.expect.verdict.value} but the real run "
            f"{run.replay}: |distributed - reference| = {_g(o.max_vs_reference)} against a "
            f"tolerance of {_g(o.tolerance)}, across ranks {_g(o.max_across_ranks)}. Either the "
            "verifier or the replay is wrong; please report it with this trace.", markup=False)
