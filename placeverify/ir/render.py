"""The IR's step written back as ``.place`` text: ``step { ... }`` that lowers to the same step.

Used to write out the canonical step placeverify derives for a file without a ``step`` block, so
that it can be read, edited and mutated like a written one (``benchmarks/soundness.py``). The
text follows ``grammar/placement.lark``: the token reductions before the loop, one block per run
of consecutive loop statements (``each microbatch { ... }``, ``on microbatch last { ... }``), the
statements after the loop, then the RNG policies. Lowering the text gives back the same ops, in
the same order, up to source spans (tested in ``tests/test_render.py``).
"""

from __future__ import annotations

from fractions import Fraction

from placeverify.ir.mesh import Group
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    CollectiveKind,
    Free,
    LoopOp,
    Monomial,
    Op,
    Order,
    Scale,
    Seed,
    Step,
    Target,
    Term,
    TermKind,
    Update,
)
from placeverify.ir.strategy import Strategy

INDENT = "    "


def step_text(strategy: Strategy) -> str:
    """The strategy's step (written or canonical) as a ``step { ... }`` block, ending in a newline."""
    return "\n".join(["step {", *(INDENT + line for line in step_lines(strategy.step)), "}"]) + "\n"


def step_lines(step: Step) -> list[str]:
    """The body of the step block, one statement per line, blocks indented by :data:`INDENT`."""
    lines = [f"microbatches = {step.microbatches}" if len(step.windows) < 2 else
             f"microbatches = [{', '.join(map(str, step.windows))}]"]
    lines += _with_waits(step, "pre", [op_text(op) for op in step.pre])
    for header, texts in _loop_blocks(step):
        lines.append(header + " {")
        lines += [INDENT + text for text in texts]
        lines.append("}")
    lines += _with_waits(step, "post", [op_text(op) for op in step.post])
    lines += [seed_text(seed) for seed in step.seeds]
    return lines


def _gather_lines(op: Op) -> list[str]:
    """The collective of embeddings a backward's loss is computed from, on its own line before it."""
    return [op.gather.label()] if isinstance(op, Backward) and op.gather is not None else []


def _with_waits(step: Step, phase: str, texts: list[str]) -> list[str]:
    """A block's statements with its ``wait`` statements in place."""
    out: list[str] = []
    for index in range(len(texts) + 1):
        out += [f"wait {target_text(w.target)}" for w in step.waits
                if w.phase == phase and w.index == index]
        if index < len(texts):
            out.append(texts[index])
    return out


def _loop_blocks(step: Step) -> list[tuple[str, list[str]]]:
    """Consecutive loop ops (and waits) that run on the same micro-batches share one block."""
    items: list[tuple[int | None, int, str]] = []  # (micro-batch, loop position, text)
    for index in range(len(step.loop) + 1):
        items += [(w.microbatch, index, f"wait {target_text(w.target)}") for w in step.waits
                  if w.phase == "loop" and w.index == index]
        if index < len(step.loop):
            lo = step.loop[index]
            items += [(lo.microbatch, index, text)
                      for text in [*_gather_lines(lo.op), op_text(lo.op)]]
    blocks: list[tuple[str, list[str]]] = []
    for n, (which, index, text) in enumerate(items):
        if n == 0 or which != items[n - 1][0]:
            header = _block_header(LoopOp(step.loop[0].op, which), step.microbatches)
            if len(step.windows) > 1 and which is not None:  # several steps' windows
                header = "on microbatch last" if index in step.last_ops else \
                    f"on microbatch {which}"
            blocks.append((header, []))
        blocks[-1][1].append(text)
    return blocks


def _block_header(lo: LoopOp, microbatches: int) -> str:
    if lo.microbatch is None:
        return "each microbatch"
    if lo.microbatch == microbatches - 1:
        return "on microbatch last"
    return f"on microbatch {lo.microbatch}"


def op_text(op: Op) -> str:
    """One step statement, e.g. ``reduce_scatter(sum, accumulate) grads[dense] over dp``."""
    if isinstance(op, Backward):
        return f"backward {op.term + ': ' if op.term else ''}{monomial_text(op.loss)}"
    if isinstance(op, Collective):
        return collective_text(op)
    if isinstance(op, Scale):
        return f"scale {target_text(op.target)} by {monomial_text(op.factor)}"
    if isinstance(op, Clip):
        options = [f"max_norm = {_decimal(op.max_norm)}"]
        if not op.replicated_once:
            options.append("replicated = every_rank")
        options += op.options()
        over = f" over {group_text(op.group)}" if op.group.axes else ""
        return f"clip({', '.join(options)}) {target_text(op.target)}{over}"
    if isinstance(op, Update):
        text = "update params" if op.target is None else f"update {target_text(op.target)}"
        return text + (" unless overflow" if op.unless_overflow else "")
    if isinstance(op, Free):
        return f"{'zero' if op.zero else 'free'} {target_text(op.target)}"
    raise AssertionError(f"no text for {op!r}")


def op_label(op: Op) -> str:
    """One step statement in the short form of reports and traces (labels, ``max_norm`` as
    ``%g``), e.g. ``all_reduce(sum) grads over dp``; :func:`op_text` is the round-trip form."""
    if isinstance(op, Backward):
        gathered = f" (after {op.gather.label()})" if op.gather is not None else ""
        return f"backward {op.term + ': ' if op.term else ''}{op.loss.text}{gathered}"
    if isinstance(op, Collective):
        return op.label()
    if isinstance(op, Scale):
        return f"scale {op.target.label()} by {op.factor.text}"
    if isinstance(op, Clip):
        once = "" if op.replicated_once else ", replicated = every_rank"
        once += "".join(f", {o}" for o in op.options())
        group = f" over {op.group.label()}" if op.group.axes else ""
        return f"clip(max_norm = {float(op.max_norm):g}{once}) {op.target.label()}{group}"
    if isinstance(op, Update):
        text = "update params" if op.target is None else f"update {op.target.label()}"
        return text + (" unless overflow" if op.unless_overflow else "")
    if isinstance(op, Free):
        return f"{'zero' if op.zero else 'free'} {op.target.label()}"
    raise AssertionError(op)


def collective_text(op: Collective) -> str:
    options: list[str] = []
    if op.op is not None:
        options.append(op.op.value)
    if op.accumulate:
        options.append("accumulate")
    if op.asynchronous:
        options.append("async")
    if op.order is Order.RANK_DEPENDENT:
        options.append("order = rank_dependent")
    if op.kind is CollectiveKind.BROADCAST:
        options.append(f"from = {op.source}")
    if op.only_used:
        options.append("only = used")
    call = f"{op.kind.value}({', '.join(options)})" if options else op.kind.value
    return f"{call} {target_text(op.target)} over {group_text(op.group)}"


def seed_text(seed: Seed) -> str:
    policy = "same" if seed.same else "differ"
    return f"seed dropout({seed.region.value}) {policy} over {group_text(seed.group)}"


def target_text(target: Target) -> str:
    if target.groups is None:
        return target.kind.value
    return f"{target.kind.value}[{', '.join(sorted(g.value for g in target.groups))}]"


def group_text(group: Group) -> str:
    if not group.axes:
        raise ValueError("an empty group has no text (a statement without 'over' has none)")
    return " * ".join(f"ends({a})" if a in group.ends else a for a in group.axes)


def monomial_text(monomial: Monomial) -> str:
    """``sum / tokens(dp, step)``: the factors in order, each ``*`` or ``/`` by its exponent's
    sign. A product that starts with a division is written ``1 / ...`` (one more factor of 1)."""
    words: list[str] = []
    for term, exponent in monomial.factors:
        for _ in range(abs(exponent)):
            operator = "*" if exponent > 0 else "/"
            if not words and operator == "/":
                words.append("1")
            if words:
                words.append(operator)
            words.append(term_text(term))
    return " ".join(words) if words else "1"


def term_text(term: Term) -> str:
    if term.kind is TermKind.NUMBER:
        return _number(term.number)
    if term.kind is TermKind.SIZE:
        assert term.group is not None
        return f"|{group_text(term.group)}|"
    if term.kind is TermKind.SIZE_ROOT:
        assert term.group is not None
        return f"|{group_text(term.group)}| ^ 0.5"
    if term.kind is TermKind.COUNT:
        assert term.count is not None
        return term.count.label()
    return {TermKind.LOSS_SUM: "sum", TermKind.MICROBATCHES: "microbatches",
            TermKind.LOSS_SCALE: "loss_scale"}[term.kind]


def _number(value: Fraction) -> str:
    """A decimal where one is exact (every number a file can write), else ``(p / q)``."""
    text = _exact_decimal(value)
    return text if text is not None else f"({value.numerator} / {value.denominator})"


def _decimal(value: Fraction) -> str:
    text = _exact_decimal(value)
    return text if text is not None else f"{float(value):.17g}"


def _exact_decimal(value: Fraction) -> str | None:
    """``value`` in decimal notation when that is exact (its denominator is made of 2s and 5s)."""
    digits = 0
    scaled = value
    while scaled.denominator != 1:
        if digits == 64:
            return None
        scaled *= 10
        digits += 1
    whole = str(abs(scaled.numerator)).rjust(digits + 1, "0")
    sign = "-" if value < 0 else ""
    return sign + (f"{whole[:-digits]}.{whole[-digits:]}" if digits else whole)
