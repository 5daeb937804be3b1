"""Rank kinds of the memory report (issue 13, "every distinct rank kind"): where ranks of one
stage cannot differ in what placeverify models, they are one kind. Expected numbers are worked
out by hand from the model's shapes.

Expert ranks against dense ranks: every layer of a ``model transformer`` with ``experts`` is a
MoE layer (no key interleaves dense layers), and ``ep`` must divide the experts (Megatron-LM's
MoE layer asserts ``num_moe_experts % expert_model_parallel_size == 0``; placeverify rejects it
at the placement, tests/errors/not-divisible-experts), so every rank of an expert group holds
experts/ep experts of every layer and the same dense part: one kind per pipeline stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MOE = """strategy "moe kinds"
model transformer {{
    layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 96, seq = 16, micro_batch = 2,
    mlp = gated, norm = rmsnorm, bias = false, position = rotary, attention = flash,
    embeddings = untied, experts = 8, top_k = 2, expert_ffn = 128
}}
precision fp32_adam
mesh {{ {mesh} }}
{place}
"""
# one layer: attention 4·64² = 16,384; two RMSNorms 2·64; router 64·8 (replicated);
# experts 8 · 3 · 64 · 128 = 196,608. Outside: embedding 96·64, output 96·64, final norm 64.
DENSE_LAYER = 4 * 64 * 64 + 2 * 64 + 64 * 8
EXPERTS_LAYER = 8 * 3 * 64 * 128
EMBEDDING = OUTPUT = 96 * 64


def ranks(mesh: str, place: str) -> list[dict]:
    path = ROOT / "build" / "rank-kinds.place"
    path.parent.mkdir(exist_ok=True)
    path.write_text(MOE.format(mesh=mesh, place=place), encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "placeverify", "check", "--json", "--no-verify",
                          str(path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)["memory"]["ranks"]


def test_expert_ranks_are_one_kind() -> None:
    kinds = ranks("ep = 4", "place expert over ep")
    assert [k["kind"] for k in kinds] == ["only"]
    params = 2 * DENSE_LAYER + 2 * EXPERTS_LAYER // 4 + EMBEDDING + OUTPUT + 64
    assert kinds[0]["device_bytes"]["params"] == 4 * params == 578_816


def test_expert_ranks_under_a_pipeline_differ_by_stage_only() -> None:
    kinds = ranks("pp = 2, ep = 2", "place pipeline(1f1b, microbatches = 4) over pp\nplace expert over ep")
    assert [k["kind"] for k in kinds] == ["first", "last"]
    first = DENSE_LAYER + EXPERTS_LAYER // 2 + EMBEDDING
    last = DENSE_LAYER + EXPERTS_LAYER // 2 + OUTPUT + 64
    assert [k["device_bytes"]["params"] for k in kinds] == [4 * first, 4 * last]
