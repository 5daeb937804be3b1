"""What the CI outputs report, once for SARIF and GitHub annotations: one :class:`Finding` per
refuted or unknown obligation, input error or warning, and strategy that does not fit.

Rules (stable ids, SARIF ``ruleId``): one per condition (``gradient_integrity``,
``state_consistency``, ``composition_safety``, the ``verdicts`` keys of the JSON report),
``memory-fits``, ``input-error`` (a file that does not load) and ``input-warning`` (a warning
about a file that loads). Levels: refuted and input errors are ``error``; unknown and input
warnings ``warning``; a strategy that does not fit is an ``error`` with ``--require-fit`` and a
``warning`` without; a file whose fit cannot be judged under ``--require-fit`` (no
``device_memory``) is a ``note``. Proved obligations are not findings.

A finding of an imported configuration points at the user's file, at the key that decided it
(:mod:`placeverify.report.locate`); the importer's warnings are ``input-warning`` findings at
their keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from placeverify.diagnostics import Diagnostic, Severity, Span
from placeverify.report.locate import Locator
from placeverify.report.outcome import Outcome, fits
from placeverify.result import CheckResult
from placeverify.trace import Trace
from placeverify.verdicts import CONDITIONS, Obligation, Verdict

Level = Literal["error", "warning", "note"]
MEMORY_FITS = "memory-fits"
INPUT_ERROR = "input-error"
INPUT_WARNING = "input-warning"


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    name: str
    short: str
    full: str
    level: Level  # the default level of its findings


RULES: tuple[Rule, ...] = (
    Rule("gradient_integrity", "GradientIntegrity",
         "The optimizer consumes the single-device gradient",
         "Gradient integrity: on every device the optimizer consumes exactly the gradient that "
         "single-device training on the global batch would compute (reductions, normalisation, "
         "clipping, overflow handling).", "error"),
    Rule("state_consistency", "StateConsistency",
         "Replicated training state stays identical",
         "State consistency: every replicated copy of parameters and optimizer state stays "
         "bitwise identical after the step (same update, same reduction order, shards refreshed, "
         "dropout seeds as the placement needs).", "error"),
    Rule("composition_safety", "CompositionSafety",
         "The parallelisms compose",
         "Composition safety: the placement is realisable, reductions use the right groups, "
         "routing and ordering agree, and the written step does what the placement says.", "error"),
    Rule(MEMORY_FITS, "MemoryFits", "The predicted memory fits the device",
         "Memory fits: the predicted per-device total (parameters, optimizer state, gradients, "
         "activations, buffers) is at most the mesh's device_memory.", "warning"),
    Rule(INPUT_ERROR, "InputError", "The file loads",
         "Input error: the file does not parse or is inconsistent (a syntax error, an unknown "
         "name, a size that does not divide), or cannot be read; nothing in it was checked.",
         "error"),
    Rule(INPUT_WARNING, "InputWarning", "No warning about the file",
         "Input warning: the file loads, but something in it is suspicious or not modelled.",
         "warning"),
)
RULE_IDS = tuple(r.id for r in RULES)
assert RULE_IDS[:len(CONDITIONS)] == tuple(c.value for c in CONDITIONS)


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    level: Level
    path: str  # the file the finding is about, as the user named it
    span: Span | None
    title: str  # one line
    message: str  # the full text: claim, reason, fix
    identity: str  # what makes the finding the same across runs (never a line or a timing)
    trace: Trace | None = None  # the counterexample, for a refutation that has one
    properties: dict[str, str] = field(default_factory=dict)
    locator: Locator | None = None  # where the trace's rows are, for a finding that has one


def findings(outcomes: list[Outcome], *, require_fit: bool = False) -> list[Finding]:
    """Every finding of a run, file by file in order, each file's in report order."""
    out: list[Finding] = []
    for outcome in outcomes:
        if outcome.error is not None:
            source = outcome.error.source
            path = source.path if source is not None and source.path else outcome.path
            out.extend(_diagnostic(d, path, INPUT_ERROR) for d in outcome.error.diagnostics)
            continue
        result = outcome.result
        assert result is not None
        strategy = result.strategy
        where = Locator(strategy.source.path or outcome.path, result.imported)
        if result.imported is not None:
            out.extend(_diagnostic(d, source.path, INPUT_WARNING)
                       for d, source in result.imported.warnings)
        out.extend(_located(_diagnostic(d, where.path, INPUT_WARNING), where)
                   for d in strategy.warnings)
        verification = result.verification
        if verification is not None:
            trace = verification.trace
            for o in verification.obligations:
                if o.verdict is not Verdict.PROVED:
                    found = _obligation(o, where.path, trace if _traced(o, trace) else None)
                    out.append(_located(found, where))
        if verification is not None and result.every_size is not None:
            out.extend(_located(f, where) for f in _every_size(result, where.path))
        fit = fits(result)
        total = result.costs.needed_bytes()
        capacity = strategy.mesh.device_memory
        if fit is False:
            out.append(_located(Finding(
                MEMORY_FITS, "error" if require_fit else "warning", where.path, strategy.mesh.span,
                "does not fit device memory",
                f"does not fit: {total:,} bytes predicted at the peak (with the reserve) > "
                f"device_memory {capacity:,} bytes", MEMORY_FITS,
                properties={"device_bytes": str(total)}), where))
        elif fit is None and require_fit:
            out.append(_located(Finding(MEMORY_FITS, "note", where.path, strategy.mesh.span,
                                        "fit not checked",
                                        "fit not checked: the mesh gives no device_memory",
                                        MEMORY_FITS), where))
    return out


def _located(finding: Finding, where: Locator) -> Finding:
    """The finding at its place in the user's files (unchanged for a ``.place`` file)."""
    if where.imported is None:
        return finding
    place = where.place(finding.span)
    message = f"{finding.message}\n{place.via}" if place.via else finding.message
    return replace(finding, path=place.path, span=place.span, message=message, locator=where)


def _traced(o: Obligation, trace: Trace | None) -> bool:
    """Whether ``trace`` (the verification's one trace) is this obligation's counterexample."""
    return (trace is not None and trace.condition is o.condition and trace.kind is o.kind
            and trace.claim == o.claim and trace.line == (o.span.line if o.span else None))


def _obligation(o: Obligation, path: str, trace: Trace | None) -> Finding:
    label = o.condition.label
    lines = [f"{label} {o.verdict.value}: {o.claim}"]
    if o.reason:
        lines.append(o.reason)
    if o.fix:
        lines.append(f"fix: {o.fix}")
    return Finding(o.condition.value, "error" if o.verdict is Verdict.REFUTED else "warning", path,
                   o.span, f"{label} {o.verdict.value}", "\n".join(lines),
                   f"{o.kind.value}\0{o.claim}", trace,
                   {"condition": o.condition.value, "verdict": o.verdict.value,
                    "kind": o.kind.value})


def _every_size(result: CheckResult, path: str) -> list[Finding]:
    """``check --every-size``: a finding per condition proved at the file's sizes but not for
    every size, at the obligation that fails at the smallest failing sizes when it has one."""
    verification, sized = result.verification, result.every_size
    assert verification is not None and sized is not None
    out = []
    for condition in CONDITIONS:
        verdict = sized.verdicts[condition]
        if verdict is Verdict.PROVED or verification.verdict(condition) is not Verdict.PROVED:
            continue
        failing = sized.failures.get(condition)
        where = f" at {failing.show()} (the smallest sizes where it fails)" if failing else ""
        lines = [f"{condition.label} {verdict.value} for every size{where}; the file's sizes "
                 "prove it", sized.reasons.get(condition, "")]
        at = sized.at_failing if failing is not None and failing == sized.failing else None
        o = None if at is None else next((o for o in at.obligations if o.condition is condition
                                          and o.verdict is Verdict.REFUTED), None)
        if o is not None:
            lines.append(f"{o.claim}: {o.reason}" if o.reason else o.claim)
        out.append(Finding(condition.value, "error" if verdict is Verdict.REFUTED else "warning",
                           path, None if o is None else o.span,
                           f"{condition.label} {verdict.value} for every size",
                           "\n".join(line for line in lines if line),
                           f"every-size\0{condition.value}",
                           None if o is None or at is None or not _traced(o, at.trace) else at.trace,
                           {"condition": condition.value, "verdict": verdict.value,
                            "kind": "every-size"}))
    return out


def _diagnostic(d: Diagnostic, path: str, rule: str) -> Finding:
    levels: dict[Severity, Level] = {Severity.ERROR: "error", Severity.WARNING: "warning",
                                     Severity.NOTE: "note"}
    level = levels[d.severity]
    lines = [f"{d.message}  [{d.code.value}]", *d.notes]
    span = d.span
    if d.source is not None and d.source.path != path:  # about an override (--set), not the file
        where = d.source.path if span is None else (
            f"{d.source.path}:{span.line}:{span.column}: {d.source.line_text(span.line)}")
        lines.append(where)
        span = None
    return Finding(rule, level, path, span, f"input {d.severity.value} [{d.code.value}]",
                   "\n".join(lines), f"{d.code.value}\0{d.message}",
                   properties={"code": d.code.value})
