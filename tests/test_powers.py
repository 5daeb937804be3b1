"""Powers of sizes in scale factors, ``|g| ^ 0.5`` (issue 12, construct 9).

The exact numbers (:mod:`placeverify.semantics.surd`) are checked against identities derived by
hand; the verdicts of pre- and post-divides that split a division between two groups against the
arithmetic of the split (the product of the factors a gradient meets must be 1 / N).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placeverify.diagnostics import Code, PlaceError, Severity
from placeverify.ir.render import step_text
from placeverify.ir.step import Scale, TermKind
from placeverify.lower import load_text
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run, uniform_instance
from placeverify.semantics.surd import Surd, inverse, sign, sqrt_of
from placeverify.verdicts import Verdict
from placeverify.verify.checks.coefficients import group_obligation

# ---- exact square roots --------------------------------------------------------------------------


def test_square_roots_of_squares_are_rationals() -> None:
    assert sqrt_of(9) == 3 and isinstance(sqrt_of(9), Fraction)
    assert sqrt_of(1) == 1
    assert isinstance(sqrt_of(8), Surd)
    assert sqrt_of(8) == 2 * sqrt_of(2)  # 8 = 2² · 2


def test_products_sums_and_inverses() -> None:
    r2, r3, r6 = sqrt_of(2), sqrt_of(3), sqrt_of(6)
    assert r2 * r2 == 2 and isinstance(r2 * r2, Fraction)
    assert r2 * r3 == r6
    assert sqrt_of(18) / r2 == 3
    assert (r2 + r3) * (r2 - r3) == -1  # 2 - 3
    assert 1 / r2 == r2 / 2
    x = 1 + r2 + r3
    assert x * inverse(x) == 1
    assert r2 + r3 != r6 and r2 != Fraction(7, 5)  # independent over the rationals


def test_signs_and_order_are_exact() -> None:
    r2, r3 = sqrt_of(2), sqrt_of(3)
    # √2 + √3 = 3.14626...: between 3.14 and 3.15
    assert sign(r2 + r3 - Fraction(314, 100)) == 1
    assert sign(r2 + r3 - Fraction(315, 100)) == -1
    assert sign(r2 - 1) == 1 and sign(1 - r2) == -1
    # 99/70 = 1.41428... > √2 = 1.41421..., 140/99 = 1.41414... < √2
    assert r2 < Fraction(99, 70) and r2 > Fraction(140, 99)
    assert max([Fraction(1), r2, Fraction(7, 5)]) == r2


def test_text_is_what_a_trace_shows() -> None:
    assert str(sqrt_of(2) / 2) == "1/2*sqrt(2)"
    assert str(1 - sqrt_of(2)) == "1 - sqrt(2)"


# ---- the language -----------------------------------------------------------------------------------

HEAD = ('strategy "powers"\nmodel {{ params = 1e9 }}\nprecision megatron\n'
        "mesh {{ shard = {shard}, replica = {replica} }}\nplace hsdp over shard * replica\n")


def hsdp(body: str, shard: int = 4, replica: int = 2) -> str:
    lines = "\n".join(f"    {line}" for line in body.strip().splitlines())
    return HEAD.format(shard=shard, replica=replica) + "step {\n" + lines + "\n}\n"


SPLIT = """
backward sum / tokens(shard * replica, step) * |shard * replica|
scale grads by 1 / |shard * replica| ^ {pre}
reduce_scatter(sum) grads over shard
all_reduce(sum) grads over replica
scale grads by 1 / |shard * replica| ^ {post}
update params
"""


def scales(text: str) -> list[tuple[tuple[TermKind, int], ...]]:
    step = load_text(text).step
    return [tuple((t.kind, e) for t, e in op.factor.factors)
            for op in step.ops() if isinstance(op, Scale)]


def test_half_powers_are_powers_of_the_square_root() -> None:
    text = hsdp(SPLIT.format(pre="0.5", post="1.5"))
    assert scales(text) == [((TermKind.NUMBER, 1), (TermKind.SIZE_ROOT, -1)),
                            ((TermKind.NUMBER, 1), (TermKind.SIZE_ROOT, -3))]
    assert scales(hsdp(SPLIT.format(pre="2", post="-1"))) == [
        ((TermKind.NUMBER, 1), (TermKind.SIZE, -2)), ((TermKind.NUMBER, 1), (TermKind.SIZE, 1))]


def test_the_rendered_step_reads_back_the_same() -> None:
    strategy = load_text(hsdp(SPLIT.format(pre="0.5", post="0.5")))
    rendered = step_text(strategy)
    assert "scale grads by 1 / |shard * replica| ^ 0.5" in rendered
    head = HEAD.format(shard=4, replica=2)
    assert step_text(load_text(head + rendered)) == rendered


@pytest.mark.parametrize("power", ["0.3", "1.25", "(1)"])
def test_other_powers_are_positioned_errors(power: str) -> None:
    text = hsdp(SPLIT.format(pre=power, post="0.5"))
    with pytest.raises(PlaceError) as raised:
        load_text(text)
    [error] = [d for d in raised.value.diagnostics if d.severity is Severity.ERROR]
    assert error.span is not None and error.span.line == 8
    if power != "(1)":
        assert error.code is Code.BAD_VALUE
        assert error.message == ("a size is raised to a whole or half-whole power (|g| ^ 0.5, "
                                 f"|g| ^ 2), not {power}")
        assert error.span.column == text.splitlines()[7].index(power) + 1


# ---- semantics: the exact interpreter and Z3 ----------------------------------------------------


def verdict(text: str) -> Verdict:
    strategy = load_text(text)
    return group_obligation(strategy, strategy.model.groups_present()[0], timeout_ms=10_000)[0].verdict


@pytest.mark.parametrize(("shard", "replica"), [(1, 2), (4, 2), (3, 2), (2, 3)])
def test_a_split_that_multiplies_to_one_over_n_is_proved_and_matches(shard: int, replica: int) -> None:
    text = hsdp(SPLIT.format(pre="0.5", post="0.5"), shard, replica)
    assert verdict(text) is Verdict.PROVED
    strategy = load_text(text)
    view = group_view(strategy, strategy.model.groups_present()[0])
    result = run(strategy, view, uniform_instance(strategy, view, {"shard": shard,
                                                                   "replica": replica}, 1))
    assert not result.mismatches()


def test_a_missing_post_divide_is_refuted_by_sqrt_n() -> None:
    # pre-divide by √N only: the gradient is √N = √2 times the single-device one (N = 1 x 2)
    text = hsdp(SPLIT.format(pre="0.5", post="0"), shard=1, replica=2)
    assert verdict(text) is Verdict.REFUTED
    strategy = load_text(text)
    view = group_view(strategy, strategy.model.groups_present()[0])
    result = run(strategy, view, uniform_instance(strategy, view, {"shard": 1, "replica": 2}, 1))
    consumed = result.devices[0].consumed
    assert consumed is not None and consumed == result.reference * sqrt_of(2)


def test_the_post_divide_over_the_wrong_group_is_refuted() -> None:
    body = SPLIT.format(pre="0.5", post="0.5").replace(
        "scale grads by 1 / |shard * replica| ^ 0.5\nupdate",
        "scale grads by 1 / |shard| ^ 0.5\nupdate")
    # 1/√(4·2) · 1/√4 = 1/(2√8), not 1/8
    assert verdict(hsdp(body)) is Verdict.REFUTED
    # at one shard rank: 1/√2 · 1, not 1/2
    assert verdict(hsdp(body, shard=1)) is Verdict.REFUTED
    more = body.replace("/ |shard| ^ 0.5\nupdate", "/ |shard| ^ 0.5 / |replica|\nupdate")
    assert more != body
    # 1/√8 · 1/√4 · 1/2 = 1/(4√8), not 1/8
    assert verdict(hsdp(more)) is Verdict.REFUTED


# every split of 1/N into pre · post with exponents over the shard and replica groups: proved
# exactly when the exponents of |shard| and of |replica| each add up to 1
HALVES = ["0", "0.5", "1", "1.5"]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(*[st.sampled_from(HALVES)] * 4), st.sampled_from([(1, 2), (2, 2), (3, 2), (2, 3)]))
def test_z3_and_the_exact_interpreter_agree_on_splits(powers: tuple[str, ...],
                                                      sizes: tuple[int, int]) -> None:
    a, b, c, d = powers
    body = f"""
backward sum / tokens(shard * replica, step) * |shard * replica|
scale grads by 1 / |shard| ^ {a} / |replica| ^ {b}
reduce_scatter(sum) grads over shard
all_reduce(sum) grads over replica
scale grads by 1 / |shard| ^ {c} / |replica| ^ {d}
update params
"""
    shard, replica = sizes
    text = hsdp(body, shard, replica)
    expected_proved = all((Fraction(x) + Fraction(y) == 1) or n == 1
                          for x, y, n in ((a, c, shard), (b, d, replica)))
    got = verdict(text)
    assert got is (Verdict.PROVED if expected_proved else Verdict.REFUTED), text
    strategy = load_text(text)
    view = group_view(strategy, strategy.model.groups_present()[0])
    for tokens in itertools.islice(itertools.product([1, 3], repeat=shard * replica), 3):
        keys = sorted(uniform_instance(strategy, view, {"shard": shard, "replica": replica},
                                       1).tokens)
        instance = uniform_instance(strategy, view, {"shard": shard, "replica": replica}, 1,
                                    dict(zip(keys, tokens, strict=True)))
        diverges = bool(run(strategy, view, instance).mismatches())
        assert diverges is not expected_proved, text


@pytest.mark.parametrize("fmt", ["text", "sarif", "json"])
def test_an_irrational_counterexample_is_reported_exactly(tmp_path: Path, fmt: str) -> None:
    # pre-divide by √2 and post-divide by 1: consumed = reference x √2, written exactly
    path = tmp_path / "split.place"
    path.write_text(hsdp(SPLIT.format(pre="0.5", post="0"), shard=1, replica=2))
    done = subprocess.run([sys.executable, "-m", "placeverify", "check", "--output-format", fmt,
                           str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stderr  # refuted
    assert "sqrt(2)" in done.stdout
    assert "Traceback" not in done.stderr
