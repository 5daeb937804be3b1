"""A search whose problem has no legal layout says which divisibility failed and exits 2,
instead of screening nothing and answering "no layout fits" (exit 6)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from placeverify.ir.model import ARCHITECTURES
from placeverify.search.space import Space, why_no_layout

ROOT = Path(__file__).resolve().parents[1]
LLAMA3_8B = ARCHITECTURES["llama3_8b"]  # 32 layers, 32 heads, 8 KV heads, MLP 14,336


def test_thirteen_devices_and_a_batch_of_seven_name_each_failed_split() -> None:
    # By hand: 13 is prime, so t = cp = 1 and the devices split as pp 1 x d 13 or pp 13 x d 1.
    # d 13 divides no b x 13 into 7 sequences; pp 13 splits 32 layers neither evenly (32 % 13)
    # nor unevenly (11 middle stages of ceil(32 / 13) = 3 layers leave -1 for the two ends), and
    # interleaving needs m = 7 a multiple of 13.
    reasons = why_no_layout(LLAMA3_8B, 13, 7, 8, Space())
    text = "\n".join(reasons)
    assert "t in {1}" in text
    assert "pp 1: d · ep = 13 data-parallel replicas" in text
    assert "global batch of 7 sequences" in text
    assert "pp 13 (d · ep = 1): the 32 layers do not split" in text
    assert len([r for r in reasons if r.startswith("pp ")]) == 2


def test_a_problem_with_a_legal_layout_has_no_reason() -> None:
    assert why_no_layout(LLAMA3_8B, 8, 64, 8, Space()) == []
    # 8 devices, batch 3: t = 8 leaves one replica, b = 1 and m = 3
    assert why_no_layout(LLAMA3_8B, 8, 3, 8, Space()) == []


def test_an_odd_batch_over_a_pure_data_parallel_space_names_the_batch() -> None:
    # t at most 1, no pipeline: 4 devices are 4 replicas; b x 4 divides 6 for no b in {1, 2}
    space = replace(Space(), max_tp=1, max_pp=1, max_cp=1, micro_batches=(1, 2))
    reasons = why_no_layout(LLAMA3_8B, 4, 6, 8, space)
    assert any("d · ep = 4 data-parallel replicas" in r and "b in {1, 2}" in r for r in reasons)


def test_search_cli_exits_2_with_the_reasons() -> None:
    done = subprocess.run([sys.executable, "-m", "placeverify", "search", "--model", "llama3_8b",
                           "--device", "h100_sxm", "--devices", "13", "--global-batch", "7", "-q",
                           "--timeout", "5"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2
    assert "no legal layout of 13 devices for a global batch of 7" in done.stderr
    assert "[not-divisible]" in done.stderr
    assert "Traceback" not in done.stderr
