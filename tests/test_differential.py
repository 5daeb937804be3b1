"""Differential test: the Z3 encoding against the exact interpreter on random steps.

Random meshes, losses, normalisations and reduction statements are generated as .place text.
For every parameter group, a *proved* gradient-integrity verdict must hold on every concrete
instance the interpreter runs (a divergence would be a soundness bug), a *refuted* one must come
with a counterexample the interpreter confirms, and every axis the agreement analysis calls
identical must give identical consumed gradients on the interpreter's devices.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from placeverify.diagnostics import PlaceError
from placeverify.lower import load_text
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import atoms, run, uniform_instance
from placeverify.verdicts import Verdict
from placeverify.verify.agreement import agreement
from placeverify.verify.checks.coefficients import group_obligation

ARCH = "model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }"


@st.composite
def programs(draw: st.DrawFn) -> str:
    dp = draw(st.integers(1, 3))
    cp = draw(st.sampled_from([1, 1, 2]))
    tp = draw(st.sampled_from([1, 1, 2]))
    zero = draw(st.sampled_from(["ddp", "zero1", "zero2"]))
    loss = draw(st.sampled_from(["token_mean", "sample_mean", "microbatch_mean", "sum"]))
    m = draw(st.integers(1, 3))
    axes = ["dp"] + (["cp"] if cp > 1 else []) + (["tp"] if tp > 1 else [])
    batch = [a for a in axes if a != "tp"]
    groups = [a for a in axes] + (["dp * cp"] if "cp" in axes else [])
    loss_exprs = ["sum", "mean", "sum / microbatches", "mean / microbatches",
                  f"sum / tokens({' * '.join(batch)}, step)", "sum / tokens(step)",
                  "sum / samples(dp, step)", "sum / tokens(dp)"]
    if "cp" in axes:
        loss_exprs += ["sum / tokens(cp) * |cp|", "sum / tokens(cp) / microbatches"]
    backward = draw(st.sampled_from(loss_exprs))
    loop: list[str] = []
    if draw(st.booleans()):
        op = draw(st.sampled_from(["sum", "mean"]))
        loop.append(f"all_reduce({op}) grads over {draw(st.sampled_from(groups))}")
    if zero == "zero2" and draw(st.booleans()):
        accumulate = draw(st.sampled_from(["sum", "sum, accumulate"]))
        loop.append(f"reduce_scatter({accumulate}) grads over dp")
        if draw(st.booleans()):
            loop.append("free grads")
    post: list[str] = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["all_reduce", "scale"]))
        if kind == "scale":
            post.append("scale grads by " + draw(st.sampled_from(
                ["1 / |dp|", "1 / microbatches", f"1 / |{groups[-1]}|", "2"])))
        else:
            op = draw(st.sampled_from(["sum", "mean"]))
            post.append(f"all_reduce({op}) grads over {draw(st.sampled_from(groups))}")
    if zero != "ddp" and draw(st.booleans()):
        post.append("reduce_scatter(sum) grads over dp")
    post.append("update params")
    if zero != "ddp":
        post.append("all_gather params over dp")
    mesh = ", ".join(f"{a} = {n}" for a, n in (("dp", dp), ("cp", cp), ("tp", tp)) if a in axes)
    places = [f"place {zero} over dp"] + (["place context over cp"] if cp > 1 else []) + \
        (["place megatron(sequence_parallel) over tp"] if tp > 1 else [])
    body = "\n".join(["    each microbatch {", f"        backward {backward}",
                      *(f"        {s}" for s in loop), "    }", *(f"    {s}" for s in post)])
    return "\n".join([ARCH, "precision megatron", f"mesh {{ {mesh} }}", *places, f"loss {loss}",
                      "step {", f"    microbatches = {m}", body, "}", ""])


def instances(strategy, view, count: int):  # type: ignore[no-untyped-def]
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    m = strategy.step.microbatches
    keys = atoms(view, sizes, m)
    rng = random.Random(7)
    yield uniform_instance(strategy, view, sizes, m)
    for _ in range(count):
        tokens = {k: rng.randint(1, 5) for k in keys}
        samples = {k: 2 for k in keys}
        yield uniform_instance(strategy, view, sizes, m, tokens, samples)


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(programs())
def test_z3_verdicts_agree_with_the_exact_interpreter(text: str) -> None:
    try:
        strategy = load_text(text)
    except PlaceError:
        return  # an ill-formed combination the language rejects
    for group in strategy.model.groups_present():
        view = group_view(strategy, group)
        obligation, found = group_obligation(strategy, group, timeout_ms=5000)
        runs = [run(strategy, view, inst) for inst in instances(strategy, view, 6)]
        diverged = [r for r in runs if r.mismatches()]
        if obligation.verdict is Verdict.PROVED:
            assert not diverged, f"soundness: proved but the interpreter diverges\n{text}"
        if obligation.verdict is Verdict.REFUTED and obligation.kind == "coefficient":
            assert found is not None and found.run.mismatches(), text
        identical = agreement(strategy, view).identical
        for r in runs:
            for d1, d2 in itertools.combinations(r.devices, 2):
                differ = [a for a in d1.coords if d1.coords[a] != d2.coords[a]]
                if len(differ) == 1 and differ[0] in identical:
                    assert d1.consumed == d2.consumed, \
                        f"agreement: {differ[0]} called identical but devices differ\n{text}"


def _verdicts(text: str) -> set[Verdict]:
    try:
        strategy = load_text(text)
    except PlaceError:
        return set()
    return {group_obligation(strategy, g, timeout_ms=5000)[0].verdict
            for g in strategy.model.groups_present()}


@pytest.mark.parametrize("wanted", [Verdict.PROVED, Verdict.REFUTED])
def test_the_generator_reaches_both_verdicts(wanted: Verdict) -> None:
    """If the random programs were all proved (or all refuted) the test above would be idle."""
    find(programs(), lambda text: wanted in _verdicts(text),
         settings=settings(max_examples=300, database=None, derandomize=True, deadline=None))


@pytest.mark.parametrize("dp", [8, 4096])
def test_formula_size_does_not_depend_on_the_mesh(dp: int) -> None:
    """The symmetry reduction: the same number of relation classes at dp = 8 and dp = 4096."""
    from placeverify.verify.z3.integrity import encode

    text = f"model {{ params = 1e9 }}\nprecision megatron\nmesh {{ dp = {dp} }}\nplace zero2 over dp\n"
    strategy = load_text(text)
    view = group_view(strategy, strategy.model.groups_present()[0])
    encoded = encode(strategy, view, {"dp": dp}, 1, "t_", integer=False)
    assert len(encoded.consumed) == 2  # the atom is on this rank's coordinate, or on another
