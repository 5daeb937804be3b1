"""Lower ``step { ... }`` into the pre / loop / post operations of :class:`Step`.

A written step says which collectives run where; the checks compare it with what the placement
needs. Its operations and expressions are read by :class:`placeverify.lower.step_ops.OpReader`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from placeverify.diagnostics import Code, Span, did_you_mean
from placeverify.ir.flights import flight_errors
from placeverify.ir.presets import MAX_MICROBATCHES, MAX_STEPS
from placeverify.ir.step import (
    Backward,
    Collective,
    Free,
    LoopOp,
    LossGather,
    Op,
    Scale,
    Scope,
    Seed,
    Step,
    TargetKind,
    Update,
    Wait,
)
from placeverify.ir.strategy import Config
from placeverify.lower.gather import is_loss_gather, read_loss_gather, unused_gather, with_gather
from placeverify.lower.settings import check_microbatches
from placeverify.lower.step_ops import OpReader
from placeverify.lower.values import Context
from placeverify.roles.queries import region_named
from placeverify.syntax import ast


def is_wait(item: ast.StepItem) -> bool:
    return isinstance(item, ast.OpStmt) and item.name.text == "wait"


def waits_params(item: ast.StepItem) -> bool:
    """``wait params``: completes an asynchronous parameter gather (it may stand before the
    forward it guards)."""
    return isinstance(item, ast.OpStmt) and item.target.name.text in ("params", "parameters")


def lower_step(ctx: Context, stmt: ast.StepStmt, config: Config) -> Step:
    """The step a file writes, read against its configuration."""
    return StepLowerer(ctx, config).run(stmt)


@dataclass
class _Reading:
    """What :meth:`StepLowerer.run` has read of a step block so far."""

    pre: list[Op] = field(default_factory=list)
    loop: list[LoopOp] = field(default_factory=list)
    post: list[Op] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)  # index: the block's statements before it
    # (loop: resolved by resolve_loop)
    seeds: list[Seed] = field(default_factory=list)
    backward_seen: bool = False
    terms_seen: set[str] = field(default_factory=set)
    deferred_on: list[ast.OnMicrobatch] = field(default_factory=list)
    top_gather: LossGather | None = None  # a collective of embeddings (lower/gather.py)
    top_gather_used: bool = False


class StepLowerer(OpReader):
    """Lowers ``step { ... }``; keeps the micro-batch count the step declares."""

    def __init__(self, ctx: Context, config: Config) -> None:
        super().__init__(ctx, config)
        self.microbatches: int = config.microbatches
        self.microbatches_span: Span | None = None
        self.windows: tuple[int, ...] = ()  # microbatches = [4, 4, 2]: one optimizer step each

    def run(self, stmt: ast.StepStmt) -> Step:
        r = _Reading()
        for item in stmt.items:
            self.read_item(r, item)
        if not r.top_gather_used:
            unused_gather(self.ctx, r.top_gather)
        if not r.backward_seen:
            self.error("the step has no 'backward' (the loss each micro-batch back-propagates, "
                       "e.g. 'backward sum / tokens(dp, step)')", Code.MISSING, stmt.span)
        resolved, last_ops, placed = self.resolve_loop(r)
        # a step without 'update params' lowers: its parameters never change, which the
        # integrity check refutes at the step (placeverify.verify.checks.coefficients)
        updates = [op for op in r.post if isinstance(op, Update)]
        for extra in updates[1:]:
            self.error("a step updates the parameters once", Code.DUPLICATE, extra.span)
        placed += [w for w in r.waits if w.phase == "post"]
        if self.run_counts and len(self.windows) < 2:
            self.error("a count over the run ('run') or the batch ('batch') spans several "
                       "optimizer steps, but this step verifies one", Code.BAD_VALUE,
                       self.run_counts[0],
                       "write the steps' windows as 'microbatches = [4, 4]' (state across steps)")
        placed += [w for w in r.waits if w.phase == "pre"]  # 'wait params' before the forward
        step = Step(self.microbatches, tuple(r.pre), tuple(resolved), tuple(r.post),
                    tuple(r.seeds), False, stmt.span, waits=tuple(placed), windows=self.windows,
                    last_ops=tuple(last_ops))
        if r.backward_seen:
            for message, code, span in flight_errors(step):
                self.error(message, code, span)
        return step

    def read_item(self, r: _Reading, item: ast.StepItem) -> None:
        """One statement of the step block, in its phase: before, inside or after the loop."""
        if isinstance(item, ast.MicrobatchesStmt):
            self.set_microbatches(item)
        elif is_loss_gather(item) and not r.backward_seen:
            assert isinstance(item, ast.OpStmt)
            if r.top_gather is not None and not r.top_gather_used:
                unused_gather(self.ctx, r.top_gather)
            r.top_gather, r.top_gather_used = read_loss_gather(self.ctx, item, self.config), False
        elif isinstance(item, ast.BackwardStmt):
            r.backward_seen = True
            backward = self.backward(item, r.terms_seen)
            r.top_gather_used = True
            if backward is not None:
                r.loop.append(LoopOp(with_gather(backward, r.top_gather)))
        elif isinstance(item, ast.EachMicrobatch):
            self.read_each_microbatch(r, item)
        elif isinstance(item, ast.OnMicrobatch):
            r.deferred_on.append(item)
            r.loop.append(LoopOp(Update(item.span), -1))  # placeholder keeps textual order
        elif isinstance(item, ast.SeedStmt):
            seed = self.seed(item)
            if seed is not None:
                self.check_seed_conflict(seed, r.seeds)
                r.seeds.append(seed)
        elif is_wait(item) and r.backward_seen:
            assert isinstance(item, ast.OpStmt)
            wait = self.wait(item, "post", len(r.post), None)
            if wait is not None:
                r.waits.append(wait)
        elif is_wait(item) and waits_params(item):
            # 'wait params' before the forward: completes the parameter gather the step
            # before started (placeverify.semantics.param_flights)
            assert isinstance(item, ast.OpStmt)
            wait = self.wait(item, "pre", len(r.pre), None)
            if wait is not None:
                r.waits.append(wait)
        else:
            op = self.op(item)
            if op is None:
                return
            if r.backward_seen:
                self.check_post_scale(op)
                r.post.append(op)
            else:
                if not ((isinstance(op, Collective) and op.target.kind is TargetKind.TOKENS)
                        or (isinstance(op, Free) and op.zero)):
                    self.error("this runs before 'backward'; only token counts are reduced "
                               "(and 'zero grads' run) before the micro-batch loop",
                               Code.BAD_VALUE, item.span)
                r.pre.append(op)

    def read_each_microbatch(self, r: _Reading, item: ast.EachMicrobatch) -> None:
        """``each microbatch { ... }``: the loop's operations, its waits and its backward."""
        gather: LossGather | None = None
        gather_used = False
        for inner in item.items:
            if is_loss_gather(inner):
                assert isinstance(inner, ast.OpStmt)
                if gather is not None and not gather_used:
                    unused_gather(self.ctx, gather)
                gather, gather_used = read_loss_gather(self.ctx, inner, self.config), False
            elif isinstance(inner, ast.BackwardStmt):
                r.backward_seen = True
                backward = self.backward(inner, r.terms_seen)
                gather_used = True
                if backward is not None:
                    r.loop.append(LoopOp(with_gather(backward, gather)))
            elif is_wait(inner):
                assert isinstance(inner, ast.OpStmt)
                wait = self.wait(inner, "loop", len(r.loop), None)
                if wait is not None:
                    r.waits.append(wait)
                    r.loop.append(LoopOp(Update(inner.span), -2))  # its place, resolved below
            else:
                op = self.inner_op(inner)
                if op is not None:
                    r.loop.append(LoopOp(op))
        if not gather_used:
            unused_gather(self.ctx, gather)

    def resolve_loop(self, r: _Reading) -> tuple[list[LoopOp], list[int], list[Wait]]:
        """The loop with its 'on microbatch' blocks resolved now that the micro-batch count is
        known, the indices of the operations on the last micro-batch, and the loop's waits at
        their places."""
        resolved: list[LoopOp] = []
        last_ops: list[int] = []
        pending = iter(r.deferred_on)
        in_loop = iter([w for w in r.waits if w.phase == "loop"])
        placed: list[Wait] = []
        for lo in r.loop:
            if lo.microbatch == -2:
                placed.append(replace(next(in_loop), index=len(resolved)))
                continue
            if lo.microbatch == -1:
                self.read_on_microbatch(next(pending), resolved, last_ops, placed)
            else:
                resolved.append(lo)
        return resolved, last_ops, placed

    def read_on_microbatch(self, block: ast.OnMicrobatch, resolved: list[LoopOp],
                           last_ops: list[int], placed: list[Wait]) -> None:
        """``on microbatch N { ... }``: its operations on micro-batch N only."""
        index = self.which(block.which)
        is_last = isinstance(block.which, ast.NameValue) and block.which.name.text == "last"
        for inner in block.items:
            if isinstance(inner, ast.BackwardStmt):
                self.error("'backward' belongs in the step or in 'each microbatch'",
                           Code.BAD_VALUE, inner.span)
                continue
            if is_wait(inner):
                assert isinstance(inner, ast.OpStmt)
                wait = self.wait(inner, "loop", len(resolved), index)
                if wait is not None and index is not None:
                    placed.append(wait)
                continue
            op = self.inner_op(inner)
            if op is not None and index is not None:
                if is_last:
                    last_ops.append(len(resolved))
                resolved.append(LoopOp(op, index))

    def backward(self, item: ast.BackwardStmt, seen: set[str]) -> Backward | None:
        """``backward L`` (the main loss) or ``backward name: L`` (a named loss term): one
        each per step, the term declared by a ``loss name: ...`` statement."""
        name = item.term.text if item.term is not None else ""
        if name in seen:
            self.error("a step has one 'backward'" if not name else
                       f"a step has one 'backward {name}: ...'", Code.DUPLICATE, item.span)
        seen.add(name)
        if not name:
            return self.term_loss(item, None)
        declared = {t.name: t for t in self.config.terms}
        term = declared.get(name)
        if term is None:
            assert item.term is not None
            self.error(f"no loss term '{name}'{did_you_mean(name, list(declared))}",
                       Code.UNKNOWN_NAME, item.term.span,
                       f"declare it beside the main loss, e.g. 'loss {name}: token_mean'")
            return None
        return self.term_loss(item, term)

    def wait(self, item: ast.OpStmt, phase: str, index: int, microbatch: int | None) -> Wait | None:
        """``wait grads[...]``: where the asynchronous collectives in flight on it complete."""
        if item.args:
            self.error("'wait' takes no options", Code.BAD_VALUE, item.args[0].span)
        if item.group is not None:
            self.error("'wait' names the buffer, not a group: 'wait grads'", Code.BAD_VALUE,
                       item.group.span)
        target = self.target(item.target, [TargetKind.GRADS, TargetKind.PARAMS])
        return None if target is None else Wait(target, item.span, phase, index, microbatch)

    def check_seed_conflict(self, seed: Seed, earlier: list[Seed]) -> None:
        """Two statements may not set opposite policies for one dropout region of one axis."""
        for other in earlier:
            if other.same == seed.same:
                continue
            for axis in seed.group.axes:
                if axis not in other.group.axes:
                    continue
                region = region_named(self.config, axis, seed.region)
                if region_named(self.config, axis, other.region) is region:
                    self.error(f"this seed policy contradicts line {other.span.line}: the "
                               f"{region.value} dropout region along {axis} is both "
                               f"{'same' if seed.same else 'differ'} and "
                               f"{'same' if other.same else 'differ'}", Code.CONFLICT, seed.span,
                               *(["on this axis either region word names its one region"]
                                 if seed.region is not other.region else []))
                    return

    def check_post_scale(self, op: Op) -> None:
        """After the loop there is no current micro-batch to count the tokens of."""
        if not isinstance(op, Scale):
            return
        for term, _ in op.factor.factors:
            if term.count is not None and term.count.scope is Scope.MICROBATCH:
                self.error(f"'{term.count.label()}' counts one micro-batch, but this scale runs "
                           f"after the micro-batch loop; write {term.count.kind.value}(..., step)",
                           Code.BAD_VALUE, op.span)

    def set_microbatches(self, item: ast.MicrobatchesStmt) -> None:
        if isinstance(item.value, ast.ListValue):
            self.set_windows(item)
            return
        n = self.ctx.integer(item.value, "microbatches", 1, MAX_MICROBATCHES)
        if n is None:
            return
        if self.microbatches_span is not None:
            self.error("duplicate 'microbatches'", Code.DUPLICATE, item.span)
        check_microbatches(self.ctx, n, item.span, self.config.pipeline, self.config.microbatches)
        self.microbatches = n
        self.microbatches_span = item.span

    def set_windows(self, item: ast.MicrobatchesStmt) -> None:
        """``microbatches = [4, 4, 2]``: k consecutive optimizer steps, each accumulating its
        own window of micro-batches (:mod:`placeverify.semantics.steps`)."""
        assert isinstance(item.value, ast.ListValue)
        if self.microbatches_span is not None:
            self.error("duplicate 'microbatches'", Code.DUPLICATE, item.span)
        if self.config.pipeline is not None:
            self.error("several optimizer steps ('microbatches = [...]') are not modelled with a "
                       "pipeline", Code.BAD_VALUE, item.span,
                       "write one step with 'microbatches = m'")
            return
        values = [self.ctx.integer(v, "a step's micro-batches", 1, MAX_MICROBATCHES)
                  for v in item.value.items]
        if len(values) < 2:
            self.error("a list of micro-batches names one window per optimizer step: give two or "
                       "more, or write 'microbatches = m' for one step", Code.BAD_VALUE,
                       item.value.span)
            return
        if len(values) > MAX_STEPS:
            self.error(f"{len(values)} optimizer steps: at most {MAX_STEPS} are verified together",
                       Code.BAD_VALUE, item.value.span)
            return
        windows = [v for v in values if v is not None]
        if len(windows) != len(values):
            return
        self.windows = tuple(windows)
        self.microbatches = windows[0]
        self.microbatches_span = item.span

    def which(self, value: ast.Value) -> int | None:
        if isinstance(value, ast.NameValue) and value.name.text in ("first", "last"):
            return 0 if value.name.text == "first" else self.microbatches - 1
        index = self.ctx.integer(value, "micro-batch index", 0, MAX_MICROBATCHES)
        largest = max(self.windows, default=self.microbatches)
        if index is not None and index >= largest:
            self.error(f"micro-batch {index} does not exist: the step has {largest} "
                       "(numbered from 0)", Code.BAD_VALUE, value.span)
            return None
        return index

    def inner_op(self, item: ast.StepItem) -> Op | None:
        if isinstance(item, ast.OpStmt):
            op = self.op(item)
            if isinstance(op, Update):
                self.error("'update' runs once per step, after the micro-batch loop",
                           Code.BAD_VALUE, item.span)
                return None
            return op
        if isinstance(item, ast.ScaleStmt):
            return self.op(item)
        self.error("only collectives, 'scale' and 'free' run per micro-batch", Code.BAD_VALUE,
                   item.span)
        return None
