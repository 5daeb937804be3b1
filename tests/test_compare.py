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
