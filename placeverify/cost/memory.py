"""Per-device memory: model states, activations, transient buffers, and host memory.

Mode rules (REFERENCE §1, arXiv 2601.02311 Theorem 1): a state of s bytes placed R along an axis
of size n keeps s, S keeps s/n, S* keeps s/n plus one gathered reconstruction unit while in use,
O keeps nothing on the device and s/n on the host, M (activations) keeps what rebuilding needs
plus one layer's working set. Along a tensor axis the replicated parameters (norms, row-parallel
biases, the router) stay whole; along an expert axis only the experts are split.

Pipeline stages are not alike (Megatron-LM ``megatron/training/theoretical_memory_usage.py``,
``compute_weight_and_optimizer_memory``: "most loaded model shard has (1/pp_size transformer
layers + 1 embedding layer) / tp_size"): each stage holds L/p layers; the first also the word
embedding (vocabulary padded to a multiple of ``vocab_divisible_by`` · t, Megatron's
``--make-vocab-size-divisible-by``, ``_vocab_size_with_padding``) and learned positions; the last
the output layer and the final norm (untied), or its copy of the tied embedding; with p = 1 one
stage holds both. Each distinct stage is a rank kind; the device figure is the fullest one.
The activations outside the layers (``activations.outside_layers``: the embedding's dropout mask
on the first stage; the final norm and output-layer inputs, the logits and the loss's fp32 copy on
the last) are a category of their own, ``outside_layers``, beside the layers' ``activations``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from placeverify.cost import fine_tune
from placeverify.cost.activations import (
    ActivationCost,
    activation_cost,
    outside_layers,
    stage_in_flight,
    stage_layer_count,
    stage_share,
    tensor_size,
)
from placeverify.cost.domain import Domain, Exact, Num
from placeverify.cost.step_kept import kept_parameter_axes as kept_parameter_axes
from placeverify.cost.step_kept import unsharded_gradient_axes as unsharded_gradient_axes
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Reduce, Role, State
from placeverify.ir.profiles import host_gradient_bytes
from placeverify.ir.strategy import Strategy
from placeverify.roles import ROLES
from placeverify.roles.pipeline import chunk_layers, chunk_ordered, stage_layers
from placeverify.roles.queries import gathered_axes, offloaded, partitions, per_group

MODEL_STATES = (State.PARAMS, State.OPTIMIZER, State.GRADIENTS)

WORKING_SET_LABEL = "recompute working set (one layer)"  # alive only in backward (cost/peak.py)
GATHER_BUFFER_LABEL = "gather buffer (largest layer)"
GROUP_SYMBOLS = {ParamGroup.DENSE: "Ψ_dense", ParamGroup.NORMS: "Ψ_norms",
                 ParamGroup.EMBEDDING: "Ψ_emb", ParamGroup.EXPERTS: "Ψ_exp",
                 ParamGroup.ADAPTERS: "Ψ_lora"}


@dataclass(frozen=True, slots=True)
class MemoryItem:
    category: str  # params | optimizer | gradients | activations | outside_layers | buffers
    label: str
    bytes: Num
    host: bool = False


def group_params(d: Domain, strategy: Strategy) -> dict[ParamGroup, Num]:
    """Ψ per parameter group, as symbols (a bare model is one symbol Ψ)."""
    counts = strategy.model.group_params()
    if strategy.model.arch is None:
        return {ParamGroup.DENSE: d.sym("Ψ", counts[ParamGroup.DENSE])}
    return {g: d.sym(GROUP_SYMBOLS[g], n) for g, n in counts.items() if n > 0}


def bytes_per_element(d: Domain, strategy: Strategy, state: State) -> Num:
    p = strategy.precision
    value = {State.PARAMS: p.params, State.OPTIMIZER: p.optimizer, State.GRADIENTS: p.grads,
             State.ACTIVATIONS: p.activations}[state]
    return d.const(value)


def gathered_bytes(d: Domain, strategy: Strategy) -> Num:
    """Bytes per element of Θ as all-gathered and kept gathered for compute (FSDP2's
    ``param_dtype``; the stored dtype unless the precision says ``gather``)."""
    return d.const(strategy.precision.gathered)


def reduced_bytes(d: Domain, strategy: Strategy) -> Num:
    """Bytes per element of G on the links (FSDP2's ``reduce_dtype``, DeepSpeed's
    ``communication_data_type``; the gradient's own dtype unless the precision says ``reduce``)."""
    return d.const(strategy.precision.reduced)


def model_split(d: Domain, strategy: Strategy, group: ParamGroup, state: State,
                pipeline: bool = True, tensor: bool = True) -> Num:
    """The divisor from splitting the model itself: tensor, pipeline and expert axes (the
    pipeline axis left out with ``pipeline = False``, when the stage's own counts are used; the
    tensor axes with ``tensor = False``, for the learned position table they leave whole).
    A pipeline whose stages list their layers divides the layers' groups by L / L_max: the
    share of the stage with the most layers."""
    divisor: Num = d.const(1)
    arch = strategy.model.arch
    for p in strategy.placements:
        if not p.mode(state).sharded or (not pipeline and p.role is Role.PIPELINE) or \
                (not tensor and p.role is Role.TENSOR):
            continue
        if ROLES[p.role].splits_model(group):
            if (p.role is Role.PIPELINE and arch is not None and group is not ParamGroup.EMBEDDING
                    and stage_layers(strategy) is not None):
                divisor = divisor * d.sym("L", arch.layers) / stage_share(d, strategy, arch)
            else:
                divisor = divisor * d.sym(p.axis, strategy.size(p.axis))
    return divisor


def data_split(d: Domain, strategy: Strategy, state: State, skip: tuple[str, ...] = (),
               group: ParamGroup | None = None) -> Num:
    """The divisor from sharding over data-parallel (and context) axes: ZeRO / FSDP (the axes in
    ``skip`` left out), for one parameter group when given (``docs/language/place.md``)."""
    divisor: Num = d.const(1)
    for p in strategy.placements:
        if partitions(strategy, p.axis, state, group) and p.axis not in skip:
            divisor = divisor * d.sym(p.axis, strategy.size(p.axis))
    return divisor


def local_params(d: Domain, strategy: Strategy, state: State = State.PARAMS) -> dict[ParamGroup, Num]:
    """Elements of each group on one device before any data-parallel sharding (the learned
    position table whole along tensor axes: :func:`device_params`)."""
    counts = group_params(d, strategy)
    arch = strategy.model.arch
    rows = 0 if arch is None else arch.position_rows * arch.hidden
    if rows:  # the embedding group is the word table (split) and the position table (whole)
        assert arch is not None
        counts[ParamGroup.EMBEDDING] = d.sym("Ψ_word", arch.vocab * arch.hidden)
    return device_params(d, strategy, counts, d.sym("Ψ_pos", rows) if rows else None, state,
                         pipeline=True)


def device_params(d: Domain, strategy: Strategy, held: dict[ParamGroup, Num],
                  positions: Num | None, state: State, pipeline: bool = False
                  ) -> dict[ParamGroup, Num]:
    """Elements of each group on one device after the model's own splits (tensor, expert and,
    with ``pipeline``, pipeline axes), before any data-parallel sharding: ``held`` split by each
    group's divisor, and the learned position table ``positions`` (of the embedding group) by
    the same axes less the tensor ones. Megatron-LM's ``LanguageModelEmbedding``
    (``megatron/core/models/common/embeddings/language_model_embedding.py``) builds the word
    table as a ``VocabParallelEmbedding`` (rows split over tp) and the position table as a
    plain ``torch.nn.Embedding(max_sequence_length, hidden_size)``: every tensor-parallel rank
    holds all of it."""
    out = {g: n / model_split(d, strategy, g, state, pipeline) for g, n in held.items()}
    if positions is not None:
        whole = positions / model_split(d, strategy, ParamGroup.EMBEDDING, state, pipeline,
                                        tensor=False)
        out[ParamGroup.EMBEDDING] = out.get(ParamGroup.EMBEDDING, d.const(0)) + whole
    return out


@dataclass(frozen=True, slots=True)
class StageKind:
    """A kind of pipeline stage with the same memory: which stages, and what they hold besides
    their layers."""

    name: str  # only | first | middle | last
    stages: tuple[int, ...]
    first: bool  # holds the word embedding (and learned positions)
    last: bool  # holds the output layer and the final norm (or the tied embedding's copy)
    layers: int | None = None  # its layers when the pipeline lists them; None: L / p


@dataclass(frozen=True, slots=True)
class RankMemory:
    """The memory of one rank kind."""

    kind: StageKind
    items: tuple[MemoryItem, ...]


def stage_kinds(strategy: Strategy) -> tuple[StageKind, ...]:
    pipe = strategy.pipeline
    p = 1 if pipe is None else strategy.size(pipe.axis)
    if p == 1 or strategy.model.arch is None:
        return (StageKind("only" if p == 1 else "every", tuple(range(p)), True, True),)
    listed = stage_layers(strategy)
    if listed is not None:
        return uneven_kinds(listed)
    kinds = [StageKind("first", (0,), True, False)]
    if p > 2:
        kinds.append(StageKind("middle", tuple(range(1, p - 1)), False, False))
    kinds.append(StageKind("last", (p - 1,), False, True))
    return tuple(kinds)


def uneven_kinds(layers: tuple[int, ...]) -> tuple[StageKind, ...]:
    """Stage kinds of a pipeline whose stages list their layers: the first, the last, and the
    middle stages grouped by their layer count (named by it when they differ)."""
    p = len(layers)
    middle: dict[int, list[int]] = {}
    for stage in range(1, p - 1):
        middle.setdefault(layers[stage], []).append(stage)
    kinds = [StageKind("first", (0,), True, False, layers[0])]
    for count, stages in middle.items():
        name = "middle" if len(middle) == 1 else f"middle ({count} layers)"
        kinds.append(StageKind(name, tuple(stages), False, False, count))
    kinds.append(StageKind("last", (p - 1,), False, True, layers[-1]))
    return tuple(kinds)


def stage_params(d: Domain, strategy: Strategy, kind: StageKind,
                 chunk: Num | None = None) -> dict[ParamGroup, Num]:
    """Parameters of each group held by a stage of this kind, before tensor, expert and data
    splits (a bare parameter count is split evenly over the stages); with ``chunk``, the layers
    of one model chunk of that many layers instead of the stage's, beside what the stage holds
    outside its layers (an upper bound for any one chunk)."""
    arch = strategy.model.arch
    pipe = strategy.pipeline
    p = 1 if pipe is None else strategy.size(pipe.axis)
    if arch is None:
        stages = d.const(1) if pipe is None else d.sym(pipe.axis, p)
        return {g: n / stages for g, n in group_params(d, strategy).items()}
    word = arch.padded_vocab(tensor_size(strategy)) * arch.hidden
    layers = arch.layers_params()  # dense and MoE layers alike under a pipeline (lower/model.py)
    output = 0 if arch.tied_embeddings else word
    # the embedding group here is the word table; a learned position table is apart
    # (stage_positions), since tensor axes leave it whole
    embedding = "Ψ_word" if arch.position_rows else GROUP_SYMBOLS[ParamGroup.EMBEDDING]
    if p == 1:
        counts = {ParamGroup.DENSE: layers[ParamGroup.DENSE] + output,
                  ParamGroup.NORMS: layers[ParamGroup.NORMS] + arch.norm_params(),
                  ParamGroup.EMBEDDING: word,
                  ParamGroup.EXPERTS: layers[ParamGroup.EXPERTS]}
        whole_model = {**strategy.model.group_params(),
                       ParamGroup.EMBEDDING: arch.vocab * arch.hidden}
        names = {**GROUP_SYMBOLS, ParamGroup.EMBEDDING: embedding}
        if ParamGroup.ADAPTERS in whole_model:  # a fine-tune's adapters (cost.fine_tune)
            counts[ParamGroup.ADAPTERS] = whole_model[ParamGroup.ADAPTERS]
        # a padded vocabulary changes the count: a symbol of its own (communication keeps Ψ_emb)
        return {g: d.sym(names[g] + ("" if n == whole_model[g] else "_padded"), n)
                for g, n in counts.items() if n > 0}
    pp = d.sym(pipe.axis, p) if pipe is not None else d.const(1)
    # the stage's share of the layers: 1/p, or its listed count over the model's L (a stage
    # that lists none holds no layer: only the embedding or the output layer)
    held = None if kind.layers is None else stage_layer_count(d, strategy, kind.layers)
    if chunk is not None:
        held = chunk
    out: dict[ParamGroup, Num] = {}
    for group, name in ((ParamGroup.DENSE, "Ψ_dense_layers"), (ParamGroup.NORMS, "Ψ_norms_layers"),
                        (ParamGroup.EXPERTS, "Ψ_exp")):
        if layers[group] and held is None:
            out[group] = d.sym(name, layers[group]) / pp
        elif layers[group] and held is not None:
            out[group] = d.sym(name, layers[group]) * held / d.sym("L", arch.layers)
    if kind.first:
        out[ParamGroup.EMBEDDING] = d.sym(embedding + "_first", word)
    if kind.last:
        if output:
            out[ParamGroup.DENSE] = out.get(ParamGroup.DENSE, d.const(0)) + d.sym("Ψ_out", output)
        else:
            out[ParamGroup.EMBEDDING] = d.sym("Ψ_tied", word)
        out[ParamGroup.NORMS] = out.get(ParamGroup.NORMS, d.const(0)) + \
            d.sym("Ψ_final_norm", arch.norm_params())
    return out


def stage_positions(d: Domain, strategy: Strategy, kind: StageKind) -> Num | None:
    """The learned position table a stage of this kind holds (the first stage's, of the
    embedding group), before any split; None for none."""
    arch = strategy.model.arch
    if arch is None or not kind.first or not arch.position_rows:
        return None
    return d.sym("Ψ_pos", arch.position_rows * arch.hidden)


def memory_items(d: Domain, strategy: Strategy) -> tuple[list[MemoryItem], ActivationCost | None]:
    """The memory of the fullest rank kind (the one that decides whether the step fits)."""
    ranks, activations = memory_by_rank(d, strategy)
    return list(ranks[fullest(strategy, ranks)].items), activations


def fullest(strategy: Strategy, ranks: tuple[RankMemory, ...]) -> int:
    """Index of the rank kind with the most device bytes (the first of equals), decided on exact
    numbers in either domain."""
    if len(ranks) == 1:
        return 0
    exact, _ = memory_by_rank(Exact(), strategy)
    totals = [sum((Fraction(i.bytes) for i in r.items if not i.host), Fraction(0)) for r in exact]
    return totals.index(max(totals))


def memory_by_rank(d: Domain, strategy: Strategy) -> tuple[tuple[RankMemory, ...],
                                                           ActivationCost | None]:
    activations = activation_cost(d, strategy, bytes_per_element(d, strategy, State.ACTIVATIONS))
    activation_bytes = bytes_per_element(d, strategy, State.ACTIVATIONS)
    buffer = gather_buffer(d, strategy)
    ranks = tuple(RankMemory(kind, (
        *state_items(d, strategy, kind),
        *step_items(d, strategy, kind),
        *(MemoryItem("outside_layers", label, amount) for label, amount in
          outside_layers(d, strategy, activation_bytes, kind.first, kind.last)),
        *activation_items(d, strategy, kind, activations, buffer))) for kind in stage_kinds(strategy))
    return ranks, activations


def activation_items(d: Domain, strategy: Strategy, kind: StageKind,
                     activations: ActivationCost | None, buffer: MemoryItem | None) -> list[MemoryItem]:
    """The layers' activations of one stage kind and the buffers beside them: its layers (L / p,
    or its listed count) times the micro-batches in flight on the kind's first stage
    (:func:`placeverify.cost.activations.stage_in_flight`; in-flight counts never grow with the
    stage index, so the kind's first stage is its fullest)."""
    items: list[MemoryItem] = []
    if activations is not None:
        arch = strategy.model.arch
        assert arch is not None
        layers = stage_share(d, strategy, arch) if kind.layers is None else \
            stage_layer_count(d, strategy, kind.layers)
        in_flight, _ = stage_in_flight(d, strategy, kind.stages[0] if kind.stages else 0)
        kept = activations.per_layer * layers * in_flight
        if offloaded(strategy, State.ACTIVATIONS):
            items.append(MemoryItem("activations", "A activations (offloaded)", kept, host=True))
            items.append(MemoryItem("activations", "A activations", d.const(0)))
            items.append(MemoryItem("buffers", "activation staging (one layer)",
                                    activations.per_layer))
        else:
            items.append(MemoryItem("activations", "A activations", kept))
        if activations.working_set != 0:
            items.append(MemoryItem("buffers", WORKING_SET_LABEL, activations.working_set))
    if buffer is not None:
        items.append(buffer)
    return items


def state_items(d: Domain, strategy: Strategy, kind: StageKind) -> list[MemoryItem]:
    items: list[MemoryItem] = []
    held = stage_params(d, strategy, kind)
    positions = stage_positions(d, strategy, kind)
    for state in MODEL_STATES:
        host = offloaded(strategy, state)  # offloaded G: the profile's host dtype (profiles.py)
        per_element = d.const(host_gradient_bytes(strategy.mesh.memory_profile, strategy.precision
                                                  .grads)) if host and state is State.GRADIENTS \
            else bytes_per_element(d, strategy, state)
        local = fine_tune.counted(strategy, state, device_params(d, strategy, held, positions, state))
        if state is State.PARAMS:  # a quantised base's layer weights are items of their own
            local = fine_tune.stored_params(d, strategy, local)
        total: Num = 0
        for n in local.values():
            total = total + n
        amount = total * per_element / data_split(d, strategy, state)
        if per_group(strategy):  # each group divided by its own data-parallel shards
            amount = 0
            for group, n in local.items():
                amount = amount + n * per_element / data_split(d, strategy, state, group=group)
        items.append(MemoryItem(state.value, f"{state.symbol} {state.value}",
                                d.const(0) if host else amount))
        if host:
            items.append(MemoryItem(state.value, f"{state.symbol} {state.value} (offloaded)", amount,
                                    host=True))
        if state is State.PARAMS and fine_tune.quantised(d, strategy) is not None:
            packed, scales = fine_tune.packed_bytes(d, strategy)
            base = strategy.model.base_dtype
            items.append(MemoryItem(state.value, f"Θ frozen {base} weights (packed)", packed
                                    / data_split(d, strategy, state, group=ParamGroup.DENSE)))
            items.append(MemoryItem(state.value, f"Θ frozen {base} scales (whole on every rank)",
                                    scales))
    return items


def step_items(d: Domain, strategy: Strategy, kind: StageKind) -> list[MemoryItem]:
    """What the step as written keeps beyond the placement's modes: the full unsharded gradient
    (beside its shard, the reduce-scatter's output) and parameters gathered after the update
    (beside the shard the optimizer updates)."""
    items: list[MemoryItem] = []
    held = stage_params(d, strategy, kind)
    arch = strategy.model.arch
    accumulating, what = held, "G unsharded gradient (accumulated before the reduce-scatter)"
    unsharded = unsharded_gradient_axes(strategy)
    if (arch is not None and chunk_ordered(strategy) and unsharded
            and all(strategy.placement(a).reduce is Reduce.STEP for a in unsharded)):
        # 'reduce = step' reduces each chunk after its last micro-batch, and the backward
        # finishes one chunk before the next: one chunk's gradient accumulates at a time
        layers = chunk_layers(strategy, arch, kind.stages)
        accumulating = stage_params(d, strategy, kind, d.sym("L_chunk", layers))
        what = ("G unsharded gradient of one model chunk (accumulated before the "
                "reduce-scatter; the backward runs chunk by chunk)")
    for state, axes, label, params in (
            (State.GRADIENTS, unsharded, what, accumulating),
            (State.PARAMS, kept_parameter_axes(strategy),
             "Θ gathered parameters (kept after the step's all-gather)", held)):
        if not axes:
            continue
        total: Num = 0
        for n in fine_tune.counted(strategy, state, device_params(
                d, strategy, params, stage_positions(d, strategy, kind), state)).values():
            total = total + n
        per_element = (gathered_bytes(d, strategy) if state is State.PARAMS
                       else bytes_per_element(d, strategy, state))
        items.append(MemoryItem(state.value, label, total * per_element
                                / data_split(d, strategy, state, skip=axes)))
    return items


GATHERED_KEPT_LABEL = "gathered parameters (kept from forward to backward)"


def gather_buffer(d: Domain, strategy: Strategy) -> MemoryItem | None:
    """S*: one gathered reconstruction unit (FSDP's wrapping unit: a layer or an embedding).

    With reshard_after_forward = false (FSDP SHARD_GRAD_OP) every unit stays gathered from forward
    to backward, so the buffer is the whole local model. A bare parameter count has no unit.
    """
    axes = gathered_axes(strategy)
    if not axes or set(axes) <= set(kept_parameter_axes(strategy)):
        return None  # none, or the step keeps the parameters gathered: nothing more to gather
    per_element = gathered_bytes(d, strategy)
    keep_all = any(not strategy.placement(a).reshard_after_forward for a in axes)
    if keep_all:
        total: Num = 0
        for n in local_params(d, strategy).values():
            total = total + n
        return MemoryItem("buffers", GATHERED_KEPT_LABEL, total * per_element)
    arch = strategy.model.arch
    if arch is None:
        return None
    tp = d.const(1)
    for p in strategy.placements:
        if p.role is Role.TENSOR:
            tp = tp * d.sym(p.axis, strategy.size(p.axis))
    unit = d.sym("Ψ_unit", arch.largest_unit_params())
    return MemoryItem("buffers", GATHER_BUFFER_LABEL, unit * per_element / tp)
