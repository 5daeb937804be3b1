"""``activation = gelu_new``: a plain MLP whose tanh GELU is written out as elementwise
operations (transformers' ``NewGELUActivation``, GPT-2's default ``activation_function``:
``0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 *
torch.pow(input, 3.0))))``, transformers 5.23 ``activations.py`` line 66).

Autograd saves, beyond what the one-kernel GELU saves (its input, the fc1 output): ``tanh``'s
output (``tools/autograd/derivatives.yaml``: ``tanh_backward(grad, result)``), and the last
product's two operands, ``0.5 * input`` and ``1.0 + tanh(...)`` (``mul``: ``grad * other``,
``grad * self``); ``pow`` saves its input, the fc1 output already saved; products and sums with
a Python number save none. Three more s·b·f tensors per layer, e bytes each, counted here by hand.
``benchmarks/peak_memory.py`` measures ``transformers``' GPT-2 with it
(``benchmarks/models/gpt2-gelu_new``).
"""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from placeverify.api import load_text
from placeverify.cost import analyse
from placeverify.diagnostics import PlaceError

TEXT = """strategy "gelu"
model transformer {{
    layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 512, seq = 64, micro_batch = 2,
    mlp = {mlp}, norm = layernorm, bias = true, position = learned, attention = standard,
    embeddings = tied{extra}
}}
precision {precision}
mesh {{ dp = 2 }}
place ddp over dp
"""
S, B, FF, L = 64, 2, 256, 2


def activations(extra: str, precision: str = "fp32_adam") -> F:
    c = analyse(load_text(TEXT.format(mlp="plain", extra=extra, precision=precision), "g.place"))
    return F(c.device_bytes()["activations"])


@pytest.mark.parametrize(("precision", "e"), [("fp32_adam", 4), ("mixed_adam", 2)])
def test_gelu_new_saves_three_more_ffn_wide_tensors_per_layer(precision: str, e: int) -> None:
    plain = activations("", precision)
    assert activations(", activation = gelu", precision) == plain  # the default, written out
    assert activations(", activation = gelu_new", precision) - plain == L * 3 * e * S * B * FF


def test_a_gated_mlp_takes_no_gelu_new() -> None:
    with pytest.raises(PlaceError) as info:
        load_text(TEXT.format(mlp="gated", extra=", activation = gelu_new",
                              precision="fp32_adam"), "g.place")
    assert "g.place:5:" in str(info.value) and "a plain MLP's" in str(info.value)


def test_an_unknown_activation_is_an_error_at_its_text() -> None:
    with pytest.raises(PlaceError) as info:
        load_text(TEXT.format(mlp="plain", extra=", activation = relu", precision="fp32_adam"),
                  "g.place")
    assert "g.place:5:" in str(info.value) and "unknown activation 'relu'" in str(info.value)


def test_the_measure_model_computes_the_tanh_gelu() -> None:
    torch = pytest.importorskip("torch")
    from placeverify.measure.models import FeedForward

    arch = load_text(TEXT.format(mlp="plain", extra=", activation = gelu_new",
                                 precision="fp32_adam"), "g.place").model.arch
    assert arch is not None
    torch.manual_seed(0)
    mlp = FeedForward(arch)
    x = torch.randn(2, 3, 64)
    want = mlp.down(torch.nn.functional.gelu(mlp.up(x), approximate="tanh"))
    torch.testing.assert_close(mlp(x), want)
