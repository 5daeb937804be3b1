"""The step renderer: IR step -> ``step { ... }`` text -> lowering gives the same step again.

Every example's step (written or canonical) is rendered, put back into its file in place of the
file's own step block, lowered again and compared operation by operation, up to source spans and
the source text of expressions.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from placeverify.diagnostics import Span
from placeverify.ir.render import monomial_text, op_text, step_text
from placeverify.ir.step import Monomial, Scale, Step, Target, TargetKind, Term, TermKind
from placeverify.ir.strategy import Strategy
from placeverify.lower import load, load_text
from placeverify.lower.edit import replace_step

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("**/*.place"))
WRITTEN = [p for p in EXAMPLES if "step {" in p.read_text(encoding="utf-8")]

HEADER = """\
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16, dropout = true }
precision mixed_adam
mesh { tp = 2, pp = 2, dp = 2, cp = 2 }
place megatron over tp
place pipeline(1f1b, microbatches = 3) over pp
place zero2 over dp
place context over cp
clip max_norm = 0.25
"""


def without_spans(value: Any) -> Any:
    """The value with every span removed and expressions' source text blanked, recursively."""
    if isinstance(value, Span):
        return None
    if isinstance(value, Monomial):
        return (without_spans(value.factors),)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: without_spans(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, tuple):
        return tuple(without_spans(v) for v in value)
    return value


def comparable(step: Step) -> Any:
    return without_spans((step.microbatches, step.pre, step.loop, step.post, step.seeds))


def round_trip(strategy: Strategy) -> Strategy:
    text = replace_step(strategy.source.text, step_text(strategy))
    return load_text(text, strategy.source.path)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_example_step_round_trips(path: Path) -> None:
    strategy = load(str(path))
    again = round_trip(strategy)
    assert not again.step.canonical, "a rendered step is a written one"
    assert comparable(again.step) == comparable(strategy.step), step_text(strategy)


@pytest.mark.parametrize("path", WRITTEN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_canonical_step_of_a_written_file_round_trips(path: Path) -> None:
    stepless = load_text(replace_step(path.read_text(encoding="utf-8"), None), str(path))
    assert stepless.step.canonical
    again = round_trip(stepless)
    assert comparable(again.step) == comparable(stepless.step), step_text(stepless)


def test_every_construct_round_trips() -> None:
    text = HEADER + """
step {
    microbatches = 3
    all_reduce(sum) tokens over dp * cp
    on microbatch 0 { all_reduce(mean) grads[norms] over tp }
    each microbatch {
        backward mean * |cp| / tokens(dp, cp, step) / (2.5 * microbatches) * loss_scale
        reduce_scatter(sum, accumulate, order = rank_dependent) grads over dp
        free grads
    }
    on microbatch last { all_reduce(sum) grads[embedding] over ends(pp) }
    scale grads by 1 / |dp * cp| * 0.5
    all_reduce(max) overflow over world
    clip(max_norm = 0.25, replicated = every_rank) grads[dense, norms] over tp * pp
    update params
    broadcast(from = 1) params over dp
    all_gather params over dp
    seed dropout(replicated) same over tp
    seed dropout(sharded) differ over tp * dp
}
"""
    strategy = load_text(text)
    again = round_trip(strategy)
    assert comparable(again.step) == comparable(strategy.step)
    rendered = step_text(strategy)
    assert "    on microbatch 0 {\n        all_reduce(mean) grads[norms] over tp\n    }\n" in rendered
    assert "    on microbatch last {\n        all_reduce(sum) grads[embedding] over ends(pp)\n" in rendered
    assert "reduce_scatter(sum, accumulate, order = rank_dependent) grads over dp" in rendered
    assert "clip(max_norm = 0.25, replicated = every_rank) grads[dense, norms] over tp * pp" in rendered
    assert "broadcast(from = 1) params over dp" in rendered
    assert "all_reduce(max) overflow over tp * pp * dp * cp" in rendered


def test_the_rendered_canonical_step_reads_as_expected() -> None:
    strategy = load(str(ROOT / "examples" / "zero-paper" / "zero2.place"))
    assert strategy.step.canonical
    assert step_text(strategy) == (
        "step {\n"
        "    microbatches = 1\n"
        "    each microbatch {\n"
        "        backward sum / tokens(dp, step)\n"
        "    }\n"
        "    reduce_scatter(sum) grads over dp\n"
        "    all_reduce(max) overflow over dp\n"
        "    update params\n"
        "    all_gather params over dp\n"
        "}\n")


def test_numbers_are_written_exactly() -> None:
    def scale(*factors: tuple[Term, int]) -> str:
        return monomial_text(Monomial(tuple(factors), ""))

    third = Term(TermKind.NUMBER, Fraction(1, 3))
    assert scale((Term(TermKind.NUMBER, Fraction(5, 8)), 1)) == "0.625"
    assert scale((Term(TermKind.NUMBER, Fraction(3)), 1), (third, -1)) == "3 / (1 / 3)"
    assert scale((Term(TermKind.MICROBATCHES), -1)) == "1 / microbatches"
    op = Scale(Target(TargetKind.GRADS), Monomial(((third, 1),), ""), Span.point(1, 1))
    assert op_text(op) == "scale grads by (1 / 3)"


def test_a_file_without_a_step_gets_one_appended() -> None:
    text = "model { params = 1e6 }\nmesh { dp = 2 }\nplace ddp over dp\n"
    assert replace_step(text, None) == text
    assert replace_step(text, "step {\n}\n") == text + "\nstep {\n}\n"
    written = replace_step(text, step_text(load_text(text)))
    assert replace_step(written, None).rstrip() == text.rstrip()
