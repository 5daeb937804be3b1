"""The meaning of composition: statements that change the mode matrix after the placements.

``recompute`` turns the activations' batch-axis modes R into M (Korthikanti et al. 2022: the
activations are materialised again in backward); ``offload`` turns a state's sharded data-axis
modes into O (ZeRO-Offload, Ren et al. 2021, partitions the offloaded state over data-parallel
ranks), and the activations' batch-axis modes into O. Offloading the optimizer moves the gradient
partition with it wherever the gradients are sharded (ZeRO-Offload's and DeepSpeed's
``offload_optimizer``: the host runs the step on the gradient shard it holds). Both are pure
functions of the placements; lowering reports the problems at the statement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from placeverify.diagnostics import Code
from placeverify.ir.placement import STATES, AxisPlacement, Mode, Reduce, Role, State
from placeverify.ir.strategy import RecomputeKind
from placeverify.roles.relations import token_roles

Placements = tuple[AxisPlacement, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a composition does not apply, for lowering to report at the statement."""

    message: str
    code: Code


def with_recompute(placements: Placements, kind: RecomputeKind) -> Placements:
    """The placements with recomputed activations: M where the batch axes kept them (R)."""
    if kind is RecomputeKind.NONE:
        return placements
    return tuple(
        replace(p, modes=(*p.modes[:3], Mode.M)) if p.role in token_roles() and p.modes[3] is Mode.R
        else p for p in placements)


def with_offload(placements: Placements, state: State) -> tuple[Placements, list[Problem]]:
    """The placements with ``state`` offloaded (O on the axes that partition it), or the problems
    that prevent it (then the placements are returned unchanged)."""
    index = STATES.index(state)
    data = [p for p in placements if p.role is Role.DATA]
    if state is State.ACTIVATIONS:
        targets = {p.axis for p in placements if p.role in token_roles()}
    else:
        targets = {p.axis for p in data if p.modes[index].sharded}
        if not targets and data:
            return placements, [Problem(
                f"offloading {state.value} needs them sharded over a data-parallel axis "
                f"(ZeRO-Offload partitions them); place zero1/zero2/zero3 over "
                f"{data[0].axis}", Code.CONFLICT)]
        if not data:
            return placements, [Problem(
                f"offloading {state.value} needs a data-parallel axis to partition them over",
                Code.CONFLICT)]
    moved = {index: targets}
    if state is State.OPTIMIZER:
        # ZeRO-Offload: the optimizer step runs on the host, so the gradient partition it reads
        # lives there too (DeepSpeed offload_optimizer; REFERENCE §8)
        grads = STATES.index(State.GRADIENTS)
        moved[grads] = {p.axis for p in data if p.modes[grads].sharded}
    once = [p.axis for p in data if p.reduce is Reduce.STEP
            and p.axis in moved.get(STATES.index(State.GRADIENTS), ())]
    if once:
        return placements, [Problem(
            f"not modelled: offloaded gradients with 'reduce = step' over {once[0]} (the "
            "unsharded gradient would accumulate on the device before its shard moves to the "
            "host); reduce every micro-batch, or do not offload the gradients", Code.NOT_MODELLED)]
    return tuple(
        replace(p, modes=tuple(Mode.O if p.axis in moved.get(i, ()) else m  # type: ignore[arg-type]
                               for i, m in enumerate(p.modes)))
        for p in placements), []
