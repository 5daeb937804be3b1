"""The replay model's shape and how the placement splits it (no torch here).

The replay does not run the file's model (a 175B transformer does not fit on a laptop): it runs a
small real model with the same *structure* — the same parameter groups (dense, norms, embedding,
experts), tied or untied embeddings, dropout, plain or gated MLP, mixture of experts — and splits
it exactly as the placement says:

- tensor axes (Megatron-LM, Shoeybi et al. 2019): attention by heads and the MLP column-then-row,
  the vocabulary of the embedding and of the output layer; norms (LayerNorm weight and bias, the
  MoE router) replicated, and under sequence parallelism (Korthikanti et al. 2022) applied to
  each rank's part of the sequence;
- pipeline axes: consecutive layers per stage, the embedding on the first stage, the final norm
  and output layer on the last, and with tied embeddings a copy of the embedding on the last;
- context axes: each rank holds a contiguous chunk of every sequence;
- expert axes: each rank holds ``experts / ep`` experts, and also holds its own samples;
- data axes: a replica of everything, its own samples.

Sizes are chosen small and divisible by every split: ``heads`` and ``vocab`` are multiples of the
tensor size, the layers a multiple of the pipeline size, the experts a multiple of the expert size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from placeverify.errors import PlaceverifyError
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role, State
from placeverify.ir.strategy import RecomputeKind, Strategy
from placeverify.roles import queries
from placeverify.roles.relations import batch_axes, sample_axes

HEAD_DIM = 4
DROPOUT = 0.5  # high on purpose: masks drawn from different streams differ almost surely


class Unsupported(PlaceverifyError):
    """A strategy the replay cannot run; the message says what and why."""


@dataclass(frozen=True, slots=True)
class Layout:
    """The mesh axis (and its size) that splits the model in each way; size 1 when none does."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    tp: str | None
    tp_size: int
    sp: bool
    pp: str | None
    pp_size: int
    cp: str | None
    cp_size: int
    ep: str | None
    ep_size: int
    batch: tuple[str, ...]  # axes whose ranks hold different tokens (data, context, expert)
    samples: tuple[str, ...]  # batch axes whose ranks hold different samples (data, expert)

    def size(self, axis: str) -> int:
        return self.sizes[self.names.index(axis)]


# The roles the replay model can split over; any other role is refused, never run as data.
REPLAYED_ROLES = frozenset({Role.DATA, Role.TENSOR, Role.PIPELINE, Role.CONTEXT, Role.EXPERT})


def layout_of(strategy: Strategy) -> Layout:
    for p in strategy.placements:
        if p.role not in REPLAYED_ROLES:
            raise Unsupported(f"the replay has no model of {p.role.value} axes ({p.axis})")
    for p in strategy.placements:
        if p.experts_split:
            raise Unsupported(f"not modelled: the replay splits the experts over the tensor axis "
                              f"{p.axis} as slices of each expert; an 'expert' statement over a "
                              f"product with {p.axis} splits them whole over it "
                              "(docs/language/place.md)")
    _flag_sources(strategy)
    names = strategy.mesh.names
    sizes = tuple(strategy.mesh.size(a) for a in names)
    chosen: dict[Role, tuple[str | None, int]] = {}
    sp = False
    for role in (Role.TENSOR, Role.PIPELINE, Role.CONTEXT, Role.EXPERT):
        split = [a for a in strategy.axes(role) if strategy.size(a) > 1]
        if len(split) > 1:
            raise Unsupported(f"the replay splits the model over one {role.value} axis; "
                              f"{', '.join(split)} are all larger than 1")
        axis = split[0] if split else None
        chosen[role] = (axis, strategy.size(axis) if axis else 1)
        if role is Role.TENSOR and axis is not None:
            sp = strategy.placement(axis).sequence_parallel
    tp, pp, cp, ep = (chosen[r] for r in (Role.TENSOR, Role.PIPELINE, Role.CONTEXT, Role.EXPERT))
    return Layout(names, sizes, tp[0], tp[1], sp, pp[0], pp[1], cp[0], cp[1], ep[0], ep[1],
                  batch_axes(strategy), sample_axes(strategy))


@dataclass(frozen=True, slots=True)
class ModelConfig:
    transformer: bool  # a transformer (embedding, attention, norms) or a residual MLP
    hidden: int
    heads: int
    ffn: int
    vocab: int
    layers: int
    gated: bool
    tied: bool
    dropout: float
    flash: bool  # attention masks regenerated from a saved seed (FlashAttention)
    experts: int
    top_k: int
    chunk: int  # sequence positions per context rank
    seq: int  # the whole sequence: chunk x context size
    recompute: str  # "none", "selective" (attention core) or "full" (whole layer)
    restore_rng: bool
    lora_rank: int = 0  # LoRA adapters (0: none) on the linears lora_targets names
    lora_targets: tuple[str, ...] = ()

    @property
    def head_dim(self) -> int:
        return HEAD_DIM


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def model_config(strategy: Strategy, layout: Layout, tokens_per_sample: int) -> ModelConfig:
    """The replay model for this strategy and mesh; ``tokens_per_sample`` is the most loss
    tokens any atom puts in one sample (each chunk must have room for them)."""
    tp = layout.tp_size
    arch = strategy.model.arch
    heads = tp * math.ceil(4 / tp)
    hidden = heads * HEAD_DIM
    chunk = _round_up(max(2, tokens_per_sample), tp if layout.sp else 1)
    experts = top_k = 0
    if arch is not None and arch.moe:
        experts = layout.ep_size * math.ceil(4 / layout.ep_size)
        top_k = max(1, min(arch.top_k or 1, experts))
    recompute = strategy.recompute.kind
    return ModelConfig(
        transformer=arch is not None,
        hidden=hidden,
        heads=heads,
        ffn=2 * hidden,
        vocab=tp * math.ceil(16 / tp),
        layers=layout.pp_size * (2 if layout.pp_size == 1 else 1),
        gated=bool(arch and arch.gated),
        tied=bool(arch and arch.tied_embeddings),
        dropout=DROPOUT if arch is not None and arch.dropout else 0.0,
        flash=bool(arch and arch.attention == "flash"),
        experts=experts,
        top_k=top_k,
        chunk=chunk,
        seq=chunk * layout.cp_size,
        recompute=recompute.value if recompute is not RecomputeKind.NONE else "none",
        restore_rng=strategy.recompute.restore_rng,
        # a rank below the small model's width, so that the adapters stay low-rank
        lora_rank=0 if strategy.model.adapter is None else min(strategy.model.adapter.rank, 2),
        lora_targets=() if strategy.model.adapter is None else strategy.model.adapter.targets,
    )


@dataclass(frozen=True, slots=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    group: ParamGroup
    tp_dim: int | None  # the dim the tensor axis splits (None: replicated over it)
    stage: int  # the pipeline stage holding it
    tied_copy: bool = False  # the last stage's copy of a tied embedding
    expert: int | None = None
    init: str = "matrix"  # "matrix" (fan-in scaled normal), "embedding", "norm_weight", "norm_bias"


def param_specs(config: ModelConfig, layout: Layout) -> list[ParamSpec]:
    """Every parameter of the single-device model, in one fixed order."""
    h, f, v = config.hidden, config.ffn, config.vocab
    qkv = config.heads * config.head_dim
    per_stage = config.layers // layout.pp_size
    last = layout.pp_size - 1
    dense, norms = ParamGroup.DENSE, ParamGroup.NORMS
    out: list[ParamSpec] = []
    if config.transformer:
        out.append(ParamSpec("embed", (v, h), ParamGroup.EMBEDDING, 0, 0, init="embedding"))
    for i in range(config.layers):
        stage = i // per_stage
        p = f"layers.{i}."
        if config.transformer:
            out += [ParamSpec(p + "ln1.weight", (h,), norms, None, stage, init="norm_weight"),
                    ParamSpec(p + "ln1.bias", (h,), norms, None, stage, init="norm_bias"),
                    ParamSpec(p + "attn.q", (qkv, h), dense, 0, stage),
                    ParamSpec(p + "attn.k", (qkv, h), dense, 0, stage),
                    ParamSpec(p + "attn.v", (qkv, h), dense, 0, stage),
                    ParamSpec(p + "attn.o", (h, qkv), dense, 1, stage),
                    ParamSpec(p + "ln2.weight", (h,), norms, None, stage, init="norm_weight"),
                    ParamSpec(p + "ln2.bias", (h,), norms, None, stage, init="norm_bias")]
        if config.experts:
            out.append(ParamSpec(p + "router", (config.experts, h), norms, None, stage))
            for e in range(config.experts):
                q = f"{p}experts.{e}."
                out += _mlp_specs(q, h, h, config.gated, ParamGroup.EXPERTS, stage, e)
        else:
            out += _mlp_specs(p + "mlp.", h, f, config.gated, dense, stage, None)
        out += _lora_specs(config, out, p, stage)
    if config.transformer:
        out += [ParamSpec("ln_f.weight", (h,), norms, None, last, init="norm_weight"),
                ParamSpec("ln_f.bias", (h,), norms, None, last, init="norm_bias")]
        if config.tied and layout.pp_size > 1:
            out.append(ParamSpec("embed", (v, h), ParamGroup.EMBEDDING, 0, last, tied_copy=True,
                                 init="embedding"))
    if not config.tied:
        out.append(ParamSpec("head", (v, h), dense, 0, last))
    return out


# PEFT's module names (without _proj) -> the replay model's linears
LORA_NAMES = {"q": "attn.q", "k": "attn.k", "v": "attn.v", "o": "attn.o", "up": "mlp.fc1",
              "gate": "mlp.gate", "down": "mlp.fc2"}


def _lora_specs(config: ModelConfig, specs: list[ParamSpec], prefix: str,
                stage: int) -> list[ParamSpec]:
    """LoRA's A (r x in) and B (out x r) for each targeted linear of one layer (PEFT's
    ``LoraLayer.update_layer``), the trained ``adapters`` group; the forward uses W + B·A
    (:func:`placeverify.replay.model.weight`)."""
    if not config.lora_rank:
        return []
    shapes = {s.name: s.shape for s in specs}
    out: list[ParamSpec] = []
    for target in config.lora_targets:
        name = prefix + LORA_NAMES[target]
        rows, cols = shapes[name]
        out += [ParamSpec(name + ".lora_A", (config.lora_rank, cols), ParamGroup.ADAPTERS, None,
                          stage),
                ParamSpec(name + ".lora_B", (rows, config.lora_rank), ParamGroup.ADAPTERS, None,
                          stage)]
    return out


def _mlp_specs(prefix: str, h: int, f: int, gated: bool, group: ParamGroup, stage: int,
               expert: int | None) -> list[ParamSpec]:
    specs = [ParamSpec(prefix + "fc1", (f, h), group, 0, stage, expert=expert)]
    if gated:
        specs.append(ParamSpec(prefix + "gate", (f, h), group, 0, stage, expert=expert))
    specs.append(ParamSpec(prefix + "fc2", (h, f), group, 1, stage, expert=expert))
    return specs


def global_specs(specs: list[ParamSpec]) -> list[ParamSpec]:
    """One spec per distinct parameter of the single-device model (a tied copy is the same)."""
    return [s for s in specs if not s.tied_copy]


def holds(spec: ParamSpec, config: ModelConfig, layout: Layout, coords: dict[str, int]) -> bool:
    stage = coords[layout.pp] if layout.pp else 0
    if spec.stage != stage:
        return False
    if spec.expert is not None and layout.ep is not None:
        per_rank = config.experts // layout.ep_size
        return spec.expert // per_rank == coords[layout.ep]
    return True


def tp_slice(spec: ParamSpec, layout: Layout, coords: dict[str, int]) -> tuple[int, int, int] | None:
    """(dim, start, stop) of this rank's part along the tensor axis, or None when whole."""
    if spec.tp_dim is None or layout.tp is None:
        return None
    n = spec.shape[spec.tp_dim] // layout.tp_size
    j = coords[layout.tp]
    return spec.tp_dim, j * n, (j + 1) * n


def local_key(spec: ParamSpec, layout: Layout, coords: dict[str, int]) -> str:
    """The name of the tensor a rank holds; ranks with equal keys hold copies of one tensor."""
    part = tp_slice(spec, layout, coords)
    return spec.name if part is None else f"{spec.name}[tp {coords[layout.tp or '']}/{layout.tp_size}]"


def optimizer_axes(strategy: Strategy, group: ParamGroup) -> tuple[str, ...]:
    """Axes (larger than 1) whose ranks each update one shard of this group (ZeRO)."""
    return queries.optimizer_axes(strategy, group)


def gathered_axes(strategy: Strategy, group: ParamGroup | None = None) -> tuple[str, ...]:
    """Data axes where the parameters (of ``group``, when given: README "Per-group meshes") are
    sharded and gathered before use (S*, or offloaded O); without a group, where any group's
    are."""
    groups = [group] if group is not None else [None, *strategy.model.groups_present()]
    return tuple(p.axis for p in strategy.placements
                 if strategy.size(p.axis) > 1
                 and any(queries.gathers_before_use(p, g)
                         and p.mode_of(State.PARAMS, g).sharded for g in groups))


def _flag_sources(strategy: Strategy) -> None:
    """``broadcast(from = k) overflow`` on a mesh resized below k ranks (a replay on fewer
    devices than the file's) has no source rank to run."""
    from placeverify.semantics.skip import flag_broadcasts

    sizes = {a.name: a.size for a in strategy.mesh.axes}
    for op in flag_broadcasts(strategy.step):
        if int(op.source) >= op.group.size_of(sizes):
            mesh = ", ".join(f"{a} = {n}" for a, n in sizes.items())
            raise Unsupported(f"line {op.span.line}: '{op.label()}' needs more than {op.source} "
                              f"ranks over {op.group.label()}; the replayed mesh ({mesh}) has "
                              "fewer (replay it on more devices with --world)")
