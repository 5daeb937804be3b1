"""What a replay found, as data, as the ``placeverify.replay/1`` JSON document, and as text.

:class:`Report` holds the main run and the control run of a :class:`placeverify.replay.plan.Plan`
beside Z3's expectation for each, and derives the verdict and exit code that
:mod:`placeverify.replay.cli` documents; :func:`document` and :func:`render` write it out.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from placeverify.backend.runtime import BackendFailure
from placeverify.diagnostics import ExitCode
from placeverify.replay.compare import Outcome
from placeverify.replay.plan import Expectation, Plan, RunSpec
from placeverify.replay.sizes import MAX_DEFAULT_WORLD
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
        if self.unstable or not self.updated:
            return "unknown"
        if self.main.agrees is False or (self.control is not None and self.control.agrees is False):
            return "not_confirmed"
        if self.main.agrees is None:
            return "unknown"
        if not self.plan.same_verdict:
            return "unconfirmed"
        return "confirmed"

    @property
    def unstable(self) -> bool:
        """Does a run's reference amplify rounding past the tolerance (compare.Outcome.unstable)?"""
        return any(run is not None and run.outcome.unstable for run in (self.main, self.control))

    @property
    def updated(self) -> bool:
        """Did every run update its states in some step (compare.Outcome.updated)?"""
        return all(run is None or run.outcome.updated for run in (self.main, self.control))

    @property
    def exit_code(self) -> ExitCode:
        return {"error": ExitCode.BACKEND_ERROR, "not_confirmed": ExitCode.REFUTED,
                "unknown": ExitCode.UNKNOWN, "unconfirmed": ExitCode.UNKNOWN,
                "confirmed": ExitCode.OK}[self.verdict]


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
        "reference_sensitivity": _num(o.sensitivity),
        "unstable": o.unstable,
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
        "reference_sensitivity": _num(main.outcome.sensitivity) if main else None,
        "unstable": report.unstable,
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
        console.print(f"  skipped steps (overflow injected into one rank's gradients): "
                      f"{main.outcome.skipped}", markup=False)
    _judge(main, "the replay", console, plan.resized)
    if report.control is not None:
        control = report.control
        console.print(f"  control ({plan.control_origin}, Z3: {control.expect.verdict.value}): "
                      f"{control.replay}: {_numbers(control.outcome)}", markup=False)
        _judge(control, "the control", console, plan.resized)
    if report.verdict == "unconfirmed" and claim.sizes == spec.sizes \
            and claim.verdict is Verdict.REFUTED and expect.verdict is Verdict.PROVED:
        console.print(
            f"  UNCONFIRMED: Z3 says {claim.verdict.value} at {_mesh(claim.sizes)} on a condition "
            f"about no value the run computes (a placement's bookkeeping, or a collective's "
            f"group whose result nothing reads), and {expect.verdict.value} on every value; the "
            "run agrees with the values", markup=False)
    elif report.verdict == "unconfirmed":
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
    if run.outcome.unstable:
        o = run.outcome
        console.print(
            f"  {what}: inconclusive: the single-device reference is numerically unstable over "
            f"{run.spec.steps} steps ("
            + (f"one rounding unit per step moves a state by {_g(o.sensitivity)}: rounding "
               f"grows to a tolerance of {_g(o.tolerance)}, the size of a bug beside its largest "
               f"state, {_g(o.scale)}" if o.sensitivity == o.sensitivity
               else "its states overflow")
            + "), so rounding and a bug look alike; replay fewer steps (--steps)", markup=False)
    elif not run.outcome.updated:
        console.print(f"  {what}: inconclusive: every step replayed was skipped (the one step "
                      "replayed is the one whose gradients overflow), so no state moved; replay "
                      "more steps (--steps)", markup=False)
    elif run.agrees is None:
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
