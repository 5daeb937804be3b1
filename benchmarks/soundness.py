"""Mutation-based soundness harness: mutate every example's step, verify, replay on torch.

For every bundled example (``examples/**/*.place``) the harness takes up to two *bases*: the step
as written (when the file has a ``step`` block) and the canonical step placeverify derives from
the placement, written out explicitly (:func:`placeverify.ir.render.step_text`). It applies small
named mutation operators to each base's step text (delete, duplicate, swap and move statements,
move them into and out of the micro-batch loop and ``on microbatch last``, change reduce ops,
groups, targets, scales, the loss, the powers of sizes, split a division into square-root pre-
and post-divides, swap, rescale or drop named loss terms' backwards, make a collective inside
the loss detached or differentiable, insert or drop one, the clip and its norm, the
RNG seeds, the overflow reduction, the parameter gather, a gradient reduction of only the groups
a micro-batch used, the step over two optimizer steps with or without 'zero grads', ...),
checks every mutant that still lowers with placeverify's Python API under a per-mutant time limit,
and replays on real ``torch.distributed`` processes every mutant whose verdict differs from its
base's, plus a sample of the rest stratified by base file and verdict.

A replay re-asks Z3 at the replayed mesh and runs the step: *proved-but-diverges* (Z3 proved it
at that mesh but the real run diverges) is a soundness bug of the verifier or of the replay;
*refuted-but-matches* (the replay's ``not_confirmed`` for a refutation) a false alarm or a replay
that cannot see the difference. Mutants that no longer parse or lower are *rejected* and not
counted; an exception other than placeverify's diagnostics is an *internal error*.

    .venv/bin/python benchmarks/soundness.py                          # the full run (~14 min)
    .venv/bin/python benchmarks/soundness.py --limit-mutants 300 --replays 30 --json out.json
    .venv/bin/python benchmarks/soundness.py examples/ok/hsdp.place --replays 0

The full run on this project's 2-core machine: 131 bases from the 91 example files, 7,379
distinct mutants made by the operators, 1,700 checked in about 25 s (1,589 lower), 1,085
replays at world 4 in about 14 minutes. The last line printed is always (one line)::

    soundness: N mutants, P proved, R refuted, U unknown;
    proved-but-diverges X, refuted-but-matches Y, internal errors Z
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import math
import multiprocessing as mp
import random
import re
import sys
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)

from placeverify.diagnostics import PlaceError  # noqa: E402
from placeverify.ir.placement import Role  # noqa: E402
from placeverify.ir.render import step_text  # noqa: E402
from placeverify.ir.strategy import Strategy  # noqa: E402
from placeverify.lower import load_text  # noqa: E402
from placeverify.lower.edit import replace_step  # noqa: E402
from placeverify.roles.relations import batch_axes  # noqa: E402

SCHEMA = "placeverify.soundness/1"
VERDICTS = ("proved", "refuted", "unknown")
DEFAULT_LIMIT = 1700  # mutants checked in the full run (a stratified sample when more are made);
# about 7% do not lower, so that at least 1,500 are verified
DEFAULT_REPLAYS = 300  # replays beyond the differing mutants: a sample of the others
DEFAULT_WORLD = 4
DEFAULT_TIMEOUT = 60.0  # seconds per mutant check
QUERY_TIMEOUT_MS = 10_000  # per solver query, as `placeverify check`
REPLAY_TIMEOUT = 30.0  # seconds per replay run (a correct one takes a few; a mismatch hangs)
REPLAY_STEPS = 3


# ---- the step as text -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Block:
    """``each microbatch { ... }`` or ``on microbatch last { ... }``: a header and its statements."""

    header: str
    body: tuple[str, ...]


Item = str | Block
Loc = tuple[int | None, int]  # (the top-level index of a block, or None for the top level; index)


@dataclass(frozen=True, slots=True)
class StepBody:
    """A step block's statements, one per line, as :func:`step_text` writes them."""

    items: tuple[Item, ...]
    # top-level declarations written before the step (participation's 'unused dense'); the
    # edits below keep only the items, so an operator sets these last
    preamble: tuple[str, ...] = ()

    @staticmethod
    def parse(text: str) -> StepBody:
        lines = [line.strip() for line in text.strip().splitlines()]
        if lines[:1] != ["step {"] or lines[-1:] != ["}"]:
            raise ValueError(f"not a rendered step block: {text!r}")
        items: list[Item] = []
        block: tuple[str, list[str]] | None = None
        for line in lines[1:-1]:
            if line.endswith("{"):
                block = (line[:-1].strip(), [])
            elif line == "}":
                assert block is not None, "unbalanced braces in a rendered step"
                items.append(Block(block[0], tuple(block[1])))
                block = None
            elif block is not None:
                block[1].append(line)
            else:
                items.append(line)
        return StepBody(tuple(items))

    def text(self) -> str:
        lines = [*self.preamble, "step {"]
        for item in self.items:
            if isinstance(item, Block):
                lines += [f"    {item.header} {{", *(f"        {s}" for s in item.body), "    }"]
            else:
                lines.append(f"    {item}")
        return "\n".join([*lines, "}"]) + "\n"

    def flat(self) -> list[str]:
        """One line per statement, prefixed by its block: what a diff between steps shows."""
        return [*self.preamble, *(f"{self.header(b)}: {s}" if b is not None else s
                                  for (b, _), s in self.statements())]

    def header(self, block: int | None) -> str | None:
        """The header of the block at this top-level index (None: the top level)."""
        if block is None:
            return None
        item = self.items[block]
        assert isinstance(item, Block)
        return item.header

    def statements(self) -> Iterator[tuple[Loc, str]]:
        for i, item in enumerate(self.items):
            if isinstance(item, Block):
                for j, statement in enumerate(item.body):
                    yield (i, j), statement
            else:
                yield (None, i), item

    def container(self, block: int | None) -> tuple[Item, ...]:
        if block is None:
            return self.items
        item = self.items[block]
        assert isinstance(item, Block)
        return item.body

    def with_container(self, block: int | None, items: Sequence[Item]) -> StepBody:
        """The body with one container's items replaced (a block left empty is dropped)."""
        if block is None:
            return StepBody(tuple(items))
        header = self.header(block)
        statements = tuple(s for s in items if isinstance(s, str))
        assert header is not None and len(statements) == len(items), "blocks do not nest"
        top = list(self.items)
        if statements:
            top[block] = Block(header, statements)
        else:
            del top[block]
        return StepBody(tuple(top))

    def at(self, loc: Loc) -> Item:
        return self.container(loc[0])[loc[1]]

    def removed(self, loc: Loc) -> StepBody:
        items = list(self.container(loc[0]))
        del items[loc[1]]
        return self.with_container(loc[0], items)

    def inserted(self, loc: Loc, item: Item) -> StepBody:
        items = list(self.container(loc[0]))
        items.insert(loc[1], item)
        return self.with_container(loc[0], items)

    def replaced(self, loc: Loc, item: Item) -> StepBody:
        items = list(self.container(loc[0]))
        items[loc[1]] = item
        return self.with_container(loc[0], items)

    def block(self, header: str) -> int | None:
        return next((i for i, item in enumerate(self.items)
                     if isinstance(item, Block) and item.header == header), None)

    def loop_end(self) -> int:
        """The top-level index just after the last micro-batch block."""
        blocks = [i for i, item in enumerate(self.items) if isinstance(item, Block)]
        return blocks[-1] + 1 if blocks else 1

    def top_index(self, predicate: Callable[[str], bool]) -> int | None:
        return next((i for i, item in enumerate(self.items)
                     if isinstance(item, str) and predicate(item)), None)


# ---- statements -------------------------------------------------------------------------------

CALL = re.compile(r"^(?P<name>[a-z_]+)(?:\((?P<options>[^)]*)\))? (?P<target>[a-z_]+(?:\[[^\]]*\])?)"
                  r"(?: over (?P<group>.+))?$")
SEED = re.compile(r"^seed dropout\((?P<region>[a-z_]+)\) (?P<policy>same|differ) over (?P<group>.+)$")
SCALE = re.compile(r"^scale (?P<target>\S+) by (?P<expr>.+)$")
BACKWARD = re.compile(r"^backward (?:(?P<term>[A-Za-z_][A-Za-z0-9_]*): )?(?P<expr>.+)$")
COUNT = re.compile(r"\b(?P<kind>tokens|samples)(?:\((?P<args>[^)]*)\))?")
REDUCE_OPS = ("sum", "mean", "max")
REDUCTIONS = ("all_reduce", "reduce_scatter")
EACH = "each microbatch"
LAST = "on microbatch last"


@dataclass(frozen=True, slots=True)
class Call:
    """A statement ``name(options) target over group``: collectives, clip, update, free."""

    name: str
    options: tuple[str, ...]
    target: str
    group: str | None

    @staticmethod
    def parse(text: str) -> Call | None:
        match = CALL.match(text)
        if match is None or text.startswith(("seed ", "scale ", "backward ")):
            return None
        options = tuple(o.strip() for o in (match["options"] or "").split(",") if o.strip())
        return Call(match["name"], options, match["target"], match["group"])

    def text(self) -> str:
        call = f"{self.name}({', '.join(self.options)})" if self.options else self.name
        over = f" over {self.group}" if self.group else ""
        return f"{call} {self.target}{over}"

    @property
    def reduce_op(self) -> str | None:
        return next((o for o in self.options if o in REDUCE_OPS), None)

    def reduces_grads(self) -> bool:
        return self.name in REDUCTIONS and self.target.startswith("grads")


def is_fixed(statement: str) -> bool:
    """The backward, the update and the micro-batch count: every step has exactly one."""
    return statement.startswith(("backward ", "microbatches")) or is_update(statement)


def is_update(statement: str) -> bool:
    """The optimizer step, conditional on the overflow flag or not."""
    return statement in ("update params", "update params unless overflow")


def reduces_grads(statement: str) -> bool:
    call = Call.parse(statement)
    return call is not None and call.reduces_grads()


def group_of(statement: str) -> str | None:
    call = Call.parse(statement)
    if call is not None:
        return call.group
    seed = SEED.match(statement)
    return seed["group"] if seed else None


def with_group(statement: str, group: str | None) -> str | None:
    """The statement over another group (None: without ``over``, where that is allowed)."""
    call = Call.parse(statement)
    if call is not None:
        return replace(call, group=group).text()
    seed = SEED.match(statement)
    if seed is None or group is None:
        return None
    return f"seed dropout({seed['region']}) {seed['policy']} over {group}"


def group_terms(group: str) -> list[str]:
    return [t.strip() for t in group.split("*")]


def term_axis(term: str) -> str:
    return term[5:-1] if term.startswith("ends(") else term


def target_name(target: str) -> tuple[str, list[str]]:
    """``grads[dense, norms]`` -> ("grads", ["dense", "norms"])."""
    if "[" not in target:
        return target, []
    name, selectors = target[:-1].split("[", 1)
    return name, [s.strip() for s in selectors.split(",")]


def with_selectors(name: str, selectors: Sequence[str]) -> str:
    return f"{name}[{', '.join(selectors)}]" if selectors else name


def backward_head(match: re.Match[str]) -> str:
    """``backward `` or, for a named loss term, ``backward aux: ``."""
    return f"backward {match['term']}: " if match["term"] else "backward "


def expr_factors(expr: str) -> list[str]:
    """``sum / tokens(dp, step) * |cp|`` -> ["sum", "/ tokens(dp, step)", "* |cp|"]."""
    parts = re.split(r" ([*/]) ", expr)
    return [parts[0], *(f"{op} {factor}" for op, factor in zip(parts[1::2], parts[2::2], strict=True))]


# ---- what a base's operators may use ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Context:
    """What the mutation operators may use about a base's strategy."""

    axes: tuple[str, ...]
    batch_axes: tuple[str, ...]
    pipeline_axes: tuple[str, ...]
    param_groups: tuple[str, ...]
    dropout: bool
    unused: tuple[str, ...] = ()  # the groups the file declares 'unused' (participation)
    empty: bool = False  # the file declares 'empty microbatches' (semantics/empty)
    sizes: tuple[tuple[str, int], ...] = ()  # each axis's size as declared

    @staticmethod
    def of(strategy: Strategy) -> Context:
        arch = strategy.model.arch
        return Context(strategy.mesh.names, batch_axes(strategy), strategy.axes(Role.PIPELINE),
                       tuple(g.value for g in strategy.model.groups_present()),
                       arch is not None and bool(arch.dropout),
                       tuple(sorted(g.value for g in strategy.config.unused)),
                       strategy.config.empty, tuple((a.name, a.size) for a in strategy.mesh.axes))


# ---- mutation operators -------------------------------------------------------------------------

Operator = Callable[[StepBody, Context], Iterator[StepBody]]
OPERATORS: dict[str, Operator] = {}


def operator(function: Operator) -> Operator:
    OPERATORS[function.__name__] = function
    return function


Placer = Callable[[StepBody, str], StepBody | None]


def moved(body: StepBody, loc: Loc, place: Placer) -> StepBody | None:
    """The statement at ``loc`` placed elsewhere; None when it cannot go there or stays put."""
    statement = body.at(loc)
    assert isinstance(statement, str)
    result = place(body.removed(loc), statement)
    return None if result == body else result


def into_block(header: str) -> Placer:
    """At the end of the block; ``on microbatch last`` is made after the loop when missing."""

    def place(body: StepBody, statement: str) -> StepBody | None:
        index = body.block(header)
        if index is not None:
            return body.inserted((index, len(body.container(index))), statement)
        if header != LAST:
            return None
        return body.inserted((None, body.loop_end()), Block(LAST, (statement,)))

    return place


def after_loop(body: StepBody, statement: str) -> StepBody:
    return body.inserted((None, body.loop_end()), statement)


def before_update(body: StepBody, statement: str) -> StepBody | None:
    index = body.top_index(is_update)
    return None if index is None else body.inserted((None, index), statement)


def after_update(body: StepBody, statement: str) -> StepBody | None:
    index = body.top_index(is_update)
    return None if index is None else body.inserted((None, index + 1), statement)


def before_reductions(body: StepBody, statement: str) -> StepBody | None:
    """Just after the loop, before the first gradient reduction that follows it."""
    index = body.top_index(reduces_grads)
    return None if index is None else body.inserted((None, index), statement)


def edited(body: StepBody, select: Callable[[str], bool],
           variants: Callable[[str], Iterator[str | None]]) -> Iterator[StepBody]:
    """Each selected statement replaced by each of its variants."""
    for loc, statement in body.statements():
        if select(statement):
            for variant in variants(statement):
                if variant is not None and variant != statement:
                    yield body.replaced(loc, variant)


def movable(statement: str) -> bool:
    return not is_fixed(statement) and not statement.startswith("seed ")


@operator
def delete_statement(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Delete one statement (not the backward, the update or the micro-batch count)."""
    for loc, statement in body.statements():
        if not is_fixed(statement):
            yield body.removed(loc)


@operator
def duplicate_statement(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Run a statement twice in a row."""
    for (block, index), statement in body.statements():
        if not is_fixed(statement):
            yield body.inserted((block, index + 1), statement)


@operator
def swap_neighbours(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Swap two neighbouring statements of one block (or a statement and a loop block)."""
    containers: list[int | None] = [None, *(i for i, item in enumerate(body.items)
                                            if isinstance(item, Block))]
    for block in containers:
        items = list(body.container(block))
        for i in range(len(items) - 1):
            a, b = items[i], items[i + 1]
            if a == b or any(isinstance(x, str) and x.startswith("microbatches") for x in (a, b)):
                continue
            yield body.with_container(block, [*items[:i], b, a, *items[i + 2:]])


@operator
def move_statement(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Move a statement to the start or the end of its block (the update too)."""
    for (block, index), statement in body.statements():
        if statement.startswith(("microbatches", "seed ")):
            continue
        size = len(body.container(block))
        first = 1 if block is None else 0  # after the micro-batch count
        for target in (first, size - 1):
            if target not in (index, index - 1, index + 1):
                rest = body.removed((block, index))
                if len(rest.container(block)) == size - 1:  # the block survived the removal
                    yield rest.inserted((block, target), statement)


@operator
def into_loop(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Run a statement after (or before) the loop in every micro-batch instead."""
    for (block, index), statement in body.statements():
        if block is None and movable(statement):
            result = moved(body, (None, index), into_block(EACH))
            if result is not None:
                yield result


@operator
def out_of_loop(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Run a statement of ``each microbatch`` once, after the loop."""
    each = body.block(EACH)
    for (block, index), statement in body.statements():
        if block is not None and block == each and movable(statement):
            result = moved(body, (block, index), after_loop)
            if result is not None:
                yield result


@operator
def into_last_microbatch(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Run a statement in ``on microbatch last`` instead (from the loop or after it)."""
    last = body.block(LAST)
    for (block, index), statement in body.statements():
        if movable(statement) and (block is None or block != last):
            result = moved(body, (block, index), into_block(LAST))
            if result is not None:
                yield result


@operator
def out_of_last_microbatch(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Run a statement of an ``on microbatch`` block in every micro-batch, or after the loop."""
    for (block, index), _ in body.statements():
        if (body.header(block) or "").startswith("on microbatch"):
            for place in (into_block(EACH), after_loop):
                result = moved(body, (block, index), place)
                if result is not None:
                    yield result


@operator
def change_reduce_op(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """sum / mean / max in a gradient reduction."""
    def variants(statement: str) -> Iterator[str | None]:
        call = Call.parse(statement)
        assert call is not None and call.reduce_op is not None
        for op in REDUCE_OPS:
            yield replace(call, options=tuple(op if o == call.reduce_op else o
                                              for o in call.options)).text()

    def selected(statement: str) -> bool:
        call = Call.parse(statement)
        return call is not None and call.reduces_grads() and call.reduce_op is not None

    yield from edited(body, selected, variants)


def grouped(statement: str) -> bool:
    return group_of(statement) is not None


@operator
def change_group(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A collective, clip or seed over another single axis, or over the whole world."""
    def variants(statement: str) -> Iterator[str | None]:
        for axis in ctx.axes:
            yield with_group(statement, axis)
        if len(ctx.axes) > 1:
            yield with_group(statement, "world")

    yield from edited(body, grouped, variants)


@operator
def add_group_axis(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """One more axis in a statement's group."""
    def variants(statement: str) -> Iterator[str | None]:
        group = group_of(statement)
        assert group is not None
        present = {term_axis(t) for t in group_terms(group)}
        for axis in ctx.axes:
            if axis not in present and group != "world":
                yield with_group(statement, f"{group} * {axis}")

    yield from edited(body, grouped, variants)


@operator
def remove_group_axis(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """One axis fewer in a statement's group (``world`` spelled out first)."""
    def variants(statement: str) -> Iterator[str | None]:
        group = group_of(statement)
        assert group is not None
        terms = list(ctx.axes) if group == "world" else group_terms(group)
        if len(terms) > 1:
            for i in range(len(terms)):
                yield with_group(statement, " * ".join(terms[:i] + terms[i + 1:]))

    yield from edited(body, grouped, variants)


@operator
def toggle_ends(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """``ends(pp)`` for ``pp`` and back, in any statement's group."""
    def variants(statement: str) -> Iterator[str | None]:
        group = group_of(statement)
        assert group is not None
        terms = group_terms(group)
        for i, term in enumerate(terms):
            if term.startswith("ends("):
                flipped = term_axis(term)
            elif term in ctx.pipeline_axes:
                flipped = f"ends({term})"
            else:
                continue
            yield with_group(statement, " * ".join([*terms[:i], flipped, *terms[i + 1:]]))

    yield from edited(body, grouped, variants)


@operator
def change_selector(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """``grads`` for ``grads[embedding]`` and back, one parameter group fewer or another one."""
    def selector_variants(target: str) -> Iterator[str]:
        name, selectors = target_name(target)
        if selectors:
            yield name
            for s in selectors:
                if len(selectors) > 1:
                    yield with_selectors(name, [x for x in selectors if x != s])
        for group in ctx.param_groups:
            if group not in selectors and len(ctx.param_groups) > 1:
                yield with_selectors(name, [group] if not selectors else sorted([*selectors, group]))

    def variants(statement: str) -> Iterator[str | None]:
        scale = SCALE.match(statement)
        if scale:
            for target in selector_variants(scale["target"]):
                yield f"scale {target} by {scale['expr']}"
            return
        call = Call.parse(statement)
        assert call is not None
        for target in selector_variants(call.target):
            yield replace(call, target=target).text()

    def selectable(statement: str) -> bool:
        call = Call.parse(statement)
        scale = SCALE.match(statement)
        return (call is not None and call.target.startswith("grads")) or scale is not None

    yield from edited(body, selectable, variants)


@operator
def toggle_accumulate(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """``reduce_scatter(sum, accumulate)`` for ``reduce_scatter(sum)`` and back."""
    def variants(statement: str) -> Iterator[str | None]:
        call = Call.parse(statement)
        assert call is not None
        options = tuple(o for o in call.options if o != "accumulate")
        if options == call.options:
            options = (*options[:1], "accumulate", *options[1:])
        yield replace(call, options=options).text()

    yield from edited(body, lambda s: s.startswith("reduce_scatter"), variants)


@operator
def change_collective(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """An all-reduce of gradients for a reduce-scatter, and back."""
    def variants(statement: str) -> Iterator[str | None]:
        call = Call.parse(statement)
        assert call is not None
        if call.name == "all_reduce":
            yield replace(call, name="reduce_scatter").text()
        else:
            yield replace(call, name="all_reduce",
                          options=tuple(o for o in call.options if o != "accumulate")).text()

    yield from edited(body, reduces_grads, variants)


@operator
def toggle_rank_order(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """``order = rank_dependent`` on a gradient reduction, or off."""
    def variants(statement: str) -> Iterator[str | None]:
        call = Call.parse(statement)
        assert call is not None
        flag = "order = rank_dependent"
        options = tuple(o for o in call.options if o != flag)
        yield replace(call, options=options if options != call.options else (*options, flag)).text()

    yield from edited(body, reduces_grads, variants)


@operator
def insert_reduction(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """One more gradient all-reduce (sum) over one axis, just before the update."""
    for axis in ctx.axes:
        result = before_update(body, f"all_reduce(sum) grads over {axis}")
        if result is not None:
            yield result


def factor_variants(expr: str, ctx: Context, loss: bool) -> Iterator[str]:
    """An expression with one factor more or fewer: sizes, micro-batches, counts, numbers."""
    factors = expr_factors(expr)
    for i in range(1, len(factors)):
        rest = [*factors[:i], *factors[i + 1:]]
        yield " ".join(rest)
    extra = ["/ microbatches", "* microbatches", "* 2", *(f"/ |{a}|" for a in ctx.axes),
             *(f"* |{a}|" for a in ctx.axes)]
    if loss:
        extra += [f"/ tokens({', '.join(ctx.batch_axes)}, step)" if ctx.batch_axes else
                  "/ tokens(step)", "/ tokens"]
    for factor in extra:
        yield f"{expr} {factor}"


def count_variants(expr: str, ctx: Context) -> Iterator[str]:
    """A token or sample count summed over one axis fewer or more, per micro-batch or per step,
    or counting the other unit."""
    for match in COUNT.finditer(expr):
        args = [a.strip() for a in (match["args"] or "").split(",") if a.strip()]
        axes = [a for a in args if a != "step"]
        step = ["step"] if "step" in args else []

        def count(kind: str, axes: list[str], step: list[str]) -> str:
            inner = [*axes, *step]
            return f"{kind}({', '.join(inner)})" if inner else kind

        other = "samples" if match["kind"] == "tokens" else "tokens"
        replacements = [count(other, axes, step), count(match["kind"], axes, [] if step else ["step"])]
        replacements += [count(match["kind"], [a for a in axes if a != x], step) for x in axes]
        replacements += [count(match["kind"], [*axes, a], step) for a in ctx.batch_axes
                         if a not in axes]
        for new in replacements:
            yield expr[:match.start()] + new + expr[match.end():]


@operator
def change_scale(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A gradient scale's factor with one factor more or fewer."""
    def variants(statement: str) -> Iterator[str | None]:
        match = SCALE.match(statement)
        assert match is not None
        expr = match["expr"]
        alternatives = [*factor_variants(expr, ctx, loss=False), *count_variants(expr, ctx)]
        if len(expr_factors(expr)) == 1:
            alternatives.append("2")
        for new in alternatives:
            yield f"scale {match['target']} by {new}"

    yield from edited(body, lambda s: SCALE.match(s) is not None, variants)


@operator
def insert_scale(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A gradient scale by 1 / |axis| or 1 / microbatches before the update."""
    for factor in ["1 / microbatches", *(f"1 / |{a}|" for a in ctx.axes)]:
        result = before_update(body, f"scale grads by {factor}")
        if result is not None:
            yield result


@operator
def change_loss(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The backward's loss: a factor more or fewer, another count, ``mean`` for ``sum``."""
    def variants(statement: str) -> Iterator[str | None]:
        match = BACKWARD.match(statement)
        assert match is not None
        expr = match["expr"]
        alternatives = [*factor_variants(expr, ctx, loss=True), *count_variants(expr, ctx)]
        head = expr_factors(expr)[0]
        if head in ("sum", "mean"):
            alternatives.append(("mean" if head == "sum" else "sum") + expr[len(head):])
        for new in alternatives:
            yield backward_head(match) + new

    yield from edited(body, lambda s: s.startswith("backward "), variants)


SIZE = re.compile(r"\|(?P<group>[^|]+)\|(?: \^ (?P<power>-?[0-9.]+))?")
POWERS = ("0.5", "1.5", "2")


def power_variants(expr: str) -> Iterator[str]:
    """An expression with one size factor raised to another power: ``|g|`` to ``|g| ^ 0.5``,
    ``|g| ^ 1.5``, ``|g| ^ 2``; ``|g| ^ p`` to ``|g|`` and the other powers."""
    for match in SIZE.finditer(expr):
        now = match["power"]
        for power in (None, *POWERS):
            if power == now:
                continue
            factor = f"|{match['group']}|" + (f" ^ {power}" if power else "")
            yield expr[:match.start()] + factor + expr[match.end():]


@operator
def change_power(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A size in a scale or the loss raised to another (whole or half-whole) power."""
    def variants(statement: str) -> Iterator[str | None]:
        scale, backward = SCALE.match(statement), BACKWARD.match(statement)
        if scale is not None:
            for new in power_variants(scale["expr"]):
                yield f"scale {scale['target']} by {new}"
        elif backward is not None:
            for new in power_variants(backward["expr"]):
                yield backward_head(backward) + new

    yield from edited(body, lambda s: SCALE.match(s) is not None or s.startswith("backward "),
                      variants)


@operator
def split_division(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A division by a size in a scale or the loss split into a pre- and a post-divide by its
    square root (``/ |g|`` becomes ``/ |g| ^ 0.5`` there and ``scale grads by 1 / |g| ^ 0.5``
    just before the update), and the same split with the post-divide over another group or
    missing."""
    for loc, statement in body.statements():
        scale, backward = SCALE.match(statement), BACKWARD.match(statement)
        match = scale or backward
        if match is None:
            continue
        expr = match["expr"]
        for size in SIZE.finditer(expr):
            if size["power"] is not None or not expr[:size.start()].endswith("/ "):
                continue
            head = f"scale {scale['target']} by " if scale is not None else backward_head(match)
            half = head + expr[:size.start()] + f"|{size['group']}| ^ 0.5" + expr[size.end():]
            split = body.replaced(loc, half)
            posts = [size["group"], *(a for a in ctx.axes if a != size["group"])][:2]
            for group in posts:
                result = before_update(split, f"scale grads by 1 / |{group}| ^ 0.5")
                if result is not None:
                    yield result
            yield split


@operator
def insert_root_scale(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A gradient scale by 1 / |axis| ^ 0.5 before the update."""
    for axis in ctx.axes:
        result = before_update(body, f"scale grads by 1 / |{axis}| ^ 0.5")
        if result is not None:
            yield result


def term_backwards(body: StepBody) -> list[tuple[Loc, re.Match[str]]]:
    """Every backward of the step with its match (named loss terms have ``term``)."""
    out = []
    for loc, statement in body.statements():
        match = BACKWARD.match(statement)
        if match is not None:
            out.append((loc, match))
    return out


@operator
def swap_term_losses(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Two backwards of different loss terms exchange their expressions (each term normalised
    as the other one is)."""
    backwards = term_backwards(body)
    for (loc_a, a), (loc_b, b) in itertools.combinations(backwards, 2):
        if a["term"] == b["term"] or a["expr"] == b["expr"]:
            continue
        yield body.replaced(loc_a, backward_head(a) + b["expr"]).replaced(
            loc_b, backward_head(b) + a["expr"])


@operator
def rescale_term(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A named loss term's backward multiplied or divided by an axis size or by the micro-batch
    count (a term scaled by a local count or size, NVIDIA/Megatron-LM#5047)."""
    for loc, match in term_backwards(body):
        if not match["term"]:
            continue
        for factor in (*(f"{op} |{a}|" for a in ctx.axes for op in ("*", "/")),
                       "* microbatches", "/ microbatches"):
            yield body.replaced(loc, f"{backward_head(match)}{match['expr']} {factor}")


@operator
def drop_term_backward(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A named loss term never back-propagated (its backward deleted)."""
    for loc, match in term_backwards(body):
        if match["term"]:
            yield body.removed(loc)


ONLY_USED = "only = used"


@operator
def toggle_only_used(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A gradient reduction that reduces only the groups some rank used in the current
    micro-batch (DDP's find_unused_parameters reducer, pytorch/pytorch#69031), or one that had
    the option without it; a file that declares no 'unused' group gets one ('unused dense' or
    another group the model has), so that micro-batches may leave it unused."""
    def variants(statement: str) -> Iterator[str | None]:
        call = Call.parse(statement)
        assert call is not None
        options = tuple(o for o in call.options if o != ONLY_USED)
        yield replace(call, options=options if options != call.options
                      else (*options, ONLY_USED)).text()

    edited_bodies = list(edited(body, reduces_grads, variants))
    if ctx.unused:
        yield from edited_bodies
        return
    for group in ctx.param_groups[:2]:
        declaration = (f"unused {group}",)
        yield replace(body, preamble=declaration)  # declared, every reduction as it was
        for mutant in edited_bodies:
            yield replace(mutant, preamble=declaration)


EMPTY = "empty microbatches"


@operator
def empty_microbatches(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Micro-batches that may hold no tokens (a micro-batch of padding rows,
    EleutherAI/bergson#461): the file declares 'empty microbatches' with its step as it was, and
    with each backward's loss sum written as the micro-batch's mean times its tokens (the model's
    mean loss weighted by the micro-batch's count: 0/0 = NaN without tokens) or its step-wide
    counts made the micro-batch's own."""
    declaration = () if ctx.empty else (EMPTY,)
    if declaration:
        yield replace(body, preamble=declaration)  # declared, every backward as it was
    for loc, match in term_backwards(body):
        factors = expr_factors(match["expr"])
        variants = []
        if factors[0] == "sum":
            variants.append(" ".join(["mean * tokens", *factors[1:]]))
        for i, factor in enumerate(factors):
            local = re.sub(r"\((\w[^()]*?),\s*step\)", r"(\1)", factor).replace("(step)", "")
            if local != factor:
                variants.append(" ".join([*factors[:i], local, *factors[i + 1:]]))
        for expr in variants:
            yield replace(body.replaced(loc, backward_head(match) + expr), preamble=declaration)


def is_loss_gather(statement: str) -> bool:
    call = Call.parse(statement)
    return call is not None and call.target == "embeddings"


LOSS_GATHERS = ("all_gather(differentiable)", "all_gather(detached)",
                "all_reduce(sum, differentiable)", "all_reduce(sum, detached)")


@operator
def flip_loss_gather(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A collective inside the loss made detached (or differentiable: lightly-ai/lightly#1977
    summed Barlow Twins' cross-correlation with a detached all-reduce), or the other collective
    (an all-gather for an all-reduce of the embeddings: the same gradient)."""
    def variants(statement: str) -> Iterator[str | None]:
        call = Call.parse(statement)
        assert call is not None
        for other in LOSS_GATHERS:
            yield f"{other} embeddings over {call.group}"

    yield from edited(body, is_loss_gather, variants)


@operator
def insert_loss_gather(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A collective of the embeddings over one batch axis before the first backward (steps
    without one): the loss computed on every rank from the group's embeddings, its gradient
    carried back (|axis| times each rank's share) or not."""
    if any(is_loss_gather(s) for _, s in body.statements()):
        return
    backwards = term_backwards(body)
    if not backwards:
        return
    loc = backwards[0][0]
    for axis in ctx.batch_axes:
        for gather in LOSS_GATHERS[:2]:
            yield body.inserted(loc, f"{gather} embeddings over {axis}")


@operator
def drop_loss_gather(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A collective inside the loss deleted: each rank's loss over its own samples only."""
    for loc, statement in body.statements():
        if is_loss_gather(statement):
            yield body.removed(loc)



WINDOWS = re.compile(r"microbatches = (\d+|\[[\d, ]+\])$")


@operator
def several_steps(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The step verified over two consecutive optimizer steps (state across steps): windows of
    equal size or a shorter (longer) tail, gradients zeroed after the update or not at all
    (meta-pytorch/torchforge#71 never zeroed them; transformers#38872 divided the tail by the
    full window's count)."""
    for loc, statement in body.statements():
        match = WINDOWS.match(statement)
        if match is None or loc[0] is not None or match[1].startswith("["):
            continue
        n = int(match[1])
        tail = n - 1 if n > 1 else 2
        zeroed = after_update(body, "zero grads")
        for windows in (f"[{n}, {n}]", f"[{n}, {tail}]"):
            yield body.replaced(loc, f"microbatches = {windows}")
            if zeroed is not None:
                yield zeroed.replaced(loc, f"microbatches = {windows}")


@operator
def move_zero_grads(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """'zero grads' dropped (the optimizer's zero_grad forgotten), moved into the micro-batch loop
    (zeroing every micro-batch) or before the update (the step consumes nothing)."""
    for loc, statement in body.statements():
        if statement != "zero grads":
            continue
        yield body.removed(loc)
        for place in (into_block(EACH), before_update):
            result = moved(body, loc, place)
            if result is not None:
                yield result


COUNT_SCOPE = re.compile(r"\b(tokens|samples)\(([^()]*), (step|run|batch)\)")
SCOPES_INSTEAD = {"step": ("run", "batch"), "run": ("step", "batch"), "batch": ("step", "run")}


@operator
def run_counts(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Counts across steps (state across steps, semantics/counters.py): a normaliser counted over
    the step turned into one never reset (over the run, as a num_tokens kept before the loop) or
    one over the whole batch the steps split (trl#6024's generation batch), verified over two
    consecutive steps with the gradients zeroed between them; and such counts reset every step
    or turned into the other."""
    windows = next(((loc, m) for loc, s in body.statements()
                    if (m := WINDOWS.match(s)) is not None and loc[0] is None), None)
    if windows is None:
        return
    (wloc, match) = windows
    several = match[1] if match[1].startswith("[") else f"[{match[1]}, {match[1]}]"
    for loc, statement in body.statements():
        if not statement.startswith(("backward", "scale")):
            continue
        for found in COUNT_SCOPE.finditer(statement):
            for other in SCOPES_INSTEAD[found[3]]:
                edited_ = (statement[:found.start()] + f"{found[1]}({found[2]}, {other})"
                           + statement[found.end():])
                mutant = body.replaced(loc, edited_).replaced(wloc, f"microbatches = {several}")
                if not any(s == "zero grads" for _, s in mutant.statements()):
                    mutant = after_update(mutant, "zero grads") or mutant
                yield mutant


def is_clip(statement: str) -> bool:
    return statement.startswith("clip(")


def is_overflow(statement: str) -> bool:
    call = Call.parse(statement)
    return call is not None and call.target == "overflow"


def is_param_gather(statement: str) -> bool:
    call = Call.parse(statement)
    return call is not None and call.target == "params" and call.name in ("all_gather", "broadcast")


def relocations(body: StepBody, select: Callable[[str], bool]) -> Iterator[StepBody]:
    """Each selected statement before the reductions, into the loop, into the last micro-batch,
    before and after the update."""
    for loc, statement in body.statements():
        if select(statement):
            for place in (before_reductions, into_block(EACH), into_block(LAST), before_update,
                          after_update):
                result = moved(body, loc, place)
                if result is not None:
                    yield result


@operator
def move_clip(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The clip before the gradient reduction, in the loop, or after the update."""
    yield from relocations(body, is_clip)


@operator
def change_clip(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The clip counting replicated elements on every rank (or once), or without a group."""
    def variants(statement: str) -> Iterator[str | None]:
        call = Call.parse(statement)
        assert call is not None
        flag = "replicated = every_rank"
        options = tuple(o for o in call.options if o != flag)
        yield replace(call, options=options if options != call.options else (*options, flag)).text()
        if call.group is not None:
            yield replace(call, group=None).text()

    yield from edited(body, is_clip, variants)


NORM_OPTIONS = ("norm = inf", "reduce = sum", "reduce = mean", "reduce = max")


@operator
def change_clip_norm(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The clip by the inf norm (or back to the 2-norm), with its ranks' norms combined another
    way (their mean or maximum, or summed: DeepSpeed#8475 averaged them), or its norm computed
    over the dense parameters only (DeepSpeed#8613 left the experts out)."""
    def variants(statement: str) -> Iterator[str | None]:
        call = Call.parse(statement)
        assert call is not None
        inf = "norm = inf" in call.options
        if not any(o.startswith("norm_of") for o in call.options):
            yield replace(call, options=(*call.options, "norm_of = [dense]")).text()
        kept = tuple(o for o in call.options if o not in NORM_OPTIONS)
        reduce = next((o for o in call.options if o.startswith("reduce = ")), None)
        yield replace(call, options=kept if inf else (*kept, "norm = inf")).text()
        norm = ("norm = inf",) if inf else ()
        for other in ("reduce = sum", "reduce = mean", "reduce = max"):
            if other != (reduce or ("reduce = max" if inf else "reduce = sum")):
                yield replace(call, options=(*kept, *norm, other)).text()

    yield from edited(body, is_clip, variants)


@operator
def overlap_reduction(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A gradient reduction made asynchronous (issue 12, construct 3), its ``wait`` right after it
    (the same step), before or after the update (a read in flight: NERSC/sc24-dl-tutorial#1),
    at the end of its micro-batch block, after the loop, or the reduction started on the last
    micro-batch before its backward, waited where it stood (a write in flight:
    NVIDIA/Megatron-LM#3670, deepspeedai/DeepSpeed#8061)."""
    for loc, statement in body.statements():
        call = Call.parse(statement)
        if call is None or not call.reduces_grads() or "max" in call.options \
                or "async" in call.options:
            continue
        started = replace(call, options=(*call.options, "async")).text()
        wait = f"wait {call.target}"
        here = body.replaced(loc, started)
        block, index = loc
        yield here.inserted((block, index + 1), wait)
        if block is not None:
            if index + 1 < len(body.container(block)):
                yield here.inserted((block, len(body.container(block))), wait)
            if body.header(block) == EACH:
                continue  # a wait after the loop: the next micro-batch starts another in flight
            yield here.inserted((None, here.loop_end()), wait)
        for place in (before_update, after_update):
            result = place(here, wait)
            if result is not None:
                yield result
        if block is None and body.block(EACH) is not None:
            each = body.block(EACH)
            assert each is not None
            yield body.replaced(loc, wait).inserted((None, each), Block(LAST, (started,)))


@operator
def insert_clip(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A clip before the update, of the norm summed over one axis, all of them or none (steps
    without one)."""
    if any(is_clip(s) for _, s in body.statements()):
        return
    for group in [*ctx.axes, *(["world"] if len(ctx.axes) > 1 else []), None]:
        result = before_update(body, Call("clip", ("max_norm = 1",), "grads", group).text())
        if result is not None:
            yield result


@operator
def flip_seed(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """A dropout seed ``same`` for ``differ`` (and back), or for the other activation region."""
    def variants(statement: str) -> Iterator[str | None]:
        match = SEED.match(statement)
        assert match is not None
        policy = "differ" if match["policy"] == "same" else "same"
        region = "sharded" if match["region"] == "replicated" else "replicated"
        yield f"seed dropout({match['region']}) {policy} over {match['group']}"
        yield f"seed dropout({region}) {match['policy']} over {match['group']}"

    yield from edited(body, lambda s: SEED.match(s) is not None, variants)


@operator
def insert_seed(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """One more dropout seed policy (models with dropout only)."""
    if not ctx.dropout:
        return
    for axis in ctx.axes:
        for region in ("replicated", "sharded"):
            for policy in ("same", "differ"):
                yield body.inserted((None, len(body.items)),
                                    f"seed dropout({region}) {policy} over {axis}")


@operator
def move_overflow(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The overflow flag's all-reduce before the reductions, in the loop, or after the update."""
    yield from relocations(body, is_overflow)


@operator
def insert_overflow(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The overflow flag's all-reduce (max) over one axis or the world, before the update
    (steps without one)."""
    if any(is_overflow(s) for _, s in body.statements()):
        return
    for group in [*ctx.axes, *(["world"] if len(ctx.axes) > 1 else [])]:
        result = before_update(body, f"all_reduce(max) overflow over {group}")
        if result is not None:
            yield result


@operator
def drop_update(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The optimizer step left out (placeverify/semantics/skip.py: the parameters never change;
    dotnet/TorchSharp#414), or made conditional on the overflow flag, or made unconditional."""
    index = body.top_index(is_update)
    if index is None:
        return
    yield body.removed((None, index))
    statement = str(body.at((None, index)))
    other = "update params" if statement.endswith("unless overflow") else \
        "update params unless overflow"
    yield body.replaced((None, index), other)


@operator
def broadcast_overflow(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The overflow flag's all-reduce (max) as a broadcast from rank 0 or the group's last rank
    (ecmwf/WeatherGenerator#2718), a broadcast as the all-reduce; with a conditional update and no
    flag statement, a broadcast over each axis before the gradient reduction and before the
    update."""
    flags = [(loc, s) for loc, s in body.statements() if is_overflow(s)]
    for loc, statement in flags:
        call = Call.parse(statement)
        assert call is not None
        group = statement.split(" over ", 1)[1]
        if call.name == "all_reduce":
            size = dict(ctx.sizes).get(group, 1)  # a single axis: its last rank is a source too
            for k in sorted({0, size - 1}):
                yield body.replaced(loc, f"broadcast(from = {k}) overflow over {group}")
        elif call.name == "broadcast":
            yield body.replaced(loc, f"all_reduce(max) overflow over {group}")
    if flags or not any(s == "update params unless overflow" for _, s in body.statements()):
        return
    for axis in ctx.axes:
        for place in (before_reductions, before_update):
            result = place(body, f"broadcast(from = 0) overflow over {axis}")
            if result is not None:
                yield result


@operator
def change_param_gather(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The parameter all-gather as a broadcast (from the owner, from rank 0), moved before the
    update or into the loop; a gather added where there is none."""
    def variants(statement: str) -> Iterator[str | None]:
        call = Call.parse(statement)
        assert call is not None
        for source in ("owner", "0"):
            yield Call("broadcast", (f"from = {source}",), "params", call.group).text()
        yield Call("all_gather", (), "params", call.group).text()

    yield from edited(body, is_param_gather, variants)
    for loc, statement in body.statements():
        if is_param_gather(statement):
            for place in (before_update, into_block(EACH)):
                result = moved(body, loc, place)
                if result is not None:
                    yield result
    if not any(is_param_gather(s) for _, s in body.statements()):
        for axis in ctx.batch_axes:
            result = after_update(body, f"all_gather params over {axis}")
            if result is not None:
                yield result


@operator
def insert_free(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """``free grads`` at the end of each micro-batch, before or after the update."""
    for place in (into_block(EACH), before_update, after_update):
        result = place(body, "free grads")
        if result is not None:
            yield result


@operator
def insert_token_reduction(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """An all-reduce of the token counts before the loop (over the batch axes, or one of them)."""
    groups = [" * ".join(ctx.batch_axes)] if len(ctx.batch_axes) > 1 else []
    for group in [*groups, *ctx.batch_axes]:
        yield body.inserted((None, 1), f"all_reduce(sum) tokens over {group}")


@operator
def split_group_reduction(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Per-group meshes: one parameter group of a gradient reduction given a statement of its
    own, over another data-parallel group (one axis of a product left out, or one more batch
    axis: the expert data-parallel group, Megatron-LM#7160) or with the other collective
    (all-reduced where the others are reduce-scattered: FSDP's replicated parameters,
    hyper-parallel#526)."""
    for loc, statement in body.statements():
        call = Call.parse(statement)
        if call is None or not call.reduces_grads() or call.group is None:
            continue
        name, selectors = target_name(call.target)
        members = selectors or list(ctx.param_groups)
        if len(members) < 2:
            continue
        terms = group_terms(call.group)
        others_of_axes = [a for a in ctx.batch_axes if a not in terms]
        for group in members:
            rest = replace(call, target=with_selectors(name, [g for g in members if g != group]))
            own = replace(call, target=with_selectors(name, [group]))
            variants = [replace(own, group=" * ".join(t for t in terms if t != drop))
                        for drop in terms if len(terms) > 1]
            variants += [replace(own, group=" * ".join([*terms, extra]))
                         for extra in others_of_axes[:1]]
            other = "all_reduce" if call.name == "reduce_scatter" else "reduce_scatter"
            options = tuple(o for o in call.options if o != "accumulate") \
                if other == "all_reduce" else call.options
            variants.append(replace(own, name=other, options=options))
            for variant in variants:
                split = body.replaced(loc, rest.text())
                yield split.inserted((loc[0], loc[1] + 1), variant.text())


@operator
def overlap_param_gather(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """The parameter all-gather after the update made asynchronous (issue 12, construct 3:
    overlapped with the next step's forward), its ``wait params`` before the loop or first in
    the micro-batch block (before the forward reads them), right after it (the same step), last
    in the micro-batch block or after the loop (the forward reads the other ranks' shards stale:
    NVIDIA/Megatron-LM#950)."""
    update = body.top_index(is_update)
    for loc, statement in body.statements():
        call = Call.parse(statement)
        if call is None or call.name != "all_gather" or not call.target.startswith("params") \
                or "async" in call.options or loc[0] is not None or update is None \
                or loc[1] < update:
            continue
        wait = f"wait {call.target}"
        here = body.replaced(loc, replace(call, options=(*call.options, "async")).text())
        yield here.inserted((None, loc[1] + 1), wait)  # completed in the same step
        first = 1 if here.items and isinstance(here.items[0], str) and \
            here.items[0].startswith("microbatches") else 0
        yield here.inserted((None, first), wait)  # before the forward of the next step
        each = here.block(EACH)
        if each is not None:
            yield here.inserted((each, 0), wait)  # first in the micro-batch block
            yield here.inserted((each, len(here.container(each))), wait)  # after the forward
        yield here.inserted((None, here.loop_end()), wait)  # after the loop


@operator
def merge_group_reductions(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Per-group meshes, the reverse of ``split_group_reduction``: two gradient reductions of
    different parameter groups made one, over either's group (the experts reduced with the dense
    groups over the whole data-parallel group, or the dense groups over the expert data-parallel
    group); and a reduction of every group over one's group put before the other's own (the
    experts added into the dense reduce-scatter over dp * ep, then reduce-scattered over dp:
    a mixed shard the second overwrites, semantics/buffers.py)."""
    found = [(loc, call) for loc, statement in body.statements()
             if (call := Call.parse(statement)) is not None and call.reduces_grads()
             and call.group is not None and "[" in call.target]
    for (loc_a, a), (loc_b, b) in itertools.combinations(found, 2):
        if loc_a[0] != loc_b[0] or a.name != b.name or a.group == b.group:
            continue
        name, first = target_name(a.target)
        _, second = target_name(b.target)
        both = with_selectors(name, sorted({*first, *second}))
        for group in (a.group, b.group):
            merged = body.replaced(loc_a, replace(a, target=both, group=group).text())
            yield merged.removed(loc_b)
        for loc, call in ((loc_a, a), (loc_b, b)):  # every group's gradients, the other's kept
            yield body.replaced(loc, replace(call, target=name).text())


@operator
def group_divide_factor(body: StepBody, ctx: Context) -> Iterator[StepBody]:
    """Per-group meshes: one parameter group's gradients divided (or multiplied) by the size of
    one axis before its own reduction, as FSDP2's per-module gradient divide factor
    (``set_gradient_divide_factor``, pytorch/torchtitan#1551, Megatron-LM#5956's grad_divisor),
    and a group's averaging reduction turned into a sum."""
    for loc, statement in body.statements():
        call = Call.parse(statement)
        if call is None or not call.reduces_grads() or call.group is None:
            continue
        _, selectors = target_name(call.target)
        for group in selectors or list(ctx.param_groups):
            for axis in ctx.axes:
                for factor in (f"1 / |{axis}|", f"|{axis}|"):
                    yield body.inserted(loc, f"scale grads[{group}] by {factor}")
        op = call.reduce_op
        if op in ("mean", "sum"):
            other = "sum" if op == "mean" else "mean"
            options = tuple(other if o == op else o for o in call.options)
            yield body.replaced(loc, replace(call, options=options).text())


# ---- bases and mutants ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Base:
    """A file with one step to mutate: as written, or the canonical step written out."""

    path: str  # relative to the repository
    kind: str  # "written" or "canonical"
    stepless: str  # the file's text without its step block
    body: StepBody
    context: Context

    @property
    def label(self) -> str:
        return f"{self.path} ({self.kind})"

    def text(self, body: StepBody) -> str:
        return self.stepless.rstrip("\n") + "\n\n" + body.text()


@dataclass(slots=True)
class Mutant:
    id: int
    base: Base
    operator: str  # "" for the base itself
    body: StepBody
    check: dict[str, Any] = field(default_factory=dict)
    replay: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return self.base.text(self.body)

    @property
    def path(self) -> str:
        return f"{self.base.path}#{self.base.kind}-{self.operator or 'base'}-{self.id}"

    @property
    def verdict(self) -> str:
        """proved / refuted / unknown, or rejected / internal_error."""
        status = self.check.get("status")
        if status == "checked":
            return str(self.check["verdict"])
        return "unknown" if status == "timeout" else str(status)

    def traceback(self) -> str | None:
        """The internal error's traceback, from the check or from planning the replay."""
        if self.verdict == "internal_error":
            return str(self.check.get("traceback", ""))
        if self.replay is not None and self.replay["result"] == "internal_error":
            return str(self.replay.get("traceback", ""))
        return None

    def diff(self) -> list[str]:
        """The removed lines (``-``), then the added ones (``+``); a line that moved says what
        now precedes it."""
        before, after = self.base.body.flat(), self.body.flat()
        removed, added = [], []
        matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag in ("replace", "delete"):
                removed += before[i1:i2]
            if tag in ("replace", "insert"):
                added += [(j, after[j]) for j in range(j1, j2)]
        lines = [f"- {line}" for line in removed]
        for j, line in added:
            moved_here = line in removed or line.split(": ", 1)[-1] in removed
            where = f"   [after: {after[j - 1]}]" if j else "   [first]"
            lines.append(f"+ {line}{where if moved_here else ''}")
        return lines


def bases_of(path: Path) -> list[Base]:
    """The file's written step (if any) and its canonical step, both as step text."""
    relative = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    source = path.read_text(encoding="utf-8")
    stepless = replace_step(source, None)
    canonical = load_text(stepless, relative)
    bases = []
    if stepless != source:
        written = load_text(source, relative)
        bases.append(Base(relative, "written", stepless, StepBody.parse(step_text(written)),
                          Context.of(written)))
    body = StepBody.parse(step_text(canonical))
    if not bases or bases[0].body != body:
        bases.append(Base(relative, "canonical", stepless, body, Context.of(canonical)))
    return bases


def mutants_of(base: Base, operators: dict[str, Operator]) -> Iterator[tuple[str, StepBody]]:
    for name, function in operators.items():
        for body in function(base.body, base.context):
            if body != base.body:
                yield name, body


def sample(items: Sequence[Any], limit: int | None, key: Callable[[Any], tuple[str, str]],
           rng: random.Random) -> list[Any]:
    """At most ``limit`` items (all when they fit), stratified two levels deep by ``key``: each
    round takes one item of every first-level stratum (in a shuffled order), cycling through its
    second-level strata, so that small strata are kept whole and large ones are thinned."""
    if limit is None or len(items) <= limit:
        return list(items)
    strata: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for item in items:
        first, second = key(item)
        strata[first][second].append(item)
    rotations: dict[str, list[list[Any]]] = {}
    for first, inner in sorted(strata.items()):
        buckets = [inner[k] for k in sorted(inner)]
        for bucket in buckets:
            rng.shuffle(bucket)
        rng.shuffle(buckets)
        rotations[first] = buckets
    order = sorted(rotations)
    rng.shuffle(order)
    picked: list[Any] = []
    while len(picked) < limit:
        for first in order:
            buckets = rotations[first]
            while buckets and not buckets[0]:
                buckets.pop(0)
            if buckets and len(picked) < limit:
                picked.append(buckets[0].pop())
                buckets.append(buckets.pop(0))
    return picked


# ---- checking, in worker processes --------------------------------------------------------------


def check_text(text: str, path: str, timeout_ms: int) -> dict[str, Any]:
    """placeverify's combined verdict on one file's text, as a JSON-serialisable record."""
    from placeverify.api import verify

    started = time.perf_counter()
    try:
        strategy = load_text(text, path)
    except PlaceError as error:
        return {"status": "rejected", "message": str(error).splitlines()[0] if str(error) else ""}
    except Exception:
        return {"status": "internal_error", "phase": "lower", "traceback": traceback.format_exc()}
    try:
        verification = verify(strategy, timeout_ms)
    except PlaceError as error:
        return {"status": "rejected", "message": str(error).splitlines()[0] if str(error) else ""}
    except Exception:
        return {"status": "internal_error", "phase": "verify", "traceback": traceback.format_exc()}
    record: dict[str, Any] = {
        "status": "checked",
        "verdict": verification.overall().value,
        "conditions": verification.verdicts(),
        "unknown": sorted({f"{o.condition.value}: {o.kind}: {o.reason}"
                           for o in verification.obligations if o.verdict.value == "unknown"}),
        "trace": verification.trace.to_json() if verification.trace is not None else None,
        "seconds": round(time.perf_counter() - started, 4),
    }
    first = verification.first_refuted()
    if first is not None:
        record["refuted"] = {"condition": first.condition.value, "kind": first.kind,
                             "line": first.span.line if first.span else None, "claim": first.claim}
    plain: dict[str, Any] = json.loads(json.dumps(record))  # the trace's tuples become lists
    return plain


def _serve(conn: Connection, timeout_ms: int) -> None:
    """A check worker: one JSON request (text, path) in, one JSON record out, until EOF."""
    while True:
        try:
            text, path = json.loads(conn.recv_bytes())
        except EOFError:
            return
        conn.send_bytes(json.dumps(check_text(text, path, timeout_ms)).encode("utf-8"))


class CheckPool:
    """Checks in ``jobs`` forked worker processes; a check past ``limit`` seconds is killed
    (its worker replaced) and recorded as a timeout."""

    def __init__(self, jobs: int, limit: float, timeout_ms: int) -> None:
        self.jobs = max(1, jobs)
        self.limit = limit
        self.timeout_ms = timeout_ms
        self.context = mp.get_context("fork")

    def _start(self) -> tuple[Any, Connection]:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_serve, args=(child, self.timeout_ms), daemon=True,
                                       name="soundness-check")
        process.start()
        child.close()
        return process, parent

    def map(self, tasks: Sequence[tuple[str, str]],
            progress: Callable[[int], None] = lambda done: None) -> list[dict[str, Any]]:
        """Each task's record, in order; ``progress`` hears the count done after each one."""
        results: list[dict[str, Any]] = [{} for _ in tasks]
        queue = iter(range(len(tasks)))
        busy: dict[Connection, tuple[Any, int, float]] = {}
        idle: list[tuple[Any, Connection]] = []
        done = 0

        def dispatch(process: Any, conn: Connection) -> None:
            index = next(queue, None)
            if index is None:
                idle.append((process, conn))
                return
            conn.send_bytes(json.dumps(tasks[index]).encode("utf-8"))
            busy[conn] = (process, index, time.monotonic() + self.limit)

        try:
            for _ in range(min(self.jobs, len(tasks))):
                dispatch(*self._start())
            while busy:
                deadline = min(d for _, _, d in busy.values())
                for ready in wait(list(busy), timeout=max(0.0, deadline - time.monotonic())):
                    conn = cast(Connection, ready)
                    process, index, _ = busy.pop(conn)
                    try:
                        results[index] = json.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        self._stop(process, conn)
                        results[index] = {"status": "internal_error", "phase": "worker",
                                          "traceback": "the check process died (exit code "
                                                       f"{process.exitcode})"}
                        process, conn = self._start()
                    done += 1
                    progress(done)
                    dispatch(process, conn)
                now = time.monotonic()
                for conn, (process, index, deadline) in list(busy.items()):
                    if deadline <= now:
                        del busy[conn]
                        self._stop(process, conn)
                        results[index] = {"status": "timeout", "unknown": [
                            f"time limit: no verdict within {self.limit:g} s"]}
                        done += 1
                        progress(done)
                        dispatch(*self._start())
        finally:
            for process, conn in [*idle, *((p, c) for c, (p, _, _) in busy.items())]:
                self._stop(process, conn)
        return results

    @staticmethod
    def _stop(process: Any, conn: Connection) -> None:
        """Close the worker's pipe and end it (workers keep nothing worth waiting for)."""
        conn.close()
        process.kill()
        process.join(timeout=10)


# ---- replaying ----------------------------------------------------------------------------------


def replay(mutant: Mutant, world: int, timeout: float = REPLAY_TIMEOUT) -> dict[str, Any]:
    """Run the mutant on ``world`` real processes: its counterexample when refuted, else its own
    step; Z3 is asked again at the replayed mesh. No control run."""
    from placeverify.backend.runtime import BackendFailure
    from placeverify.replay.cli import execute
    from placeverify.replay.layout import Unsupported, layout_of
    from placeverify.replay.plan import plan_from_strategy, plan_from_trace, strategy_of
    from placeverify.trace import Trace

    started = time.perf_counter()
    try:
        trace = mutant.check.get("trace")
        if mutant.verdict == "refuted" and trace is not None:
            plan = plan_from_trace(Trace.from_json(trace), world=world, steps=REPLAY_STEPS)
        else:
            plan = plan_from_strategy(load_text(mutant.text, mutant.path), world=world,
                                      steps=REPLAY_STEPS)
        plan = replace(plan, control=None, control_expect=None, control_origin=None)
        layout_of(strategy_of(plan.main))
    except (BackendFailure, Unsupported, ValueError, PlaceError) as error:
        return {"result": "unsupported", "message": str(error).splitlines()[0]}
    except Exception:
        return {"result": "internal_error", "traceback": traceback.format_exc()}
    report = execute(plan, timeout=timeout, source=mutant.path)
    record: dict[str, Any] = {"mesh": plan.main.sizes, "microbatches": plan.main.microbatches,
                              "z3": plan.expect.verdict.value,
                              "z3_refuted": _refutation(plan.expect.condition, plan.expect.kind,
                                                        plan.expect.line),
                              "seconds": round(time.perf_counter() - started, 3)}
    if report.error is not None:
        result = "unsupported" if report.error.kind == "unsupported" else "error"
        return {**record, "result": result, "message": report.error.message}
    main = report.main
    assert main is not None
    o = main.outcome
    record.update(run=main.replay, vs_reference=_finite(o.max_vs_reference),
                  across_ranks=_finite(o.max_across_ranks), tolerance=o.tolerance, worst=o.worst)
    if plan.expect.verdict.value == "proved" and o.diverges:
        record["result"] = "proved_but_diverges"
    elif plan.expect.verdict.value == "refuted" and not o.diverges:
        record["result"] = "refuted_but_matches"
    elif plan.expect.verdict.value == "unknown":
        record["result"] = "z3_unknown"
    else:
        record["result"] = "confirmed"
    return record


def _refutation(condition: str | None, kind: str | None, line: int | None) -> str | None:
    if condition is None:
        return None
    return f"{condition}: {kind}" + (f", line {line}" if line else "")


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def choose_replays(mutants: Sequence[Mutant], bases: dict[Base, Mutant], others: int,
                   rng: random.Random) -> list[Mutant]:
    """Every mutant whose verdict differs from its base's, and ``others`` of the rest: a sample
    stratified by base file, then verdict."""
    checked = [m for m in mutants if m.verdict in VERDICTS]
    differing = [m for m in checked if m.verdict != bases[m.base].verdict]
    same = [m for m in checked if m.verdict == bases[m.base].verdict]
    rest = sample(same, others, lambda m: (m.base.path, m.verdict), rng)
    return sorted([*differing, *rest], key=lambda m: m.id)


@dataclass(slots=True)
class Summary:
    mutants: int = 0  # checked to a verdict: proved + refuted + unknown
    proved: int = 0
    refuted: int = 0
    unknown: int = 0
    rejected: int = 0
    internal_errors: int = 0  # in checks and in planning replays
    replays: int = 0
    proved_but_diverges: int = 0
    refuted_but_matches: int = 0
    replay_unsupported: int = 0
    replay_errors: int = 0
    replay_unknown: int = 0

    @staticmethod
    def of(mutants: Sequence[Mutant]) -> Summary:
        verdicts = Counter(m.verdict for m in mutants)
        replays = Counter(m.replay["result"] for m in mutants if m.replay is not None)
        return Summary(
            mutants=sum(verdicts[v] for v in VERDICTS), proved=verdicts["proved"],
            refuted=verdicts["refuted"], unknown=verdicts["unknown"], rejected=verdicts["rejected"],
            internal_errors=verdicts["internal_error"] + replays["internal_error"],
            replays=sum(replays.values()), proved_but_diverges=replays["proved_but_diverges"],
            refuted_but_matches=replays["refuted_but_matches"],
            replay_unsupported=replays["unsupported"], replay_errors=replays["error"],
            replay_unknown=replays["z3_unknown"])

    def line(self) -> str:
        return (f"soundness: {self.mutants} mutants, {self.proved} proved, {self.refuted} refuted, "
                f"{self.unknown} unknown; proved-but-diverges {self.proved_but_diverges}, "
                f"refuted-but-matches {self.refuted_but_matches}, internal errors "
                f"{self.internal_errors}")


@dataclass(slots=True)
class Run:
    bases: list[Mutant]  # each base's own step, checked like a mutant (operator "")
    mutants: list[Mutant]
    generated: int  # distinct mutants made, before sampling
    notes: list[str] = field(default_factory=list)

    @property
    def summary(self) -> Summary:
        return Summary.of(self.mutants)


def example_files() -> list[Path]:
    return sorted((ROOT / "examples").glob("**/*.place"))


def generate(files: Sequence[Path], *, seed: int = 0, limit: int | None = DEFAULT_LIMIT,
             operators: Sequence[str] | None = None) -> Run:
    """The bases of ``files`` and their distinct mutants, at most ``limit`` of them (a sample
    stratified by operator, then file)."""
    rng = random.Random(seed)
    chosen = {n: OPERATORS[n] for n in (operators or OPERATORS)}
    bases = [b for path in files for b in bases_of(path)]
    seen: set[tuple[str, str]] = {(b.path, b.body.text()) for b in bases}
    candidates: list[tuple[Base, str, StepBody]] = []
    for base in bases:
        for name, body in mutants_of(base, chosen):
            key = (base.path, body.text())
            if key not in seen:
                seen.add(key)
                candidates.append((base, name, body))
    indices = sorted(sample(range(len(candidates)), limit,
                            lambda i: (candidates[i][1], candidates[i][0].path), rng))
    base_runs = [Mutant(i, b, "", b.body) for i, b in enumerate(bases)]
    mutants = [Mutant(len(bases) + n, candidates[i][0], candidates[i][1], candidates[i][2])
               for n, i in enumerate(indices)]
    return Run(base_runs, mutants, len(candidates))


def check_all(result: Run, *, jobs: int = 2, timeout: float = DEFAULT_TIMEOUT,
              say: Callable[[str], None] = lambda _: None) -> None:
    """Check every base and mutant (in worker processes); note bases that do not check, and
    written steps whose rendering changes the file's verdict."""
    import placeverify.verify  # noqa: F401  (z3 imported once, before the workers fork)

    everything = [*result.bases, *result.mutants]
    started = time.perf_counter()
    every = max(1, len(everything) // 10)

    def progress(done: int) -> None:
        if done % every == 0 or done == len(everything):
            say(f"checked {done} of {len(everything)} in {time.perf_counter() - started:.0f} s")

    pool = CheckPool(jobs, timeout, min(QUERY_TIMEOUT_MS, int(timeout * 1000)))
    for m, record in zip(everything, pool.map([(m.text, m.path) for m in everything], progress),
                         strict=True):
        m.check = record
    for b in result.bases:
        if b.verdict not in VERDICTS:
            result.notes.append(f"{b.base.label}: the base itself is {b.verdict}: "
                                f"{b.check.get('message') or b.check.get('traceback', '')}")
        elif b.base.kind == "written":
            source = (ROOT / b.base.path).read_text(encoding="utf-8")
            original = check_text(source, b.base.path, QUERY_TIMEOUT_MS).get("verdict")
            if original != b.verdict:
                result.notes.append(f"{b.base.label}: the file says {original}, its step as the "
                                    f"renderer writes it says {b.verdict}")


def replay_all(result: Run, *, replays: int = DEFAULT_REPLAYS, world: int = DEFAULT_WORLD,
               seed: int = 0, timeout: float = REPLAY_TIMEOUT,
               say: Callable[[str], None] = lambda _: None) -> None:
    """Replay every mutant whose verdict differs from its base's, and ``replays`` of the others."""
    chosen = choose_replays(result.mutants, {b.base: b for b in result.bases}, replays,
                            random.Random(seed))
    started = time.perf_counter()
    for i, m in enumerate(chosen, 1):
        m.replay = replay(m, world, timeout)
        if i % 25 == 0 or i == len(chosen):
            say(f"replayed {i} of {len(chosen)} in {time.perf_counter() - started:.0f} s")


def run(files: Sequence[Path], *, seed: int = 0, limit: int | None = DEFAULT_LIMIT,
        replays: int = DEFAULT_REPLAYS, world: int = DEFAULT_WORLD, jobs: int = 2,
        timeout: float = DEFAULT_TIMEOUT, replay_timeout: float = REPLAY_TIMEOUT,
        operators: Sequence[str] | None = None, say: Callable[[str], None] = lambda _: None) -> Run:
    """Generate, check and replay (``replays = 0``: check only)."""
    result = generate(files, seed=seed, limit=limit, operators=operators)
    say(f"{len(result.bases)} bases from {len(files)} files; {result.generated} distinct mutants, "
        f"{len(result.mutants)} to check")
    if replays > 0:
        from placeverify.backend.available import torch_available
        from placeverify.backend.runtime import pool

        if torch_available():
            pool().prestart()  # torch imports in the forkserver while the checks run
        else:
            result.notes.append("torch is not installed: no replays")
            replays = 0
    check_all(result, jobs=jobs, timeout=timeout, say=say)
    if replays > 0:
        replay_all(result, replays=replays, world=world, seed=seed, timeout=replay_timeout,
                   say=say)
    return result


# ---- the report ---------------------------------------------------------------------------------


def _g(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float | int) else str(x)


def _mesh(sizes: dict[str, int]) -> str:
    return ", ".join(f"{a} = {n}" for a, n in sizes.items())


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _error_summary(tb: str) -> str:
    """The exception and the innermost placeverify frame that raised it."""
    lines = [line.strip() for line in tb.strip().splitlines() if line.strip()]
    frames = [line for line in lines if line.startswith("File ") and "placeverify" in line
              and "benchmarks" not in line]
    where = ""
    if frames:
        match = re.search(r'File "(?:.*/)?(placeverify/[^"]+)", line (\d+), in (\S+)', frames[-1])
        where = f" at {match[1]}:{match[2]} in {match[3]}" if match else ""
    return f"{lines[-1] if lines else '?'}{where}"


def print_report(result: Run, out: Any = None) -> None:
    """The operator table, the discrepancies, internal errors, unknowns, replays that could not
    run, and the summary line last."""
    lines = [*_overview(result), *_discrepancies(result), *_internal_errors(result),
             *_unknowns(result), *_unrunnable(result), "", result.summary.line()]
    print("\n".join(lines), file=out or sys.stdout)


def _overview(result: Run) -> Iterator[str]:
    s = result.summary
    yield (f"bases: {len(result.bases)}; distinct mutants made: {result.generated}, checked: "
           f"{len(result.mutants)}, rejected (do not lower): {s.rejected}")
    yield from (f"note: {note}" for note in result.notes)
    yield ""
    yield (f"{'operator':24} {'mutants':>8} {'proved':>7} {'refuted':>8} {'unknown':>8} "
           f"{'rejected':>9} {'errors':>7}")
    by_operator: dict[str, Counter[str]] = defaultdict(Counter)
    for m in result.mutants:
        by_operator[m.operator][m.verdict] += 1
    for name, c in ((n, by_operator[n]) for n in OPERATORS if n in by_operator):
        yield (f"{name:24} {sum(c[v] for v in VERDICTS):8} {c['proved']:7} {c['refuted']:8} "
               f"{c['unknown']:8} {c['rejected']:9} {c['internal_error']:7}")
    if s.replays:
        yield ""
        yield (f"replays: {s.replays} on real processes; proved-but-diverges "
               f"{s.proved_but_diverges}, refuted-but-matches {s.refuted_but_matches}, Z3 unknown "
               f"at the replayed mesh {s.replay_unknown}, replay unsupported "
               f"{s.replay_unsupported}, replay errors {s.replay_errors}")


def _discrepancies(result: Run) -> Iterator[str]:
    flagged = [m for m in result.mutants if m.replay and m.replay["result"] in
               ("proved_but_diverges", "refuted_but_matches")]
    if not flagged:
        return
    bases = {b.base: b for b in result.bases}
    yield ""
    yield ("discrepancies (the mutated lines: - removed, + added; 'each microbatch:' and 'on "
           "microbatch last:' say where)")
    for m in flagged:
        r = m.replay or {}
        refuted = m.check.get("refuted")
        why = f" ({_refutation(refuted['condition'], refuted['kind'], refuted['line'])})" \
            if refuted else ""
        at_mesh = f"Z3 {r['z3']}" + (f" ({r['z3_refuted']})" if r.get("z3_refuted") else "")
        yield f"  #{m.id} {r['result'].replace('_', '-')}: {m.base.label}, {m.operator}"
        yield f"      verdict: base {bases[m.base].verdict}, mutant {m.verdict}{why}"
        yield (f"      replay at {_mesh(r['mesh'])}, micro-batches {r['microbatches']}: {at_mesh}; "
               f"the run {r['run']} (vs reference {_g(r['vs_reference'])}, across ranks "
               f"{_g(r['across_ranks'])}, tolerance {_g(r['tolerance'])})")
        yield from (f"        {line}" for line in m.diff())


def _internal_errors(result: Run) -> Iterator[str]:
    groups: dict[str, list[Mutant]] = defaultdict(list)
    for m in result.mutants:
        tb = m.traceback()
        if tb is not None:
            groups[_error_summary(tb)].append(m)
    if not groups:
        return
    yield ""
    yield "internal errors (by exception and place; the first mutant of each)"
    for summary, members in sorted(groups.items(), key=lambda g: -len(g[1])):
        first = members[0]
        operators = Counter(m.operator for m in members).most_common()
        yield f"  {len(members):5}  {summary}"
        yield (f"         e.g. #{first.id} {first.base.label}; operators: "
               + ", ".join(f"{name} {n}" for name, n in operators))
        yield from (f"           {line}" for line in first.diff())


def _unknowns(result: Run) -> Iterator[str]:
    reasons = Counter(_short(reason, 150) for m in result.mutants if m.verdict == "unknown"
                      for reason in m.check.get("unknown", ["?"]))
    if reasons:
        yield ""
        yield "unknown verdicts by reason"
        yield from (f"  {n:5}  {reason}" for reason, n in reasons.most_common())


def _unrunnable(result: Run) -> Iterator[str]:
    messages = Counter(
        f"{m.replay['result']}: "
        + _short(re.sub(r"(line|rank) \d+", r"\1 N", str(m.replay.get("message", ""))), 140)
        for m in result.mutants if m.replay and m.replay["result"] in ("unsupported", "error"))
    if messages:
        yield ""
        yield "replays that could not run"
        yield from (f"  {n:5}  {message}" for message, n in messages.most_common())


def document(result: Run, options: dict[str, Any]) -> dict[str, Any]:
    def record(m: Mutant) -> dict[str, Any]:
        check = {k: v for k, v in m.check.items() if k != "trace"}
        return {"id": m.id, "file": m.base.path, "base": m.base.kind, "operator": m.operator or None,
                "diff": m.diff(), "verdict": m.verdict, "check": check, "replay": m.replay,
                "text": m.text}

    summary = result.summary
    return {"schema": SCHEMA, "options": options,
            "summary": {**asdict(summary), "line": summary.line(), "generated": result.generated},
            "notes": result.notes, "bases": [record(b) for b in result.bases],
            "mutants": [record(m) for m in result.mutants]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path,
                        help="example files (default: every examples/**/*.place)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--limit-mutants", type=int, default=DEFAULT_LIMIT,
                        help=f"check at most this many mutants, a sample stratified by operator and "
                        f"file (default {DEFAULT_LIMIT}; 0: all)")
    parser.add_argument("--replays", type=int, default=DEFAULT_REPLAYS,
                        help="replay every mutant whose verdict differs from its base's, and a sample "
                        f"of this many others (default {DEFAULT_REPLAYS}; 0: no replays at all)")
    parser.add_argument("--world", type=int, default=DEFAULT_WORLD,
                        help=f"processes per replay (default {DEFAULT_WORLD})")
    parser.add_argument("--jobs", type=int, default=2, help="check processes (default 2)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds per mutant check (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--replay-timeout", type=float, default=REPLAY_TIMEOUT,
                        help=f"seconds per replay before its ranks are stopped (default "
                        f"{REPLAY_TIMEOUT:g})")
    parser.add_argument("--operators", help="comma-separated operator names (default: all)")
    parser.add_argument("--json", dest="json_out", type=Path, help="write every record here")
    figures.add_docs_flag(parser)
    args = parser.parse_args(argv)
    if args.world < 2:
        parser.error("--world must be at least 2")
    operators = args.operators.split(",") if args.operators else None
    unknown = set(operators or ()) - set(OPERATORS)
    if unknown:
        parser.error(f"unknown operators: {', '.join(sorted(unknown))}; known: "
                     f"{', '.join(OPERATORS)}")
    files = [p.resolve() for p in args.files] or example_files()
    result = run(files, seed=args.seed, limit=args.limit_mutants or None, replays=args.replays,
                 world=args.world, jobs=args.jobs, timeout=args.timeout,
                 replay_timeout=args.replay_timeout, operators=operators,
                 say=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json_out is not None:
        options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                   if k != "files"}
        args.json_out.write_text(json.dumps(document(result, options), indent=1, default=str) + "\n",
                                 encoding="utf-8")
    print_report(result)
    if args.docs:
        s = result.summary
        figures.write_section("soundness", "Soundness: mutants of every example, checked and replayed", [
            (f"{len(result.bases)} examples, {result.generated} distinct mutants made, "
             f"{len(result.mutants)} checked", f"{s.mutants} mutants to a verdict: {s.proved} proved, "
             f"{s.refuted} refuted, {s.unknown} unknown; {s.rejected} rejected (do not lower)"),
            (f"replays on real processes ({s.replays})",
             f"proved-but-diverges {s.proved_but_diverges}, refuted-but-matches "
             f"{s.refuted_but_matches}, Z3 unknown at the replayed mesh {s.replay_unknown}, "
             f"replay unsupported {s.replay_unsupported}, replay errors {s.replay_errors}"),
            ("internal errors", str(s.internal_errors))],
            argv=sys.argv[1:] if argv is None else argv, name=args.docs_name,
            facts=figures.machine(torch=True, device="cpu (gloo)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
