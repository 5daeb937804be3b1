"""transformers' own parameter counts of the ``deepseek_v3`` and ``llama4_text`` configs of
``tests/test_hf_layer_kinds.py``, beside placeverify's.

Each model is built on the meta device (no weights) from its config and its ``parameters()``
counted; placeverify reads the same config.json with ``--model`` (importers/hf_config.py). Needs
transformers, the project's ``models`` extra (pinned to 5.23.0, which works with torch 2.13.0):

    .venv/bin/pip install -e '.[models]'
    .venv/bin/python benchmarks/hf_layer_kinds_counts.py

transformers 5.23.0 gives 671,026,404,352 (DeepSeek-V3), 398,024 and 404,624 (the small
DeepSeek, with and without a query rank), 107,769,861,120 (Llama-4-Scout's text model),
400,711,848,960 (Maverick's) and 298,816 (the small Llama 4), each equal to placeverify's.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_hf_layer_kinds import DEEPSEEK_V3, SCOUT, SMALL_DEEPSEEK  # noqa: E402

SMALL_LLAMA4 = {"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 6,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
                "intermediate_size": 32, "intermediate_size_mlp": 80, "num_local_experts": 4,
                "num_experts_per_tok": 1, "interleave_moe_layer_step": 3, "vocab_size": 500}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("DeepSeek-V3", DEEPSEEK_V3),
    ("small deepseek_v3", SMALL_DEEPSEEK),
    ("small deepseek_v3, q_lora_rank null", {**SMALL_DEEPSEEK, "q_lora_rank": None}),
    ("Llama-4-Scout text", SCOUT),
    ("Llama-4-Maverick text", {**SCOUT, "num_local_experts": 128,
                               "interleave_moe_layer_step": 2}),
    ("small llama4_text", SMALL_LLAMA4),
]


def transformers_count(config: dict[str, Any]) -> int:
    import torch
    from transformers import (
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        Llama4ForCausalLM,
        Llama4TextConfig,
    )

    keys = {k: v for k, v in config.items() if k != "model_type"}
    if config["model_type"] == "deepseek_v3":
        built: Any = (DeepseekV3ForCausalLM, DeepseekV3Config(**keys))
    else:
        built = (Llama4ForCausalLM, Llama4TextConfig(**keys))
    with torch.device("meta"):
        model = built[0](built[1])
    return sum(p.numel() for p in model.parameters())


def placeverify_count(config: dict[str, Any]) -> int:
    from placeverify.importers import Options
    from tests.seq_given import load_seq

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(json.dumps(config))
        strategy, _ = load_seq(str(ROOT / "tests" / "importers" / "llama3-8b-zero3.json"),
                               Options(model=str(path), world=8))
    return int(strategy.model.params)


def main() -> int:
    worst = 0
    for name, config in CASES:
        ours, theirs = placeverify_count(config), transformers_count(config)
        print(f"{name:40} placeverify {ours:>18,}  transformers {theirs:>18,}"
              + ("" if ours == theirs else "  DIFFERENT"))
        worst = max(worst, int(ours != theirs))
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
