"""The SymPy closed forms agree with the exact numbers, and have the published shapes.

``placeverify.cost.analyse(strategy, symbolic=True)`` evaluates the cost formulas over SymPy
symbols; substituting ``Symbolic.values`` must give exactly what the rational evaluation gives,
for every memory category, the host bytes, every collective and the bubble, for every example.
A few closed forms are also compared, as expressions, with the formulas the papers print.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import sympy

from placeverify.cost import CATEGORIES, Costs, analyse
from placeverify.cost.domain import Symbolic
from placeverify.lower import load, load_text

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(f"{p.parent.name}/{p.name}" for folder in ("strategies", "zero-paper")
                  for p in (ROOT / "examples" / folder).glob("*.place"))


def both(name: str) -> tuple[Costs, Costs, Symbolic]:
    strategy = load(str(ROOT / "examples" / name))
    symbolic = analyse(strategy, symbolic=True)
    assert isinstance(symbolic.domain, Symbolic)
    return analyse(strategy), symbolic, symbolic.domain


@pytest.fixture(scope="module")
def analysed() -> dict[str, tuple[Costs, Costs, Symbolic]]:
    return {name: both(name) for name in EXAMPLES}


def closed(expr: Any, domain: Symbolic) -> Fraction:
    """Evaluate a closed form, after checking that every free symbol has a value."""
    free = sympy.sympify(expr).free_symbols
    assert free <= set(domain.values), f"unbound symbols {free - set(domain.values)} in {expr}"
    return domain.evaluate(expr)


def test_there_are_examples() -> None:
    assert len(EXAMPLES) == 22


@pytest.mark.parametrize("name", EXAMPLES)
def test_memory_closed_forms_evaluate_to_the_exact_numbers(
        analysed: dict[str, tuple[Costs, Costs, Symbolic]], name: str) -> None:
    exact, symbolic, d = analysed[name]
    want = exact.device_bytes()
    got = symbolic.device_bytes()
    assert set(got) == {*CATEGORIES, "total"}
    for category in (*CATEGORIES, "total"):
        assert closed(got[category], d) == Fraction(want[category]), category
    assert closed(symbolic.host_bytes(), d) == Fraction(exact.host_bytes())
    # Item by item too (a category may hide compensating errors).
    assert [(i.category, i.label, i.host) for i in symbolic.memory] == \
        [(i.category, i.label, i.host) for i in exact.memory]
    for s_item, e_item in zip(symbolic.memory, exact.memory, strict=True):
        assert closed(s_item.bytes, d) == Fraction(e_item.bytes), e_item.label


@pytest.mark.parametrize("name", EXAMPLES)
def test_memory_total_is_a_formula_in_the_model_symbols(
        analysed: dict[str, tuple[Costs, Costs, Symbolic]], name: str) -> None:
    _, symbolic, _ = analysed[name]
    names = {str(s) for s in sympy.sympify(symbolic.device_bytes()["total"]).free_symbols}
    # not a bare number: the whole model's Ψ, or a stage's layers (the fullest pipeline stage)
    assert names & {"Ψ", "Ψ_dense", "Ψ_dense_padded", "Ψ_dense_layers"}, names


@pytest.mark.parametrize("name", EXAMPLES)
def test_collective_closed_forms_evaluate_to_the_exact_numbers(
        analysed: dict[str, tuple[Costs, Costs, Symbolic]], name: str) -> None:
    exact, symbolic, d = analysed[name]
    assert [(c.op, c.axes, c.what) for c in symbolic.comm] == \
        [(c.op, c.axes, c.what) for c in exact.comm]
    for s_item, e_item in zip(symbolic.comm, exact.comm, strict=True):
        key = (e_item.op, e_item.axes, e_item.what)
        assert closed(s_item.bytes, d) == Fraction(e_item.bytes), key
        assert closed(s_item.payload, d) == Fraction(e_item.payload), key
        assert closed(s_item.calls, d) == Fraction(e_item.calls), key
        assert closed(s_item.factor, d) == Fraction(e_item.factor), key
    assert closed(symbolic.network_bytes(), d) == Fraction(exact.network_bytes())
    assert closed(symbolic.state_bytes(), d) == Fraction(exact.state_bytes())
    assert closed(symbolic.pcie_bytes(), d) == Fraction(exact.pcie_bytes())


@pytest.mark.parametrize("name", EXAMPLES)
def test_bubble_and_activation_closed_forms(
        analysed: dict[str, tuple[Costs, Costs, Symbolic]], name: str) -> None:
    exact, symbolic, d = analysed[name]
    assert (exact.bubble is None) == (symbolic.bubble is None)
    if exact.bubble is not None:
        assert closed(symbolic.bubble, d) == Fraction(exact.bubble)
    assert (exact.activations is None) == (symbolic.activations is None)
    if exact.activations is not None and symbolic.activations is not None:
        for attr in ("per_layer", "layers", "in_flight", "kept", "working_set"):
            assert closed(getattr(symbolic.activations, attr), d) == \
                Fraction(getattr(exact.activations, attr)), attr


# ---- closed forms against the published formulas (as expressions) -----------------------------

def symbols(domain: Symbolic) -> dict[str, Any]:
    return {str(s): s for s in domain.values}


def same(a: Any, b: Any) -> bool:
    return bool(sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0)


@pytest.mark.parametrize(("preset", "model_states"), [
    ("ddp", lambda psi, n: 16 * psi),
    ("zero1", lambda psi, n: 4 * psi + 12 * psi / n),
    ("zero2", lambda psi, n: 2 * psi + 14 * psi / n),
    ("zero3", lambda psi, n: 16 * psi / n),
])
def test_zero_paper_closed_forms(preset: str, model_states: Any) -> None:
    _, symbolic, d = both(f"zero-paper/{preset}.place")
    sym = symbols(d)
    psi, n = sym["Ψ"], sym["dp"]
    assert same(symbolic.device_bytes()["total"], model_states(psi, n))
    # ZeRO §7: 2Ψ_B(N-1)/N for DP and ZeRO-1/2, 3Ψ_B(N-1)/N for ZeRO-3; Ψ_B = 2Ψ (fp16).
    # ZeRO-3 gathers the parameters for forward and for backward of every micro-batch, so its
    # closed form is (2m + 1)Ψ_B(N-1)/N, the published 3Ψ_B(N-1)/N at m = 1.
    m = sym.get("m", sympy.Integer(1))
    volumes = 2 * m + 1 if preset == "zero3" else 2
    assert same(symbolic.state_bytes(), volumes * 2 * psi * (n - 1) / n)
    assert same(sympy.sympify(symbolic.state_bytes()).subs(m, 1),
                (3 if preset == "zero3" else 2) * 2 * psi * (n - 1) / n)


def gpt3_symbolic(mesh_and_place: str, recompute: str = "none") -> tuple[Costs, dict[str, Any]]:
    text = f"model gpt3_175b {{ seq = 2048, micro_batch = 1 }}\nprecision megatron\n{mesh_and_place}\n"
    if recompute != "none":
        text += f"recompute {recompute}\n"
    costs = analyse(load_text(text), symbolic=True)
    assert isinstance(costs.domain, Symbolic)
    return costs, symbols(costs.domain)


KORTHIKANTI: dict[str, tuple[str, str, Callable[..., Any]]] = {
    # row: (mesh and placement, recompute, Table 2 formula in s, b, h, a, t)
    "no parallelism": ("mesh { dp = 1 }\nplace ddp over dp", "none",
                       lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
    "tensor parallel": ("mesh { tp = 8 }\nplace megatron over tp", "none",
                        lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    "tensor + sequence parallel": (
        "mesh { tp = 8 }\nplace megatron(sequence_parallel) over tp", "none",
        lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s / (h * t))),
    "tensor parallel + selective": ("mesh { tp = 8 }\nplace megatron over tp", "selective",
                                    lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
    "tensor + sequence parallel + selective": (
        "mesh { tp = 8 }\nplace megatron(sequence_parallel) over tp", "selective",
        lambda s, b, h, a, t: 34 * s * b * h / t),
    "full recompute": ("mesh { tp = 8 }\nplace megatron over tp", "full",
                       lambda s, b, h, a, t: 2 * s * b * h),
}


@pytest.mark.parametrize("row", list(KORTHIKANTI))
def test_korthikanti_table_2_as_closed_forms(row: str) -> None:
    mesh_and_place, recompute, formula = KORTHIKANTI[row]
    costs, sym = gpt3_symbolic(mesh_and_place, recompute)
    assert costs.activations is not None
    s, b, h, a = sym["s"], sym["b"], sym["h"], sym["a"]
    t = sym.get("tp", sympy.Integer(1))
    # GPT-3 has a plain 4h MLP and as many KV heads as heads: substitute f = 4h, a_kv = a.
    per_layer = sympy.sympify(costs.activations.per_layer).subs(
        {sym[k]: v for k, v in (("f", 4 * h), ("a_kv", a)) if k in sym})
    assert same(per_layer, formula(s, b, h, a, t))


def test_tensor_parallel_communication_closed_form() -> None:
    costs, sym = gpt3_symbolic("mesh { tp = 8 }\nplace megatron over tp")
    item = next(c for c in costs.comm if c.what.startswith("activations (tensor parallel"))
    s, b, h, L, t, m = sym["s"], sym["b"], sym["h"], sym["L"], sym["tp"], sym["m"]
    # 4 all-reduces of b·s·h (2 bytes) per layer per micro-batch, ring 2(t-1)/t.
    assert same(item.bytes, 4 * L * m * b * s * h * 2 * 2 * (t - 1) / t)


@pytest.mark.parametrize(("schedule", "bubble"), [
    ("pipeline(1f1b, microbatches = 32)", lambda p, m, v: (p - 1) / m),
    ("pipeline(gpipe, microbatches = 32)", lambda p, m, v: (p - 1) / m),
    ("pipeline(interleaved, chunks = 2, microbatches = 32)", lambda p, m, v: (p - 1) / (v * m)),
])
def test_pipeline_bubble_closed_forms(schedule: str, bubble: Any) -> None:
    costs = analyse(load_text("model llama3_70b\nprecision megatron\nmesh { pp = 8 }\n"
                              f"place {schedule} over pp\n"), symbolic=True)
    assert isinstance(costs.domain, Symbolic)
    sym = symbols(costs.domain)
    assert same(costs.bubble, bubble(sym["pp"], sym["m"], sym.get("v", 1)))


@pytest.mark.parametrize(("schedule", "layers_worth"), [
    ("pipeline(1f1b, microbatches = 32)", lambda L, p, m, v: L),
    ("pipeline(gpipe, microbatches = 32)", lambda L, p, m, v: m * L / p),
    ("pipeline(interleaved, chunks = 2, microbatches = 32)",
     lambda L, p, m, v: L * (1 + (p - 1) / (p * v))),
])
def test_pipeline_in_flight_closed_forms(schedule: str, layers_worth: Any) -> None:
    costs = analyse(load_text("model llama3_70b\nprecision megatron\nmesh { pp = 8 }\n"
                              f"place {schedule} over pp\n"), symbolic=True)
    assert isinstance(costs.domain, Symbolic) and costs.activations is not None
    sym = symbols(costs.domain)
    expected = layers_worth(sym["L"], sym["pp"], sym["m"], sym.get("v", 1))
    assert same(costs.activations.kept, expected * costs.activations.per_layer)
