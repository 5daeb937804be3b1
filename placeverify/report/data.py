"""The content of a report as plain data (the ``--json`` document); the text report renders it."""

from __future__ import annotations

from enum import Enum
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from placeverify import __version__
from placeverify.cost import CATEGORIES, Costs, whole
from placeverify.ir.placement import STATES, AxisPlacement, Overlap, Reduce, TensorOverlap
from placeverify.ir.render import op_label
from placeverify.ir.step import Op
from placeverify.ir.strategy import Strategy
from placeverify.result import CheckResult
from placeverify.roles import ROLES
from placeverify.verdicts import CONDITIONS

if TYPE_CHECKING:
    from placeverify.verify.every_size import EverySize  # check --every-size only

CHECK_SCHEMA = "placeverify.check/1"


def step_lines(strategy: Strategy) -> list[dict[str, Any]]:
    """The step as (where, text, line) rows, in execution order."""
    step = strategy.step
    rows: list[dict[str, Any]] = []

    def waits(phase: str, index: int, where: str | None = None) -> None:
        for w in step.waits:  # where asynchronous collectives complete
            if w.phase == phase and w.index == index:
                at = where if where is not None else "each micro-batch" if w.microbatch is None \
                    else f"micro-batch {w.microbatch}"
                rows.append({"phase": at, "op": f"wait {w.target.label()}", "line": w.span.line})

    for index, op in enumerate(step.pre):
        waits("pre", index, "before the loop")  # 'wait params' before the forward
        rows.append({"phase": "before the loop", "op": op_label(op), "line": _line(op)})
    waits("pre", len(step.pre), "before the loop")
    for index, lo in enumerate(step.loop):
        waits("loop", index)
        phase = "each micro-batch" if lo.microbatch is None else f"micro-batch {lo.microbatch}"
        rows.append({"phase": phase, "op": op_label(lo.op), "line": _line(lo.op)})
    waits("loop", len(step.loop))
    for index, op in enumerate(step.post):
        waits("post", index, "after the loop")
        rows.append({"phase": "after the loop", "op": op_label(op), "line": _line(op)})
    waits("post", len(step.post), "after the loop")
    for seed in step.seeds:
        policy = "same" if seed.same else "differ"
        rows.append({"phase": "rng", "op": f"seed dropout({seed.region.value}) {policy} over "
                     f"{seed.group.label()}", "line": seed.span.line})
    return rows


def _line(op: Op) -> int | None:
    span = getattr(op, "span", None)
    return span.line if span is not None else None


def _option(value: object) -> object:
    """An option of a placement as JSON shows it: an enum by its value."""
    return value.value if isinstance(value, Enum) else value


def _float(value: Any) -> float:
    return float(Fraction(value))


def peak_document(costs: Costs) -> dict[str, Any]:
    """``memory.peak_bytes`` and when it happens, the persistent states, the reserve and every
    moment of every rank kind (placeverify/cost/peak.py)."""
    peak = costs.peak
    if peak is None:
        return {}
    return {
        "profile": peak.profile,
        "persistent_bytes": whole(peak.persistent),
        "peak_bytes": whole(peak.bytes),
        "peak_at": peak.peak.describe(),
        "reserve_bytes": costs.strategy.mesh.reserve or 0,
        "moments": [{"rank": m.rank, "moment": m.name, "bytes": whole(m.total),
                     **({"stage": m.stage} if m.stage is not None else {}),
                     "parts": {label: whole(b) for label, b in m.parts if b},
                     **({"not_modelled": list(m.not_modelled)} if m.not_modelled else {})}
                    for m in peak.moments],
    }


def check_document(result: CheckResult) -> dict[str, Any]:
    s = result.strategy
    costs = result.costs
    capacity = s.mesh.device_memory
    doc: dict[str, Any] = {
        "schema": CHECK_SCHEMA,
        "placeverify": __version__,
        "file": s.source.path,
        "strategy": s.name,
        "model": _model_document(s),
        "precision": {
            "name": s.precision.name, "params_bytes": _float(s.precision.params),
            "grads_bytes": _float(s.precision.grads),
            "optimizer_bytes": _float(s.precision.optimizer),
            "activation_bytes": _float(s.precision.activations), "loss_scale": s.loss_scale,
            "gather_bytes": _float(s.precision.gathered),
            "reduce_bytes": _float(s.precision.reduced), "matmul": s.precision.matmul},
        "mesh": {a.name: a.size for a in s.mesh.axes},
        "world": s.mesh.world,
        "placement": {p.axis: _placement_document(p) for p in s.placements},
        "recompute": {"kind": s.recompute.kind.value, "restore_rng": s.recompute.restore_rng,
                      **({"every": s.recompute.every} if s.recompute.every > 1 else {})},
        "loss": s.loss.kind.value,
        "step": {"canonical": s.step.canonical, "microbatches": s.step.microbatches,
                 "ops": step_lines(s)},
        "memory": _memory_document(costs, capacity),
        "activations": None if costs.activations is None else {
            "per_layer_bytes": whole(costs.activations.per_layer),
            "layers": _float(costs.activations.layers),
            "in_flight_microbatches": _float(costs.activations.in_flight),
            "rule": costs.activations.in_flight_rule},
        "communication": _communication_document(costs),
        "pipeline": None if costs.bubble is None else {
            "bubble_fraction": _float(costs.bubble), "bubble_ratio": _float(costs.bubble),
            "idle_fraction": _float(costs.idle())},
        "verdicts": {} if result.verification is None else result.verification.verdicts(),
        "verdicts_cover": None if result.verification is None else {
            "mesh": {a.name: a.size for a in s.mesh.axes},
            "microbatches": list(s.step.windows) if s.step.windows else s.step.microbatches},
        "obligations": _obligations_document(result),
        "warnings": [w.to_json(s.source) for w in s.warnings],
    }
    if s.overrides:  # only with --set: a document without overrides keeps its shape
        doc = {**dict(list(doc.items())[:4]), "overrides": overrides_document(s),
               **dict(list(doc.items())[4:])}
    if result.every_size is not None:
        doc["every_size"] = every_size_document(result.every_size)
    if result.formulas is not None:
        doc["formulas"] = formulas_document(result.formulas)
    if result.time is not None:
        doc["time"] = result.time.to_json()
    return doc


def _model_document(s: Strategy) -> dict[str, Any]:
    """The ``model`` section: the name, the parameters by group and the architecture."""
    arch = s.model.arch
    return {
        "name": s.model.name,
        "params": s.model.params,
        "groups": {g.value: n for g, n in s.model.group_params().items() if n},
        "architecture": None if arch is None else {
            "layers": arch.layers, "hidden": arch.hidden, "heads": arch.heads,
            "kv_heads": arch.kv_heads, "ffn": arch.ffn, "gated": arch.gated,
            "vocab": arch.vocab, "seq": arch.seq, "micro_batch": arch.micro_batch,
            "tied_embeddings": arch.tied_embeddings, "experts": arch.experts,
            "top_k": arch.top_k, **({"head_dim": arch.head_dim} if arch.head_size else {}),
            **({"qkv_bias": True} if arch.qkv_bias else {}),
            **({"qk_norm": True} if arch.qk_norm else {}),
            **({"sandwich_norm": True} if arch.sandwich_norm else {})},
    }


def _placement_document(p: AxisPlacement) -> dict[str, Any]:
    """One axis's entry of the ``placement`` section: its role, preset, modes and options."""
    return {"role": p.role.value, "preset": p.preset,
            "modes": {st.value: p.mode(st).value for st in STATES},
            **{name: _option(getattr(p, name)) for name in ROLES[p.role].reported_options},
            **({"reduce": p.reduce.value} if p.reduce is not Reduce.MICROBATCH else {}),
            **({"overlap": p.data_overlap.value}
               if p.data_overlap is not Overlap.ALL else {}),
            **({"overlap": p.overlap.json}
               if p.overlap is not TensorOverlap.NONE else {}),
            **({"layers": list(p.layers)} if p.layers is not None else {}),
            **({"experts_split": True} if p.experts_split else {}),
            **({"groups": {g: {st.value: p.mode_of(st, g).value for st in STATES}
                           for g, _ in p.group_modes}} if p.group_modes else {})}


def _memory_document(costs: Costs, capacity: int | None) -> dict[str, Any]:
    """The ``memory`` section: the fullest rank's bytes and items, every rank kind, the fit and
    the peak."""
    device = costs.device_bytes()
    return {
        "device_bytes": {k: whole(device[k]) for k in (*CATEGORIES, "total")},
        "host_bytes": whole(costs.host_bytes()),
        "items": [{"category": i.category, "label": i.label, "bytes": whole(i.bytes),
                   "host": i.host} for i in costs.memory],
        "ranks": [{"kind": r.kind.name, "stages": list(r.kind.stages),
                   **({"layers": r.kind.layers} if r.kind.layers is not None else {}),
                   # several stages: the figures are those of the first, the fullest
                   **({"figures_of_stage": r.kind.stages[0]} if len(r.kind.stages) > 1
                      and r.kind.name != "every" else {}),
                   "fullest": r.items == costs.memory,
                   "device_bytes": {k: whole(v) for k, v in costs.rank_bytes(r).items()},
                   "host_bytes": whole(sum((i.bytes for i in r.items if i.host), 0))}
                  for r in costs.ranks],
        "capacity_bytes": capacity,
        "fits": costs.fits(),
        "headroom_bytes": None if capacity is None else capacity - costs.needed_bytes(),
        **peak_document(costs),
    }


def _communication_document(costs: Costs) -> dict[str, Any]:
    """The ``communication`` section: bytes and seconds per step, and every collective."""
    return {
        "bytes_per_step": whole(costs.network_bytes()),
        "state_bytes_per_step": whole(costs.state_bytes()),
        "pcie_bytes_per_step": whole(costs.pcie_bytes()),
        "seconds_per_step": _seconds(costs),
        "collectives": [{
            "op": c.op, "axes": list(c.axes), "what": c.what, "bytes": whole(c.bytes),
            "count": whole(c.calls), "payload_bytes": whole(c.payload),
            "group_size": c.group_size, "state": c.state, "source": c.source,
            "line": c.span.line if c.span else None,
            "seconds": None if c.seconds is None else float(c.seconds)} for c in costs.comm],
    }


def _obligations_document(result: CheckResult) -> list[dict[str, Any]]:
    """The ``obligations`` section: every verified condition with its verdict."""
    return [] if result.verification is None else [
        {"condition": o.condition.value, "claim": o.claim, "verdict": o.verdict.value,
         "kind": o.kind, "line": o.span.line if o.span else None,
         "column": o.span.column if o.span else None, "reason": o.reason or None,
         "fix": o.fix, "method": o.method, "seconds": round(o.seconds, 4),
         "counterexample": o.counterexample}
        for o in result.verification.obligations]


def overrides_document(strategy: Strategy) -> list[dict[str, Any]]:
    """The ``--set`` overrides a strategy was lowered with, in order; ``implied`` for the
    ``world`` that follows resized axes."""
    return [{"key": o.key, "value": o.value, "implied": o.implied} for o in strategy.overrides]


def overrides_text(strategy: Strategy) -> str:
    """``mesh.dp=16, mesh.world=128 (implied)``: the text report's "overrides:" line."""
    return ", ".join(o.text + (" (implied)" if o.implied else "") for o in strategy.overrides)


def _seconds(costs: Costs) -> float | None:
    times = [c.seconds for c in costs.comm]
    if not times or any(t is None for t in times):
        return None
    return float(sum(t for t in times if t is not None))


def formulas_document(costs: Costs) -> dict[str, Any]:
    """Closed forms (SymPy, as text) and the symbol values they are evaluated at."""
    d = costs.domain
    show = getattr(d, "show", str)
    device = costs.device_bytes()
    return {
        "symbols": {str(k): _number(v) for k, v in getattr(d, "values", {}).items()},
        "memory": {k: show(device[k]) for k in (*CATEGORIES, "total")},
        "host": show(costs.host_bytes()),
        "communication": [{"op": c.op, "axes": list(c.axes), "what": c.what, "bytes": show(c.bytes)}
                          for c in costs.comm],
        "communication_total": show(costs.network_bytes()),
        "bubble": None if costs.bubble is None else show(costs.bubble),
        "idle": None if costs.bubble is None else show(costs.idle()),
    }


def _number(value: Fraction) -> int | float:
    return int(value) if value.denominator == 1 else float(value)


def every_size_document(sized: EverySize) -> dict[str, Any]:
    """The ``every_size`` section of ``check --json``: per condition its verdict, the sizes it
    covers, why it is not proved and the smallest sizes where it fails."""
    return {
        "axes": list(sized.axes), "microbatches": sized.microbatches,
        "verdicts": {c.value: sized.verdicts[c].value for c in CONDITIONS if c in sized.verdicts},
        "covers": {c.value: sized.covers[c] for c in CONDITIONS if c in sized.covers},
        "reasons": {c.value: sized.reasons[c] for c in CONDITIONS if c in sized.reasons},
        "smallest_failures": {c.value: sized.failures[c].to_json() for c in CONDITIONS
                              if c in sized.failures},
        "methods": list(sized.methods), "seconds": sized.seconds,
        "counterexample": sized.counterexample}
