"""What one training step does: loss normalisation, accumulation, collectives, the update.

A step runs ``pre`` once, then ``loop`` once per micro-batch (an op may be limited to one
micro-batch), then ``post``. Gradients accumulate locally (``+=``) at each ``Backward``; a
collective replaces the buffer it names by the reduced buffer, so a reduction inside the loop
reduces everything accumulated so far. That exact semantics is shared by the Z3 encoding
(:mod:`placeverify.verify`), the exact interpreter (:mod:`placeverify.semantics`) and the torch
replay backend. Every class is a frozen, slotted dataclass made by :func:`~placeverify.node.node`
(built without generating code: check start-up time).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from fractions import Fraction
from typing import Any

from placeverify.diagnostics import Span
from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup
from placeverify.node import node

OWNER = "owner"  # a broadcast's source when each shard comes from its owner (Collective.source)


class CountKind(StrEnum):
    TOKENS = "tokens"
    SAMPLES = "samples"


class Scope(StrEnum):
    MICROBATCH = "microbatch"  # this micro-batch only
    STEP = "step"  # every micro-batch of the step
    RUN = "run"  # every micro-batch since the run began: never reset (semantics/counters.py)
    BATCH = "batch"  # every micro-batch of every step listed: the batch they split (ditto)


@node
class Count:
    """A token or sample count, summed over ``axes`` (by an all-reduce) and over ``scope``."""

    kind: CountKind
    axes: tuple[str, ...]
    scope: Scope

    def label(self) -> str:
        parts = [*self.axes, *([self.scope.value] if self.scope is not Scope.MICROBATCH else [])]
        return f"{self.kind.value}({', '.join(parts)})" if parts else self.kind.value


class TermKind(StrEnum):
    NUMBER = "number"
    LOSS_SUM = "sum"  # the sum of per-token (or per-sample) losses of this micro-batch here
    COUNT = "count"
    SIZE = "size"  # |group|
    SIZE_ROOT = "size_root"  # the square root of |group|: |group| ^ 0.5
    MICROBATCHES = "microbatches"
    LOSS_SCALE = "loss_scale"  # the loss-scale factor of mixed-precision training (any S > 0)


@node
class Term:
    kind: TermKind
    number: Fraction = Fraction(1)
    count: Count | None = None
    group: Group | None = None

    def label(self) -> str:
        if self.kind is TermKind.NUMBER:
            return str(self.number)
        if self.kind is TermKind.COUNT:
            assert self.count is not None
            return self.count.label()
        if self.kind is TermKind.SIZE:
            assert self.group is not None
            return f"|{self.group.label()}|"
        if self.kind is TermKind.SIZE_ROOT:
            assert self.group is not None
            return f"|{self.group.label()}| ^ 0.5"
        return self.kind.value


@node
class Monomial:
    """A product of terms with integer exponents, e.g. ``sum * |cp| / tokens(dp, step)``; a
    half-whole power of a size is a whole power of its square root (``|dp| ^ 1.5`` is
    (SIZE_ROOT dp, 3))."""

    factors: tuple[tuple[Term, int], ...]
    text: str
    span: Span | None = None

    def evaluate(self, *, one: Any, number: Callable[[Fraction], Any], microbatches: Any,
                 size: Callable[[Group], Any], count: Callable[[Count], Any],
                 loss_scale: Any, root: Callable[[Group], Any]) -> Any:
        """The product of the terms other than the loss, in whatever number domain the
        callbacks give (exact numbers, solver terms): ``one`` times each term to its power;
        ``root`` gives the square root of a group's size."""
        value = one
        for term, exponent in self.factors:
            if term.kind is TermKind.LOSS_SUM:
                continue
            if term.kind is TermKind.NUMBER:
                x = number(term.number)
            elif term.kind is TermKind.MICROBATCHES:
                x = microbatches
            elif term.kind is TermKind.LOSS_SCALE:
                x = loss_scale
            elif term.kind is TermKind.SIZE:
                assert term.group is not None
                x = size(term.group)
            elif term.kind is TermKind.SIZE_ROOT:
                assert term.group is not None
                x = root(term.group)
            else:
                assert term.count is not None
                x = count(term.count)
            for _ in range(abs(exponent)):
                value = value * x if exponent > 0 else value / x
        return value

    def exponent(self, kind: TermKind) -> int:
        return sum(e for t, e in self.factors if t.kind is kind)


class TargetKind(StrEnum):
    GRADS = "grads"
    PARAMS = "params"
    OPTIMIZER = "optimizer"
    TOKENS = "tokens"
    OVERFLOW = "overflow"
    ACTIVATIONS = "activations"


@node
class Target:
    kind: TargetKind
    groups: frozenset[ParamGroup] | None = None  # None: every parameter group
    span: Span | None = None

    def applies_to(self, group: ParamGroup) -> bool:
        return self.groups is None or group in self.groups

    def label(self) -> str:
        if self.groups is None:
            return self.kind.value
        return f"{self.kind.value}[{', '.join(sorted(g.value for g in self.groups))}]"


class CollectiveKind(StrEnum):
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    BROADCAST = "broadcast"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"


class ReduceOp(StrEnum):
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"


class NormKind(StrEnum):
    """The p of the norm a clip computes: 2 (the square root of the sum of squares) or inf (the
    largest absolute element)."""

    L2 = "2"
    INF = "inf"


DEFAULT_NORM_REDUCE = {NormKind.L2: ReduceOp.SUM, NormKind.INF: ReduceOp.MAX}


class Order(StrEnum):
    FIXED = "fixed"  # every rank reduces in the same order (ring / tree all-reduce)
    RANK_DEPENDENT = "rank_dependent"  # each rank sums in its own order


class Region(StrEnum):
    REPLICATED = "replicated"  # dropout on activations replicated over the group
    SHARDED = "sharded"  # dropout on activations sharded over the group


@node
class LossGather:
    """``all_gather(differentiable | detached) embeddings over G`` (or ``all_reduce(sum, ...)``)
    before a backward: the loss is computed on every rank of G from the whole group's embeddings
    (or a statistic summed over them). ``differentiable``: the collective's backward sums every
    rank's gradient for a slice into the rank that owns it (``torch.distributed.nn``);
    detached: only the rank's own slot carries gradient. What that does to the gradient is
    :mod:`placeverify.semantics.gather`."""

    kind: CollectiveKind  # ALL_GATHER or ALL_REDUCE
    differentiable: bool
    group: Group
    span: Span

    def label(self) -> str:
        mode = "differentiable" if self.differentiable else "detached"
        opts = f"sum, {mode}" if self.kind is CollectiveKind.ALL_REDUCE else mode
        return f"{self.kind.value}({opts}) embeddings over {self.group.label()}"


@node
class Backward:
    """``backward L``: one micro-batch's loss back-propagated; ``term`` names the loss term it
    computes ("" for the main loss), ``reaches`` the parameter groups that term's gradient reaches
    (None: every group; a group outside it gets nothing from this backward); ``gather`` the
    collective inside the loss before it, if any (``loss`` is the expression as written)."""

    loss: Monomial
    span: Span
    term: str = ""
    reaches: frozenset[ParamGroup] | None = None
    gather: LossGather | None = None

    def adds_to(self, group: ParamGroup) -> bool:
        return self.reaches is None or group in self.reaches


@node
class Collective:
    kind: CollectiveKind
    op: ReduceOp | None
    target: Target
    group: Group
    span: Span
    accumulate: bool = False  # reduce_scatter(sum, accumulate): shard += instead of shard =
    order: Order = Order.FIXED
    source: str = OWNER  # broadcast: OWNER (each shard from its owner) or a rank index
    # ``only = used``: the groups no rank of the group used in the current micro-batch are left
    # as they are (DDP's find_unused_parameters reducer, placeverify.semantics.participation)
    only_used: bool = False
    # all_reduce(sum, async): started here, completed at its 'wait' (placeverify.semantics.asynchrony)
    asynchronous: bool = False

    @property
    def from_owner(self) -> bool:
        """A broadcast that sends each shard from the rank that owns it (``from = owner``)."""
        return self.source == OWNER

    def label(self) -> str:
        opts = [o for o in (self.op.value if self.op else None,
                            "accumulate" if self.accumulate else None,
                            "async" if self.asynchronous else None,
                            "order = rank_dependent" if self.order is Order.RANK_DEPENDENT else None,
                            f"from = {self.source}" if self.kind is CollectiveKind.BROADCAST else None,
                            "only = used" if self.only_used else None)
                if o]
        call = f"{self.kind.value}({', '.join(opts)})" if opts else self.kind.value
        return f"{call} {self.target.label()} over {self.group.label()}"


@node
class Scale:
    target: Target
    factor: Monomial
    span: Span


@node
class Clip:
    max_norm: Fraction
    group: Group  # the squared norm is summed over this group
    replicated_once: bool  # replicated elements counted once (True) or on every rank (False)
    span: Span
    target: Target = Target(TargetKind.GRADS)  # the gradients whose joint norm is clipped
    norm: NormKind = NormKind.L2
    # How ranks combine their parts over ``group`` (placeverify.semantics.norms): SUM all-reduces
    # each rank's squared 2-norm (or its inf norm), MEAN and MAX its norm itself.
    reduce: ReduceOp = ReduceOp.SUM
    # The groups whose gradients the norm is computed over (``norm_of = [dense, ...]``); None:
    # the groups the clip scales.
    measured: frozenset[ParamGroup] | None = None

    def measures(self, group: ParamGroup) -> bool:
        return self.target.applies_to(group) if self.measured is None else group in self.measured

    def options(self) -> list[str]:
        """The norm options that differ from the 2-norm's sum of squares over the clipped
        gradients, as written."""
        out = [f"norm = {self.norm.value}"] if self.norm is not NormKind.L2 else []
        if self.reduce is not DEFAULT_NORM_REDUCE[self.norm]:
            out.append(f"reduce = {self.reduce.value}")
        if self.measured is not None:
            names = [g.value for g in ParamGroup if g in self.measured]
            out.append(f"norm_of = [{', '.join(names)}]")
        return out


@node
class Update:
    """``update params``: the optimizer step on every trained group. The target as written is
    kept for :mod:`placeverify.verify.checks.frozen` (``update params[dense]`` on a frozen
    group is refuted there); the trained groups are updated whatever it selects.
    ``unless_overflow`` (``update params unless overflow``): every rank skips the step when its
    view of the overflow flag is set (:mod:`placeverify.semantics.skip`), as dynamic loss
    scaling does without saying so."""

    span: Span
    target: Target | None = None
    unless_overflow: bool = False


@node
class Free:
    """``free grads`` drops the full gradient buffer; ``zero grads`` (``zero``) is the optimizer's
    zero_grad: the full buffer and the accumulated shard both start again from zero (what several
    consecutive steps carry, :mod:`placeverify.semantics.steps`)."""

    target: Target
    span: Span
    zero: bool = False


@node
class Seed:
    region: Region
    same: bool  # same seed across the group (True) or one per rank (False)
    group: Group
    span: Span


@node
class Wait:
    """``wait grads``: the asynchronous collectives in flight on the target complete here. Kept
    apart from the statements (:attr:`Step.waits`, :mod:`placeverify.semantics.asynchrony`): a
    step's ``ops`` are the step as if every collective completed where it starts."""

    target: Target
    span: Span
    phase: str  # "pre", "loop" or "post"
    index: int  # the statements of its block before it
    microbatch: int | None = None  # in the loop: None on every micro-batch, k on micro-batch k


Op = Backward | Collective | Scale | Clip | Update | Free


@node
class LoopOp:
    op: Op
    microbatch: int | None = None  # None: every micro-batch; k: only micro-batch k (0-based)


@node
class Step:
    microbatches: int
    pre: tuple[Op, ...]
    loop: tuple[LoopOp, ...]
    post: tuple[Op, ...]
    seeds: tuple[Seed, ...]
    canonical: bool  # derived from the placement rather than written in the file
    span: Span | None = None
    # one participation pattern (placeverify.semantics.participation): per parameter group, the
    # micro-batches that no rank uses it in; () for the files that declare no 'unused' groups
    idle: tuple[tuple[ParamGroup, frozenset[int]], ...] = ()
    waits: tuple[Wait, ...] = ()  # where asynchronous collectives complete (in written order)
    # State across steps (placeverify.semantics.steps): the accumulation window of each of k
    # consecutive optimizer steps, ``microbatches = [4, 4, 2]`` (empty: one step of
    # ``microbatches``), and the positions in ``loop`` of the ops written 'on microbatch last'
    # (the last micro-batch of each step's own window).
    windows: tuple[int, ...] = ()
    last_ops: tuple[int, ...] = ()
    # the micro-batches that hold no tokens on any rank (placeverify.semantics.empty); a
    # micro-batch without tokens uses no parameter group, so it is idle for every group
    empty: frozenset[int] = frozenset()

    def idle_in(self, group: ParamGroup) -> frozenset[int]:
        """The micro-batches that leave ``group`` unused on every rank in this pattern (an
        empty micro-batch leaves every group unused)."""
        for g, ks in self.idle:
            if g is group:
                return ks | self.empty
        return self.empty

    def ops(self) -> tuple[Op, ...]:
        return (*self.pre, *(lo.op for lo in self.loop), *self.post)

    def backward(self) -> Backward:
        for lo in self.loop:
            if isinstance(lo.op, Backward):
                return lo.op
        raise AssertionError("lowering guarantees one backward")
