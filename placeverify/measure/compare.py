"""Predicted against measured, row by row (no torch import).

Each row is one quantity on one rank (ranks whose numbers are all equal share a row "all"):
model-state bytes (exact: the goal is predicted / measured = 1.000), activation bytes saved for
backward (within 10 %: the prediction is Korthikanti et al.'s per-layer count plus the tensors
torch saves beyond it, see :mod:`placeverify.cost.implementations`), and each kind of collective per
phase of a step (exact, in bytes and calls). Where the placement-level cost model
(:func:`placeverify.cost.analyse` on the model and precision that ran) has a figure for the
quantity it is shown beside it, so the gap between the paper-level model and the real
implementation is visible too; for the layers' activations that figure is Korthikanti's count
alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from placeverify.cost import analyse, whole
from placeverify.cost.communication import ring_factor
from placeverify.cost.domain import Exact
from placeverify.cost.implementations import predict
from placeverify.cost.implementations.common import ELEMENT_BYTES, RankPrediction, gloo_wire_op
from placeverify.cost.implementations.spec import Implementation, OptimizerKind, RunSpec
from placeverify.ir.model import Model
from placeverify.ir.precision import PRECISIONS
from placeverify.ir.strategy import Strategy
from placeverify.measure.plan import Plan

MEASURE_SCHEMA = "placeverify.measure/1"
ACTIVATION_TOLERANCE = 0.10

STATE_ROWS: list[tuple[str, str]] = [
    ("params", "Θ params (local)"),
    ("params_storage", "Θ params (storage, padded)"),
    ("params_after_forward", "Θ params after forward"),
    ("grads", "G gradients (local)"),
    ("grads_storage", "G gradients (storage)"),
    ("ddp_buckets", "G DDP bucket buffers"),
    ("optimizer", "Ω optimizer state"),
]
SHOW_STORAGE = (Implementation.FSDP2, Implementation.FSDP2_TP)

ACTIVATION_ROWS: list[tuple[str, str]] = [
    ("layers", "A layers / micro-batch"),
    ("other", "A other / micro-batch"),
    ("peak", "A peak held at once"),
]


@dataclass(frozen=True, slots=True)
class Row:
    section: str  # model state | activations | communication
    key: str
    quantity: str
    rank: str  # "all" or a rank number
    predicted: int
    measured: int
    tolerance: float = 0.0
    placement: int | None = None  # the placement-level cost model's figure, where it has one
    predicted_calls: int | None = None
    measured_calls: int | None = None
    ring_bytes: int | None = None  # bytes one device sends under a ring algorithm (measured payload)
    wire_op: str = ""  # the collective gloo runs for it
    wire_bytes: int | None = None  # the same for gloo's collective
    what: str = ""  # what a collective carries

    @property
    def ratio(self) -> float:
        if self.measured == 0:
            return 1.0 if self.predicted == 0 else math.inf
        return self.predicted / self.measured

    @property
    def wire(self) -> str:
        """How many bytes a device sends for it, and what gloo runs where that differs."""
        if self.ring_bytes is None:
            return ""
        if self.wire_op == self.key.split(".")[1]:
            return f"ring {self.ring_bytes:,} B/device"
        return (f"gloo runs {self.wire_op}: {self.wire_bytes:,} B/device "
                f"(ring {self.key.split('.')[1]}: {self.ring_bytes:,})")

    @property
    def ok(self) -> bool:
        if self.predicted_calls != self.measured_calls:
            return False
        if self.tolerance == 0:
            return self.predicted == self.measured
        return abs(self.ratio - 1) <= self.tolerance

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "section": self.section, "key": self.key, "quantity": self.quantity,
            "rank": self.rank, "predicted": self.predicted, "measured": self.measured,
            "ratio": None if math.isinf(self.ratio) else round(self.ratio, 6),
            "tolerance": self.tolerance, "ok": self.ok,
        }
        if self.placement is not None:
            data["placement_model"] = self.placement
        if self.predicted_calls is not None or self.measured_calls is not None:
            data["predicted_calls"] = self.predicted_calls
            data["measured_calls"] = self.measured_calls
        if self.ring_bytes is not None:
            data["ring_bytes_per_device"] = self.ring_bytes
            data["gloo_op"] = self.wire_op
            data["gloo_bytes_per_device"] = self.wire_bytes
        if self.what:
            data["what"] = self.what
        return data


@dataclass(frozen=True, slots=True)
class Comparison:
    strategy: Strategy
    plan: Plan
    rows: tuple[Row, ...]
    predictions: tuple[RankPrediction, ...]
    results: tuple[dict[str, Any], ...]
    seconds: float
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)


# ---- measured collectives ----------------------------------------------------------------------


def axis_of(spec: RunSpec, rank: int, ranks: Sequence[int]) -> str:
    """The mesh axis a process group spans, seen from ``rank``."""
    if spec.implementation is Implementation.PIPELINE:
        return "pp"
    group = set(ranks)
    coords = spec.coords(rank)
    tp_group = {coords["dp"] * spec.tp + j for j in range(spec.tp)}
    dp_group = {d * spec.tp + coords["tp"] for d in range(spec.dp)}
    if spec.tp > 1 and group == tp_group:
        return "tp"
    if spec.dp > 1 and group == dp_group:
        return "dp"
    return "world" if len(group) == spec.world else "other"


@dataclass
class _Tally:
    calls: int = 0
    payload: int = 0
    group_size: int = 0
    what: list[str] = field(default_factory=list)


def measured_comm(spec: RunSpec, result: dict[str, Any]) -> dict[tuple[str, str, str], _Tally]:
    out: dict[tuple[str, str, str], _Tally] = {}
    for record in result["collectives"]:
        if record["kind"] == "barrier":
            continue
        axis = axis_of(spec, result["rank"], record["group_ranks"])
        tally = out.setdefault((record["phase"], record["kind"], axis), _Tally())
        tally.calls += 1
        tally.payload += record["payload"]
        tally.group_size = record["group_size"]
    return out


def predicted_comm(prediction: RankPrediction) -> dict[tuple[str, str, str], _Tally]:
    out: dict[tuple[str, str, str], _Tally] = {}
    for c in prediction.comm:
        tally = out.setdefault(c.key, _Tally())
        tally.calls += c.calls
        tally.payload += c.payload
        tally.group_size = c.group_size
        tally.what.append(c.what)
    return out


PHASES = ("forward", "backward", "optimizer", "step")
OP_ORDER = ("all_gather", "all_reduce", "reduce_scatter", "broadcast", "send", "recv")


def _comm_order(key: tuple[str, str, str]) -> tuple[int, int, str]:
    phase, op, axis = key
    return (PHASES.index(phase) if phase in PHASES else len(PHASES),
            OP_ORDER.index(op) if op in OP_ORDER else len(OP_ORDER), axis)


def ring_bytes(op: str, payload: int, group_size: int) -> int | None:
    """Bytes one device sends for ``payload`` under a bandwidth-optimal ring algorithm
    (REFERENCE §2.2): 2(n-1)/n for an all-reduce, (n-1)/n for the others; None for
    point-to-point ops, which send their payload."""
    if group_size <= 1 or op in ("send", "recv"):
        return None
    d = Exact()
    return whole(ring_factor(d, op, d.const(group_size)) * payload)


# ---- the placement-level cost model, for reference ---------------------------------------------


def placement_model(strategy: Strategy, spec: RunSpec) -> dict[str, int]:
    """What :func:`placeverify.cost.analyse` predicts per device for the model and precision that
    actually run (fp32; the torch optimizer's state bytes per parameter)."""
    precision = PRECISIONS[{OptimizerKind.ADAM: "fp32_adam", OptimizerKind.SGD: "sgd",
                            OptimizerKind.SGD_MOMENTUM: "sgd_momentum"}[spec.optimizer]]
    if spec.arch is not None:
        model = Model(strategy.model.name, spec.arch.params(), spec.arch)
    else:
        assert spec.mlp is not None
        # the MLP that runs: its largest tensor is a weight, width²
        model = Model(strategy.model.name, spec.mlp.params(), None,
                      largest_tensor=spec.mlp.width * spec.mlp.width)
    run = replace(strategy, config=replace(strategy.config, model=model, precision=precision))
    device = analyse(run).device_bytes()
    out = {"params": whole(device["params"]), "grads": whole(device["gradients"]),
           "optimizer": whole(device["optimizer"])}
    if spec.arch is not None:
        out["peak"] = whole(device["activations"])
    return out


# ---- rows ---------------------------------------------------------------------------------------


def _merge(section: str, key: str, quantity: str, values: list[tuple[int, int]],
           placements: list[int | None] | None = None, **extra: Any) -> list[Row]:
    """One row when every rank agrees, else one row per rank."""
    refs = placements or [None] * len(values)
    if len(set(zip(values, refs, strict=True))) == 1:
        p, m = values[0]
        return [Row(section, key, quantity, "all", p, m, placement=refs[0], **extra)]
    return [Row(section, key, quantity, str(rank), p, m, placement=ref, **extra)
            for rank, ((p, m), ref) in enumerate(zip(values, refs, strict=True))]


def compare(strategy: Strategy, plan: Plan, results: Iterable[dict[str, Any]],
            seconds: float) -> Comparison:
    """The comparison of one measured strategy (per-rank results from the workers)."""
    spec = plan.spec
    ordered = tuple(sorted(results, key=lambda r: r["rank"]))
    rows, predictions = compare_rows(spec, ordered, placement_model(strategy, spec))
    notes = list(plan.notes)
    unknown = sorted({op for r in ordered for op in r.get("unknown_ops", [])})
    if unknown:
        notes.append("collectives not counted (unknown ops): " + ", ".join(unknown))
    return Comparison(strategy, plan, tuple(rows), predictions, ordered, seconds, tuple(notes))


def compare_rows(spec: RunSpec, results: Sequence[dict[str, Any]],
                 placement: dict[str, int] | None = None
                 ) -> tuple[list[Row], tuple[RankPrediction, ...]]:
    """Rows of predicted against measured for ``spec``; ``results`` in rank order."""
    placement = placement or {}
    predictions = tuple(predict(spec))
    if len(results) != len(predictions):
        raise ValueError(f"{len(results)} results for a world of {len(predictions)}")
    rows: list[Row] = []
    for key, label in STATE_ROWS:
        if key.endswith("_storage") and spec.implementation not in SHOW_STORAGE:
            continue
        present = [key in p.states and key in r["states"] for p, r in zip(predictions, results,
                                                                          strict=True)]
        if not any(present):
            continue
        values = [(p.states.get(key, 0), r["states"].get(key, 0))
                  for p, r in zip(predictions, results, strict=True)]
        rows += _merge("model state", key, label, values, [placement.get(key)] * len(values))

    for key, label in ACTIVATION_ROWS:
        values = []
        for p, r in zip(predictions, results, strict=True):
            measured = r["activations"][key]
            if key != "peak":
                measured = whole(Fraction(measured, r["activations"]["microbatches"]))
            values.append((p.activations[key], measured))
        references: list[int | None] = [placement.get(key)] * len(values)
        if key == "layers":  # Korthikanti's count alone
            references = [p.activations.get("layers_korthikanti") for p in predictions]
        rows += _merge("activations", key, label, values, references,
                       tolerance=ACTIVATION_TOLERANCE)

    rows += _comm_rows(spec, predictions, results)
    return rows, predictions


def _comm_rows(spec: RunSpec, predictions: Sequence[RankPrediction],
               results: Sequence[dict[str, Any]]) -> list[Row]:
    """One row per (phase, collective, axis): payload bytes and calls, predicted and measured."""
    per_rank = [(predicted_comm(p), measured_comm(spec, r))
                for p, r in zip(predictions, results, strict=True)]
    keys = sorted({k for pc, mc in per_rank for k in (*pc, *mc)}, key=_comm_order)
    rows: list[Row] = []
    for comm_key in keys:
        phase, op, axis = comm_key
        payloads: list[tuple[int, int]] = []
        calls: list[tuple[int, int]] = []
        what, size = "", 0
        for pc, mc in per_rank:
            predicted, measured = pc.get(comm_key, _Tally()), mc.get(comm_key, _Tally())
            payloads.append((predicted.payload, measured.payload))
            calls.append((predicted.calls, measured.calls))
            what = what or "; ".join(predicted.what)
            size = size or predicted.group_size or measured.group_size
        label = f"{phase} {op} {axis}"
        what = what or "not predicted"
        per_rank_rows = list(enumerate(zip(payloads, calls, strict=True)))
        if len(set(zip(payloads, calls, strict=True))) == 1:
            per_rank_rows = [(-1, (payloads[0], calls[0]))]
        for rank, ((p_bytes, m_bytes), (p_calls, m_calls)) in per_rank_rows:
            if rank >= 0 and p_bytes == m_bytes == 0 and p_calls == m_calls == 0:
                continue  # a rank without this collective (a pipeline's end stages)
            rows.append(Row("communication", f"{phase}.{op}.{axis}", label,
                            "all" if rank < 0 else str(rank), p_bytes, m_bytes,
                            predicted_calls=p_calls, measured_calls=m_calls,
                            ring_bytes=ring_bytes(op, m_bytes, size), wire_op=gloo_wire_op(op),
                            wire_bytes=ring_bytes(gloo_wire_op(op), m_bytes, size), what=what))
    return rows


def model_text(spec: RunSpec) -> str:
    if spec.arch is not None:
        a = spec.arch
        parts = [f"{a.layers} layers", f"hidden {a.hidden}", f"{a.heads} heads ({a.kv_heads} kv)",
                 f"ffn {a.ffn} ({'gated' if a.gated else 'plain'})", f"vocab {a.vocab}",
                 f"seq {a.seq}", f"micro-batch {a.micro_batch}", a.norm, f"{a.position} positions",
                 f"{a.attention} attention", "tied" if a.tied_embeddings else "untied"]
        return f"transformer, {a.params():,} parameters: " + ", ".join(parts)
    assert spec.mlp is not None
    m = spec.mlp
    return f"MLP, {m.params():,} parameters: {m.depth} x Linear({m.width}, {m.width}) + GELU, batch {m.batch}"


def comparison_document(comparison: Comparison) -> dict[str, Any]:
    spec = comparison.plan.spec
    s = comparison.strategy
    return {
        "schema": MEASURE_SCHEMA,
        "file": s.source.path,
        "strategy": s.name,
        "implementation": spec.implementation.value,
        "implementation_label": spec.label(),
        "world_size": spec.world,
        "mesh": {"dp": spec.dp, "tp": spec.tp, "pp": spec.pp},
        "model": model_text(spec),
        "optimizer": spec.optimizer.value,
        "element_bytes": ELEMENT_BYTES,
        "spec": spec.to_json(),
        "ok": comparison.ok,
        "seconds": round(comparison.seconds, 3),
        "notes": list(comparison.notes),
        "rows": [r.to_json() for r in comparison.rows],
        "ranks": [
            {"rank": r["rank"], "measured_states": r["states"],
             "predicted_states": p.states, "measured_activations": r["activations"],
             "predicted_activations": p.activations,
             "collectives": r["collectives"], "seconds": r.get("seconds")}
            for p, r in zip(comparison.predictions, comparison.results, strict=True)
        ],
    }
