"""Per-device memory: model states, activations, transient buffers, and host memory.

Mode rules (REFERENCE §1, arXiv 2601.02311 Theorem 1): a state of s bytes placed R along an axis
of size n keeps s, S keeps s/n, S* keeps s/n plus one gathered reconstruction unit while in use,
O keeps nothing on the device and s/n on the host, M (activations) keeps what rebuilding needs
plus one layer's working set. Along a tensor axis the replicated parameters (norms, row-parallel
biases, the router) stay whole; along an expert axis only the experts are split. Model states are
divided evenly over pipeline stages (Megatron-LM's Ψ/(t·p) approximation).
"""

from __future__ import annotations

from dataclasses import dataclass

from placeverify.cost.activations import ActivationCost, activation_cost
from placeverify.cost.domain import Domain, Num
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role, State
from placeverify.ir.strategy import Strategy
from placeverify.roles import ROLES
from placeverify.roles.queries import gathered_axes, offloaded, partitions

MODEL_STATES = (State.PARAMS, State.OPTIMIZER, State.GRADIENTS)

GROUP_SYMBOLS = {ParamGroup.DENSE: "Ψ_dense", ParamGroup.NORMS: "Ψ_norms",
                 ParamGroup.EMBEDDING: "Ψ_emb", ParamGroup.EXPERTS: "Ψ_exp"}


@dataclass(frozen=True, slots=True)
class MemoryItem:
    category: str  # params | optimizer | gradients | activations | buffers
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


def model_split(d: Domain, strategy: Strategy, group: ParamGroup, state: State) -> Num:
    """The divisor from splitting the model itself: tensor, pipeline and expert axes."""
    divisor: Num = d.const(1)
    for p in strategy.placements:
        if not p.mode(state).sharded:
            continue
        if ROLES[p.role].splits_model(group):
            divisor = divisor * d.sym(p.axis, strategy.size(p.axis))
    return divisor


def data_split(d: Domain, strategy: Strategy, state: State) -> Num:
    """The divisor from sharding over data-parallel (and context) axes: ZeRO / FSDP."""
    divisor: Num = d.const(1)
    for p in strategy.placements:
        if partitions(strategy, p.axis, state):
            divisor = divisor * d.sym(p.axis, strategy.size(p.axis))
    return divisor


def local_params(d: Domain, strategy: Strategy, state: State = State.PARAMS) -> dict[ParamGroup, Num]:
    """Elements of each group on one device before any data-parallel sharding."""
    return {g: n / model_split(d, strategy, g, state) for g, n in group_params(d, strategy).items()}


def memory_items(d: Domain, strategy: Strategy) -> tuple[list[MemoryItem], ActivationCost | None]:
    items: list[MemoryItem] = []
    for state in MODEL_STATES:
        per_element = bytes_per_element(d, strategy, state)
        total: Num = 0
        for group, n in group_params(d, strategy).items():
            total = total + n / model_split(d, strategy, group, state)
        amount = total * per_element / data_split(d, strategy, state)
        host = offloaded(strategy, state)
        items.append(MemoryItem(state.value, f"{state.symbol} {state.value}",
                                d.const(0) if host else amount))
        if host:
            items.append(MemoryItem(state.value, f"{state.symbol} {state.value} (offloaded)", amount,
                                    host=True))

    activations = activation_cost(d, strategy, bytes_per_element(d, strategy, State.ACTIVATIONS))
    if activations is not None:
        if offloaded(strategy, State.ACTIVATIONS):
            items.append(MemoryItem("activations", "A activations (offloaded)", activations.kept,
                                    host=True))
            items.append(MemoryItem("activations", "A activations", d.const(0)))
            items.append(MemoryItem("buffers", "activation staging (one layer)",
                                    activations.per_layer))
        else:
            items.append(MemoryItem("activations", "A activations", activations.kept))
        if activations.working_set != 0:
            items.append(MemoryItem("buffers", "recompute working set (one layer)",
                                    activations.working_set))

    buffer = gather_buffer(d, strategy)
    if buffer is not None:
        items.append(buffer)
    return items, activations


def gather_buffer(d: Domain, strategy: Strategy) -> MemoryItem | None:
    """S*: one gathered reconstruction unit (FSDP's wrapping unit: a layer or an embedding).

    With reshard_after_forward = false (FSDP SHARD_GRAD_OP) every unit stays gathered from forward
    to backward, so the buffer is the whole local model. A bare parameter count has no unit.
    """
    axes = gathered_axes(strategy)
    if not axes:
        return None
    per_element = bytes_per_element(d, strategy, State.PARAMS)
    keep_all = any(not strategy.placement(a).reshard_after_forward for a in axes)
    if keep_all:
        total: Num = 0
        for n in local_params(d, strategy).values():
            total = total + n
        return MemoryItem("buffers", "gathered parameters (kept from forward to backward)",
                          total * per_element)
    arch = strategy.model.arch
    if arch is None:
        return None
    tp = d.const(1)
    for p in strategy.placements:
        if p.role is Role.TENSOR:
            tp = tp * d.sym(p.axis, strategy.size(p.axis))
    unit = d.sym("Ψ_unit", arch.largest_unit_params())
    return MemoryItem("buffers", "gather buffer (largest layer)", unit * per_element / tp)
