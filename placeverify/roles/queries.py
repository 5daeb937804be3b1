"""Questions about a placement asked by several backends, each answered in one place.

Data and context axes split the batch: every rank along them holds the same parameters, so a
state placed S (or offloaded, O) along one of them is a ZeRO-style partition of one copy: each
rank updates one shard (ZeRO stage 1-3, FSDP, Megatron-LM's distributed optimizer, which shards
over data × context ranks) and the updated parameters must reach the others. Along tensor,
pipeline and expert axes a sharded state is a different part of the model, not a partition.
"""

from __future__ import annotations

from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import AxisPlacement, Mode, Role, State
from placeverify.ir.relations import Relation
from placeverify.ir.step import Region
from placeverify.ir.strategy import Layout
from placeverify.roles import ROLES
from placeverify.roles.relations import relation


def replicates_model(p: AxisPlacement, group: ParamGroup | None = None) -> bool:
    """Do the ranks along this axis hold the same parameters (data, context), so that a sharded
    state along it is a partition of one copy? Of ``group``, when given: along an expert axis
    placed by a data preset over a product (``place zero1 over ep * dp``,
    ``docs/language/place.md``) the groups it does not split are copies too, and their states
    are partitioned."""
    if ROLES[p.role].replicates_model:
        return True
    return (group is not None and p.role is Role.EXPERT and bool(p.group_modes)
            and not ROLES[p.role].splits_model(group))


def partitions(strategy: Layout, axis: str, state: State, group: ParamGroup | None = None) -> bool:
    """Is ``state`` (of ``group``, when given: ``docs/language/place.md``) along ``axis`` a
    partition of one replicated copy (ZeRO-style)?"""
    p = strategy.placement(axis)
    return replicates_model(p, group) and p.mode_of(state, group).sharded


def optimizer_axes(strategy: Layout, group: ParamGroup) -> tuple[str, ...]:
    """Axes (larger than 1) along which each rank updates one shard of this group's optimizer
    state, in mesh order."""
    return tuple(p.axis for p in strategy.placements
                 if strategy.size(p.axis) > 1 and partitions(strategy, p.axis, State.OPTIMIZER, group)
                 and relation(strategy, group, p.axis) is not Relation.OWNED)


def sharded_update(strategy: Layout, axis: str, group: ParamGroup | None = None) -> bool:
    """Is the optimizer step along this axis done on shards (of Ω, or of G: ZeRO-2 without a
    sharded Ω is not realisable and refuted on composition)?"""
    return (partitions(strategy, axis, State.OPTIMIZER, group)
            or partitions(strategy, axis, State.GRADIENTS, group))


def gradients_sharded(strategy: Layout, axis: str, group: ParamGroup | None = None) -> bool:
    """Does each rank along this axis hold only a shard of the gradient (ZeRO-2/3, FSDP)?"""
    return strategy.placement(axis).mode_of(State.GRADIENTS, group).sharded


def gathered_axes(strategy: Layout, group: ParamGroup | None = None) -> tuple[str, ...]:
    """Data axes over which the parameters (of ``group``, when given) are gathered before use
    (S*, or O streamed in)."""
    return tuple(p.axis for p in strategy.placements
                 if gathers_before_use(p, group)
                 and p.mode_of(State.PARAMS, group) in (Mode.S_STAR, Mode.O))


def gathers_copies(p: AxisPlacement, group: ParamGroup | None) -> bool:
    """Is ``p`` an expert axis along which ``group`` is a copy with its own placement
    (``place fsdp over ep * dp``: the dense groups' parameters sharded over ep x dp and gathered
    over it, ``docs/language/place.md``)?"""
    return group is not None and p.role is Role.EXPERT and replicates_model(p, group)


def gathers_before_use(p: AxisPlacement, group: ParamGroup | None) -> bool:
    """Is ``p`` an axis whose ranks hold copies of ``group`` that a sharded placement gathers
    before use: a data axis, a context axis (``place fsdp over dp * cp``: FSDP2 over the
    flattened dp_shard x cp mesh, as accelerate and torchtitan apply it, ``docs/language/place.md``)
    or an expert axis the group is a copy along (:func:`gathers_copies`)?"""
    return p.role is Role.DATA or p.role is Role.CONTEXT or gathers_copies(p, group)


def offloaded(strategy: Layout, state: State) -> bool:
    """Is ``state`` offloaded to host memory (O along some axis)?"""
    return any(p.mode(state) is Mode.O for p in strategy.placements)


def gathered_after_update(strategy: Layout, group: ParamGroup | None = None) -> tuple[str, ...]:
    """Axes where the parameters (of ``group``, when given) stay replicated but are updated on
    shards, so they must be all-gathered after the update (ZeRO-1/2, an offloaded optimizer)."""
    return tuple(p.axis for p in strategy.placements
                 if replicates_model(p, group) and p.mode_of(State.PARAMS, group) is Mode.R
                 and p.mode_of(State.OPTIMIZER, group).sharded)


def per_group(strategy: Layout) -> bool:
    """Does some axis place a parameter group by its own preset (``docs/language/place.md``)?"""
    return any(p.group_modes for p in strategy.placements)


def dropout_regions(strategy: Layout, axis: str) -> tuple[Region, ...]:
    """The dropout regions an axis has (placeverify.semantics.rng): replicated and sharded on a
    tensor axis without sequence parallelism, sharded only elsewhere."""
    p = strategy.placement(axis)
    return ROLES[p.role].dropout_regions(p)


def region_named(strategy: Layout, axis: str, word: Region) -> Region:
    """The region of ``axis`` that a seed statement's region word names."""
    return word if word in dropout_regions(strategy, axis) else Region.SHARDED
