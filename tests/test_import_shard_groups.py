"""Flattened shard groups: FSDP2 with context parallelism shards over dp_shard x cp.

accelerate: ``src/accelerate/parallelism_config.py`` (huggingface/accelerate at 16cb6eb) lines
136-143 (``dp_shard_cp_dim_names``: dp_shard and cp, "flattened into a joint mesh across which is
model sharded in FSDP"), 158-164 (``fsdp_dim_names``: dp_replicate when enabled, then
dp_shard_cp), 239-240 (the flatten); ``utils/fsdp_utils.py`` line 770 passes
``mesh[fsdp_dim_names]`` to ``fully_shard``.

torchtitan: ``torchtitan/distributed/parallel_dims.py`` (pytorch/torchtitan at b5bcd76) line 281
(``fsdp = self.dp_shard * self.cp``), 644-645 (``fsdp_enabled``: dp_shard or cp enabled);
``torchtitan/models/llama3/parallelize.py`` lines 62-64 (fully_shard over ("dp_replicate",
"fsdp") when dp_replicate is enabled, else ("fsdp",)); before 183a0d2 the same mesh was
flattened as "dp_shard_cp" (parallel_dims.py:183, models/llama3/infra/parallelize.py:116-118).

Every rank of the shard group holds 1/|dp_shard x cp| of the parameters, gradients and
optimizer state, so the per-device bytes are Ψ · bytes / (dp_shard · cp · tp), the replicas of
HSDP holding the same shard.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from placeverify.api import check_strategy, overrides
from placeverify.importers import Options
from placeverify.importers.registry import load

HERE = Path(__file__).parent / "importers"

# Llama 3 8B (tests/importers/llama3-8b-config.json), counted by hand: untied embedding and
# output layer 2 x 128256 x 4096; per layer q, o 4096 x 4096, k, v 4096 x 1024 (8 kv heads of
# 128), SwiGLU 3 x 4096 x 14336, two RMSNorm weights of 4096; 32 layers; a final norm of 4096.
LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
PSI = 2 * 128256 * 4096 + 32 * LAYER + 4096
# FSDP2 keeps the sharded parameters in fp32 (MixedPrecisionPolicy casts only the gathered
# copy), the sharded gradient in the parameter's dtype (fp32), and AdamW two fp32 moments.
BYTES = {"params": 4, "gradients": 4, "optimizer": 8}


def _per_device(name: str, world: int, shard_group: int, *sets: str) -> None:
    settings = overrides(list(sets)) if sets else None
    options = Options(world=world, model=str(HERE / "llama3-8b-config.json")
                      if name.endswith(".yaml") else None)
    strategy, imported = load(str(HERE / name), options, settings)
    assert strategy.model.params == PSI
    result = check_strategy(strategy)
    [rank] = result.costs.ranks
    got = result.costs.rank_bytes(rank)
    for state, size in BYTES.items():
        assert got[state] == PSI * size // shard_group, state
    assert result.verification is not None
    assert set(result.verification.verdicts().values()) == {"proved"}, \
        result.verification.verdicts()
    return imported.text


def test_accelerate_cp_only_shards_over_cp() -> None:
    # configs/cp.yaml: cp 8, dp_shard 1, dp_replicate 1: dp_shard_cp = cp = 8 ranks
    text = _per_device("llama3-8b-cp8-accelerate.yaml", 8, 8, "model.seq=16384")
    assert "place fsdp over dp * cp" in text and "place context over cp" in text


def test_accelerate_hsdp_with_cp_shards_over_shard_times_cp() -> None:
    # dp_replicate 2 x dp_shard 2 x cp 2: fully_shard over (dp_replicate, dp_shard_cp), each
    # replica's 4 ranks holding 1/4
    text = _per_device("llama3-8b-hsdp-cp2-accelerate.yaml", 8, 4, "model.seq=16384")
    assert "place fsdp over shard * cp" in text and "place ddp over replica" in text


def test_torchtitan_fsdp_with_cp_shards_over_dp_times_cp() -> None:
    # world 8, cp 4: data_parallel_shard_degree -1 = 8 / 4 = 2; the fsdp mesh is 2 x 4 = 8
    text = _per_device("llama3-8b-cp4-torchtitan.toml", 8, 8)
    assert "place fsdp over dp * cp" in text and "seq = 32768" in text


def test_torchtitan_hsdp_with_cp_shards_over_shard_times_cp() -> None:
    # world 16: replicate 2, cp 2, shard -1 = 16 / 4 = 4; fully_shard over (dp_replicate,
    # fsdp = 4 x 2)
    text = _per_device("llama3-8b-hsdp-cp2-torchtitan.toml", 16, 8)
    assert "place fsdp over shard * cp" in text and "place ddp over replica" in text


def test_torchtitan_cp_without_a_shard_degree_still_shards_over_cp(tmp_path: Path) -> None:
    # fsdp_enabled = dp_shard_enabled or cp_enabled (parallel_dims.py:644-645): world 4, cp 4
    # leaves dp_shard 1, and FSDP2 still shards over the 4 cp ranks
    text = (HERE / "llama3-8b-cp4-torchtitan.toml").read_text()
    (tmp_path / "cp-only.toml").write_text(text)
    strategy, imported = load(str(tmp_path / "cp-only.toml"), Options(world=4))
    assert "place fsdp over dp * cp" in imported.text
    [rank] = check_strategy(strategy).costs.ranks
    assert check_strategy(strategy).costs.rank_bytes(rank)["params"] == PSI * 4 // 4


@pytest.mark.parametrize("preset", ["fsdp", "zero3"])
def test_a_sharding_preset_over_data_times_context_divides_by_the_product(preset: str) -> None:
    # the language (docs/language/place.md, "Per-group meshes"): Θ, Ω, G S over dp and cp
    from placeverify.importers.registry import load_text

    text = f"""
strategy "hand"
model llama3_8b {{ seq = 8192 }}
precision {{ params = fp32, grads = fp32, optimizer = 8, activations = bf16, loss_scale = none }}
mesh {{ dp = 2, cp = 4 }}
place context over cp
place {preset} over dp * cp
"""
    strategy = load_text(text, "hand.place")
    result = check_strategy(strategy)
    [rank] = result.costs.ranks
    got = result.costs.rank_bytes(rank)
    for state, size in BYTES.items():
        assert got[state] == PSI * size // 8, state
    assert set(result.verification.verdicts().values()) == {"proved"}


def test_no_sequence_length_is_refused_not_guessed() -> None:
    # an accelerate config gives no sequence length (the script does: configs/cp.yaml's README
    # runs --sequence-length=128000); max_position_embeddings is not taken for it: exit 2
    # (docs/exit-codes.md), an error at the key with the way to give it
    import subprocess
    import sys

    args = [sys.executable, "-m", "placeverify", "import", str(HERE / "llama3-8b-cp8-accelerate.yaml"),
            "--model", str(HERE / "llama3-8b-config.json")]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert "llama3-8b-config.json:11:3: error: no sequence length" in done.stderr
    assert "--set model.seq=N" in done.stderr and "Traceback" not in done.stderr
    given = subprocess.run([*args, "--set", "model.seq=128000"], capture_output=True, text=True,
                           check=False)
    assert given.returncode == 0 and "seq = 128000" in given.stdout
