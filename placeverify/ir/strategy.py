"""The resolved, typed, immutable description of one strategy: the IR every backend reads."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from placeverify.diagnostics import Diagnostic, Source, Span
from placeverify.ir.mesh import Mesh
from placeverify.ir.model import Model, ParamGroup
from placeverify.ir.placement import AxisPlacement, Mode, Role, State
from placeverify.ir.precision import Precision
from placeverify.ir.step import NormKind, Step


class LossKind(StrEnum):
    """What the single-device reference computes on the global batch."""

    TOKEN_MEAN = "token_mean"  # mean over every token of the global batch
    SAMPLE_MEAN = "sample_mean"  # mean over every sample of the global batch
    MICROBATCH_MEAN = "microbatch_mean"  # mean over micro-batches of each one's token mean
    SUM = "sum"  # plain sum


@dataclass(frozen=True, slots=True)
class Loss:
    kind: LossKind
    span: Span | None
    uneven_samples: bool = False  # sample_mean: micro-batches may hold different sample counts


MAIN_TERM = "main"  # how reports name the main loss; no named term may take the name


@dataclass(frozen=True, slots=True)
class LossTerm:
    """A named loss term beside the main loss (``loss aux: token_mean reaches experts``): the
    single-device loss is the sum of the main loss and every term, each normalised as its ``loss``
    says and reaching the parameter groups ``reaches`` names (None: every group)."""

    name: str
    loss: Loss
    reaches: frozenset[ParamGroup] | None
    span: Span


class RecomputeKind(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"  # Korthikanti et al.: recompute the attention core only
    FULL = "full"  # keep each layer's input, recompute the layer in backward
    # torchtitan's op-level policy (activation_checkpoint.selective_ac_option = "op"): keep each
    # layer's input, the fused attention's output and every other matmul's output; recompute
    # the rest (``docs/models/step-time.md``)
    SELECTIVE_OP = "selective_op"


@dataclass(frozen=True, slots=True)
class Recompute:
    kind: RecomputeKind
    restore_rng: bool
    span: Span | None
    every: int = 1  # full: every n-th layer is recomputed (torchtitan's selective layer AC)


@dataclass(frozen=True, slots=True)
class ClipConfig:
    max_norm: Fraction
    span: Span
    norm: NormKind = NormKind.L2  # the p of the global norm single-device training clips by


@dataclass(frozen=True, slots=True)
class Config:
    """Everything a strategy says except its step: what the canonical step is derived from."""

    name: str
    source: Source
    model: Model
    model_span: Span
    precision: Precision
    precision_span: Span | None
    mesh: Mesh
    placements: tuple[AxisPlacement, ...]  # one per mesh axis, in mesh order
    recompute: Recompute
    loss: Loss
    microbatches: int  # the micro-batches of one step (a written step may declare them)
    clip: ClipConfig | None
    loss_scale: str
    terms: tuple[LossTerm, ...] = ()  # named loss terms beside the main loss (``docs/language/loss.md``)
    # 'unused dense': groups a micro-batch may leave unused on any rank (``docs/language/unused.md``)
    unused: frozenset[ParamGroup] = frozenset()
    # 'empty microbatches': a micro-batch may hold no tokens (``docs/language/empty.md``)
    empty: bool = False

    def placement(self, axis: str) -> AxisPlacement:
        for p in self.placements:
            if p.axis == axis:
                return p
        raise KeyError(axis)

    def mode(self, state: State, axis: str) -> Mode:
        return self.placement(axis).mode(state)

    def axes(self, *roles: Role) -> tuple[str, ...]:
        return tuple(p.axis for p in self.placements if p.role in roles)

    def size(self, axis: str) -> int:
        return self.mesh.size(axis)

    @property
    def pipeline(self) -> AxisPlacement | None:
        for p in self.placements:
            if p.role is Role.PIPELINE:
                return p
        return None

    @property
    def offloaded(self) -> frozenset[State]:
        return frozenset(s for p in self.placements for s in State if p.mode(s) is Mode.O)


@dataclass(frozen=True, slots=True)
class Override:
    """A ``--set KEY=VALUE`` the strategy was lowered with (``docs/overrides.md``); ``implied`` for
    the ``world`` a file writes, which follows the axes an override resizes."""

    key: str
    value: str
    implied: bool = False

    @property
    def text(self) -> str:
        return f"{self.key}={self.value}"


@dataclass(frozen=True, slots=True)
class Strategy:
    """A configuration and the step it trains with (written in the file, or the canonical one).

    Every field of :class:`Config` reads through, so ``strategy.mesh`` is ``strategy.config.mesh``.
    ``overrides`` are the ``--set`` options applied to the file's text before it was lowered
    (its ``source`` is that text).
    """

    config: Config
    step: Step
    warnings: tuple[Diagnostic, ...] = ()
    overrides: tuple[Override, ...] = ()

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def source(self) -> Source:
        return self.config.source

    @property
    def model(self) -> Model:
        return self.config.model

    @property
    def model_span(self) -> Span:
        return self.config.model_span

    @property
    def precision(self) -> Precision:
        return self.config.precision

    @property
    def precision_span(self) -> Span | None:
        return self.config.precision_span

    @property
    def mesh(self) -> Mesh:
        return self.config.mesh

    @property
    def placements(self) -> tuple[AxisPlacement, ...]:
        return self.config.placements

    @property
    def recompute(self) -> Recompute:
        return self.config.recompute

    @property
    def loss(self) -> Loss:
        return self.config.loss

    @property
    def microbatches(self) -> int:
        return self.config.microbatches

    @property
    def terms(self) -> tuple[LossTerm, ...]:
        return self.config.terms

    @property
    def clip(self) -> ClipConfig | None:
        return self.config.clip

    @property
    def loss_scale(self) -> str:
        return self.config.loss_scale

    def placement(self, axis: str) -> AxisPlacement:
        return self.config.placement(axis)

    def mode(self, state: State, axis: str) -> Mode:
        return self.config.mode(state, axis)

    def axes(self, *roles: Role) -> tuple[str, ...]:
        return self.config.axes(*roles)

    def size(self, axis: str) -> int:
        return self.config.size(axis)

    @property
    def pipeline(self) -> AxisPlacement | None:
        return self.config.pipeline

    @property
    def offloaded(self) -> frozenset[State]:
        return self.config.offloaded


Layout = Config | Strategy  # what the placement questions of roles/relations and roles/queries read
