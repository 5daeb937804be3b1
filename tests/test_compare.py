"""The comparison table: the paper's headline, ZeRO-3 vs DP at N = 8 (REFERENCE §1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLES, ROOT


def at_eight(tmp_path: Path, name: str) -> Path:
    text = (EXAMPLES / "zero-paper" / f"{name}.place").read_text().replace("dp = 64", "dp = 8")
    out = tmp_path / f"{name}.place"
    out.write_text(text)
    return out


def test_zero3_uses_8x_less_memory_at_1_5x_traffic(tmp_path: Path) -> None:
    files = [str(at_eight(tmp_path, n)) for n in ("ddp", "zero3")]
    done = subprocess.run([sys.executable, "-m", "placeverify", "compare", "--json", "--verify",
                           *files], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["strategies"]
    ddp, zero3 = rows
    psi = 7_500_000_000
    assert ddp["memory"]["total"] == 16 * psi  # 2 + 2 + 12 bytes per parameter
    assert zero3["memory"]["total"] == 16 * psi // 8
    assert zero3["memory_ratio"] == 1 / 8
    # 2Ψ_B (N-1)/N for DP against 3Ψ_B (N-1)/N for ZeRO-3, Ψ_B = 2Ψ bytes
    assert ddp["state_traffic_bytes"] == 2 * 2 * psi * 7 // 8
    assert zero3["state_traffic_bytes"] == 3 * 2 * psi * 7 // 8
    assert zero3["state_traffic_ratio"] == 1.5
    # all traffic adds the step's scalars, all-reduced over 8: the token count (8 B) and the
    # fp16 overflow flag (4 B), 2·(7/8)·12 = 21 B each step
    assert ddp["traffic_bytes"] == 2 * 2 * psi * 7 // 8 + 21
    assert zero3["traffic_ratio"] == (3 * 2 * psi * 7 // 8 + 21) / (2 * 2 * psi * 7 // 8 + 21)
    assert ddp["verdicts"] == zero3["verdicts"] == {
        "gradient_integrity": "proved", "state_consistency": "proved",
        "composition_safety": "proved"}


def test_text_table_lists_every_strategy(tmp_path: Path) -> None:
    files = [str(at_eight(tmp_path, n)) for n in ("ddp", "zero1", "zero2", "zero3")]
    done = subprocess.run([sys.executable, "-m", "placeverify", "compare", *files],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    for name, tuple_text in (("ddp", "(R, R, R, R)"), ("zero1", "(R, S, R, R)"),
                             ("zero2", "(R, S, S, R)"), ("zero3", "(S*, S, S, R)")):
        assert any(name in line and tuple_text in line for line in done.stdout.splitlines())
    assert "0.125x" in done.stdout and "1.5x" in done.stdout


def test_compare_gives_traffic_per_token_and_the_step_time_estimate() -> None:
    from placeverify.compare_cli import compare_files

    ddp = EXAMPLES / "strategies" / "llama3-8b-ddp.place"
    timed = EXAMPLES / "strategies" / "gpt3-175b-megatron-2022.place"
    bare = EXAMPLES / "zero-paper" / "ddp.place"
    document, _ = compare_files([str(ddp), str(timed), str(bare)], with_verdicts=False)
    by_file = {Path(r["file"]).stem: r for r in document["strategies"]}
    # Llama 3 8B by hand: embeddings and head 2 x 128,256 x 4,096, 32 layers of attention
    # (2 x 4,096^2 + 2 x 4,096 x 1,024), gated MLP 3 x 4,096 x 14,336 and two norms, a final norm
    psi = 2 * 128_256 * 4_096 + 32 * (2 * 4_096**2 + 2 * 4_096 * 1_024 + 3 * 4_096 * 14_336
                                      + 2 * 4_096) + 4_096
    assert psi == 8_030_261_248
    ring = 2 * 7 / 8 * 2 * psi  # a ring all-reduce of 2-byte gradients over 8 ranks
    tokens = 8 * 1 * 8_192  # 8 replicas x micro-batch 1 x seq 8,192, one micro-batch
    row = by_file["llama3-8b-ddp"]
    assert abs(row["traffic_bytes_per_token"] - ring / tokens) / (ring / tokens) < 1e-6
    assert row["step_seconds"] is None and row["mfu"] is None  # no device: no compute time
    # a file naming a device: the same estimate check reports, its tokens/s from the step
    timed_row = by_file["gpt3-175b-megatron-2022"]
    step = timed_row["step_seconds"]
    assert step is not None and step > 0
    gpt_tokens = 64 * 2_048  # Korthikanti et al. Table 5: batch 64 sequences of 2,048
    assert abs(timed_row["tokens_per_second"] - gpt_tokens / step) < 1e-6 * gpt_tokens / step
    assert 0 < timed_row["mfu"] < 1
    assert by_file["ddp"]["traffic_bytes_per_token"] is None  # a bare count has no tokens
