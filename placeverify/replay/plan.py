"""What to replay: the mesh, the counts, the verifier's verdict there, and the control run.

Everything here runs in the placeverify process and never imports torch. A :class:`RunSpec` is
the whole input of one distributed run, as plain JSON: the worker processes receive it as a
string and rebuild the strategy by lowering the ``.place`` text again (nothing is unpickled or
evaluated).

**Which mesh.** A replay confirms a *claimed verdict about one mesh*: for ``check --replay`` the
verdict at the file's declared mesh, for ``replay trace.json`` the refutation at the trace's mesh
(the smallest mesh Z3 found). It runs on that mesh whenever it has at most
:data:`MAX_DEFAULT_WORLD` devices. A larger mesh, or ``--world N``, is *resized*
(:mod:`placeverify.replay.sizes`): the strategy is re-targeted with
:func:`placeverify.lower.resize.resize`, Z3 is asked for its verdict *at the replayed mesh* (a constant
such as ``scale grads by 1 / 4`` can be right at dp = 4 and wrong at dp = 2; a rank-dependent
reduction order only differs bitwise with three or more ranks) and, when Z3 refutes gradient
integrity there, token counts are picked that the exact interpreter
(:func:`placeverify.semantics.interpreter.run`) shows diverging. The plan records the claimed
mesh and verdict, the replayed mesh and why it differs; :mod:`placeverify.replay.cli` calls the
result *confirmed* only when Z3's verdict at the replayed mesh is the claimed verdict and the real
run agrees with it, and *unconfirmed* when the replayed mesh's verdict is another one: a run on
a smaller mesh says nothing about the declared one then.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from placeverify.api import verify as api_verify
from placeverify.diagnostics import PlaceError
from placeverify.ir.strategy import Strategy
from placeverify.lower import canonical, load_text
from placeverify.lower.resize import resize
from placeverify.replay.carried import at_least
from placeverify.replay.consistency import (
    check_claim,
    check_counts,
    check_mesh,
    check_microbatches,
)
from placeverify.replay.counts import AtomCounts, pick_counts, trace_counts
from placeverify.replay.layout import Unsupported
from placeverify.replay.sizes import replayed_sizes
from placeverify.replay.witnessed import GROUP_ONLY, UNWITNESSED, unwitnessed_notes
from placeverify.semantics.asynchrony import replayed
from placeverify.semantics.schedule import Unmodelled
from placeverify.syntax.source import read_source
from placeverify.trace import Trace
from placeverify.verdicts import ObligationKind, Verdict, Verification
from placeverify.verify.size_space import with_microbatches

DEFAULT_STEPS = 3
DEFAULT_SEED = 1234
MAX_MICROBATCHES = 4  # a proved file's pipeline micro-batches beyond this are not replayed



@dataclass(frozen=True, slots=True)
class RunSpec:
    """The complete, JSON-serialisable input of one distributed replay run."""

    label: str  # "trace", "control" or "step"
    source: str  # the .place text, lowered again in every worker
    path: str
    sizes: dict[str, int]
    microbatches: int
    canonical: bool  # replace the file's step by the canonical correct one (and restore RNG)
    tokens: AtomCounts
    samples: AtomCounts
    steps: int = DEFAULT_STEPS
    dtype: str = "float64"
    seed: int = DEFAULT_SEED
    backend: str | None = None  # None: nccl when enough CUDA devices are visible, else gloo
    fault: dict[str, Any] | None = None  # tests only: {"rank": r, "kind": "crash"|"raise"|"hang"}
    # the participation pattern the run realises: (group, idle micro-batches) pairs
    # (placeverify.semantics.participation); empty for files without 'unused' groups
    idle: list[tuple[str, list[int]]] = field(default_factory=list)
    # the micro-batches that hold no tokens on any rank (placeverify.semantics.empty): their
    # atoms get 0 tokens, every label ignored; empty for files without 'empty microbatches'
    empty: list[int] = field(default_factory=list)

    @property
    def world(self) -> int:
        return math.prod(self.sizes.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> RunSpec:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("a replay job is a JSON object")
        known = set(RunSpec.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown replay job fields: {sorted(unknown)}")
        raw["tokens"] = [(tuple(int(c) for c in b), int(k), int(n)) for b, k, n in raw["tokens"]]
        raw["samples"] = [(tuple(int(c) for c in b), int(k), int(n)) for b, k, n in raw["samples"]]
        raw["sizes"] = {str(a): int(n) for a, n in raw["sizes"].items()}
        raw["idle"] = [(str(g), [int(k) for k in ks]) for g, ks in raw.get("idle", [])]
        raw["empty"] = [int(k) for k in raw.get("empty", [])]
        return RunSpec(**raw)


@dataclass(frozen=True, slots=True)
class Expectation:
    """Z3's verdict on the strategy exactly as it is replayed (same mesh, same step)."""

    verdict: Verdict
    condition: str | None = None
    kind: str | None = None  # the refuted obligation's kind, e.g. "coefficient", "fp-order"
    claim: str | None = None
    reason: str | None = None
    line: int | None = None

    @property
    def needs_counts(self) -> bool:
        """Does the refutation depend on the token counts (a wrong loss coefficient)?"""
        return self.verdict is Verdict.REFUTED and self.kind == ObligationKind.COEFFICIENT


@dataclass(frozen=True, slots=True)
class Claim:
    """The verdict a replay is asked to confirm, and the mesh it is about."""

    verdict: Verdict
    sizes: dict[str, int]
    origin: str  # "file" (check --replay: the declared mesh) or "trace" (the trace's mesh)

    @property
    def mesh_name(self) -> str:
        return "declared mesh" if self.origin == "file" else "trace's mesh"


@dataclass(frozen=True, slots=True)
class Plan:
    main: RunSpec
    expect: Expectation  # Z3 at the replayed mesh
    claim: Claim
    control: RunSpec | None = None
    control_expect: Expectation | None = None
    control_origin: str | None = None  # the fixed twin's path, or "canonical step"
    resize_reason: str | None = None  # why the replayed mesh is not the claim's
    notes: tuple[str, ...] = field(default=())

    @property
    def resized(self) -> bool:
        return self.main.sizes != self.claim.sizes

    @property
    def same_verdict(self) -> bool:
        """Is Z3's verdict at the replayed mesh the verdict the replay is to confirm?"""
        return self.expect.verdict is self.claim.verdict


# ---- strategies ----------------------------------------------------------------------------------


def at_microbatches(strategy: Strategy, m: int) -> Strategy:
    """The strategy with the micro-batch count a run uses (a trace's may be below the file's):
    Z3 is asked about the step the run executes, not the one the file declares. A strategy of
    several optimizer steps runs the step of a window of ``m`` (:mod:`placeverify.semantics.steps`)."""
    if strategy.step.windows:
        from placeverify.semantics.steps import projection

        return projection(strategy, m)
    if m == strategy.step.microbatches:
        return strategy
    return with_microbatches(strategy, m)  # 'on microbatch last' on the new last one


def outcome_replayed(strategy: Strategy) -> Strategy:
    """With asynchronous collectives, the outcome the replay runs (each completed at its wait, as
    a stream that never synchronised with it gives); one the construct does not model is not
    replayed."""
    try:
        return replayed(strategy)
    except Unmodelled as err:
        where = f"line {err.span.line}: " if err.span is not None else ""
        raise Unsupported(f"{where}not modelled: {err}") from None


def strategy_of(spec: RunSpec) -> Strategy:
    """Lower the spec's source and re-target it to the spec's mesh and micro-batch count (worker
    and parent alike)."""
    strategy = at_microbatches(resize(load_text(spec.source, spec.path), spec.sizes),
                               spec.microbatches)
    if spec.canonical:
        strategy = replace(strategy, step=canonical.derive(strategy.config), config=replace(
            strategy.config, recompute=replace(strategy.recompute, restore_rng=True)))
    if spec.idle:
        from placeverify.replay.participation import realised

        strategy = realised(strategy, spec.idle)
    if spec.empty:
        from placeverify.semantics.empty import with_empty

        strategy = with_empty(strategy, frozenset(spec.empty))
    return outcome_replayed(strategy)


def expectation(verification: Verification) -> Expectation:
    """What a real run must show: Z3's verdict over the obligations about computed values."""
    kept = tuple(o for o in verification.obligations if o.kind not in UNWITNESSED)
    if all(o.verdict is Verdict.PROVED for o in kept if o.kind not in GROUP_ONLY):
        kept = tuple(o for o in kept if o.kind not in GROUP_ONLY)
    verification = replace(verification, obligations=kept)
    overall = verification.overall()
    first = verification.first_refuted()
    if first is None:
        return Expectation(overall)
    return Expectation(overall, first.condition.value, first.kind, first.claim,
                       first.reason or None, first.span.line if first.span else None)


def verify(strategy: Strategy, timeout_ms: int, attempts: int = 3) -> Expectation:
    """Z3's verdict; an *unknown* is asked again (the solver's search is randomised, and a
    floating-point query that times out once often succeeds on the next try)."""
    result = expectation(api_verify(strategy, timeout_ms))
    for _ in range(attempts - 1):
        if result.verdict is not Verdict.UNKNOWN:
            break
        result = expectation(api_verify(strategy, timeout_ms))
    return result


# ---- mesh sizes ----------------------------------------------------------------------------------


# ---- plans ---------------------------------------------------------------------------------------


def _trace_sizes(trace: Trace, strategy: Strategy) -> dict[str, int]:
    return {a: trace.mesh.get(a, 1) for a in strategy.mesh.names}


@dataclass(frozen=True)
class TraceCase:
    """A trace checked against its own source, and where it is replayed."""

    strategy: Strategy  # the source, resized to ``sizes``
    sizes: dict[str, int]  # the replayed mesh
    keep: dict[str, int]  # the trace's own mesh
    reason: str | None  # why the mesh was resized (None when it was not)
    expect: Expectation  # Z3's verdict at the replayed mesh
    windows: int = 1  # the optimizer steps the source's step is written over


def trace_case(trace: Trace, *, world: int | None, timeout_ms: int = 10_000) -> TraceCase:
    """The checks every use of a trace makes before it runs anything (``replay`` and ``replay
    --emit`` alike): a trace that is no counterexample of its own source
    (:mod:`placeverify.replay.consistency`) raises an input error."""
    path = trace.file or "<trace>"
    strategy = outcome_replayed(load_text(trace.source, path))
    check_mesh(trace, strategy)
    check_microbatches(trace, strategy)
    keep = _trace_sizes(trace, strategy)
    sizes, reason = replayed_sizes(strategy, keep, world, "trace's mesh")
    at_file = resize(strategy, sizes)
    if trace.values.get("participation"):  # the pattern the trace refutes
        from placeverify.replay.participation import realised, trace_idle

        at_file = realised(at_file, trace_idle(trace))
    if "empty" in trace.values:  # the micro-batches without tokens the trace refutes
        from placeverify.replay.empty import trace_empty
        from placeverify.semantics.empty import with_empty

        at_file = with_empty(at_file, frozenset(trace_empty(trace)))
    resized = at_microbatches(at_file, trace.microbatches)
    if sizes == keep:  # the trace's own mesh: its counts are replayed, so they must fit
        check_counts(trace, resized, sizes, at_file)
    expect = verify(resized, timeout_ms)
    group_only = trace.kind in GROUP_ONLY and expect.verdict is Verdict.PROVED  # see expectation
    if sizes == keep and trace.kind not in UNWITNESSED and not group_only:
        check_claim(trace, resized, sizes, expect.verdict)
    return TraceCase(resized, sizes, keep, reason, expect, len(strategy.step.windows) or 1)


def plan_from_trace(trace: Trace, *, world: int | None, steps: int,
                    timeout_ms: int = 10_000) -> Plan:
    """Replay a counterexample trace (already validated by :func:`placeverify.trace.load`) on the
    trace's mesh, or on ``world`` processes (:func:`trace_case` checks it first)."""
    path = trace.file or "<trace>"
    case = trace_case(trace, world=world, timeout_ms=timeout_ms)
    sizes, keep, m, expect = case.sizes, case.keep, trace.microbatches, case.expect
    notes: list[str] = []
    steps = at_least(steps, case.windows, trace.condition, notes)
    spec_base = RunSpec("trace", trace.source, path, sizes, m, False, [], [], steps)
    if case.strategy.config.unused:
        from placeverify.replay.participation import chosen_idle, trace_idle

        spec_base = replace(spec_base, idle=trace_idle(trace) if trace.values.get("participation")
                            else chosen_idle(strategy_of(spec_base), timeout_ms))
    if case.strategy.config.empty:
        from placeverify.replay.empty import chosen_empty, trace_empty

        spec_base = replace(spec_base, empty=trace_empty(trace) if "empty" in trace.values
                            else chosen_empty(strategy_of(spec_base), timeout_ms))
    counts = trace_counts(trace, case.strategy, sizes, m) if sizes == keep else None
    tokens, samples = _counts(case.strategy, sizes, m, expect, counts, notes)
    tokens = _emptied(tokens, spec_base.empty)
    main = replace(spec_base, tokens=tokens, samples=samples)
    control, control_expect, origin = _control(path, main, timeout_ms)
    return Plan(main, expect, Claim(Verdict.REFUTED, keep, "trace"), control, control_expect,
                origin, case.reason, tuple(notes))


def plan_from_strategy(strategy: Strategy, *, world: int | None = None,
                       steps: int = DEFAULT_STEPS, timeout_ms: int = 10_000,
                       label: str = "step", known: Verification | None = None) -> Plan:
    """Replay a strategy's own step at its declared mesh (or a smaller one, see the module doc).

    ``known`` is the verification ``check`` already has at the declared mesh: it is the claim,
    and, when the declared mesh is replayed, Z3's verdict there (it is not asked again). A
    refuted strategy gets a control run: its fixed twin, or the canonical step.
    """
    declared = {a.name: a.size for a in strategy.mesh.axes}
    sizes, reason = replayed_sizes(strategy, declared, world, "declared mesh")
    m = strategy.step.microbatches
    notes: list[str] = unwitnessed_notes(known)
    if len(strategy.step.windows) > 1:  # several steps: one window's step (semantics/steps.py)
        m = _window_replayed(strategy, known)
        notes.append(f"{len(strategy.step.windows)} optimizer steps: the replay runs the step of "
                     f"a window of {m} micro-batches (the refuted one, or else the smallest)")
    if m > MAX_MICROBATCHES and not any(lo.microbatch is not None for lo in strategy.step.loop):
        notes.append(f"{m} micro-batches replayed as {MAX_MICROBATCHES} (the step does not "
                     "name micro-batches, so its meaning does not depend on their number)")
        m = MAX_MICROBATCHES
    steps = at_least(steps, len(strategy.step.windows),
                     known.trace.condition if known and known.trace else None, notes)
    base = RunSpec(label, strategy.source.text, strategy.source.path, sizes, m, False, [], [],
                   steps)
    if strategy.config.unused:
        from placeverify.replay.participation import chosen_idle

        base = replace(base, idle=chosen_idle(strategy_of(base), timeout_ms))
    if strategy.config.empty:
        from placeverify.replay.empty import chosen_empty

        base = replace(base, empty=chosen_empty(strategy_of(base), timeout_ms))
    resized = strategy_of(base)
    if sizes == declared:
        expect = expectation(known) if known is not None else verify(resized, timeout_ms)
        claimed = expect.verdict
    else:
        expect = verify(resized, timeout_ms)
        claimed = (known.overall() if known is not None
                   else verify(strategy, timeout_ms).verdict)
    counts = None
    trace = known.trace if known is not None else None
    if trace is not None and sizes == declared and _trace_sizes(trace, strategy) == sizes \
            and trace.microbatches == m:
        counts = trace_counts(trace, resized, sizes, m)
    tokens, samples = _counts(resized, sizes, m, expect, counts, notes)
    tokens = _emptied(tokens, base.empty)
    main = replace(base, tokens=tokens, samples=samples)
    control = control_expect = origin = None
    if claimed is Verdict.REFUTED:
        control, control_expect, origin = _control(strategy.source.path, main, timeout_ms)
    return Plan(main, expect, Claim(claimed, declared, "file"), control, control_expect, origin,
                reason, tuple(notes))


def _window_replayed(strategy: Strategy, known: Verification | None) -> int:
    """The window a several-step strategy's replay runs: the refuted step's, else the smallest."""
    if known is not None and known.trace is not None:
        return known.trace.microbatches
    return min(strategy.step.windows)


def _control(path: str, main: RunSpec,
             timeout_ms: int) -> tuple[RunSpec | None, Expectation | None, str | None]:
    """The fixed twin (examples/ok/<name>-fixed.place beside examples/bugs/<name>.place) on the
    same mesh, else the canonical correct step of the same placement. The twin fixes the bug
    file as it is written: a strategy that is not that text (checked with --set overrides, or a
    trace of an edited file) gets the canonical step."""
    twin = _twin_path(path if path != "<trace>" else "")
    if twin is not None and not _is_text_of(path, main.source):
        twin = None
    if twin is not None:
        try:
            text = twin.read_text(encoding="utf-8")
            fixed = load_text(text, str(twin))
        except Exception:  # a broken twin only loses the twin: the canonical step still runs
            fixed = None
        if fixed is not None and set(fixed.mesh.names) == set(main.sizes):
            spec = replace(main, label="control", source=text, path=str(twin))
            return spec, verify(strategy_of(spec), timeout_ms), str(twin)
    spec = replace(main, label="control", canonical=True)
    return spec, verify(strategy_of(spec), timeout_ms), "canonical step"


def _is_text_of(path: str, text: str) -> bool:
    """Whether the file at ``path`` reads (as check reads it) as ``text``."""
    try:
        return read_source(path).text == text
    except PlaceError:
        return False


def _twin_path(file: str) -> Path | None:
    if not file:
        return None
    p = Path(file)
    if p.parent.name != "bugs":
        return None
    twin = p.parent.parent / "ok" / f"{p.stem}-fixed.place"
    return twin if twin.is_file() else None


def _counts(strategy: Strategy, sizes: dict[str, int], m: int, expect: Expectation,
            counts: tuple[AtomCounts, AtomCounts] | None,
            notes: list[str]) -> tuple[AtomCounts, AtomCounts]:
    """The trace's own counts when they fit this mesh, else counts the exact interpreter shows
    diverging here (a note says when there are none)."""
    if counts is not None:
        return counts
    tokens, samples, found = pick_counts(strategy, sizes, m, expect.needs_counts)
    if not found:
        notes.append("no token counts were found that the exact interpreter shows diverging at "
                     "this mesh")
    return tokens, samples


def _emptied(tokens: AtomCounts, empty: list[int]) -> AtomCounts:
    """The counts with the micro-batches ``empty`` holding no tokens: every label of theirs
    ignored (placeverify.semantics.empty)."""
    return [(b, k, 0 if k in empty else n) for b, k, n in tokens]
