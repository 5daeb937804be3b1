"""A seeded short run of ``benchmarks/fuzz.py``: no internal error, every input within its budget."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_seeded_fuzz_campaign_has_no_internal_error_and_no_overrun() -> None:
    spec = importlib.util.spec_from_file_location("fuzz_benchmark", ROOT / "benchmarks" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    fuzz = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_benchmark"] = fuzz
    spec.loader.exec_module(fuzz)
    budget = 3.0
    outcomes = fuzz.campaign(200, seed=1, budget=budget)
    assert len(outcomes) == 200
    assert [o for o in outcomes if o.internal] == []
    assert [o.name for o in outcomes if o.seconds > budget * 1.1 + 0.5] == []
