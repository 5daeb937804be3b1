"""The placement presets of one axis, as one table of data.

Each preset names a role, the modes (Θ, Ω, G, A) it gives the states along its axis, how many axes
it is placed over, and the options it takes: by keyword (``zero3(reshard_after_forward = false)``)
and, for some, by a bare word (``fsdp(grad_op)``, ``pipeline(gpipe)``, ``megatron(sequence_parallel)``).
A preset may also turn into another one by an option's value: FSDP's sharding strategies
(PyTorch ``ShardingStrategy``: ``HYBRID_SHARD`` is HSDP, ``NO_SHARD`` is DDP). The preset table of
``docs/language/place.md`` states the same facts and ``tests/test_presets.py`` holds the two together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from placeverify.ir.placement import Mode, Overlap, Reduce, Role, Schedule, TensorOverlap

MAX_MICROBATCHES = 10**6  # a sanity bound: more micro-batches per step is a typing mistake
MAX_STEPS = 16  # consecutive optimizer steps verified together (microbatches = [4, 4, 2])

R, S, SS = Mode.R, Mode.S, Mode.S_STAR
Modes = tuple[Mode, Mode, Mode, Mode]


class OptionKind(StrEnum):
    BOOL = "bool"  # true or false
    INT = "int"  # a whole number within bounds
    CHOICE = "choice"  # one of the words of ``choices``
    INTS = "ints"  # a bracketed list of whole numbers within bounds


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One option of a preset: its kind, and what the lowering reads and sets."""

    kind: OptionKind
    default: object = None  # set when the option is not given; None leaves the IR's default
    bounds: tuple[int, int] = (1, MAX_MICROBATCHES)  # INT
    choices: Mapping[str, object] = field(default_factory=dict)  # CHOICE: word -> value
    what: str = ""  # CHOICE: how a message names the value ("pipeline schedule")


@dataclass(frozen=True, slots=True)
class Rewrite:
    """What a preset becomes for one value of its rewriting option."""

    preset: str  # the preset whose role, modes and axes apply
    label: str  # the name the placement carries (reports show it)
    options: Mapping[str, object] = field(default_factory=dict)  # options it sets


@dataclass(frozen=True, slots=True)
class PresetSpec:
    name: str
    role: Role
    modes: Modes
    axes: int = 1  # hsdp takes two axes: shard, replicate (R, R, R, R)
    options: Mapping[str, OptionSpec] = field(default_factory=dict)
    positional: Mapping[str, tuple[str, object]] = field(default_factory=dict)  # word -> (option, value)
    aliases: tuple[str, ...] = ()  # other names of the same preset (they keep their own label)
    implied: Mapping[str, object] = field(default_factory=dict)  # option values the preset fixes
    rewrite_option: str | None = None  # the option whose value may turn this preset into another
    rewrite: Mapping[str, Rewrite] = field(default_factory=dict)

    @property
    def hybrid(self) -> bool:
        """Is it placed over a shard axis and a replicate axis (HSDP)?"""
        return self.axes == 2


RESHARD = OptionSpec(OptionKind.BOOL)
# zero2(reduce = step): gradients accumulated unsharded, reduce-scattered once a step
REDUCE = OptionSpec(OptionKind.CHOICE, choices={r.value: r for r in Reduce},
                    what="gradient reduction")
# ddp(overlap = none): which of a data axis's collectives overlap with compute
DATA_OVERLAP = OptionSpec(OptionKind.CHOICE, choices={o.value: o for o in Overlap},
                          what="data-parallel overlap")
SEQUENCE_PARALLEL = OptionSpec(OptionKind.BOOL)
# megatron(overlap = backward): which tensor-parallel collectives run beside the GEMMs
# (``true`` and ``false``, the option's first values, are ``all`` and ``none``)
OVERLAP = OptionSpec(OptionKind.CHOICE, choices={
    **{o.value: o for o in TensorOverlap}, "true": TensorOverlap.ALL,
    "false": TensorOverlap.NONE}, what="tensor-parallel overlap")
MICROBATCHES = OptionSpec(OptionKind.INT)
CHUNKS = OptionSpec(OptionKind.INT)
STAGE_LAYERS = OptionSpec(OptionKind.INTS, bounds=(0, MAX_MICROBATCHES))  # layers per (virtual)
# pipeline stage; a stage of none holds only the embedding or the output layer (Llama 3)
SCATTER_GATHER = OptionSpec(OptionKind.BOOL)

# PyTorch FSDP ShardingStrategy names (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD) and short forms
FSDP_STRATEGIES: Mapping[str, str] = {
    "full": "full", "full_shard": "full", "grad_op": "grad_op", "shard_grad_op": "grad_op",
    "no_shard": "no_shard", "hybrid": "hybrid", "hybrid_shard": "hybrid"}
SCHEDULES: Mapping[str, Schedule] = {s.value: s for s in Schedule}

_FSDP = PresetSpec(
    "fsdp", Role.DATA, (SS, S, S, R),
    options={"reshard_after_forward": RESHARD, "reduce": REDUCE, "overlap": DATA_OVERLAP,
             "strategy": OptionSpec(OptionKind.CHOICE, choices=FSDP_STRATEGIES,
                                    what="FSDP sharding strategy")},
    positional={word: ("strategy", value) for word, value in FSDP_STRATEGIES.items()},
    rewrite_option="strategy",
    rewrite={"hybrid": Rewrite("hsdp", "hsdp"), "no_shard": Rewrite("ddp", "fsdp(no_shard)"),
             "grad_op": Rewrite("fsdp", "fsdp", {"reshard_after_forward": False})})

TABLE: tuple[PresetSpec, ...] = (
    PresetSpec("ddp", Role.DATA, (R, R, R, R), options={"overlap": DATA_OVERLAP}),
    PresetSpec("zero1", Role.DATA, (R, S, R, R), options={"overlap": DATA_OVERLAP}),
    PresetSpec("zero2", Role.DATA, (R, S, S, R),
               options={"reduce": REDUCE, "overlap": DATA_OVERLAP}),
    PresetSpec("zero3", Role.DATA, (SS, S, S, R),
               options={"reshard_after_forward": RESHARD, "reduce": REDUCE,
                        "overlap": DATA_OVERLAP}),
    _FSDP,
    PresetSpec("hsdp", Role.DATA, (SS, S, S, R), axes=2,
               options={"reshard_after_forward": RESHARD, "reduce": REDUCE,
                        "overlap": DATA_OVERLAP}),
    PresetSpec("megatron", Role.TENSOR, (S, S, S, R), aliases=("tp",),
               options={"sequence_parallel": SEQUENCE_PARALLEL, "overlap": OVERLAP},
               positional={"sequence_parallel": ("sequence_parallel", True)}),
    PresetSpec("sp", Role.TENSOR, (S, S, S, S), options={"overlap": OVERLAP},
               implied={"sequence_parallel": True}),
    PresetSpec("pipeline", Role.PIPELINE, (S, S, S, S),
               options={"schedule": OptionSpec(OptionKind.CHOICE, Schedule.ONE_F_ONE_B,
                                               choices=SCHEDULES, what="pipeline schedule"),
                        "microbatches": MICROBATCHES, "chunks": CHUNKS, "layers": STAGE_LAYERS,
                        "scatter_gather": SCATTER_GATHER},
               positional={word: ("schedule", value) for word, value in SCHEDULES.items()}),
    PresetSpec("gpipe", Role.PIPELINE, (S, S, S, S),
               options={"microbatches": MICROBATCHES, "layers": STAGE_LAYERS,
                        "scatter_gather": SCATTER_GATHER},
               implied={"schedule": Schedule.GPIPE}),
    PresetSpec("interleaved", Role.PIPELINE, (S, S, S, S),
               options={"microbatches": MICROBATCHES, "chunks": CHUNKS, "layers": STAGE_LAYERS,
                        "scatter_gather": SCATTER_GATHER},
               implied={"schedule": Schedule.INTERLEAVED}),
    PresetSpec("context", Role.CONTEXT, (R, R, R, S), aliases=("cp",)),
    PresetSpec("expert", Role.EXPERT, (S, S, S, R), aliases=("ep",)),
)

# every name a file may write, aliases included
PRESETS: Mapping[str, PresetSpec] = {
    name: spec for spec in TABLE for name in (spec.name, *spec.aliases)}


def hybrid(label: str) -> bool:
    """Is a placement labelled ``label`` one axis of a shard x replicate preset (HSDP)?"""
    spec = PRESETS.get(label)
    return spec is not None and spec.hybrid
