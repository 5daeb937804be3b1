"""One rank executing the step IR, statement by statement, on real tensors.

The semantics is that of :mod:`placeverify.semantics.interpreter` (its docstring is the
specification); here each parameter group's gradient is a real flat buffer of this rank's local
parameters (their concatenation in spec order), not one rational:

- ``backward L``: forward and backward of one micro-batch through this rank's pipeline stage
  (activations and their gradients travel by send/recv), with the loss ``factor(L) * sum``; the
  parameters' gradients are added (``+=``) to the full buffers, and ``grads`` denotes the full
  buffers again. Counts in ``L`` are all-reduced over their axes' process groups, for real;
- ``all_reduce(op) grads[g] over G``: a real all-reduce of the denoted buffer over G's process
  group (``order = fixed``: ``torch.distributed.all_reduce``; ``rank_dependent``: an all-gather,
  then each rank sums starting from its own index); ``mean`` divides the sum by |G|;
- ``reduce_scatter(op[, accumulate]) grads[g] over G``: reduce the full buffer (zero-padded to a
  multiple of |G|) and keep this rank's 1/|G| slice as the shard (assigned, or added to the
  previous shard); ``grads`` denotes the shard until the next backward;
- ``all_gather grads``: the shards of the group, concatenated, become the full buffer;
- ``scale``, ``free``, ``clip`` (squared norms summed over the group's process group, elements
  that ranks hold as copies counted once or on every rank), ``all_reduce(max) overflow``;
- ``update params``: SGD with momentum (:mod:`placeverify.replay.reference` for the constants)
  on this rank's optimizer slice — all of the group, or its 1/n along the data axes where the
  optimizer state is sharded (ZeRO, Rajbhandari et al. 2020) — reading the denoted gradient there
  (the shard where the gradient was reduce-scattered, the full buffer elsewhere); under dynamic
  loss scaling, or ``unless overflow``, the step is skipped when the rank's view of the overflow
  flag is set (:mod:`placeverify.semantics.skip`: the flag or its own check, the flag alone after
  a broadcast it decides on); a step without ``update params`` leaves the parameters as they are;
- ``all_gather params`` / ``broadcast params``: each element from the rank of the group that owns
  it in the optimizer layout (or all from one rank); parameters sharded and gathered before use
  (S*, offloaded) are gathered from their owners at the end of every step.

Token all-reduces, token all-to-alls and activation send/recv are already part of the model's
forward and backward; as statements they do nothing more.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import torch
import torch.distributed as dist

from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role
from placeverify.ir.relations import Relation
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    Count,
    CountKind,
    Free,
    Monomial,
    NormKind,
    Op,
    ReduceOp,
    Scale,
    Scope,
    TargetKind,
    TermKind,
    Update,
)
from placeverify.ir.strategy import Strategy
from placeverify.replay import comm
from placeverify.replay.batch import overflow_step
from placeverify.replay.buffers import Buffers
from placeverify.replay.collectives import RankCollectives
from placeverify.replay.data import layer_seed, loss_weights, make_atom
from placeverify.replay.layout import Unsupported, gathered_axes
from placeverify.replay.reference import LEARNING_RATE, MOMENTUM, NORM_EPS
from placeverify.roles.relations import relation
from placeverify.semantics.interpreter import LOSS_SCALE
from placeverify.semantics.participation import idle_at
from placeverify.semantics.schedule import events
from placeverify.semantics.surd import Real, sqrt_of


class RankRun(RankCollectives):
    """One rank running the step: the micro-batch loop and every statement of the step IR."""

    # ---- training ------------------------------------------------------------------------------

    def train(self, steps: int) -> None:
        self.total_steps = steps
        for t in range(steps):
            self.step_index = t
            self.progress(f"step {t + 1}/{steps}")
            self.run_step(t)
        pending = getattr(self, "pending", None)
        if pending is not None:  # a parameter gather still in flight completes before the end
            for op in pending.complete(None):
                self.collective(op, self.s.microbatches - 1)

    def run_step(self, t: int) -> None:
        # one of several consecutive steps (semantics/steps.py) starts from what the previous one
        # left: only 'zero grads' empties the buffers; a single step starts from empty ones
        carried = bool(self.strategy.step.windows) and t > 0
        for buf in self.buffers.values() if not carried else ():
            buf.full = self._zeros(buf.numel)
            buf.shard, buf.shard_at, buf.sharded, buf.scattered = None, None, False, set()
        self.overflow, self.flag_alone = False, False
        self.counts = self._counts()
        from placeverify.semantics.param_flights import has_param_flights

        if has_param_flights(self.strategy.step):  # a gather overlapped with the next forward
            self._run_param_flights(t)
        else:
            for event in events(self.strategy.step, self.s.microbatches):
                assert isinstance(event.k, int)
                self.apply(event.op, t, event.k)
        for buf in self.buffers.values():
            gathered = gathered_axes(self.strategy, buf.group)  # per-group meshes: its own
            if gathered:
                self.gather_params(buf, Group(tuple(a for a in self.grid.names if a in gathered)),
                                   "owner")

    def _run_param_flights(self, t: int) -> None:
        """The step with its parameter gathers completed at their waits (replay/param_flights)."""
        from placeverify.ir.step import Wait
        from placeverify.replay.param_flights import Pending, param_events

        if getattr(self, "pending", None) is None:
            self.pending = Pending()
        for item, k in param_events(self.strategy.step):
            if isinstance(item, Wait):
                for op in self.pending.complete(item):
                    self.collective(op, k)
            elif isinstance(item, Collective) and item.asynchronous:
                self.pending.start(item)
            else:
                self.apply(item, t, k)

    def apply(self, op: Op, t: int, k: int) -> None:
        if isinstance(op, Backward):
            self.backward(op, t, k)
        elif isinstance(op, Collective):
            if op.asynchronous:  # the replay runs an outcome (semantics.asynchrony.replayed)
                raise Unsupported(f"line {op.span.line}: '{op.label()}' reached the replay "
                                  "without its outcome")
            self.collective(op, k)
        elif isinstance(op, Scale):
            factor = float(self.factor(op.factor, k))
            for buf in self.targeted(op.target.applies_to):
                buf.set_denoted(buf.denoted() * factor)
        elif isinstance(op, Free):
            for buf in self.targeted(op.target.applies_to):
                buf.full = self._zeros(buf.numel)
                if op.zero and buf.shard is not None:  # zero grads: the shard too
                    buf.shard = torch.zeros_like(buf.shard)
        elif isinstance(op, Clip):
            self.clip(op)
        elif isinstance(op, Update):
            self.update()
        else:
            raise Unsupported(f"statement {type(op).__name__} is not replayed")

    # ---- counts and loss factors ----------------------------------------------------------------

    def _counts(self) -> dict[tuple[Count, int], int]:
        """Every count the step's expressions name, all-reduced over its axes, per micro-batch."""
        wanted: list[Count] = []
        for op in self.strategy.step.ops():
            monomial = op.loss if isinstance(op, Backward) else op.factor if isinstance(op, Scale) \
                else None
            if monomial is None:
                continue
            for term, _ in monomial.factors:
                if term.kind is TermKind.COUNT and term.count is not None and term.count not in wanted:
                    wanted.append(term.count)
        m = self.s.microbatches
        b = tuple(self.coords[a] for a in self.layout.batch)
        out: dict[tuple[Count, int], int] = {}
        for count in wanted:
            table = self.s.tokens if count.kind is CountKind.TOKENS else self.s.samples
            local = [table[(b, k)] for k in range(m)]
            if count.scope is not Scope.MICROBATCH:
                local = [sum(local)] * m
            values = torch.tensor(local, dtype=torch.int64, device=self.device)
            handle = self.handle(Group(tuple(a for a in self.grid.names if a in count.axes)))
            comm.all_reduce(values, handle)
            earlier, times = 0, 1
            if count.scope is Scope.RUN:  # never reset: every step replayed so far counts too
                earlier = self.run_totals.get(count, 0)
                self.run_totals[count] = earlier + int(values[0])
            elif count.scope is Scope.BATCH:  # the steps replayed, one batch: each holds the
                times = self.total_steps      # same tokens, so the batch holds this many times
            for k, v in enumerate(values.tolist()):
                out[(count, k)] = earlier + times * int(v)
        return out

    def factor(self, monomial: Monomial, k: int) -> Real:
        """A loss or scale factor, exactly (square roots of sizes as :mod:`semantics.surd`
        numbers); the caller rounds it to the run's float once."""
        def size(group: Group) -> int:
            return group.size_of({a: self.grid.size(a) for a in group.axes})

        value: Real = monomial.evaluate(
            one=Fraction(1), number=Fraction, microbatches=Fraction(self.s.microbatches),
            size=lambda group: Fraction(size(group)),
            count=lambda c: Fraction(self.counts[(c, k)]), loss_scale=LOSS_SCALE,
            root=lambda group: sqrt_of(size(group)))
        return value

    # ---- backward: one micro-batch through the pipeline ----------------------------------------

    def backward(self, op: Backward, t: int, k: int) -> None:
        s, model, layout = self.s, self.model, self.layout
        b = tuple(self.coords[a] for a in layout.batch)
        atom = make_atom(s.config, s.seed, t, b, k, s.samples[(b, k)], s.tokens[(b, k)], s.dtype)
        stage = model.stage
        shape = (atom.samples, model.local_positions, s.config.hidden)
        prev = self._neighbour(stage - 1) if not model.first else None
        nxt = self._neighbour(stage + 1) if not model.last else None
        if model.first:
            x = model.embed(atom)
        else:
            x = torch.empty(shape, dtype=self.dtype, device=self.device)
            dist.recv(x, src=prev)
            x.requires_grad_(True)

        def seed_layer(i: int) -> None:
            torch.manual_seed(layer_seed(s.seed, t, k, model.dropout.stream_layer(i, self.coords)))

        h = model.layers(x, seed_layer)
        if model.last:
            losses = model.head(h, atom.labels)
            strategy = self.strategy
            if op.term or strategy.terms:  # one of several loss terms (replay/terms.py)
                from placeverify.replay.terms import index_of, term_loss, term_view

                view = term_view(strategy, op.term)
                assert view is not None
                losses = term_loss(losses, index_of(strategy, op.term))
                strategy = replace(strategy, config=replace(strategy.config, loss=view.loss))
            weights = loss_weights(strategy, atom, s.config).to(self.device)
            part = (losses * weights).sum()
            if op.gather is not None:  # a collective inside the loss, run for real
                from placeverify.replay.gather import group_loss

                part = group_loss(part, op.gather, self.handle(op.gather.group))
            try:
                factor = float(self.factor(op.loss, k))
            except ZeroDivisionError:  # a micro-batch without tokens: its count is 0, 0/0 is
                factor = float("nan")  # NaN, as the model's mean loss there (semantics/empty)
            total = part * (factor * self.alpha)
            total.backward()
        else:
            dist.send(h.detach().contiguous(), dst=nxt)
            grad = torch.empty_like(h)
            dist.recv(grad, src=nxt)
            h.backward(grad)
        if not model.first:
            assert x.grad is not None
            dist.send(x.grad.contiguous(), dst=prev)
        for buf in self.buffers.values():
            if buf.specs and op.adds_to(buf.group) and not idle_at(
                    self.strategy.step.idle_in(buf.group) - self.strategy.step.empty, k):
                # a micro-batch without tokens adds what it computed: 0, or NaN (semantics/empty)
                # a loss term reaching other groups adds 0, and so does a group this micro-batch
                # leaves unused (semantics/participation: the replay realises the pattern)
                grad = torch.cat([_grad(self.params[sp.name]) for sp in buf.specs])
                weight = s.grad_weights.get(buf.group)  # Setup.grad_weights: inf-norm clips
                buf.full = buf.full + (grad if weight is None else grad * weight)
            for sp in buf.specs:
                self.params[sp.name].grad = None
            buf.sharded = False
        if (s.skips and t == overflow_step(self.total_steps) and k == 0
                and self.grid.rank == self._injected_rank()):
            self._inject_overflow()

    def _neighbour(self, stage: int) -> int:
        coords = dict(self.coords)
        assert self.layout.pp is not None
        coords[self.layout.pp] = stage
        return self.grid.rank_of(coords)

    def _injected_rank(self) -> int:
        """Rank 0; with the skip decided on a broadcast flag, the last rank, which is no
        broadcast's source (unless one broadcasts from its group's last member)."""
        from placeverify.semantics.skip import flag_broadcasts

        sizes = {a: self.grid.size(a) for a in self.grid.names}
        sources = flag_broadcasts(self.strategy.step)
        if sources and all(int(op.source) != op.group.size_of(sizes) - 1 for op in sources):
            return self.grid.world - 1
        return 0

    def _inject_overflow(self) -> None:
        """A skip on the overflow flag only matters when a gradient overflows: make one do so on
        one rank in step :func:`~placeverify.replay.batch.overflow_step` (the reference skips
        it). On the last rank (a skip decided on a broadcast flag) it is the buffer's last
        element, which a reduce-scatter leaves in that rank's own shard: at element 0 it would
        land in the broadcast's source's shard, whose own check then sets the flag every rank
        takes, and no run could differ. The buffer is the group whose gradient reductions reach
        the fewest ranks: a tied embedding's is reduced over the pipeline's ends too, so an
        overflow there reaches every stage's check, and a step that skips on each rank's own
        check could not differ."""
        last = self.grid.rank == self.grid.world - 1 and self.grid.world > 1
        held = [buf for buf in self.buffers.values() if buf.numel]
        if held:
            buf = min(held, key=lambda b: self._gradient_reach(b.group))  # the first of the least
            buf.full = buf.full.clone()
            buf.full[-1 if last else 0] = float("inf")

    def _gradient_reach(self, group: ParamGroup) -> int:
        """How many ranks the step's reductions of ``group``'s gradients span together (an axis
        only some reduction takes whole counts whole; one only ``ends(...)`` takes counts 2)."""
        reductions = [op.group for op in self.strategy.step.ops()
                      if isinstance(op, Collective) and op.target.kind is TargetKind.GRADS
                      and op.op is not None and op.target.applies_to(group)]
        axes = {a for g in reductions for a in g.axes}
        whole = {a for g in reductions for a in g.axes if g.covers(a)}
        sizes = {a: self.grid.size(a) for a in self.grid.names}
        return int(Group(tuple(sorted(axes)), frozenset(axes - whole)).size_of(sizes))

    # ---- clipping, overflow, update --------------------------------------------------------------

    def _replica(self, buf: Buffers, axis: str) -> bool:
        """Do the ranks along ``axis`` hold copies of the same elements of this group?"""
        if buf.sharded and axis in buf.scattered:
            return False
        return relation(self.strategy, buf.group, axis) is not Relation.OWNED

    def clip(self, op: Clip) -> None:
        """:mod:`placeverify.semantics.norms` on real gradients: this rank's squared 2-norm (or
        inf norm) over the elements of the measured groups it counts, all-reduced over the
        clip's group as ``reduce`` says (the squares or inf norms summed; the per-rank norms
        averaged or maxed); the targeted groups are scaled."""
        handle = self.handle(op.group)
        total = torch.zeros(1, dtype=self.dtype, device=self.device)
        clipped = self.targeted(op.target.applies_to)
        l2 = op.norm is NormKind.L2
        for buf in self.targeted(op.measures):
            counted = op.replicated_once is False or all(
                self.coords[a] == 0 for a in op.group.axes
                if self.grid.size(a) > 1 and self._replica(buf, a))
            if counted and buf.numel:
                value = buf.denoted()
                total = total + (value * value).sum() if l2 else \
                    torch.maximum(total, value.abs().max().reshape(1))
        if l2 and op.reduce is not ReduceOp.SUM:
            total = torch.sqrt(total)  # the per-rank norm is what is reduced
        comm.all_reduce(total, handle, "max" if op.reduce is ReduceOp.MAX else "sum")
        if op.reduce is ReduceOp.MEAN:
            total = total / (handle.size if handle is not None else 1)
        norm = float((torch.sqrt(total) if l2 and op.reduce is ReduceOp.SUM else total).item())
        coef = min(1.0, float(op.max_norm) / (norm + NORM_EPS))
        for buf in clipped:
            buf.set_denoted(buf.denoted() * coef)

    def update(self) -> None:
        # placeverify.semantics.skip: the rank's view of the flag, or the flag alone after a
        # broadcast it decides on; a step without 'update params' never gets here
        view = self.overflow if self.flag_alone else \
            (self.overflow or self._local_overflow(denoted=False))
        if self.s.skips and view:
            self.skipped.append(self.step_index)
            return
        for buf in self.buffers.values():
            if not buf.numel:
                continue
            start, stop = buf.opt
            grad = buf.consumed()[start:stop]
            buf.momentum = buf.momentum * MOMENTUM + grad
            flat = self.flat_params(buf).clone()
            flat[start:stop] = flat[start:stop] - LEARNING_RATE * buf.momentum
            self.write_params(buf, flat)

def groups_needed(strategy: Strategy) -> list[Group]:
    """Every group a run communicates over: the step's statements and counts, the model's
    tensor, context and expert axes, and the gather of parameters sharded before use."""
    names = strategy.mesh.names

    def ordered(axes: tuple[str, ...]) -> Group:
        return Group(tuple(a for a in names if a in axes))

    out: list[Group] = []
    for op in strategy.step.ops():
        if isinstance(op, Collective | Clip):
            out.append(op.group)
        if isinstance(op, Backward) and op.gather is not None:
            out.append(op.gather.group)
        monomial = op.loss if isinstance(op, Backward) else op.factor if isinstance(op, Scale) \
            else None
        if monomial is not None:
            out += [ordered(t.count.axes) for t, _ in monomial.factors if t.count is not None]
    for p in strategy.placements:
        if p.role is not Role.DATA and strategy.size(p.axis) > 1:
            out.append(ordered((p.axis,)))
    gathered = gathered_axes(strategy)
    if gathered:
        out.append(ordered(gathered))
    for group in strategy.model.groups_present():  # per-group meshes: each group's own gather
        own = gathered_axes(strategy, group)
        if own and ordered(own) not in out:
            out.append(ordered(own))
    return out


def _grad(p: torch.Tensor) -> torch.Tensor:
    return p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype,
                                                                     device=p.device)
