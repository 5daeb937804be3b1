"""``--quick-geglu`` is a gated MLP (issue 32, item 4). NVIDIA/Megatron-LM at d98e8a64dd:
``megatron/training/argument_utils.py:323-326`` sets ``gated_linear_unit = True`` and
``activation_func = quick_gelu`` for it (asserting no --swiglu beside it);
``megatron/core/transformer/mlp.py:205-206`` doubles fc1's output for a gated linear unit
(``ffn_hidden_size *= 2``), so fc1 is h x 2f (gate and up) and fc2 f x h, as under --swiglu;
``megatron/core/fusions/fused_bias_geglu.py:191-202`` quick_geglu(y) = quick_gelu(y1) * y2 over the
two halves. Only --swiglu changes the default --ffn-hidden-size (``megatron/training/arguments.py:
1320-1329``): with --quick-geglu it stays 4h. Expected counts are by hand from those shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import load

SCRIPT = """#!/bin/bash
torchrun --nproc-per-node 2 pretrain_gpt.py \\
    --num-layers 2 --hidden-size 64 --num-attention-heads 4 {flags} \\
    --seq-length 128 --max-position-embeddings 128 --vocab-size 1000 \\
    --micro-batch-size 1 --global-batch-size 2 --bf16
"""


def imported(tmp_path: Path, flags: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT.format(flags=flags), encoding="utf-8")
    return load(str(path), Options())


def hand_count(f: int, gated: bool) -> int:
    """h 64, L 2, vocab 1000 (unpadded: the model's own count), 128 learned positions,
    LayerNorm (weight and bias), biases on every linear layer, tied embeddings."""
    h, layers = 64, 2
    attention = 4 * h * h + 3 * h + h  # QKV and proj weights, their biases
    fc1 = h * (2 * f if gated else f) + (2 * f if gated else f)
    fc2 = f * h + h
    norms = 2 * 2 * h
    return layers * (attention + fc1 + fc2 + norms) + 2 * h + 1000 * h + 128 * h


def test_quick_geglu_is_a_gated_mlp_of_4h(tmp_path: Path) -> None:
    strategy, result = imported(tmp_path, "--quick-geglu")
    assert "mlp = gated" in result.text
    assert strategy.model.arch is not None and strategy.model.arch.ffn == 4 * 64
    expected = hand_count(256, gated=True)
    assert expected == 2 * (16384 + 256 + 33280 + 16448 + 256) + 128 + 64000 + 8192 == 205_568
    assert strategy.model.params == expected
    assert not any("--quick-geglu" in w.message for w, _ in result.warnings)


def test_plain_gelu_keeps_two_matrices(tmp_path: Path) -> None:
    strategy, result = imported(tmp_path, "")
    assert "mlp = plain" in result.text
    assert strategy.model.params == hand_count(256, gated=False)


def test_quick_geglu_with_swiglu_is_refused_at_the_flag(tmp_path: Path) -> None:
    with pytest.raises(PlaceError) as caught:
        imported(tmp_path, "--quick-geglu --swiglu")
    error = next(e for e in caught.value.diagnostics if "--quick-geglu" in e.message)
    assert error.span is not None and error.span.line == 3
