"""Lower the operations of a written step: targets, collectives, clips, seeds and the loss and
scale expressions (monomials over sizes, counts and the loss)."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from placeverify.diagnostics import Code, Source, Span, did_you_mean
from placeverify.ir.collectives import COLLECTIVES, REDUCE_OPS
from placeverify.ir.mesh import Group, Mesh
from placeverify.ir.model import ParamGroup
from placeverify.ir.step import (
    DEFAULT_NORM_REDUCE,
    Backward,
    Clip,
    Collective,
    CollectiveKind,
    Count,
    CountKind,
    Free,
    Monomial,
    NormKind,
    Op,
    Order,
    ReduceOp,
    Region,
    Scale,
    Scope,
    Seed,
    Target,
    TargetKind,
    Term,
    TermKind,
    Update,
)
from placeverify.ir.strategy import Config, LossKind, LossTerm
from placeverify.lower.mesh import read_group
from placeverify.lower.settings import read_norm
from placeverify.lower.values import Context, value_text
from placeverify.syntax import ast

OPS = (*(k.value for k in COLLECTIVES), "update", "free", "clip", "wait", "zero")
TARGETS = {k.value: k for k in TargetKind}
GROUP_NAMES = {g.value: g for g in ParamGroup}
MAX_POWER = 16  # |g| ^ e with |e| above this is a typing mistake (and an unrolled product)


class OpReader:
    """Reads one step's operations and expressions against a configuration."""

    def __init__(self, ctx: Context, config: Config) -> None:
        self.ctx = ctx
        self.config = config
        self.mesh: Mesh = config.mesh
        self.loss_kind: LossKind | None = None  # a named term's while its backward is read
        self.run_counts: list[Span] = []  # where 'tokens(..., run | batch)' is (several steps)

    def error(self, message: str, code: Code, span: Span | None, *notes: str) -> None:
        self.ctx.error(message, code, span, *notes)

    # ---- expressions -------------------------------------------------------------------------

    def loss_expr(self, expr: ast.Expr) -> Monomial | None:
        monomial = self.monomial(expr, allow_loss=True)
        if monomial is None:
            return None
        if monomial.exponent(TermKind.LOSS_SUM) != 1:
            self.error("the loss must contain 'sum' or 'mean' exactly once, multiplied (not "
                       "divided)", Code.BAD_VALUE, expr.span)
            return None
        return monomial

    def term_loss(self, item: ast.BackwardStmt, term: LossTerm | None) -> Backward | None:
        """A backward's loss, ``mean`` counted in the unit of its term's normalisation."""
        self.loss_kind = (term.loss if term is not None else self.config.loss).kind
        try:
            loss = self.loss_expr(item.expr)
        finally:
            self.loss_kind = None
        if loss is None:
            return None
        if term is None:
            return Backward(loss, item.span)
        return Backward(loss, item.span, term.name, term.reaches)

    def monomial(self, expr: ast.Expr, allow_loss: bool) -> Monomial | None:
        factors: list[tuple[Term, int]] = []
        ok = True

        def walk(e: ast.Expr, sign: int) -> None:
            nonlocal ok
            for op, factor in (("*", e.first), *e.rest):
                exponent = sign if op == "*" else -sign
                if isinstance(factor, ast.ParenFactor):
                    walk(factor.expr, exponent)
                    continue
                terms = self.factor(factor, allow_loss)
                if terms is None:
                    ok = False
                    continue
                factors.extend((t, e_ * exponent) for t, e_ in terms)

        walk(expr, 1)
        if not ok:
            return None
        return Monomial(tuple(factors), expr_text(self.ctx.source, expr), expr.span)

    def power(self, factor: ast.PowerFactor) -> list[tuple[Term, int]] | None:
        """``|g| ^ e`` for a whole or half-whole e: |g| to the power e, or its square root to
        the power 2e (a pre- or post-divide by the square root of a group's size)."""
        group = read_group(self.ctx, factor.group, self.mesh)
        exponent = factor.exponent.value
        if (2 * exponent).denominator != 1:
            self.error(f"a size is raised to a whole or half-whole power (|g| ^ 0.5, |g| ^ 2), "
                       f"not {factor.exponent.text}", Code.BAD_VALUE, factor.exponent.span)
            return None
        if abs(exponent) > MAX_POWER:
            self.error(f"the power {factor.exponent.text} is absurdly large (the limit is "
                       f"{MAX_POWER})", Code.BAD_VALUE, factor.exponent.span)
            return None
        if group is None:
            return None
        if exponent.denominator == 1:
            return [(Term(TermKind.SIZE, group=group), int(exponent))] if exponent else []
        return [(Term(TermKind.SIZE_ROOT, group=group), int(2 * exponent))]

    def factor(self, factor: ast.Factor, allow_loss: bool) -> list[tuple[Term, int]] | None:
        loss_kind = self.loss_kind or self.config.loss.kind
        unit = CountKind.SAMPLES if loss_kind.value == "sample_mean" else CountKind.TOKENS
        if isinstance(factor, ast.NumberFactor):
            if factor.value.value <= 0:
                self.error("a scale factor must be positive", Code.BAD_VALUE, factor.span)
                return None
            return [(Term(TermKind.NUMBER, factor.value.value), 1)]
        if isinstance(factor, ast.SizeFactor):
            group = read_group(self.ctx, factor.group, self.mesh)
            return None if group is None else [(Term(TermKind.SIZE, group=group), 1)]
        if isinstance(factor, ast.PowerFactor):
            return self.power(factor)
        if isinstance(factor, ast.NameFactor):
            name = factor.name.text
            if name in ("sum", "mean"):
                if not allow_loss:
                    self.error(f"'{name}' is the loss; a gradient scale cannot contain it",
                               Code.BAD_VALUE, factor.span)
                    return None
                terms = [(Term(TermKind.LOSS_SUM), 1)]
                if name == "mean":
                    terms.append((Term(TermKind.COUNT, count=Count(unit, (), Scope.MICROBATCH)), -1))
                return terms
            if name == "microbatches":
                return [(Term(TermKind.MICROBATCHES), 1)]
            if name == "loss_scale":
                return [(Term(TermKind.LOSS_SCALE), 1)]
            if name in ("tokens", "samples"):
                return [(Term(TermKind.COUNT, count=Count(CountKind(name), (), Scope.MICROBATCH)), 1)]
            names = ["sum", "mean", "tokens", "samples", "microbatches", "loss_scale"]
            self.error(f"unknown name '{name}' in an expression{did_you_mean(name, names)}",
                       Code.UNKNOWN_NAME, factor.span,
                       "write axis sizes as |dp| and counts as tokens(dp, step)")
            return None
        if isinstance(factor, ast.CountFactor):
            name = factor.name.text
            if name not in ("tokens", "samples"):
                self.error(f"unknown count '{name}'{did_you_mean(name, ['tokens', 'samples'])}",
                           Code.UNKNOWN_NAME, factor.name.span)
                return None
            axes: list[str] = []
            scope = Scope.MICROBATCH
            for g in factor.groups:
                if len(g.terms) == 1 and isinstance(g.terms[0], ast.AxisRef) and \
                        g.terms[0].name.text in ("step", "microbatch", "run", "batch"):
                    scope = Scope(g.terms[0].name.text)
                    if scope in (Scope.RUN, Scope.BATCH):  # across steps (semantics/counters.py)
                        self.run_counts.append(g.span)
                    continue
                group = read_group(self.ctx, g, self.mesh)
                if group is None:
                    return None
                if group.ends:
                    self.error("counts are summed over whole axes", Code.BAD_VALUE, g.span)
                    return None
                axes.extend(group.axes)
            order = {n: i for i, n in enumerate(self.mesh.names)}
            count = Count(CountKind(name), tuple(sorted(set(axes), key=order.__getitem__)), scope)
            return [(Term(TermKind.COUNT, count=count), 1)]
        raise AssertionError(factor)

    # ---- statements ----------------------------------------------------------------------------

    def target(self, target: ast.Target, allowed: Sequence[TargetKind]) -> Target | None:
        name = target.name.text
        kind = TARGETS.get(name) or {"gradients": TargetKind.GRADS,
                                     "parameters": TargetKind.PARAMS}.get(name)
        if kind is None or kind not in allowed:
            self.error(f"unknown target '{name}'{did_you_mean(name, [k.value for k in allowed])}",
                       Code.UNKNOWN_NAME, target.name.span)
            return None
        if not target.selectors:
            return Target(kind, None, target.span)
        if kind not in (TargetKind.GRADS, TargetKind.PARAMS, TargetKind.OPTIMIZER):
            self.error(f"'{name}' has no parameter groups to select", Code.BAD_VALUE, target.span)
            return None
        # a frozen group may be named: verify.checks.frozen refutes a step that reduces or
        # updates one
        present = self.config.model.groups_held()
        groups: set[ParamGroup] = set()
        for sel in target.selectors:
            group = GROUP_NAMES.get(sel.text)
            if group is None:
                self.error(f"unknown parameter group '{sel.text}'"
                           f"{did_you_mean(sel.text, GROUP_NAMES)}", Code.UNKNOWN_NAME, sel.span)
                return None
            if group not in present:
                self.error(f"this model has no '{sel.text}' parameters (it has "
                           f"{', '.join(g.value for g in present)})", Code.BAD_VALUE, sel.span)
                return None
            groups.add(group)
        return Target(kind, frozenset(groups), target.span)

    def op(self, item: ast.StepItem) -> Op | None:
        if isinstance(item, ast.ScaleStmt):
            target = self.target(item.target, [TargetKind.GRADS])
            factor = self.monomial(item.expr, allow_loss=False)
            if target is None or factor is None:
                return None
            return Scale(target, factor, item.span)
        if not isinstance(item, ast.OpStmt):
            self.error("not allowed here", Code.BAD_VALUE, item.span)
            return None
        if item.target.name.text == "embeddings":  # a collective inside the loss: lower/gather.py
            self.error("a collective of embeddings feeds the loss: write it in 'each microbatch' "
                       "(or the step's top level) before the 'backward' it feeds", Code.BAD_VALUE,
                       item.span)
            return None
        name = item.name.text
        if name not in OPS:
            self.error(f"unknown step operation '{name}'{did_you_mean(name, OPS)}",
                       Code.UNKNOWN_NAME, item.name.span)
            return None
        group = None
        if item.group is not None:
            group = read_group(self.ctx, item.group, self.mesh)
            if group is None:
                return None
        if item.unless is not None and name != "update":
            self.error(f"'unless' names the flag an update is skipped on; '{name}' takes none",
                       Code.BAD_VALUE, item.unless.span)
            return None
        if name in ("update", "free", "zero"):
            if item.args:
                self.error(f"'{name}' takes no options", Code.BAD_VALUE, item.args[0].span)
            if item.group is not None:
                self.error(f"'{name}' runs on each device; it has no 'over' group", Code.BAD_VALUE,
                           item.group.span)
            if name == "update":
                return self.update(item)
            target = self.target(item.target, [TargetKind.GRADS])
            return None if target is None else Free(target, item.span, zero=name == "zero")
        if name == "clip":
            return self.clip_op(item, group)
        if name == "wait":
            self.error("'wait' completes an asynchronous collective of the gradients; write it "
                       "after the backward", Code.BAD_VALUE, item.span)
            return None
        if group is None:
            self.error(f"'{name}' needs a group: '{name} ... over dp'", Code.MISSING, item.span)
            return None
        return self.collective(item, CollectiveKind(name), group)

    def update(self, item: ast.OpStmt) -> Update | None:
        """``update params [unless overflow]``: the optimizer step, skipped on every rank whose
        overflow flag is set when it says ``unless overflow`` (placeverify.semantics.skip)."""
        target = self.target(item.target, [TargetKind.PARAMS])
        if item.unless is not None and item.unless.text != "overflow":
            self.error(f"an update is skipped on the overflow flag: 'unless overflow', not "
                       f"'unless {item.unless.text}'", Code.UNKNOWN_NAME, item.unless.span)
            return None
        return None if target is None else Update(
            item.span, target if target.groups is not None else None,
            unless_overflow=item.unless is not None)

    def options(self, item: ast.OpStmt, allowed: dict[str, Sequence[str]],
                positional: Sequence[str]) -> dict[str, str] | None:
        out: dict[str, str] = {}
        for arg in item.args:
            if isinstance(arg, ast.PositionalArg):
                word = value_text(arg.value)
                if word in positional:
                    key = "op" if word in ("sum", "mean", "max") else word
                    out[key] = word
                else:
                    self.error(f"'{item.name.text}' takes no option '{word}'"
                               f"{did_you_mean(word, positional)}", Code.UNKNOWN_NAME, arg.span)
                    return None
                continue
            key = arg.key.text
            if key not in allowed:
                self.error(f"'{item.name.text}' takes no option '{key}'"
                           f"{did_you_mean(key, allowed)}", Code.UNKNOWN_NAME, arg.key.span)
                return None
            word = value_text(arg.value)
            if allowed[key] and word not in allowed[key]:
                self.error(f"'{word}' is not a value of {key}{did_you_mean(word, allowed[key])}",
                           Code.UNKNOWN_NAME, arg.value.span)
                return None
            out[key] = word
        return out

    def collective(self, item: ast.OpStmt, kind: CollectiveKind, group: Group) -> Op | None:
        spec = COLLECTIVES[kind]
        reducing = spec.reduces
        ops = [op.value for op in REDUCE_OPS] if reducing else []
        positional = [*ops, *spec.positional]
        if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.BROADCAST) and \
                item.target.name.text not in ("params", "parameters"):
            positional.remove("async")  # a gather in flight is modelled for the parameters
        allowed: dict[str, Sequence[str]] = {"order": ["fixed", "rank_dependent"]}
        if reducing:
            allowed["op"] = ops
            allowed["only"] = ["used"]  # participation: DDP's find_unused_parameters reducer
        for keyword in spec.keywords:
            allowed[keyword] = []
        options = self.options(item, allowed, positional)
        if options is None:
            return None
        target = self.target(item.target, spec.targets)
        if target is None:
            return None
        op = ReduceOp(options["op"]) if "op" in options else (ReduceOp.SUM if reducing else None)
        if target.kind is TargetKind.OVERFLOW and reducing and op is not ReduceOp.MAX:
            self.error("the overflow flag is reduced with max (any rank overflowed)",
                       Code.BAD_VALUE, item.span)
        if options.get("only") == "used" and target.kind is not TargetKind.GRADS:
            self.error("'only = used' reduces the gradients of the groups used in the micro-batch; "
                       "it applies to 'grads'", Code.BAD_VALUE, item.span)
            return None
        gathers = kind in (CollectiveKind.ALL_GATHER, CollectiveKind.BROADCAST)
        if "async" in options and target.kind is not TargetKind.GRADS and not gathers:
            self.error("'async' is modelled for collectives of the gradients", Code.BAD_VALUE,
                       item.span)
            return None
        source = options.get("from", "owner")
        if kind is CollectiveKind.BROADCAST and source != "owner" and not source.isdigit():
            self.error("broadcast takes 'from = owner' or 'from = <rank>'", Code.BAD_VALUE, item.span)
            return None
        if kind is CollectiveKind.BROADCAST and target.kind is TargetKind.OVERFLOW:
            size = group.size_of({a.name: a.size for a in self.mesh.axes})
            if not source.isdigit() or int(source) >= size:
                self.error("the overflow flag is broadcast from one rank of the group: "
                           f"'broadcast(from = k) overflow over {group.label()}' with k below "
                           f"{size}", Code.BAD_VALUE, item.span)
                return None
        return Collective(kind, op, target, group, item.span, accumulate="accumulate" in options,
                          order=Order(options.get("order", "fixed")), source=source,
                          only_used=options.get("only") == "used",
                          asynchronous="async" in options)

    def clip_op(self, item: ast.OpStmt, group: Group | None) -> Op | None:
        max_norm: Fraction | None = None
        once = True
        norm = NormKind.L2
        reduce: ReduceOp | None = None
        measured: frozenset[ParamGroup] | None = None
        for arg in item.args:
            if isinstance(arg, ast.KeywordArg) and arg.key.text == "max_norm":
                max_norm = self.ctx.number(arg.value, "max_norm")
            elif isinstance(arg, ast.KeywordArg) and arg.key.text == "replicated":
                word = self.ctx.word(arg.value, "replicated counting", ["once", "every_rank"])
                once = word != "every_rank"
            elif isinstance(arg, ast.KeywordArg) and arg.key.text == "norm":
                kind = read_norm(self.ctx, arg.value)
                if kind is None:
                    return None
                norm = kind
            elif isinstance(arg, ast.KeywordArg) and arg.key.text == "reduce":
                word = self.ctx.word(arg.value, "norm reduction", [op.value for op in ReduceOp])
                if word is None:
                    return None
                reduce = ReduceOp(word)
            elif isinstance(arg, ast.KeywordArg) and arg.key.text == "norm_of":
                measured = self.norm_groups(arg.value)
                if measured is None:
                    return None
            else:
                self.error("clip takes 'max_norm = x', 'replicated = once|every_rank', "
                           "'norm = 2|inf', 'reduce = sum|mean|max' and 'norm_of = [groups]'",
                           Code.UNKNOWN_NAME, arg.span)
                return None
        if max_norm is None or max_norm <= 0:
            self.error("clip needs a positive 'max_norm', e.g. clip(max_norm = 1.0) grads over dp",
                       Code.MISSING, item.span)
            return None
        target = self.target(item.target, [TargetKind.GRADS])
        if target is None:
            return None
        return Clip(max_norm, group or Group(()), once, item.span, target, norm,
                    DEFAULT_NORM_REDUCE[norm] if reduce is None else reduce, measured)

    def norm_groups(self, value: ast.Value) -> frozenset[ParamGroup] | None:
        """``norm_of = [dense, norms]``: the parameter groups a clip's norm is computed over."""
        items = value.items if isinstance(value, ast.ListValue) else (value,)
        present = self.config.model.groups_present()
        groups: set[ParamGroup] = set()
        for item in items:
            name = value_text(item)
            group = GROUP_NAMES.get(name)
            if not isinstance(item, ast.NameValue) or group is None:
                self.error(f"unknown parameter group '{name}'{did_you_mean(name, GROUP_NAMES)}",
                           Code.UNKNOWN_NAME, item.span)
                return None
            if group not in present:
                self.error(f"this model has no '{name}' parameters (it has "
                           f"{', '.join(g.value for g in present)})", Code.BAD_VALUE, item.span)
                return None
            groups.add(group)
        return frozenset(groups)

    def seed(self, item: ast.SeedStmt) -> Seed | None:
        if item.call.name.text != "dropout":
            self.error(f"unknown random stream '{item.call.name.text}'; only 'dropout' is modelled",
                       Code.UNKNOWN_NAME, item.call.name.span)
            return None
        region = Region.REPLICATED
        for arg in item.call.args:
            word = value_text(arg.value)
            if isinstance(arg, ast.PositionalArg) and word in ("replicated", "sharded"):
                region = Region(word)
            else:
                self.error("dropout takes 'replicated' or 'sharded' (the activation region)",
                           Code.UNKNOWN_NAME, arg.span)
                return None
        group = read_group(self.ctx, item.group, self.mesh)
        if group is None:
            return None
        return Seed(region, item.policy.text == "same", group, item.span)


def expr_text(source: Source, expr: ast.Expr) -> str:
    """An expression as written (its first line, whitespace collapsed, when it spans several)."""
    span = expr.span
    if span.line != span.end_line:
        return " ".join(source.line_text(span.line)[span.column - 1:].split())
    return source.line_text(span.line)[span.column - 1:span.end_column - 1]
